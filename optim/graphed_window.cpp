#include "accrue/optim/graphed_window.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>
#include <sstream>
#include <utility>

#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/core/allocator.h"
#include "accrue/core/nvtx.h"
#include "accrue/core/write_order.h"
#include "accrue/kernels/stream_resources.h"
#include "accrue/optim/layer_steps.h"

namespace accrue::optim {

GraphedWindow::GraphedWindow(Window& window, StepFn step)
    : window_(window), step_(std::move(step)) {
  ACCRUE_CHECK(static_cast<bool>(step_), "GraphedWindow: the step function is empty");
  // Note [Graphed window]: what keeps everything, or the close, eager.
  if (const char* why = window.why_not_capturable()) why_eager_ = why;
  for (const WindowListener* l : window.listeners_)
    if (const char* why = l->why_not_capturable(); why && why_eager_.empty()) why_eager_ = why;
  if (window.sync_) why_close_eager_ = "the reducer launches its all-reduces from host hooks";
  if (const char* why = window.why_close_not_capturable(); why && why_close_eager_.empty())
    why_close_eager_ = why;
  if (!why_eager_.empty()) {
    warn("every micro-step and close", why_eager_);
  } else if (!why_close_eager_.empty()) {
    warn(window.sync_ ? "the last micro-step and the close" : "the close", why_close_eager_);
  }
}

void GraphedWindow::warn(const std::string& what, const std::string& why) const {
  std::fprintf(stderr, "accrue: GraphedWindow: %s runs eagerly: %s\n", what.c_str(), why.c_str());
}

std::string GraphedWindow::signature(const std::vector<Tensor>& inputs) const {
  std::ostringstream s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    ACCRUE_CHECK(t.defined(), "GraphedWindow::backward: input ", i, " is an undefined tensor");
    s << (i ? ", " : "") << shape_str(t.shape()) << " " << dtype_name(t.dtype()) << " on "
      << t.device().str();
  }
  return s.str();
}

namespace {

// A buffer for input t laid out as t is (its dims in the order of their
// strides, densely): a channels-last image batch gets a channels-last buffer,
// so the captured step sees the layout its eager warm-up saw (the
// convolutions' plans were made for it).
Tensor buffer_like(const Tensor& t) {
  std::vector<int64_t> order(static_cast<size_t>(t.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  Shape physical, inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    physical.push_back(t.size(order[i]));
    inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  }
  return empty(physical, t.dtype(), t.device()).permute(inverse);
}

}  // namespace

GraphedWindow::~GraphedWindow() = default;

void GraphedWindow::eager_micro_step(const std::vector<Tensor>& inputs) {
  window_.backward(step_(inputs));
  ++counts_.eager_micro_steps;
}

bool GraphedWindow::capture(Captured& c, const std::string& what,
                            const std::function<void()>& body) {
  // Note [Capturable code]: a failed capture ran nothing, so the host state
  // goes back to where it was and the caller runs the same work eagerly.
  const int64_t micro_step = window_.micro_step_;
  const std::vector<bool> written = window_.store_.written_flags();
  std::string why;
  c.graph = CudaGraph::capture(window_.state().device().index, body, &why);
  if (!c.graph) {
    window_.micro_step_ = micro_step;
    window_.store_.set_written_flags(written);
    window_.index_checks_->set_position(window_.windows_, micro_step);
    c.eager = true;
    warn(what, why);
    return false;
  }
  ++counts_.graphs;
  return true;
}

void GraphedWindow::backward(const std::vector<Tensor>& inputs) {
  const std::string sig = signature(inputs);
  // Note [Scale calibration]: the calibrating window's observer launches from the host.
  const bool eager =
      !why_eager_.empty() || window_.state().device().is_cpu() || window_.calibrating();
  if (eager && concurrent_ == 1) {
    eager_micro_step(inputs);
    return;
  }
  if (!eager) {
    if (signature_.empty()) signature_ = sig;
    if (sig != signature_) {
      if (!warned_signature_)
        warn("a micro-step on inputs " + sig,
             "the graphs were captured for " + signature_ + " (warned once)");
      warned_signature_ = true;
      flush();  // the group taken so far, in order (eager: a group of another size)
      eager_micro_step(inputs);
      return;
    }
  }
  if (concurrent_ > 1) {
    group_backward(inputs, eager);
    return;
  }
  const int64_t k = window_.micro_step_, K = window_.options_.micro_steps();
  if (window_.sync_ && k == K - 1) {  // the reducer's all-reduces go from host hooks
    eager_micro_step(inputs);
    return;
  }
  Captured& c = k == 0 ? first_ : rest_;
  if (c.graph) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].data_ptr() != buffers_[i].data_ptr()) buffers_[i].copy_(inputs[i]);
    c.graph->launch();
    window_.replay_micro_step(c.written_after);
    ++counts_.replayed_micro_steps;
    return;
  }
  if (c.eager || c.seen++ == 0) {  // the first run of each phase is the warm-up
    eager_micro_step(inputs);
    return;
  }
  if (buffers_.empty()) {
    for (const Tensor& t : inputs)
      buffers_.push_back(buffer_like(t));
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    buffers_[i].copy_(inputs[i]);
  const std::string what = k == 0 ? "micro-step 0" : "micro-steps 1..K-1";
  // Note [Weight gradients on a branch]: only inside the capture.
  if (branch_lag_ > 0 && !branch_) {
    const Device device = window_.state().device();
    branch_stream_ = std::make_unique<Stream>(device.index);
    kernels::prepare_stream(device, branch_stream_->handle());
    branch_ = std::make_unique<autograd::WeightGradBranch>(device.index, branch_stream_->handle(),
                                                           branch_lag_);
  }
  if (!capture(c, what, [&] {
        std::optional<autograd::WeightGradBranchScope> in_force;
        if (branch_) in_force.emplace(*branch_);
        window_.backward(step_(buffers_));
      })) {
    eager_micro_step(inputs);
    return;
  }
  c.written_after = window_.store_.written_flags();
  c.graph->launch();  // the capture recorded this micro-step; now it runs
  ++counts_.replayed_micro_steps;
  release_unused_cuda_memory(window_.state().device());
}

void GraphedWindow::check_listeners_keep_group_writes(const char* op, int64_t n) const {
  for (WindowListener* l : window_.listeners_)
    ACCRUE_CHECK(l->defers_group_writes(), op, "(", n,
                 "): not with a window listener that cannot keep a group's writes in order "
                 "(every forward adds to its state; BatchNorm can: ",
                 "Note [Concurrent micro-batches])");
}

void GraphedWindow::check_unstarted(const char* op) const {
  const int64_t run = counts_.replayed_micro_steps + counts_.eager_micro_steps;
  ACCRUE_CHECK(pending_ == 0 && run == 0, op, ": set it before the first backward (", run,
               " micro-steps run through this GraphedWindow so far)");
}

void GraphedWindow::set_concurrent_micro_batches(int n) {
  const char* op = "GraphedWindow::set_concurrent_micro_batches";
  ACCRUE_CHECK(n >= 1, op, ": n must be >= 1, got ", n);
  // A Window resumed inside a window may have micro-steps done: groups start where it is.
  check_unstarted(op);
  if (n > 1) {  // Note [Concurrent micro-batches]: what it refuses
    ACCRUE_CHECK(branch_lag_ == 0, op, "(", n,
                 "): not with the weight-gradient branch (Note [Weight gradients on a branch])");
    ACCRUE_CHECK(window_.sync_ == nullptr, op, "(", n,
                 "): not with a GradientSync, whose all-reduces launch from host hooks");
    ACCRUE_CHECK(window_.find_stage<LayerStepsStage>() == nullptr, op, "(", n,
                 "): not with close_under_forward: the forwards on side streams would not wait "
                 "for the layer steps (Note [Close under the forward])");
    check_listeners_keep_group_writes(op, n);
  }
  concurrent_ = n;
}

void GraphedWindow::set_weight_grad_branch(int lag) {
  const char* op = "GraphedWindow::set_weight_grad_branch";
  ACCRUE_CHECK(lag >= 0, op, ": lag must be >= 0 (0: off), got ", lag);
  check_unstarted(op);
  ACCRUE_CHECK(lag == 0 || concurrent_ == 1, op, "(", lag, "): not with ", concurrent_,
               " concurrent micro-batches (Note [Weight gradients on a branch])");
  ACCRUE_CHECK(lag == 0 || window_.sync_ == nullptr, op, "(", lag,
               "): not with a GradientSync, whose grad-ready hooks would join the branch at "
               "every parameter (Note [Weight gradients on a branch])");
  branch_lag_ = lag;
}

int64_t GraphedWindow::weight_grad_branch_entries() const {
  return branch_ ? branch_->entries() : 0;
}

void GraphedWindow::group_backward(const std::vector<Tensor>& inputs, bool eager) {
  // Note [Concurrent micro-batches]: the inputs wait in their place's buffers
  // (the graphs read those), or as copies of their own where the group runs
  // eagerly (the CPU, the calibrating window, ...: any shapes).
  const size_t place = static_cast<size_t>(pending_);
  if (place == 0) group_eager_ = eager;
  if (group_eager_) {
    if (eager_inputs_.size() <= place) eager_inputs_.resize(place + 1);
    eager_inputs_[place].clear();
    for (const Tensor& t : inputs)
      eager_inputs_[place].push_back(t.clone());
  } else {
    if (group_buffers_.size() <= place) {
      group_buffers_.emplace_back();
      for (const Tensor& t : inputs)
        group_buffers_.back().push_back(buffer_like(t));
    }
    for (size_t i = 0; i < inputs.size(); ++i)
      group_buffers_[place][i].copy_(inputs[i]);
  }
  const int64_t left = window_.options_.micro_steps() - window_.micro_step_;
  if (++pending_ < std::min<int64_t>(concurrent_, left)) return;
  run_group();
}

void GraphedWindow::eager_group(const std::vector<std::vector<Tensor>>& inputs, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    eager_micro_step(inputs[static_cast<size_t>(j)]);
}

void GraphedWindow::flush() {
  if (pending_ > 0) run_group();
}

void GraphedWindow::run_group() {
  const int64_t n = pending_;
  pending_ = 0;
  if (group_eager_) {  // one after another, and the copies go
    eager_group(eager_inputs_, n);
    eager_inputs_.clear();
    return;
  }
  const bool first = window_.micro_step_ == 0;  // its writes go with beta 0
  Captured& c = groups_[std::string(first ? "first:" : "rest:") + std::to_string(n)];
  if (c.graph) {
    c.graph->launch();
    for (int64_t j = 0; j < n; ++j)
      window_.replay_micro_step(c.written_after);
    counts_.replayed_micro_steps += n;
    return;
  }
  if (c.eager || c.seen++ == 0) {  // the warm-up: one after another, on the current stream
    eager_group(group_buffers_, n);
    return;
  }
  capture_group(c, n, std::string(first ? "micro-steps 0.." : "a group of ") + std::to_string(n));
}

namespace {

// Note [Concurrent micro-batches]: the window listeners' part in a group of
// micro-steps in flight; a group that does not reach end() (a capture that
// threw) drops what the listeners kept.
class ListenerGroup {
 public:
  explicit ListenerGroup(const std::vector<WindowListener*>& listeners) : listeners_(listeners) {
    for (WindowListener* l : listeners_)
      l->on_group_begin();
  }
  ~ListenerGroup() {
    if (!ended_)
      for (WindowListener* l : listeners_)
        l->on_group_abandon();
  }
  ListenerGroup(const ListenerGroup&) = delete;
  ListenerGroup& operator=(const ListenerGroup&) = delete;
  void end() {  // on the current stream, after the group's streams joined it
    ended_ = true;
    for (WindowListener* l : listeners_)
      l->on_group_end();
  }

 private:
  const std::vector<WindowListener*>& listeners_;
  bool ended_ = false;
};

}  // namespace

void GraphedWindow::capture_group(Captured& c, int64_t n, const std::string& what) {
  const Device device = window_.state().device();
  const StreamHandle main = current_stream(device.index);
  while (static_cast<int64_t>(sides_.size()) + 1 < n) {
    sides_.push_back(std::make_unique<Stream>(device.index));
    kernels::prepare_stream(device, sides_.back()->handle());
    joins_.push_back(std::make_unique<Event>());
  }
  if (!fork_) fork_ = std::make_unique<Event>();
  // Again here: a listener may have been added after set_concurrent_micro_batches.
  check_listeners_keep_group_writes("GraphedWindow: a group of", n);
  const auto stream_of = [&](int64_t j) { return j == 0 ? main : sides_[j - 1]->handle(); };
  const bool captured = capture(c, what, [&] {
    fork_->record(main);
    for (int64_t j = 1; j < n; ++j)
      fork_->block(stream_of(j));
    ListenerGroup group(window_.listeners_);  // BatchNorm's statistics: at the group's end
    {
      // Note [Ordered writes]: the slots' and the window's sums keep the micro-steps' order.
      const WriteOrderScope slots(window_.store_.grad_arena().write_order());
      const WriteOrderScope scalars(*window_.scalar_order_);
      for (int64_t j = 0; j < n; ++j) {
        const StreamGuard on(device.index, stream_of(j));
        window_.backward(step_(group_buffers_[static_cast<size_t>(j)]));
      }
    }
    for (int64_t j = 1; j < n; ++j) {
      joins_[j - 1]->record(stream_of(j));
      joins_[j - 1]->block(main);
    }
    group.end();
  });
  if (!captured) {
    eager_group(group_buffers_, n);
    return;
  }
  c.written_after = window_.store_.written_flags();
  c.graph->launch();  // the capture recorded the group; now it runs
  counts_.replayed_micro_steps += n;
  release_unused_cuda_memory(device);
}

void GraphedWindow::close() {
  ACCRUE_CHECK(window_.ready(), "GraphedWindow::close: ", window_.micro_step_, " of ",
               window_.options_.micro_steps(), " micro-steps done");
  // Note [Unused parameters], before any path closes (a captured close replays no host code).
  if (!window_.sync_)
    window_.check_unused(window_.store_.written_flags(), window_.windows_ + 1,
                         "GraphedWindow::close");
  if (!why_eager_.empty() || !why_close_eager_.empty() || window_.state().device().is_cpu() ||
      window_.calibrating()) {
    window_.close();
    ++counts_.eager_closes;
    return;
  }
  std::string key = std::to_string(window_.options_.micro_steps()) + ":";
  for (bool w : window_.store_.written_flags())
    key += w ? '1' : '0';
  Captured& c = closes_[key];
  if (c.eager || (!c.graph && c.seen++ == 0)) {
    window_.close();
    ++counts_.eager_closes;
    return;
  }
  const NvtxRange range("accrue window close");  // Note [NVTX ranges]
  // Note [Hyperparameters on the device]: this window's learning rates, eagerly, before the graph.
  window_.optimizer_.store_hyperparameters(window_.windows_);
  const bool capturing = !c.graph;
  if (capturing && !capture(c, "the close", [&] { window_.close_device(); })) {
    window_.close();
    ++counts_.eager_closes;
    return;
  }
  c.graph->launch();
  window_.close_host();
  ++counts_.replayed_closes;
  if (capturing) release_unused_cuda_memory(window_.state().device());
}

}  // namespace accrue::optim
