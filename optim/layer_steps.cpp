// Note [Close under the forward] (optim/layer_steps.h).
#include "accrue/optim/layer_steps.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "accrue/core/cuda_graph.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/error.h"

namespace accrue::optim {

namespace {

// Consecutive slots, in arena order, of at least min_elements each (the last
// range takes what is left, however short); together they cover the padded
// arena, each starting at its first slot's offset.
std::vector<ArenaRange> layer_ranges(const ParamStore& store, int64_t min_elements,
                                     std::vector<int64_t>* range_of_slot) {
  std::vector<ArenaRange> ranges;
  const std::vector<ParamStore::Slot>& slots = store.slots();
  range_of_slot->assign(slots.size(), 0);
  int64_t start = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    (*range_of_slot)[i] = static_cast<int64_t>(ranges.size());
    const int64_t end = i + 1 < slots.size() ? slots[i + 1].offset : store.padded_numel();
    if (end - start >= min_elements || i + 1 == slots.size()) {
      ranges.push_back({start, end - start});
      start = end;
    }
  }
  return ranges;
}

}  // namespace

LayerSteps::LayerSteps(ParamStore& store, const Optimizer& optimizer, int64_t min_elements,
                       bool steps_on_first_read, int64_t max_blocks)
    : store_(store),
      optimizer_(optimizer),
      lazy_(steps_on_first_read),
      on_cuda_(store.options().device().is_cuda()),
      max_blocks_(max_blocks) {
  ACCRUE_CHECK(min_elements >= 1, "close_under_forward: min_elements must be >= 1, got ",
               min_elements);
  ACCRUE_CHECK(max_blocks >= 0, "close_under_forward: max_blocks must be >= 0, got ", max_blocks);
  ACCRUE_CHECK(store.size() > 0, "close_under_forward: the store holds no parameter");
  ACCRUE_CHECK(!store.moments_sharded() && !store.master_sharded(),
               "close_under_forward: not with ZeRO-1 (each rank steps and gathers its shard in "
               "the close)");
  ranges_ = layer_ranges(store, min_elements, &range_of_slot_);
  if (on_cuda_ && !lazy_) {
    const int device = store.options().device().index;
    side_ = std::make_unique<Stream>(device);
    ready_ = std::make_unique<Event>();
    for (size_t r = 0; r < ranges_.size(); ++r)
      done_.push_back(std::make_unique<Event>());
  }
  store_.set_join_hook([this](const char* where) { join(where); });  // may refuse: first
  install_parameter_gate(this);
}

LayerSteps::~LayerSteps() {
  store_.set_join_hook(nullptr);
  remove_parameter_gate(this);
  try {
    join("~LayerSteps");
  } catch (...) {  // a destructor does not throw; the stream waits were issued
  }
}

namespace {
// Sets a flag for a scope.
class FlagScope {
 public:
  explicit FlagScope(bool& flag) : flag_(flag) { flag_ = true; }
  ~FlagScope() { flag_ = false; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

 private:
  bool& flag_;
};
}  // namespace

void LayerSteps::launch(const Tensor& state, int64_t step, const SlotTables& slots) {
  ACCRUE_CHECK(!launched_,
               "close_under_forward: a close began before the last one's steps were joined");
  const FlagScope issuing(stepping_);
  state_ = state;
  step_ = step;
  slots_ = slots;
  awaited_ = 0;
  awaits_ = 0;
  if (optimizer_.measures_step_sums()) {  // Note [Step sums]: one pass over the whole arena
    optimizer_.step(store_, state, step, {}, slots);
    store_.refresh_fp8_copies();
    return;
  }
  if (!on_cuda_ && !lazy_) {  // nothing to overlap: every range now
    optimizer_.store_hyperparameters(step);
    for (size_t r = 0; r < ranges_.size(); ++r)
      step_range(r);
    return;
  }
  set_launched(true);
  if (lazy_) {
    optimizer_.store_hyperparameters(step);
    return;
  }
  const int device = store_.options().device().index;
  // Note [Steps graph]: a kernel whose arguments are this window's values, so
  // eager, and on the current stream, where the last close's ranges, which
  // read the buffer, were joined (launch requires it).
  optimizer_.store_hyperparameters(step);
  ready_->record(current_stream(device));
  ready_->block(side_->handle());
  const StreamGuard on_side(device, side_->handle());
  if (const CudaGraph* graph = steps_graph(device)) {
    graph->launch();  // on the current stream: the side stream
    ++graphed_launches_;
    return;
  }
  issue_ranges(/*captured=*/false);
}

void LayerSteps::issue_ranges(bool captured) {
  const StreamHandle side = side_->handle();
  for (size_t r = 0; r < ranges_.size(); ++r) {
    step_range(r);
    if (captured) {
      done_[r]->record_external(side);
    } else {
      done_[r]->record(side);
    }
  }
}

// Note [Steps graph]
// ~~~~~~~~~~~~~~~~~~
// Note [Close under the forward] issues its ranges on the side stream as one
// CUDA graph: each range's fused step and its FP8 recasts (plain kernels
// into buffers that keep_fp8_copies made), then an event-record node for the
// range's event (Event::record_external), so that the current stream's
// waits, eager (Event::block) or captured (Event::block_external), see each
// replay's records. It is captured at the first close, with the side stream
// current, and replayed at each close after the side stream waits for
// ready_. The steps of the test mode, of measured step sums and of the CPU
// stay as they were.
// A replay repeats the capture's kernel arguments. That is right because
// nothing the ranges read is a host value that changes from window to
// window, and the key below holds their buffers where the capture saw them:
//  - the step count, the coefficient and found_inf come from the window
//    state (state[kStep], kCoef, kFoundInf, which the scalar step wrote),
//    each slot's own count from the slot tables, each group's learning rate
//    and weight decay from the optimizer's hyperparameter buffer (Note
//    [Hyperparameters on the device]), which launch() writes on the current
//    stream before ready_: its values travel as that kernel's arguments, so
//    it cannot be replayed, and it must not go to the side stream (Note
//    [Close under the forward]: no eager kernel there).
//  - The host `step` reaches the ranges' kernels only as config_at(step)'s
//    group rates in OptimizerParams::lr, which the kernel ignores when the
//    hyperparameter buffer is given (Optimizer::buffers always gives it), and
//    in the host checks, made at the capture; store_hyperparameters checks
//    every window's config.
//  - The other host values of each launch, the ranges, the grid cap, the
//    grid (occupancy and SM count), the betas, eps and the groups' count,
//    are fixed for the LayerSteps' life.
//  - graph_key() collects at every launch the addresses the kernels read and
//    write (the store's master, gradients, compute copy and moments, the
//    window state, the slot tables, the optimizer's chunk groups and
//    hyperparameter buffer) and the bytes of the store's FP8 copies (a copy
//    added after the capture would not be recast). A different key
//    recaptures; the old graph, if still running, is freed when it ends
//    (cudaGraphExecDestroy). None of them moves today: the Window allocates
//    them once, and loads write into them in place.
// A capture that fails (the plain allocator, Note [Capturable code]) is not
// tried again: the ranges go to the side stream as eager kernels, with one
// warning on stderr. A close issued while this thread captures
// (graph_capturing()) does not nest a capture: eager too.
const CudaGraph* LayerSteps::steps_graph(int device) {
  if (graph_failed_ || graph_capturing()) return nullptr;
  std::vector<int64_t> key = graph_key();
  if (graph_ != nullptr && key == graph_key_) return graph_.get();
  graph_.reset();
  std::string why;
  graph_ = CudaGraph::capture(
      device, [this] { issue_ranges(/*captured=*/true); }, &why);
  if (graph_ == nullptr) {
    graph_failed_ = true;
    std::fprintf(stderr,
                 "accrue: close_under_forward: the layer steps run as eager kernels on the side "
                 "stream, which slows every later kernel (Note [Steps graph]): %s\n",
                 why.c_str());
    return nullptr;
  }
  graph_key_ = std::move(key);
  ++graph_captures_;
  return graph_.get();
}

std::vector<int64_t> LayerSteps::graph_key() const {
  // Called while stepping_ is set: the store's accessors do not join.
  auto at = [](const Tensor& t) {
    return t.defined() ? static_cast<int64_t>(reinterpret_cast<intptr_t>(t.data_ptr())) : 0;
  };
  std::vector<int64_t> key = {
      at(state_),           at(slots_.chunk_slots),        at(slots_.used),
      at(slots_.steps),     at(store_.master()),           at(store_.grads()),
      at(store_.compute()), at(optimizer_.chunk_groups()), at(optimizer_.hyperparameters()),
      store_.memory().fp8};
  for (int i = 0; i < store_.options().moments(); ++i)
    key.push_back(at(store_.moment(i)));
  return key;
}

void LayerSteps::step_range(size_t r) {
  optimizer_.step_range(store_, state_, step_, ranges_[r], slots_, max_blocks_);
  // Note [Window FP8 weights]: the range's copies, recast from its new weights.
  for (size_t slot = 0; slot < range_of_slot_.size(); ++slot)
    if (range_of_slot_[slot] == static_cast<int64_t>(r)) store_.refresh_fp8_slot(slot);
}

void LayerSteps::step_ranges_until(int64_t end) {
  const FlagScope issuing(stepping_);
  for (; awaited_ < end; ++awaited_)
    step_range(static_cast<size_t>(awaited_));
}

void LayerSteps::wait_for(int64_t range) {
  if (range < awaited_) return;
  if (lazy_) {
    step_ranges_until(range + 1);
    return;
  }
  const StreamHandle stream = current_stream(store_.options().device().index);
  const Event& done = *done_[static_cast<size_t>(range)];
  if (graph_capturing()) {  // a captured micro-step: an event-wait node
    done.block_external(stream);
  } else {
    done.block(stream);
  }
  awaited_ = range + 1;
}

void LayerSteps::await(const Tensor& param) {
  if (!launched_) return;
  const int slot = store_.index_of(param);
  if (slot < 0) return;
  ++awaits_;
  wait_for(range_of_slot_[static_cast<size_t>(slot)]);
}

void LayerSteps::join(const char* where, bool after_forward) {
  if (!launched_ || stepping_) return;
  if (after_forward)
    ACCRUE_CHECK(awaits_ > 0, where,
                 ": close_under_forward, but the forward awaited none of the store's "
                 "parameters while the last close was still stepping them, so it read weights "
                 "mid-step: call accrue::await_parameters before each layer reads its weights "
                 "(nn's models do; Note [Close under the forward])");
  wait_for(static_cast<int64_t>(ranges_.size()) - 1);
  set_launched(false);
}

void LayerSteps::set_launched(bool on) {
  launched_ = on;
  set_parameter_gate_pending(this, on);  // Note [Parameter gates]
}

LayerStepsStage::LayerStepsStage(CloseContext& c, int64_t min_elements, int64_t max_blocks,
                                 bool steps_on_first_read)
    : c_(c), steps_(*c.store, *c.optimizer, min_elements, steps_on_first_read, max_blocks) {
  ACCRUE_CHECK(!c.sharded(),
               "close_under_forward: not with ZeRO-1 (Note [Close under the forward])");
}

void LayerStepsStage::run(int64_t window) {
  steps_.launch(c_.state, window, c_.slots);
}

}  // namespace accrue::optim
