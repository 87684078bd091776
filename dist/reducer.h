// Reducer: data-parallel gradient reduction for the accumulation Window.
//
//   auto comm = dist::connect_nccl(dist::discover_rank(), dist::layout_fingerprint(store));
//   dist::Reducer reducer(store, *comm);
//   reducer.broadcast_parameters();                      // every rank starts from rank 0's
//   optim::Window window(store, optimizer, options, &reducer);
//   ... the usual loop: window.backward(loss); if (window.ready()) window.close();
//
// Note [Reducer]
// ~~~~~~~~~~~~~~
// Note [Buckets] made concrete:
//   - micro-steps 1..K-1 never communicate: before_backward() only arms the
//     reducer for the last one;
//   - in the last micro-step, each parameter's grad-ready hook (autograd fires
//     it once that backward's gradient for the leaf has been enqueued into its
//     arena slot) counts down its bucket. A bucket whose count reaches zero is
//     final: an event recorded on the compute stream orders its in-place
//     all-reduce, on the communicator's stream, after those gradients, and the
//     rest of the backward runs on while it travels. No copy: a bucket is a
//     slice of the arena (dist/bucket_plan.h);
//   - buckets go strictly in plan order (bucket b waits for 0..b-1 to go), so
//     every rank issues the same collectives in the same order even when the
//     graph makes buckets complete in a different order on different ranks;
//   - finish(), at the window's close: slots no gradient reached this window
//     are zeroed first (Note [Overwrite first]; they must enter the sum as 0),
//     the buckets not yet sent go, then the item count N is summed over ranks
//     (Note [Normalization]: 1/N is global). The compute stream then waits
//     for the communicator's stream by an event: no host synchronization.
// The reduced gradient is the SUM over ranks; the window's close divides by
// the global N, so 2 ranks x K micro-batches equal 1 rank x 2K exactly in math.
//
// Note [ZeRO-1]
// ~~~~~~~~~~~~~
// With ReducerOptions::zero1 the same buckets, at the same moments, are
// reduce-scattered instead of all-reduced: rank r receives the sum of chunk r
// of every bucket (chunk r = elements [r n/W, (r+1) n/W) of a bucket of n).
// n is divisible by W when every slot is: Note [Buckets] pads slots to 256
// bytes, enough for a power of two up to 64 ranks (f32); any other W pads
// them to W x 256 bytes (ParamStoreOptions().shard_ranks(W), a few KiB per
// parameter at most), and the Reducer says so if it was not. Those chunks, in plan order, are
// the rank's owned ranges (owned_ranges()), and at the close:
//   - the optimizer moments exist only for them: the arena's moment arenas
//     are replaced by packed shards at construction (optim::ParamStore::shard_moments),
//     1/W of plain data parallelism's;
//   - the norm pass reads only them; every rank's partials are all-gathered
//     and summed in one fixed order on every rank, so all ranks compute the
//     same global norm, clip coefficient, loss-scale update and found_inf
//     (any rank non-finite => every rank skips the step);
//   - the fused optimizer steps only them (one launch per range), writing the
//     master and the compute copy there;
//   - the parameters the forward reads (the compute copy, else the master) are
//     all-gathered bucket by bucket, in place, before the next forward.
// Traffic equals plain data parallelism's (reduce-scatter + all-gather of the
// forward dtype = one all-reduce when that dtype is f32, less with bf16).
// With a bf16/f16 compute copy the forward never reads the fp32 master, so
// the master is sharded too (optim::ParamStore::shard_master): the constructor
// broadcasts rank 0's master and keeps only the owned ranges, packed as the
// moments are, and the compute copy is what all-gathers. Without a compute
// copy the master is the forward's weights and stays whole on every rank.
// Per parameter and rank, with W ranks: master 4/W + moments 8/W + grads 4 +
// compute 2 bytes (bf16), against 4 + 8 + 4 + 2 for plain data parallelism.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "accrue/core/cuda_runtime.h"
#include "accrue/dist/bucket_plan.h"
#include "accrue/dist/process_group.h"
#include "accrue/optim/gradient_sync.h"
#include "accrue/optim/param_store.h"

namespace accrue::dist {

struct ReducerOptions {
  BucketPlanOptions buckets;
  // Record timing events around every bucket's all-reduce (for the overlap
  // test and benchmarks; costs a few event records per window).
  bool timing = false;
  // Check at construction, with one small collective, that every rank has the
  // same parameter layout and bucket plan (Note [Layout fingerprint]).
  bool check_layout = true;
  // Note [ZeRO-1]: shard the optimizer state; reduce-scatter instead of all-reduce.
  bool zero1 = false;
  // Note [Gradient transport]: the dtype buckets travel in. Unset: the arena's
  // own (exact); bf16 or f16: half the bytes, at a rounding cost.
  std::optional<DType> transport;
  // Note [Copy-engine all-reduce]: two GPUs of one host sum the buckets on
  // their copy engines, the same bits as NCCL's, leaving the SMs to the
  // backward. Not with zero1, a 16-bit transport or an arena of another
  // dtype than f32 (on more than one rank). Where the communicator
  // cannot (another host, no peer access, more ranks) NCCL carries them and
  // the constructor says why on stderr; copy_engine_all_reduce() tells. With
  // a store of shareable_gradients on every rank the sums run straight
  // between the arenas (copy_engines_direct()). Off by default: measured
  // slower than NCCL for the MLP in every form (the Note has the figures).
  bool copy_engine_all_reduce = false;
  // ... straight between the arenas, each rank pulling the peer's whole
  // bucket and adding it after the backward: no kernel beside the backward,
  // 4 more bytes a parameter for the pulled copy (Note [Copy-engine
  // all-reduce], Direct::whole). Only with copy_engine_all_reduce.
  bool copy_engine_whole_buckets = false;
  // Note [GEMM SM margin] (kernels/cuda/cublaslt_state.cu): while the last
  // micro-step's backward is issued (its buckets' collectives beside it), the
  // GEMMs on this rank's device are planned for this many fewer SMs, which
  // are left to the collectives; cap the communicator's blocks to match
  // (NCCL_MAX_CTAS). 0 (the default): every SM. Other algorithms may run, so
  // the bits match a run with the same margin, not one without. Nothing on the
  // CPU. [0, 1024). Measured no faster for the MLP or GPT-2 on 2 x H200 (the
  // Note has the figures).
  int gemm_sm_margin = 0;
};

// Note [Gradient transport]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// With ReducerOptions::transport = bf16 or f16 (as DDP's bf16_compress_hook),
// each bucket is rounded into a 16-bit staging copy on the compute stream when
// it is ready, the collective sums the copies (half the bytes on the wire),
// and finish(), once the compute stream has waited for the communicator,
// widens the sums back into the fp32 arena (under ZeRO-1 only the owned
// chunk). The rounding is the price: each rank's bucket loses its low bits
// before the sum, and the sum is rounded again, so the stepped gradient is
// no longer the large batch's exactly (tests/dist/zero1_test.cpp prints the
// error against the exact transport). The staging copies take 2 bytes per
// parameter (one per bucket, since buckets are in flight together).

// What the last closed window's communication looked like (timing only).
// Times are milliseconds relative to the end of the last micro-step's
// backward on the compute stream (when finish() was reached; negative:
// before it ended).
struct ReducerTiming {
  double last_backward_ms = 0.0;  // the last micro-step, from before_backward to finish
  // Per bucket, plan order: when the communicator's stream reached its
  // all-reduce (its gradients final, earlier collectives done) and when it ended.
  std::vector<double> bucket_start_ms, bucket_end_ms;
  // Per bucket: when the compute stream had produced its gradients (its
  // collective was issued after that point), on the same clock; and on the
  // host, when the collective was issued (from before_backward) and how long
  // the communicator's call took. Together they tell a GPU slowed beside the
  // collectives from one waiting for the host's launches (bench/RESULTS.md,
  // twenty-first session).
  std::vector<double> bucket_ready_ms, host_issue_ms, host_call_ms;
  double items_end_ms = 0.0;  // the item count's all-reduce: the last collective
  // Communication the close had to wait for: max(0, items_end_ms).
  double exposed_ms = 0.0;
};

class Reducer final : public optim::GradientSync {
 public:
  // Registers a grad-ready hook on every parameter of `arena` (one reducer per
  // arena). `arena` and `comm` must outlive the reducer; the arena must be on
  // comm.device(). With check_layout, collective: every rank constructs its
  // reducer at the same point.
  Reducer(optim::ParamStore& arena, Communicator& comm, const ReducerOptions& options = {});
  ~Reducer() override;
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // optim::GradientSync, see Note [Reducer].
  void before_backward(int64_t index, int64_t micro_steps) override;
  void finish(const Tensor& items) override;
  int64_t world_size() const override { return comm_.world_size(); }
  void check() override { comm_.check(); }
  // Note [ZeRO-1] (empty unless options.zero1).
  const std::vector<ArenaRange>& owned_ranges() const override { return owned_; }
  void all_gather(const Tensor& local, const Tensor& all) override;
  void all_gather_owned(const Tensor& params) override;
  // One all-reduce (max): the written flags (Note [Unused parameters]), the f16 maxima.
  void all_reduce_max(const Tensor& values) override;
  // One all-reduce (sum): the window's loss sum, for the world's mean loss.
  void all_reduce_sum(const Tensor& values) override;
  // Note [Norm under the backward]: reports each bucket reduced during the
  // backward (false, and no reports, with a 16-bit transport).
  bool set_reduced_listener(std::function<void(const ArenaRange&)> listener) override;

  // Every rank's master weights and moments become rank `root`'s, and the
  // compute copy follows. Collective; call once before training. Under ZeRO-1
  // the moments are each rank's own shard and are left alone, and with a
  // compute copy the constructor has already broadcast rank 0's master before
  // sharding it: then this does nothing.
  void broadcast_parameters(int root = 0);

  // What slot `slot`'s grad-ready hook does, for an autograd engine other
  // than accrue's that fills the arena (the torch bridge, Note [Torch bridge
  // data parallelism]): in the armed last micro-step, counts the slot down
  // and sends every bucket that became final, ordered after the current
  // stream's work; otherwise nothing. Out-of-range slots are refused.
  void grad_ready(int64_t slot);

  const BucketPlan& plan() const { return plan_; }
  // Whether the buckets' sums run on the copy engines (Note [Copy-engine all-reduce]).
  bool copy_engine_all_reduce() const { return copy_engine_all_reduce_; }
  // ... in the direct form: straight between the ranks' arenas (a store with
  // shareable_gradients on both ranks).
  bool copy_engines_direct() const { return copy_engines_direct_; }
  Communicator& communicator() const { return comm_; }
  // Collectives this reducer has enqueued (buckets, item counts, broadcasts, the layout check).
  int64_t collectives_issued() const { return issued_; }
  // Of the last closed window: buckets that went during the backward (the
  // rest went at the close).
  int64_t buckets_sent_in_backward() const { return sent_in_backward_last_; }
  // The last closed window's timing (needs options.timing; synchronizes the host).
  ReducerTiming last_timing() const;

 private:
  // Called by the grad-ready hook of slot `slot`.
  void on_grad_ready(size_t slot);
  // Sends every bucket from next_ on that is ready, in plan order.
  void send_ready_buckets();
  void send_bucket(size_t b);
  // Tells the reduced listener, if any, that bucket b's reduction is issued.
  void report_reduced(size_t b);
  // all_reduce_max and all_reduce_sum: `values` (0-d or 1-D f64 on the
  // arena's device) reduced with `op` over the ranks, stream-ordered.
  void all_reduce_values(const char* what, const Tensor& values, ReduceOp op);
  // Orders the communicator's stream after the current stream's work so far.
  void order_comm_after_compute();
  // Orders the current stream's next work after the communicator's so far.
  void order_compute_after_comm();
  // Bucket b's chunk this rank owns under ZeRO-1, as a view of `flat`.
  Tensor owned_chunk(const Tensor& flat, size_t b) const;
  // Note [Gradient transport]: this rank's chunk of bucket b's staging copy.
  Tensor staged_chunk(size_t b) const;
  void check_layout();
  void set_up_copy_engines();
  // Note [GEMM SM margin]: on from the last micro-step's backward to finish().
  void set_gemm_margin(bool on);
  void record_bucket_end();  // options.timing: see end_to_record_
  bool on_gpu() const { return device_ >= 0; }

  optim::ParamStore& arena_;
  Communicator& comm_;
  ReducerOptions options_;
  BucketPlan plan_;
  std::vector<ArenaRange> owned_;  // ZeRO-1: chunk rank() of every bucket, plan order
  std::vector<Tensor> stage_;      // Note [Gradient transport]: one per bucket, or none
  int device_ = -1;                // CUDA device index, -1 on the CPU

  // The hooks reach the reducer through this; it dies with the reducer, so a
  // hook firing later (hooks cannot be removed) does nothing.
  struct HookTarget {
    Reducer* reducer;
  };
  std::shared_ptr<HookTarget> hook_target_;
  std::function<void(const ArenaRange&)> reduced_listener_;

  // The window in progress (last micro-step only).
  bool armed_ = false;
  // Note [GEMM SM margin]: the device's margin from before ours, while ours is set.
  std::optional<int> margin_before_;
  std::vector<int64_t> remaining_;  // per bucket: slots whose gradient is not final yet
  std::vector<bool> seen_;          // per slot: its hook fired in the last micro-step
  size_t next_ = 0;                 // the next bucket to send, in plan order
  int64_t sent_in_backward_ = 0, sent_in_backward_last_ = 0;
  int64_t issued_ = 0;

  std::unique_ptr<Event> ready_, done_;  // GPU only
  // options.timing: per bucket start/end on the comm stream, the backward's
  // end on the compute stream, the item count's end.
  std::vector<std::unique_ptr<Event>> bucket_start_, bucket_end_, bucket_ready_;
  std::vector<double> host_issue_ms_, host_call_ms_;  // options.timing: see ReducerTiming
  // options.timing: the bucket whose end event is still to be recorded. It is
  // recorded when the next one is sent (or at finish): stream() may wait for
  // NCCL to launch the collective (Note [Deferred launch] in
  // dist/nccl_communicator.cpp), which the host should not do at once.
  std::optional<size_t> end_to_record_;
  std::chrono::steady_clock::time_point host_step_start_;
  std::unique_ptr<Event> step_start_, backward_end_, items_end_;
  bool timing_valid_ = false;
  bool copy_engine_all_reduce_ = false;  // Note [Copy-engine all-reduce]: set up and in use
  bool copy_engines_direct_ = false;     // ... straight between the arenas
};

}  // namespace accrue::dist
