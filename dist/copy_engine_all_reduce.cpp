#include "accrue/dist/copy_engine_all_reduce.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

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

using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// The start of the allocation holding `p` (CUDA IPC exports whole allocations).
char* allocation_base(const void* p) {
  static const GetAddressRange range = driver_entry<GetAddressRange>("cuMemGetAddressRange");
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult r = range(&base, &size, reinterpret_cast<CUdeviceptr>(p));
  ACCRUE_CHECK(r == CUDA_SUCCESS, "CopyEngineAllReduce: cuMemGetAddressRange failed (CUresult ",
               static_cast<int>(r), ")");
  return reinterpret_cast<char*>(base);
}

enum Flag { kReady = 0, kDone = 1, kFlags = 2 };

// What a rank tells the other: where it runs and how to map its buffers
// (rank 0 names the flags' shared page; rank 1 leaves the name empty).
struct Card {
  char host[64] = {};
  char pci_bus_id[32] = {};
  char flags_page[48] = {};
  cudaIpcMemHandle_t staging{};
  int64_t capacity_bytes = 0;
};

// What a rank tells the other in share(): its arena's allocation and where
// the arena starts in it; an empty handle when it cannot be exported.
struct ArenaCard {
  cudaIpcMemHandle_t allocation{};
  int64_t offset_bytes = 0;
  int64_t count = 0;
  int exported = 0;
};

// The flags' page: one page of host memory both processes map, [rank][Flag].
constexpr size_t kFlagsPageBytes = 4096;

// Maps the POSIX shared-memory object `name` (created, zero-filled, when
// `create`); nullptr with the reason in *why on failure.
uint32_t* map_flags_page(const std::string& name, bool create, std::string* why) {
  const int fd = shm_open(name.c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) {
    *why = "shm_open(" + name + ") failed: " + std::strerror(errno);
    return nullptr;
  }
  void* page = MAP_FAILED;
  if (!create || ftruncate(fd, kFlagsPageBytes) == 0)
    page = mmap(nullptr, kFlagsPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int saved = errno;
  close(fd);
  if (page == MAP_FAILED) {
    *why = "mapping " + name + " failed: " + std::strerror(saved);
    return nullptr;
  }
  return static_cast<uint32_t*>(page);
}

template <class C>
std::string to_bytes(const C& c) {
  return std::string(reinterpret_cast<const char*>(&c), sizeof(C));
}

template <class C>
C from_bytes(const std::string& s) {
  ACCRUE_CHECK(s.size() == sizeof(C), "CopyEngineAllReduce: a peer sent ", s.size(),
               " bytes, expected ", sizeof(C));
  C c;
  std::memcpy(&c, s.data(), sizeof(C));
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

  Card mine;
  gethostname(mine.host, sizeof(mine.host) - 1);
  ACCRUE_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.pci_bus_id, sizeof(mine.pci_bus_id), device));
  ACCRUE_CUDA_CHECK(cudaIpcGetMemHandle(&mine.staging, e->staging_));
  mine.capacity_bytes = e->capacity_bytes_;
  if (rank == 0) {
    // A name no other world on this host uses; removed once both ranks have
    // answered (the destructor removes it if a gather throws first).
    const std::string name = "/accrue-ce-" + std::to_string(getpid()) + "-" +
                             std::to_string(std::random_device{}() & 0xffffff);
    std::string failed;
    e->host_flags_ = map_flags_page(name, /*create=*/true, &failed);
    ACCRUE_CHECK(e->host_flags_ != nullptr, "CopyEngineAllReduce: rank 0: ", failed);
    e->flags_page_name_ = name;
    std::strncpy(mine.flags_page, name.c_str(), sizeof(mine.flags_page) - 1);
  }
  const std::vector<std::string> cards = gather(to_bytes(mine));
  ACCRUE_CHECK(cards.size() == 2, "CopyEngineAllReduce: ", cards.size(), " ranks answered, not 2");
  const Card peer = from_bytes<Card>(cards[static_cast<size_t>(1 - rank)]);
  ACCRUE_CHECK(peer.capacity_bytes == e->capacity_bytes_, "CopyEngineAllReduce: rank ", 1 - rank,
               " staged ", peer.capacity_bytes, " bytes and rank ", rank, " ", e->capacity_bytes_,
               " (the ranks' buckets differ)");

  // Both ranks reach the same verdict from the same two cards, except for
  // peer access and the flags' page, which each checks on its side: a second
  // gather agrees on them.
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
  if (reason.empty() && rank == 1) {
    const std::string name(peer.flags_page, strnlen(peer.flags_page, sizeof(peer.flags_page)));
    e->host_flags_ = map_flags_page(name, /*create=*/false, &reason);
  }
  if (reason.empty()) {
    if (cudaHostRegister(e->host_flags_, kFlagsPageBytes,
                         cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
      reason = std::string("registering the flags' page with CUDA failed: ") +
               cudaGetErrorString(cudaGetLastError());
    } else {
      e->flags_registered_ = true;
    }
  }
  const std::vector<std::string> verdicts = gather(reason.empty() ? "ok" : "no: " + reason);
  e->unlink_flags_page();  // rank 1 has mapped it, or never will
  for (size_t r = 0; r < verdicts.size(); ++r)
    if (verdicts[r] != "ok" && reason.empty())
      reason = "rank " + std::to_string(r) + ": " + verdicts[r].substr(4);
  if (!reason.empty()) {
    if (why != nullptr) *why = reason;
    return nullptr;  // the destructor frees what was allocated
  }

  uint32_t* device_flags = nullptr;
  ACCRUE_CUDA_CHECK(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags), e->host_flags_, 0));
  e->flags_ = device_flags + rank * kFlags;
  e->peer_flags_ = device_flags + (1 - rank) * kFlags;
  ACCRUE_CUDA_CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&e->peer_staging_), peer.staging,
                                         cudaIpcMemLazyEnablePeerAccess));
  int lowest = 0, highest = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  ACCRUE_CUDA_CHECK(cudaStreamCreateWithPriority(&e->side_, cudaStreamNonBlocking, highest));
  ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e->pulled_, cudaEventDisableTiming));
  ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e->joined_, cudaEventDisableTiming));
  // Both mappings exist on both ranks before either writes into the other's.
  gather("mapped");
  return e;
}

CopyEngineAllReduce::~CopyEngineAllReduce() {
  (void)cudaSetDevice(device_);
  if (side_ != nullptr) (void)cudaStreamSynchronize(side_);
  if (peer_staging_ != nullptr) (void)cudaIpcCloseMemHandle(peer_staging_);
  if (peer_allocation_ != nullptr) (void)cudaIpcCloseMemHandle(peer_allocation_);
  for (int s = 0; s < kSlots; ++s) {
    if (slot_pulled_[s] != nullptr) (void)cudaEventDestroy(slot_pulled_[s]);
    if (slot_free_[s] != nullptr) (void)cudaEventDestroy(slot_free_[s]);
  }
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  if (received_ != nullptr) (void)cudaFree(received_);
  if (pulled_ != nullptr) (void)cudaEventDestroy(pulled_);
  if (joined_ != nullptr) (void)cudaEventDestroy(joined_);
  if (side_ != nullptr) (void)cudaStreamDestroy(side_);
  if (staging_ != nullptr) (void)cudaFree(staging_);
  if (flags_registered_) (void)cudaHostUnregister(host_flags_);
  if (host_flags_ != nullptr) munmap(host_flags_, kFlagsPageBytes);
  unlink_flags_page();
}

void CopyEngineAllReduce::unlink_flags_page() noexcept {
  if (flags_page_name_.empty()) return;
  shm_unlink(flags_page_name_.c_str());
  flags_page_name_.clear();
}

bool CopyEngineAllReduce::share(float* base, int64_t count, const Gather& gather, std::string* why,
                                Direct how) {
  ACCRUE_CHECK(base != nullptr && count > 0, "CopyEngineAllReduce::share: ", count, " floats at ",
               static_cast<const void*>(base));
  ACCRUE_CHECK(shared_ == nullptr, "CopyEngineAllReduce::share: an arena is already shared");
  ACCRUE_CUDA_CHECK(cudaSetDevice(device_));
  ArenaCard mine;
  mine.count = count;
  char* allocation = allocation_base(base);
  if (cudaIpcGetMemHandle(&mine.allocation, allocation) == cudaSuccess) {
    mine.exported = 1;
    mine.offset_bytes = reinterpret_cast<char*>(base) - allocation;
  } else {
    (void)cudaGetLastError();  // the pool's blocks cannot be exported: the staged form stays
  }
  const std::vector<std::string> cards = gather(to_bytes(mine));
  ACCRUE_CHECK(cards.size() == 2, "CopyEngineAllReduce: ", cards.size(), " ranks answered, not 2");
  std::string reason;
  for (size_t r = 0; r < 2 && reason.empty(); ++r) {
    const ArenaCard c = from_bytes<ArenaCard>(cards[r]);
    if (!c.exported)
      reason = "rank " + std::to_string(r) +
               "'s gradient arena cannot be exported by CUDA IPC (not an allocation of its own: "
               "construct the store with shareable_gradients)";
    else if (c.count != count)
      reason = "the ranks' arenas differ: rank " + std::to_string(rank_) + " has " +
               std::to_string(count) + " floats, rank " + std::to_string(r) + " " +
               std::to_string(c.count);
  }
  if (!reason.empty()) {
    if (why != nullptr) *why = reason;
    return false;  // both ranks read the same two cards: both refuse
  }
  const ArenaCard peer = from_bytes<ArenaCard>(cards[static_cast<size_t>(1 - rank_)]);
  ACCRUE_CUDA_CHECK(
      cudaIpcOpenMemHandle(&peer_allocation_, peer.allocation, cudaIpcMemLazyEnablePeerAccess));
  peer_shared_ = reinterpret_cast<float*>(static_cast<char*>(peer_allocation_) + peer.offset_bytes);
  how_ = how;
  if (how == Direct::whole) {
    ACCRUE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&received_),
                                 static_cast<size_t>(count) * sizeof(float)));
  } else {
    ACCRUE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch_),
                                 static_cast<size_t>(kSlots * kChunkFloats) * sizeof(float)));
    for (int s = 0; s < kSlots; ++s) {
      ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&slot_pulled_[s], cudaEventDisableTiming));
      ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&slot_free_[s], cudaEventDisableTiming));
      ACCRUE_CUDA_CHECK(cudaEventRecord(slot_free_[s], side_));  // every slot free at first
    }
  }
  shared_ = base;
  shared_count_ = count;
  // Both mappings exist on both ranks before either writes into the other's.
  gather("mapped");
  return true;
}

bool CopyEngineAllReduce::takes(const void* data, int64_t count) const {
  if (count < 2 || reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
  return in_shared(static_cast<const float*>(data), count) ||
         count * static_cast<int64_t>(sizeof(float)) <= capacity_bytes_;
}

void CopyEngineAllReduce::enqueue(float* data, int64_t count, CUstream_st* stream) {
  ACCRUE_CHECK(takes(data, count), "CopyEngineAllReduce: cannot take ", count, " floats (capacity ",
               capacity_bytes_, " bytes, 16-byte aligned data)");
  if (in_shared(data, count))
    return how_ == Direct::whole ? enqueue_whole(data, count, stream)
                                 : enqueue_direct(data, count, stream);
  join(stream);  // the staged form's steps assume no call before it is still running
  enqueue_staged(data, count, stream);
}

void CopyEngineAllReduce::join(CUstream_st* stream) {
  if (!pending_) return;
  ACCRUE_CUDA_CHECK(cudaEventRecord(joined_, side_));
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, joined_, 0));
  // Halves: the peer's pushes into this rank's halves; whole: the peer has
  // read this rank's buckets. Either way its DONE of the last call.
  wait_value(stream, flags_ + kDone, calls_);
  for (const auto& [offset, count] : to_add_)
    copy_engine_add_f32(shared_ + offset, received_ + offset, count, stream);
  to_add_.clear();
  pending_ = false;
}

void CopyEngineAllReduce::enqueue_whole(float* data, int64_t count, CUstream_st* stream) {
  const int64_t offset = data - shared_;
  const uint32_t call = ++calls_;
  // READY both ways: each rank's backward has written the bucket.
  write_value(stream, peer_flags_ + kReady, call);
  wait_value(stream, flags_ + kReady, call);
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(received_ + offset, peer_shared_ + offset,
                                    static_cast<size_t>(count) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
  write_value(stream, peer_flags_ + kDone, call);  // this rank has read the peer's bucket
  to_add_.emplace_back(offset, count);
  pending_ = true;
}

void CopyEngineAllReduce::enqueue_direct(float* data, int64_t count, CUstream_st* stream) {
  const int64_t split = split_of(count);
  const int64_t mine_begin = rank_ == 0 ? 0 : split, mine_end = rank_ == 0 ? split : count;
  float* const peer = peer_shared_ + (data - shared_);
  const uint32_t call = ++calls_;
  // READY both ways: each rank's backward has written the bucket.
  write_value(stream, peer_flags_ + kReady, call);
  wait_value(stream, flags_ + kReady, call);
  for (int64_t b = mine_begin; b < mine_end; b += kChunkFloats) {
    const int64_t n = std::min(kChunkFloats, mine_end - b);
    const int slot = static_cast<int>(next_slot_++ % kSlots);
    float* const scratch = scratch_ + slot * kChunkFloats;
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, slot_free_[slot], 0));
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(scratch, peer + b, static_cast<size_t>(n) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
    ACCRUE_CUDA_CHECK(cudaEventRecord(slot_pulled_[slot], stream));
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side_, slot_pulled_[slot], 0));
    copy_engine_add_f32(data + b, scratch, n, side_);
    ACCRUE_CUDA_CHECK(cudaEventRecord(slot_free_[slot], side_));  // the add has read it
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(peer + b, data + b, static_cast<size_t>(n) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, side_));
  }
  // DONE after this call's READY (when this rank has nothing of its own) and
  // after its pushes.
  ACCRUE_CUDA_CHECK(cudaEventRecord(pulled_, stream));
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side_, pulled_, 0));
  write_value(side_, peer_flags_ + kDone, call);
  pending_ = true;
}

void CopyEngineAllReduce::enqueue_staged(float* data, int64_t count, CUstream_st* stream) {
  // Rank 0 owns [0, split), rank 1 [split, count); split keeps 16-byte alignment.
  const int64_t split = split_of(count);
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
  if (host_flags_ == nullptr) return;
  // Cyclically ahead of every number a wait can hold (Note [Copy-engine
  // all-reduce]), stored by this thread: no stream has to run for it.
  const uint32_t ahead = calls_ + (uint32_t{1} << 30);
  for (int flag = 0; flag < kFlags; ++flag)
    __atomic_store_n(host_flags_ + rank_ * kFlags + flag, ahead, __ATOMIC_SEQ_CST);
}

}  // namespace accrue::dist
