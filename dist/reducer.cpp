#include "accrue/dist/reducer.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "accrue/autograd/variable.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/ops.h"

namespace accrue::dist {

Reducer::Reducer(optim::ParamStore& arena, Communicator& comm, const ReducerOptions& options)
    : arena_(arena),
      comm_(comm),
      options_(options),
      plan_(arena, options.buckets),
      hook_target_(std::make_shared<HookTarget>(HookTarget{this})) {
  ACCRUE_CHECK(arena.options().device() == comm.device(), "Reducer: the gradient arena is on ",
               arena.options().device().str(), " but rank ", comm.rank(), "'s communicator is on ",
               comm.device().str());
  if (comm.device().is_cuda()) {
    device_ = comm.device().index;
    // Events belong to the device current at their creation: make it the
    // communicator's (connect_nccl has already, in a process per GPU).
    set_cuda_device(device_);
  }
  if (on_gpu()) {
    ready_ = std::make_unique<Event>();
    done_ = std::make_unique<Event>();
    if (options.timing) {
      for (size_t b = 0; b < plan_.size(); ++b) {
        bucket_start_.push_back(std::make_unique<Event>(true));
        bucket_end_.push_back(std::make_unique<Event>(true));
        bucket_ready_.push_back(std::make_unique<Event>(true));
      }
      step_start_ = std::make_unique<Event>(true);
      backward_end_ = std::make_unique<Event>(true);
      items_end_ = std::make_unique<Event>(true);
      host_issue_ms_.assign(plan_.size(), 0.0);
      host_call_ms_.assign(plan_.size(), 0.0);
    }
  }
  remaining_.assign(plan_.size(), 0);
  seen_.assign(arena.size(), false);
  if (options.transport && *options.transport != arena.options().master_dtype()) {
    const DType t = *options.transport;
    ACCRUE_CHECK(t == DType::bf16 || t == DType::f16, "Reducer: transport dtype ", dtype_name(t),
                 " must be the arena's (", dtype_name(arena.options().master_dtype()),
                 ") or a 16-bit float (bf16, f16)");
    for (size_t b = 0; b < plan_.size(); ++b)
      stage_.push_back(zeros({plan_[b].numel}, t, arena.options().device()));
  }
  ACCRUE_CHECK(options.gemm_sm_margin >= 0 && options.gemm_sm_margin < 1024,
               "Reducer: gemm_sm_margin ", options.gemm_sm_margin,
               " is outside [0, 1024) (Note [GEMM SM margin])");
  if (options.check_layout) check_layout();
  ACCRUE_CHECK(!options.copy_engine_whole_buckets || options.copy_engine_all_reduce,
               "Reducer: copy_engine_whole_buckets is a form of copy_engine_all_reduce, which is "
               "off");
  if (options.copy_engine_all_reduce) set_up_copy_engines();
  if (options.zero1) {
    const int64_t world = comm.world_size();
    int64_t packed = 0;
    for (size_t b = 0; b < plan_.size(); ++b) {
      const Bucket& bucket = plan_[b];
      ACCRUE_CHECK(bucket.numel % world == 0, "Reducer (zero1): bucket ", b, " has ", bucket.numel,
                   " elements, not divisible by the world size ", world,
                   "; construct the store with optim::ParamStoreOptions().shard_ranks(", world,
                   ") (its shard_ranks is ", arena.options().shard_ranks(), "; Note [ZeRO-1])");
      const int64_t chunk = bucket.numel / world;
      owned_.push_back({bucket.offset + comm.rank() * chunk, chunk});
      packed += chunk;
    }
    arena.shard_moments(packed);
    if (arena.compute().defined()) {
      // Note [ZeRO-1]: the forward reads the compute copy, so the master is
      // the optimizer's alone and is cut to the owned ranges, from rank 0's
      // values: once sharded it can no longer be broadcast whole.
      broadcast_parameters(0);
      arena.shard_master(owned_);
    }
  }
  // Hooks cannot be unregistered: they reach the reducer through a weak
  // pointer that dies with it.
  const std::weak_ptr<HookTarget> target = hook_target_;
  for (size_t i = 0; i < arena.size(); ++i) {
    register_grad_ready_hook(arena.params()[i], [target, i](const Tensor&) {
      if (auto t = target.lock()) t->reducer->on_grad_ready(i);
    });
  }
}

Reducer::~Reducer() {
  set_gemm_margin(false);
  // Note [Copy-engine all-reduce]: the communicator outlives this reducer;
  // its buckets' staging goes with it (a later reducer sets its own up).
  if (copy_engine_all_reduce_) {
    try {
      comm_.use_copy_engine_all_reduce(0, 0, nullptr);
    } catch (const std::exception& e) {
      std::cerr << "accrue: Reducer: rank " << comm_.rank()
                << ": turning the copy engines off failed: " << error_message(e) << "\n";
    }
  }
}

void Reducer::order_comm_after_compute() {
  if (!on_gpu()) return;
  ready_->record(current_stream(device_));
  ready_->block(comm_.stream());
}

void Reducer::order_compute_after_comm() {
  if (!on_gpu()) return;
  comm_.join_pending();  // Note [Copy-engine all-reduce]: the direct form's sums
  done_->record(comm_.stream());
  done_->block(current_stream(device_));
}

Tensor Reducer::owned_chunk(const Tensor& flat, size_t b) const {
  return flat.narrow(0, owned_[b].offset, owned_[b].numel);
}

// Note [Layout fingerprint], checked where it matters: the buckets this rank
// will all-reduce must be the buckets every other rank will. One collective
// of four integers (max over ranks of x and of -x: all equal iff both come
// back unchanged), once, with a host read.
void Reducer::check_layout() {
  uint64_t h = layout_fingerprint(arena_);
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(plan_.size());
  for (const Bucket& b : plan_.buckets()) {
    mix(static_cast<uint64_t>(b.offset));
    mix(static_cast<uint64_t>(b.numel));
  }
  const int64_t hi = static_cast<int64_t>(h >> 32), lo = static_cast<int64_t>(h & 0xffffffffu);
  const std::vector<int64_t> mine{hi, lo, -hi, -lo};
  Tensor t = from_vector(mine, {4}, DType::i64, comm_.device());
  order_comm_after_compute();
  comm_.all_reduce(t, ReduceOp::max);
  ++issued_;
  order_compute_after_comm();
  const std::vector<int64_t> all = t.to_vector<int64_t>();
  if (all != mine) {
    std::ostringstream os;
    os << "Reducer: rank " << comm_.rank() << " of " << comm_.world_size()
       << " has a parameter layout or bucket plan that differs from another rank's (this rank: "
       << arena_.size() << " parameters, " << arena_.padded_numel() << " elements, " << plan_.size()
       << " buckets, fingerprint 0x" << std::hex << h
       << "): every rank must register the same parameters, in the same order, with the same "
          "shapes and dtype, and use the same bucket sizes";
    throw Error(os.str());
  }
}

// Note [Copy-engine all-reduce]: staging for the largest bucket.
void Reducer::set_up_copy_engines() {
  ACCRUE_CHECK(!options_.zero1,
               "Reducer: copy_engine_all_reduce is not taken with zero1 (ZeRO-1 "
               "reduce-scatters; the copy engines all-reduce)");
  ACCRUE_CHECK(stage_.empty(),
               "Reducer: copy_engine_all_reduce is not taken with a 16-bit "
               "transport (the copy engines sum fp32)");
  if (comm_.world_size() == 1) return;  // nothing to sum
  ACCRUE_CHECK(arena_.options().master_dtype() == DType::f32,
               "Reducer: copy_engine_all_reduce sums fp32 gradients; the arena's are ",
               dtype_name(arena_.options().master_dtype()));
  int64_t largest = 0;
  for (const Bucket& b : plan_.buckets())
    largest = std::max(
        largest, b.numel * static_cast<int64_t>(element_size(arena_.options().master_dtype())));
  std::string why;
  const int64_t min_bytes = Communicator::kCopyEngineMinBytes;
  if (arena_.options().shareable_gradients()) {
    // The direct form sums the buckets in place: staging for what is left.
    copy_engine_all_reduce_ = comm_.use_copy_engine_all_reduce(min_bytes, min_bytes, &why);
    if (copy_engine_all_reduce_) {
      copy_engines_direct_ =
          comm_.share_with_copy_engines(arena_.grads(), options_.copy_engine_whole_buckets, &why);
      if (!copy_engines_direct_) {
        std::cerr << "accrue: Reducer: rank " << comm_.rank()
                  << ": the copy engines stage the buckets: " << why << "\n";
        copy_engine_all_reduce_ = comm_.use_copy_engine_all_reduce(largest, min_bytes, &why);
      }
    }
  } else {
    copy_engine_all_reduce_ = comm_.use_copy_engine_all_reduce(largest, min_bytes, &why);
  }
  if (!copy_engine_all_reduce_)
    std::cerr << "accrue: Reducer: rank " << comm_.rank()
              << ": the buckets stay on NCCL, not the copy engines: " << why << "\n";
}

void Reducer::record_bucket_end() {
  if (!end_to_record_) return;
  bucket_end_[*end_to_record_]->record(comm_.stream());
  end_to_record_.reset();
}

void Reducer::set_gemm_margin(bool on) {
  if (!on_gpu() || options_.gemm_sm_margin == 0) return;
  if (on && !margin_before_) {
    margin_before_ = kernels::gemm_sm_margin(device_);
    kernels::set_gemm_sm_margin(device_, options_.gemm_sm_margin);
  } else if (!on && margin_before_) {
    kernels::set_gemm_sm_margin(device_, *margin_before_);
    margin_before_.reset();
  }
}

void Reducer::before_backward(int64_t index, int64_t micro_steps) {
  ACCRUE_CHECK(micro_steps >= 1 && index >= 0 && index < micro_steps,
               "Reducer::before_backward: micro-step ", index, " of a window of ", micro_steps);
  // Note [No silent hang]: a failed or timed-out collective surfaces here,
  // at the latest one micro-step later.
  comm_.check();
  if (index == 0) {  // a new window: nothing from an unfinished one carries over
    armed_ = false;
    set_gemm_margin(false);
  }
  if (index != micro_steps - 1) return;  // Note [Buckets]: earlier micro-steps never communicate
  set_gemm_margin(true);
  for (size_t b = 0; b < plan_.size(); ++b)
    remaining_[b] = plan_[b].num_params();
  seen_.assign(seen_.size(), false);
  next_ = 0;
  sent_in_backward_ = 0;
  armed_ = true;
  if (step_start_) {
    step_start_->record(current_stream(device_));
    host_step_start_ = std::chrono::steady_clock::now();
  }
}

void Reducer::on_grad_ready(size_t slot) {
  if (!armed_) return;
  const size_t b = plan_.bucket_of(slot);
  if (seen_[slot]) {
    // A second backward in the last micro-step: fine until the bucket has gone.
    ACCRUE_CHECK(b >= next_, "Reducer: parameter '", arena_.slots()[slot].name,
                 "' received another gradient in the last micro-step after its bucket ", b,
                 " was all-reduced; run one backward per micro-step");
    return;
  }
  seen_[slot] = true;
  if (--remaining_[b] == 0) send_ready_buckets();
}

void Reducer::grad_ready(int64_t slot) {
  ACCRUE_CHECK(slot >= 0 && slot < static_cast<int64_t>(arena_.size()),
               "Reducer::grad_ready: slot ", slot, " of a store of ", arena_.size(), " parameters");
  on_grad_ready(static_cast<size_t>(slot));
}

void Reducer::send_ready_buckets() {
  // Plan order: bucket b goes only after 0..b-1, so every rank issues the
  // same sequence of collectives whatever order its buckets complete in.
  while (next_ < plan_.size() && remaining_[next_] == 0) {
    send_bucket(next_);
    report_reduced(next_);
    ++next_;
    ++sent_in_backward_;
  }
}

bool Reducer::set_reduced_listener(std::function<void(const ArenaRange&)> listener) {
  // Note [Gradient transport]: the arena holds the sums only after finish() widens them.
  if (!stage_.empty()) return false;
  reduced_listener_ = std::move(listener);
  return true;
}

void Reducer::report_reduced(size_t b) {
  if (!reduced_listener_) return;
  const ArenaRange range = options_.zero1 ? owned_[b] : ArenaRange{plan_[b].offset, plan_[b].numel};
  // The listener orders its reads after the current stream's work: make that
  // the communicator's stream, where the reduction was just enqueued.
  std::optional<StreamGuard> on_comm;
  comm_.join_pending();  // the range's sums complete, not only enqueued
  if (on_gpu()) on_comm.emplace(device_, comm_.stream());
  reduced_listener_(range);
}

Tensor Reducer::staged_chunk(size_t b) const {
  return stage_[b].narrow(0, owned_[b].offset - plan_[b].offset, owned_[b].numel);
}

void Reducer::send_bucket(size_t b) {
  const NvtxRange range("accrue bucket collective");  // Note [NVTX ranges]
  // Note [Gradient transport]: rounded on the compute stream, before the
  // communicator's stream is told to wait for it.
  if (!stage_.empty()) stage_[b].copy_(plan_.view(arena_.grads(), b));
  record_bucket_end();  // the previous bucket's, after its collective
  using Ms = std::chrono::duration<double, std::milli>;
  const auto host_issue = std::chrono::steady_clock::now();
  if (!bucket_ready_.empty()) bucket_ready_[b]->record(current_stream(device_));
  order_comm_after_compute();
  if (!bucket_start_.empty()) bucket_start_[b]->record(comm_.stream());
  if (options_.zero1) {
    // Note [ZeRO-1]: in place, this rank's chunk receives the sum.
    if (stage_.empty()) {
      comm_.reduce_scatter(plan_.view(arena_.grads(), b), owned_chunk(arena_.grads(), b),
                           ReduceOp::sum);
    } else {
      comm_.reduce_scatter(stage_[b], staged_chunk(b), ReduceOp::sum);
    }
  } else {
    comm_.all_reduce(stage_.empty() ? plan_.view(arena_.grads(), b) : stage_[b], ReduceOp::sum);
  }
  if (!bucket_end_.empty()) {
    end_to_record_ = b;  // Note [Deferred launch] (dist/nccl_communicator.cpp): not now
    host_issue_ms_[b] = Ms(host_issue - host_step_start_).count();
    host_call_ms_[b] = Ms(std::chrono::steady_clock::now() - host_issue).count();
  }
  ++issued_;
}

void Reducer::finish(const Tensor& items) {
  ACCRUE_CHECK(items.defined() && items.numel() == 1 && items.dtype() == DType::f64,
               "Reducer::finish: items must be a single-element f64 tensor, got ",
               items.defined() ? shape_str(items.shape()) + " " + dtype_name(items.dtype())
                               : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  set_gemm_margin(false);  // the backward's GEMMs are all issued
  if (backward_end_) backward_end_->record(current_stream(device_));
  // Note [Overwrite first]: a slot no gradient reached this window holds an
  // old gradient and must enter the sum as 0. Such a slot never fired its
  // hook, so its bucket (and every later one) has not gone yet. The Window
  // zeroes them again after finish(): by then there are none left.
  arena_.zero_unwritten();
  if (!armed_) next_ = 0;  // finish() without an armed last micro-step: everything goes now
  for (; next_ < plan_.size(); ++next_)
    send_bucket(next_);
  record_bucket_end();
  // Note [Normalization]: N over every rank.
  order_comm_after_compute();
  comm_.all_reduce(items, ReduceOp::sum);
  ++issued_;
  if (items_end_) items_end_->record(comm_.stream());
  // The close's norm pass and optimizer read the reduced arena: the compute
  // stream waits for the communicator's, on the device only.
  order_compute_after_comm();
  // Note [Gradient transport]: the 16-bit sums, widened into the arena.
  for (size_t b = 0; b < stage_.size(); ++b) {
    if (options_.zero1) {
      owned_chunk(arena_.grads(), b).copy_(staged_chunk(b));
    } else {
      plan_.view(arena_.grads(), b).copy_(stage_[b]);
    }
  }
  timing_valid_ = armed_ && items_end_ != nullptr;
  sent_in_backward_last_ = armed_ ? sent_in_backward_ : 0;
  armed_ = false;
  next_ = 0;
}

void Reducer::broadcast_parameters(int root) {
  // A sharded master was cut from rank 0's, broadcast by the constructor.
  if (arena_.master_sharded()) return;
  NoGradGuard no_grad;
  order_comm_after_compute();
  comm_.broadcast(arena_.master(), root);
  ++issued_;
  for (int i = 0; i < arena_.options().moments() && !options_.zero1; ++i) {
    comm_.broadcast(arena_.moment(i), root);
    ++issued_;
  }
  order_compute_after_comm();
  // The GEMMs read the compute copy: it follows the broadcast master weights.
  arena_.refresh_compute();
}

void Reducer::all_gather(const Tensor& local, const Tensor& all) {
  ACCRUE_CHECK(options_.zero1, "Reducer::all_gather: only under zero1");
  order_comm_after_compute();
  comm_.all_gather(local, all);
  ++issued_;
  order_compute_after_comm();
}

void Reducer::all_reduce_max(const Tensor& values) {
  all_reduce_values("Reducer::all_reduce_max", values, ReduceOp::max);
}

void Reducer::all_reduce_sum(const Tensor& values) {
  all_reduce_values("Reducer::all_reduce_sum", values, ReduceOp::sum);
}

void Reducer::all_reduce_values(const char* what, const Tensor& values, ReduceOp op) {
  ACCRUE_CHECK(values.defined() && values.dim() <= 1 && values.dtype() == DType::f64 &&
                   values.device() == arena_.options().device(),
               what, ": expects a 0-d or 1-D f64 tensor on ", arena_.options().device().str(),
               ", got ",
               values.defined() ? shape_str(values.shape()) + " " + dtype_name(values.dtype()) +
                                      " on " + values.device().str()
                                : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  order_comm_after_compute();
  comm_.all_reduce(values, op);
  ++issued_;
  order_compute_after_comm();
}

void Reducer::all_gather_owned(const Tensor& params) {
  ACCRUE_CHECK(options_.zero1, "Reducer::all_gather_owned: only under zero1");
  ACCRUE_CHECK(params.defined() && params.dim() == 1 && params.numel() == plan_.padded_numel(),
               "Reducer::all_gather_owned: expects a flat arena of ", plan_.padded_numel(),
               " elements, got ", params.defined() ? shape_str(params.shape()) : "undefined");
  NoGradGuard no_grad;
  order_comm_after_compute();
  // Ranges are in elements: they cut a bf16/f16 compute copy as they cut the
  // master (plan_.view is for arenas of the master's dtype only).
  for (size_t b = 0; b < plan_.size(); ++b) {
    comm_.all_gather(owned_chunk(params, b), params.narrow(0, plan_[b].offset, plan_[b].numel));
    ++issued_;
  }
  order_compute_after_comm();
}

ReducerTiming Reducer::last_timing() const {
  ACCRUE_CHECK(options_.timing, "Reducer::last_timing: construct the reducer with timing = true");
  ACCRUE_CHECK(timing_valid_,
               "Reducer::last_timing: no window has closed on the GPU with an armed last "
               "micro-step yet");
  items_end_->synchronize();
  backward_end_->synchronize();
  // Everything is measured from the last micro-step's start (the earliest
  // event), then shifted to the backward's end.
  const double end = step_start_->elapsed_ms(*backward_end_);
  ReducerTiming t;
  t.last_backward_ms = end;
  for (size_t b = 0; b < plan_.size(); ++b) {
    t.bucket_start_ms.push_back(step_start_->elapsed_ms(*bucket_start_[b]) - end);
    t.bucket_end_ms.push_back(step_start_->elapsed_ms(*bucket_end_[b]) - end);
    t.bucket_ready_ms.push_back(step_start_->elapsed_ms(*bucket_ready_[b]) - end);
  }
  t.host_issue_ms = host_issue_ms_;
  t.host_call_ms = host_call_ms_;
  t.items_end_ms = step_start_->elapsed_ms(*items_end_) - end;
  t.exposed_ms = std::max(0.0, t.items_end_ms);
  return t;
}

}  // namespace accrue::dist
