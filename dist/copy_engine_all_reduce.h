// CopyEngineAllReduce: the fp32 gradient sum of two GPUs of one host on the
// copy engines, beside NCCL (NcclOptions-free: NcclCommunicator owns one once
// use_copy_engine_all_reduce() has set it up).
//
// Note [Copy-engine all-reduce]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under data parallelism the buckets are all-reduced while the last
// micro-batch's backward runs, and NCCL's kernels take SMs, L2 and memory
// bandwidth from its GEMMs: on two H200s a chain of backward-shaped GEMMs ran
// 40-50% slower while NCCL reduced 400 MiB beside it, and the all-reduce
// ended 1.2 ms after the chain (accrue_bench_ce_overlap, bench/RESULTS.md,
// seventeenth session). Two GPUs can sum without NCCL's kernels: each owns
// half of every bucket, pulls the peer's copy of that half over NVLink with
// a copy engine, adds it with one short kernel, and pushes the sum back into
// the peer's staging with a copy engine again; the SMs run only the add.
// Per all-reduce of `count` floats at `data`, on rank r (the other is p):
//   1. the half p owns is copied into r's staging buffer (a local copy), and
//      r writes the call's number into p's READY flag, then waits for its own;
//   2. in chunks of kChunkFloats, on the communicator's stream: pull p's
//      staged copy of r's half into r's staging; on a second stream, after
//      it: add it into `data`, push the sum into p's staging (the next chunk's
//      pull runs beside this one's add and push);
//   3. on the second stream: write the call's number into p's DONE flag, wait
//      for its own, copy p's sums of p's half from the staging into `data`;
//      the communicator's stream then waits for the second stream.
// Staging is plain cudaMalloc memory (the stream-ordered pool cannot be shared
// between processes) mapped into the peer by CUDA IPC. The flags live in one
// page of host memory both processes map (a POSIX shared-memory object, named
// by rank 0 and unlinked once rank 1 has mapped it) and register with CUDA;
// they are written and awaited with stream memory operations
// (cuStreamWriteValue32, whose default fence orders the copies before it, and
// cuStreamWaitValue32, cyclic >= comparison, so the 32-bit call number may
// wrap). Bits: every element is a + b of the two ranks' values, which IEEE
// addition makes the same on both ranks and the same as NCCL's two-rank sum
// (checked by the multi-GPU test). Hazards: a call ends only after the peer's
// DONE, which the peer writes after its last read and write of this rank's
// staging, so the next call may reuse it; and the peer starts writing into this
// rank's staging only after this rank's READY of the next call. Failure (Note
// [No silent hang]): the communicator's watchdog follows each call like an NCCL
// collective; when it aborts, release() stores far-ahead numbers into this
// rank's flags from the host, before ncclCommAbort (which frees device memory,
// and a free may wait for the whole device). The release needs no stream to
// run, so nothing blocked on the device can hold it up: with the flags in
// device memory, released by a copy after ncclCommAbort, the survivor of a dead
// peer hung (bench/RESULTS.md, nineteenth session).
//
// Direct (share()): where the two ranks' gradient arenas are allocations of
// their own (GradArenaOptions::shareable), each maps the other's, and a sum
// inside it needs no staging: after READY both ways, rank r pulls p's copy of
// r's half chunk by chunk into a ring of kSlots scratch chunks (this stream),
// adds it into its own (side_) and pushes the sum straight into p's arena
// (side_ again), then writes p's DONE on side_. The call returns without
// joining side_, so the next bucket's pulls run beside this one's adds and
// pushes; join() makes a stream wait for side_ and for this rank's DONE of
// the last call (the peer's pushes into this rank's half), and the
// communicator runs it before any other collective and wherever a result is
// read (Communicator::join_pending). Hazards: r's pull of p's half r follows
// p's READY, which p writes once its backward's writes of the bucket are
// ordered before it; r writes p's half r only after pulling it; p reads its
// half r only after join(); a scratch chunk is pulled into again only after
// the add that read it (an event per slot).
//
// Direct, whole buckets (Direct::whole): no kernel runs under the backward.
// After READY both ways each rank pulls the peer's whole bucket into a
// receive buffer as large as the arena (4 more bytes a parameter) and writes
// the peer's DONE: "I have read your bucket". join() waits for this rank's
// DONE of the last call, then adds each pulled bucket into the arena: a + b
// on one rank, b + a on the other, the same bits (IEEE addition commutes).
// Hazards: a rank changes its arena (the adds, the next backward) only after
// the peer has read it; the receive buffer is pulled into again only in the
// next window, after this rank's adds on the same stream.
//
// Measured on 2 x H200 (bench/RESULTS.md, seventeenth and twentieth
// sessions): every form gives NCCL's sums bit for bit, and none is faster
// than NCCL for the 105M-parameter MLP. Its window at K = 4 / 8 (call 7 of
// the twentieth session): NCCL 10.61 / 19.88 ms, whole buckets 11.10 /
// 20.13, halves 11.30 / 20.29 (staged 11.64 / 20.64 in call 4); the last
// backward stretches to 2.55 ms beside NCCL, 3.02 with whole buckets, 3.37
// with halves. So even with no kernel beside the backward, the copies' own
// traffic slows it more than NCCL's kernels do, and the adds of the whole
// form then run after it. GPT-2 124M on two GPUs, whole buckets and NCCL
// alternating in one call (twenty-first session): 1.94x / 1.94x and 1.91x /
// 1.95x at 8 x 4 / 4 x 8 against NCCL's 1.93x / 1.93x twice, the 2-GPU
// throughput within 0.6% in every pair: the same (halves gave 1.93x / 1.94x,
// equal to NCCL in its call). The side stream's
// priority and the add kernel's width (16 to 512 blocks) change nothing but
// make it slower at 16, and CUDA_DEVICE_MAX_CONNECTIONS=32 changes nothing,
// so neither the adds' scheduling nor a stream wait blocking a hardware
// queue the backward shares is the cause. The microbenchmark
// (accrue_bench_ce_overlap), where a pipelined pull straight from the peer's
// buffer ended 0.36-0.49 ms after a 14-GEMM chain against NCCL's 1.1-1.2,
// does not carry over to the real backward. Its traffic-only variants
// (twenty-second session) say which traffic slows the chain: a 16-block
// kernel adding each bucket into the GPU's own memory (242 GB/s) slowed it
// 18-35%, nearly as much as NCCL's 39-45%, while copy engines moving the same
// buckets inside the GPU (1,560-1,650 GB/s) or pulling them over NVLink (333
// GB/s) slowed it 2-12%: kernels beside the GEMMs cost them more than bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue/core/cuda_runtime.h"

struct CUstream_st;

namespace accrue::dist {

class CopyEngineAllReduce {
 public:
  // Gathers one byte string from each of the two ranks, in rank order
  // (collective: NcclCommunicator passes an all_gather).
  using Gather = std::function<std::vector<std::string>(const std::string&)>;
  // Elements per chunk of step 2: 4 MiB of floats.
  static constexpr int64_t kChunkFloats = int64_t{1} << 20;

  // Collective over ranks 0 and 1, which drive `device` each. Allocates
  // `capacity_bytes` of staging and maps the peer's. Returns nullptr with the
  // reason in *why when the peer's GPU is on another host, hidden from this
  // process (its PCI bus id names no visible device) or not reachable by peer
  // access; both ranks then agree. Throws accrue::Error on a CUDA failure.
  static std::unique_ptr<CopyEngineAllReduce> connect(int rank, int device, int64_t capacity_bytes,
                                                      const Gather& gather, std::string* why);
  ~CopyEngineAllReduce();
  CopyEngineAllReduce(const CopyEngineAllReduce&) = delete;
  CopyEngineAllReduce& operator=(const CopyEngineAllReduce&) = delete;

  int64_t capacity_bytes() const { return capacity_bytes_; }
  // Whether enqueue() takes `count` floats at `data`: 2 <= count, `data`
  // 16-byte aligned, and the floats inside the shared arena (share()) or
  // count * 4 <= capacity_bytes().
  bool takes(const void* data, int64_t count) const;
  // How the direct form sums (Note [Copy-engine all-reduce]).
  enum class Direct {
    halves,  // each rank sums its half under the backward and pushes it back
    whole,   // each rank pulls the peer's whole bucket; the adds wait for join()
  };
  // Collective: maps the peer's copy of the `count` floats at `base`, the
  // gradient arena, for the direct form. Returns false, with the reason in
  // *why, when either rank's buffer cannot be exported (not an allocation of
  // its own: the stream-ordered pool's) or the ranks' counts differ; both
  // ranks agree, and the staged form stays. Both ranks pass the same `how`.
  bool share(float* base, int64_t count, const Gather& gather, std::string* why,
             Direct how = Direct::halves);
  // Enqueues the in-place sum over both ranks of `count` floats at `data` on
  // `stream`: direct inside the shared arena (work stays on side_ until
  // join()), staged elsewhere (joined before it returns).
  void enqueue(float* data, int64_t count, CUstream_st* stream);
  // Whether a direct call has left work that no join() has ordered yet.
  bool pending() const { return pending_; }
  // Orders the sums of every call so far before `stream`'s later work.
  void join(CUstream_st* stream);
  // After an abort: lets every wait this rank's streams have enqueued pass.
  void release() noexcept;

 private:
  CopyEngineAllReduce() = default;

  // Removes the flags' page's name (rank 0, once): the mappings stay.
  void unlink_flags_page() noexcept;
  void enqueue_staged(float* data, int64_t count, CUstream_st* stream);
  void enqueue_direct(float* data, int64_t count, CUstream_st* stream);
  void enqueue_whole(float* data, int64_t count, CUstream_st* stream);
  // Whether [p, p + count) lies inside the shared arena (the direct forms).
  bool in_shared(const float* p, int64_t count) const {
    return shared_ != nullptr && p >= shared_ && count <= shared_count_ - (p - shared_);
  }
  // Rank 0 owns [0, split) of a call's `count` floats, rank 1 [split, count).
  static int64_t split_of(int64_t count) { return (count / 2) / 4 * 4; }

  int rank_ = 0, device_ = 0;
  int64_t capacity_bytes_ = 0;
  float* staging_ = nullptr;        // this rank's, exported
  float* peer_staging_ = nullptr;   // the peer's, mapped
  uint32_t* host_flags_ = nullptr;  // the shared page, [rank][READY, DONE]
  std::string flags_page_name_;     // rank 0's until unlinked
  bool flags_registered_ = false;   // host_flags_ registered with CUDA
  uint32_t* flags_ = nullptr;       // this rank's [READY, DONE], device address
  uint32_t* peer_flags_ = nullptr;  // the peer's, device address
  CUstream_st* side_ = nullptr;     // step 2's second stream
  EventHandle pulled_ = nullptr, joined_ = nullptr;
  uint32_t calls_ = 0;  // the number of the last call, the same on both ranks

  // The direct forms (share()); halves: scratch chunks, kSlots of kChunkFloats.
  static constexpr int kSlots = 4;
  float* shared_ = nullptr;          // this rank's arena
  int64_t shared_count_ = 0;         // its floats
  float* peer_shared_ = nullptr;     // the peer's arena, mapped
  void* peer_allocation_ = nullptr;  // what cudaIpcOpenMemHandle returned
  float* scratch_ = nullptr;
  EventHandle slot_pulled_[kSlots] = {}, slot_free_[kSlots] = {};
  int64_t next_slot_ = 0;
  bool pending_ = false;
  // Direct::whole: the peer's arena, pulled (as large as the arena), and the
  // ranges pulled since the last join, added there.
  Direct how_ = Direct::halves;
  float* received_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> to_add_;  // {offset, count} into the arena
};

// dst[i] += src[i] for i < count, on `stream` (copy_engine_add.cu). Both
// pointers 16-byte aligned.
void copy_engine_add_f32(float* dst, const float* src, int64_t count, CUstream_st* stream);

}  // namespace accrue::dist
