// Note [Close under the forward] (optim/layer_steps.h).
#include "accrue/optim/layer_steps.h"

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
  ready_->record(current_stream(device));
  ready_->block(side_->handle());
  StreamGuard on_side(device, side_->handle());
  optimizer_.store_hyperparameters(step);
  for (size_t r = 0; r < ranges_.size(); ++r) {
    step_range(r);
    done_[r]->record(side_->handle());
  }
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
