// Communicator: the collectives data parallelism needs, and the world-size-1
// stub that keeps every build (incl. ones without NCCL or CUDA) working.
//
// Implementations:
//   StubCommunicator  (this file)                 world size 1, any device, every build
//   NcclCommunicator  (dist/nccl_communicator.h)  one process per GPU, built with NCCL
//
// A communicator is owned by one rank (one process, one device). All ranks of
// a world must call the same collectives in the same order with the same
// element counts and dtypes; that is the caller's contract (the reducer keeps
// it by walking the same BucketPlan on every rank, see Note [Buckets]).
//
// Note [Collective ordering]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A collective is *enqueued* on the communicator's own stream (stream()) and
// returns without blocking the host. It is ordered only against earlier work
// on stream(): the caller orders it after its producers (Event::record on the
// compute stream, then Event::block(stream())) and its consumers after it (an
// event recorded on stream(), blocked on the compute stream). That is what
// lets a bucket's all-reduce overlap the rest of the backward. Tensors handed
// to a collective must stay alive and untouched until it has completed in
// stream order. An implementation may order more strictly (NcclCommunicator
// also waits for the caller's current stream); callers must not rely on it.
// For a CPU communicator (the stub on the CPU) stream() is nullptr and
// collectives complete before returning.
//
// Note [No silent hang]
// ~~~~~~~~~~~~~~~~~~~~~
// A dead or hung peer must become accrue::Error naming the rank and the
// collective, within the communicator's timeout: synchronize() and check()
// throw it; an implementation may also throw it from the next collective.
#pragma once

#include <cstdint>
#include <string>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/tensor.h"

namespace accrue::dist {

enum class ReduceOp : uint8_t {
  sum,  // gradients, item counts, squared norms
  max,  // agreement on flags (found_inf: any rank non-finite => every rank skips)
};
const char* reduce_op_name(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where the tensors of every collective live (CUDA:local_rank for NCCL).
  virtual Device device() const = 0;
  // The stream collectives are enqueued on; nullptr on the CPU. See Note
  // [Collective ordering]. Not const: work put on it must land after every
  // collective enqueued so far, and an implementation may first have to
  // finish putting one there (NcclCommunicator: Note [Deferred launch]).
  virtual StreamHandle stream() = 0;

  // Every tensor below must be contiguous, on device(), of a float or integer
  // dtype; otherwise accrue::Error naming the collective and the tensor.

  // In place: `data` becomes op over all ranks of every rank's `data`.
  virtual void all_reduce(const Tensor& data, ReduceOp op = ReduceOp::sum) = 0;
  // `input` has world_size() * n elements, `output` n: rank r receives op over
  // ranks of chunk r of `input` (chunk r = elements [r*n, (r+1)*n)). `output`
  // may be chunk rank() of `input` itself (in place, the ZeRO-1 case).
  virtual void reduce_scatter(const Tensor& input, const Tensor& output,
                              ReduceOp op = ReduceOp::sum) = 0;
  // `input` has n elements, `output` world_size() * n: chunk r of `output`
  // becomes rank r's `input`. `input` may be chunk rank() of `output` (in place).
  virtual void all_gather(const Tensor& input, const Tensor& output) = 0;
  // In place: every rank's `data` becomes rank `root`'s.
  virtual void broadcast(const Tensor& data, int root = 0) = 0;

  // Note [Copy-engine all-reduce]: from now on, sum f32 all-reduces of
  // `min_bytes` to `max_bytes` on the copy engines where this communicator
  // can (two GPUs of one host); NCCL keeps the rest. Collective over the
  // world, every rank with the same arguments. Returns whether it did; when
  // not, *why (if given) says why not. max_bytes 0 turns them off (after the
  // calls so far have ended; this communicates nothing); a larger max_bytes
  // than before sets them up anew.
  virtual bool use_copy_engine_all_reduce(int64_t max_bytes, int64_t min_bytes, std::string* why) {
    if (why != nullptr) *why = "this communicator has no copy-engine all-reduce";
    (void)max_bytes;
    (void)min_bytes;
    return false;
  }
  // Note [Copy-engine all-reduce], the direct form: from now on, sums inside
  // `flat` (an f32 tensor in an allocation of its own on device(): the
  // gradient arena of a store with shareable_gradients) pull from and push
  // to the peer's copy of it directly. Collective, after
  // use_copy_engine_all_reduce has returned true on every rank, with the
  // same whole_buckets (each rank pulls the peer's whole bucket and adds it
  // once the sums are joined, no kernel under the backward) everywhere.
  // Returns whether it did; when not, *why says why (the staged form stays).
  virtual bool share_with_copy_engines(const Tensor& flat, bool whole_buckets, std::string* why) {
    if (why != nullptr) *why = "this communicator has no copy-engine all-reduce";
    (void)flat;
    (void)whole_buckets;
    return false;
  }
  // A collective may leave work on streams of its own, past its end on
  // stream() (the direct form above). This orders all of it before stream()'s
  // later work: collectives do it themselves before they start, and whoever
  // reads a result through stream() before another collective calls it
  // first. Default: nothing is ever left.
  virtual void join_pending() {}
  // Below this a sum stays on NCCL by default (the item count, the norm's
  // rows): its latency is lower than the copy engines' two flag round trips.
  static constexpr int64_t kCopyEngineMinBytes = int64_t{1} << 20;

  // Blocks the host until every collective enqueued so far has completed.
  // Throws accrue::Error by Note [No silent hang].
  virtual void synchronize() = 0;
  // Does not block: throws accrue::Error if a collective has already failed
  // or outlived the timeout. Cheap enough to call once per micro-step.
  virtual void check() = 0;
};

// World size 1: every collective is the identity (reduce_scatter and
// all_gather copy when output is not input). Works on the CPU and, when built
// with CUDA, on a GPU (copies go to the current stream, which is also what
// stream() returns, so the ordering contract holds trivially).
class StubCommunicator final : public Communicator {
 public:
  explicit StubCommunicator(Device device = Device::cpu()) : device_(device) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Device device() const override { return device_; }
  StreamHandle stream() override;

  void all_reduce(const Tensor& data, ReduceOp op = ReduceOp::sum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::sum) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  void broadcast(const Tensor& data, int root = 0) override;
  void synchronize() override;
  void check() override {}

 private:
  Device device_;
};

// Throws accrue::Error("<collective>: <what> ...") unless `t` is contiguous, on
// `device` and of a dtype collectives support. Shared by every implementation.
void check_collective_tensor(const Tensor& t, Device device, const char* collective,
                             const char* what);

}  // namespace accrue::dist
