#include "accrue/dist/copy_engine_all_reduce.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "accrue/core/error.h"
#include "accrue/core/status_check.h"

namespace accrue::dist {
namespace {

// The driver's stream memory operations, found at run time (libaccrue links
// only the runtime): Note [Copy-engine all-reduce].
using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

template <class Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ACCRUE_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  ACCRUE_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
               "CopyEngineAllReduce: the CUDA driver has no ", name);
  return reinterpret_cast<Fn>(fn);
}

void write_value(CUstream_st* stream, uint32_t* address, uint32_t value) {
  static const WriteValue32 write = driver_entry<WriteValue32>("cuStreamWriteValue32");
  // The default flags put a memory barrier before the write: the copies
  // before it on this stream are visible to the peer once it sees the value.
  const CUresult r = write(stream, reinterpret_cast<CUdeviceptr>(address), value, 0);
  ACCRUE_CHECK(r == CUDA_SUCCESS, "CopyEngineAllReduce: cuStreamWriteValue32 failed (CUresult ",
               static_cast<int>(r), ")");
}

void wait_value(CUstream_st* stream, uint32_t* address, uint32_t value) {
  static const WaitValue32 wait = driver_entry<WaitValue32>("cuStreamWaitValue32");
  const CUresult r =
      wait(stream, reinterpret_cast<CUdeviceptr>(address), value, CU_STREAM_WAIT_VALUE_GEQ);
  ACCRUE_CHECK(r == CUDA_SUCCESS, "CopyEngineAllReduce: cuStreamWaitValue32 failed (CUresult ",
               static_cast<int>(r), ")");
}

enum Flag { kReady = 0, kDone = 1, kFlags = 2 };

// What a rank tells the other: where it runs and how to map its buffers.
struct Card {
  char host[64] = {};
  char pci_bus_id[32] = {};
  cudaIpcMemHandle_t staging{}, flags{};
  int64_t capacity_bytes = 0;
};

std::string to_bytes(const Card& c) {
  return std::string(reinterpret_cast<const char*>(&c), sizeof(Card));
}

Card from_bytes(const std::string& s) {
  ACCRUE_CHECK(s.size() == sizeof(Card), "CopyEngineAllReduce: a peer sent ", s.size(),
               " bytes, expected ", sizeof(Card));
  Card c;
  std::memcpy(&c, s.data(), sizeof(Card));
  return c;
}

}  // namespace

std::unique_ptr<CopyEngineAllReduce> CopyEngineAllReduce::connect(int rank, int device,
                                                                  int64_t capacity_bytes,
                                                                  const Gather& gather,
                                                                  std::string* why) {
  ACCRUE_CHECK(rank == 0 || rank == 1, "CopyEngineAllReduce: rank ", rank, " (two ranks: 0 and 1)");
  ACCRUE_CHECK(capacity_bytes >= 16, "CopyEngineAllReduce: capacity of ", capacity_bytes, " bytes");
  ACCRUE_CUDA_CHECK(cudaSetDevice(device));
  std::unique_ptr<CopyEngineAllReduce> e(new CopyEngineAllReduce());
  e->rank_ = rank;
  e->device_ = device;
  e->capacity_bytes_ = (capacity_bytes + 255) / 256 * 256;
  ACCRUE_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&e->staging_), static_cast<size_t>(e->capacity_bytes_)));
  ACCRUE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&e->flags_), kFlags * sizeof(uint32_t)));
  ACCRUE_CUDA_CHECK(cudaMemset(e->flags_, 0, kFlags * sizeof(uint32_t)));

  Card mine;
  gethostname(mine.host, sizeof(mine.host) - 1);
  ACCRUE_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.pci_bus_id, sizeof(mine.pci_bus_id), device));
  ACCRUE_CUDA_CHECK(cudaIpcGetMemHandle(&mine.staging, e->staging_));
  ACCRUE_CUDA_CHECK(cudaIpcGetMemHandle(&mine.flags, e->flags_));
  mine.capacity_bytes = e->capacity_bytes_;
  const std::vector<std::string> cards = gather(to_bytes(mine));
  ACCRUE_CHECK(cards.size() == 2, "CopyEngineAllReduce: ", cards.size(), " ranks answered, not 2");
  const Card peer = from_bytes(cards[static_cast<size_t>(1 - rank)]);
  ACCRUE_CHECK(peer.capacity_bytes == e->capacity_bytes_, "CopyEngineAllReduce: rank ", 1 - rank,
               " staged ", peer.capacity_bytes, " bytes and rank ", rank, " ", e->capacity_bytes_,
               " (the ranks' buckets differ)");

  // Both ranks reach the same verdict from the same two cards, except for
  // peer access, which each checks on its side: a second gather agrees on it.
  std::string reason;
  int peer_device = -1;
  if (std::strncmp(mine.host, peer.host, sizeof(mine.host)) != 0) {
    reason = std::string("the ranks run on different hosts (") + mine.host + ", " + peer.host + ")";
  } else if (cudaDeviceGetByPCIBusId(&peer_device, peer.pci_bus_id) != cudaSuccess) {
    (void)cudaGetLastError();
    reason = std::string("the peer's GPU (") + peer.pci_bus_id + ") is not visible to rank " +
             std::to_string(rank);
  } else {
    int can = 0;
    ACCRUE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer_device));
    if (!can)
      reason = "cuda:" + std::to_string(device) +
               " cannot access cuda:" + std::to_string(peer_device) + " as a peer";
  }
  const std::vector<std::string> verdicts = gather(reason.empty() ? "ok" : "no: " + reason);
  for (size_t r = 0; r < verdicts.size(); ++r)
    if (verdicts[r] != "ok" && reason.empty())
      reason = "rank " + std::to_string(r) + ": " + verdicts[r].substr(4);
  if (!reason.empty()) {
    if (why != nullptr) *why = reason;
    return nullptr;  // the destructor frees what was allocated
  }

  ACCRUE_CUDA_CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&e->peer_staging_), peer.staging,
                                         cudaIpcMemLazyEnablePeerAccess));
  ACCRUE_CUDA_CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&e->peer_flags_), peer.flags,
                                         cudaIpcMemLazyEnablePeerAccess));
  int lowest = 0, highest = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  ACCRUE_CUDA_CHECK(cudaStreamCreateWithPriority(&e->side_, cudaStreamNonBlocking, highest));
  ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&e->release_stream_, cudaStreamNonBlocking));
  ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e->pulled_, cudaEventDisableTiming));
  ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e->joined_, cudaEventDisableTiming));
  // Both mappings exist on both ranks before either writes into the other's.
  gather("mapped");
  return e;
}

CopyEngineAllReduce::~CopyEngineAllReduce() {
  (void)cudaSetDevice(device_);
  if (side_ != nullptr) (void)cudaStreamSynchronize(side_);
  if (release_stream_ != nullptr) (void)cudaStreamSynchronize(release_stream_);
  if (peer_staging_ != nullptr) (void)cudaIpcCloseMemHandle(peer_staging_);
  if (peer_flags_ != nullptr) (void)cudaIpcCloseMemHandle(peer_flags_);
  if (pulled_ != nullptr) (void)cudaEventDestroy(pulled_);
  if (joined_ != nullptr) (void)cudaEventDestroy(joined_);
  if (side_ != nullptr) (void)cudaStreamDestroy(side_);
  if (release_stream_ != nullptr) (void)cudaStreamDestroy(release_stream_);
  if (staging_ != nullptr) (void)cudaFree(staging_);
  if (flags_ != nullptr) (void)cudaFree(flags_);
}

bool CopyEngineAllReduce::takes(const void* data, int64_t count) const {
  return count >= 2 && count * static_cast<int64_t>(sizeof(float)) <= capacity_bytes_ &&
         reinterpret_cast<uintptr_t>(data) % 16 == 0;
}

void CopyEngineAllReduce::enqueue(float* data, int64_t count, CUstream_st* stream) {
  ACCRUE_CHECK(takes(data, count), "CopyEngineAllReduce: cannot take ", count, " floats (capacity ",
               capacity_bytes_, " bytes, 16-byte aligned data)");
  // Rank 0 owns [0, split), rank 1 [split, count); split keeps 16-byte alignment.
  const int64_t split = (count / 2) / 4 * 4;
  const int64_t mine_begin = rank_ == 0 ? 0 : split, mine_end = rank_ == 0 ? split : count;
  const int64_t theirs_begin = rank_ == 0 ? split : 0, theirs_end = rank_ == 0 ? count : split;
  const uint32_t call = ++calls_;
  auto bytes = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };

  // 1. The peer's half, staged for it to pull; READY both ways.
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(staging_ + theirs_begin, data + theirs_begin,
                                    bytes(theirs_end - theirs_begin), cudaMemcpyDeviceToDevice,
                                    stream));
  write_value(stream, peer_flags_ + kReady, call);
  wait_value(stream, flags_ + kReady, call);
  // 2. This rank's half in chunks: pull (this stream), add and push (side_).
  for (int64_t b = mine_begin; b < mine_end; b += kChunkFloats) {
    const int64_t n = std::min(kChunkFloats, mine_end - b);
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(staging_ + b, peer_staging_ + b, bytes(n),
                                      cudaMemcpyDeviceToDevice, stream));
    ACCRUE_CUDA_CHECK(cudaEventRecord(pulled_, stream));
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side_, pulled_, 0));
    copy_engine_add_f32(data + b, staging_ + b, n, side_);
    ACCRUE_CUDA_CHECK(
        cudaMemcpyAsync(peer_staging_ + b, data + b, bytes(n), cudaMemcpyDeviceToDevice, side_));
  }
  if (mine_begin == mine_end) {  // nothing of its own (count < 4 on rank 0): still in order
    ACCRUE_CUDA_CHECK(cudaEventRecord(pulled_, stream));
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side_, pulled_, 0));
  }
  // 3. DONE both ways, then the peer's sums of its half.
  write_value(side_, peer_flags_ + kDone, call);
  wait_value(side_, flags_ + kDone, call);
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(data + theirs_begin, staging_ + theirs_begin,
                                    bytes(theirs_end - theirs_begin), cudaMemcpyDeviceToDevice,
                                    side_));
  ACCRUE_CUDA_CHECK(cudaEventRecord(joined_, side_));
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, joined_, 0));
}

void CopyEngineAllReduce::release() noexcept {
  if (release_stream_ == nullptr) return;
  // Cyclically ahead of every number a wait can hold (Note [Copy-engine all-reduce]).
  // Host memory the copy reads before the synchronize below returns.
  uint32_t ahead[kFlags];
  ahead[kReady] = ahead[kDone] = calls_ + (uint32_t{1} << 30);
  (void)cudaSetDevice(device_);
  (void)cudaMemcpyAsync(flags_, ahead, sizeof(ahead), cudaMemcpyHostToDevice, release_stream_);
  (void)cudaStreamSynchronize(release_stream_);
}

}  // namespace accrue::dist
