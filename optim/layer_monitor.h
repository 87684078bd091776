// Per-layer gradient norms and update-to-weight ratios, for the health
// monitor (optim/metrics_log.h).
//
//   optim::LayerMonitor layers(arena, optimizer);  // or (arena): see below
//   ... the window's micro-steps ...
//   layers.before_close();
//   window.close();
//   layers.after_close();
//   for (const auto& l : layers.read(window.report())) ...  // one host read
//
// Note [Layer monitor]
// ~~~~~~~~~~~~~~~~~~~~
// For every named parameter (arena slot) of one window:
//  - grad_norm: the L2 norm of its part of the window's gradient, on the same
//    footing as WindowReport::grad_norm (unscaled, divided by N, before
//    clipping): the slot's norm as the arena holds it, times grad_norm over
//    the whole arena's. A slot nobody wrote this window reads 0, as the close
//    makes it (Note [Overwrite first]);
//  - update_ratio: ||p_after - p_before|| / ||p_before|| of the step, the
//    signal of Adam's variance problem (updates that stay large relative to
//    the weights); 0 for a skipped window, which changes nothing.
// groups() gives both over each optimizer parameter group's slots together
// (the group's norm is the root-sum-square of its layers'; its ratio is
// ||delta|| / ||p|| over all of its weights), from the same sums.
// Two ways to get the sums, the same figures:
//  - LayerMonitor(arena, optimizer): inside the close's own fused pass (Note
//    [Step sums] in kernels/window_close.h): the pass writes each 32-element
//    chunk's three sums as it steps (24 bytes per 32 parameters), and
//    after_close folds them per slot in two launches
//    (kernels::step_sums_per_slot): +0.23 ms of device time per GPT-2 124M
//    window on an H100, 0.3% (bench/RESULTS.md).
//    Needs an eager close over the whole arena: a close replayed from a CUDA
//    graph, or ZeRO-1 ranges, are refused.
//  - LayerMonitor(arena): separate passes, for any close (a captured one
//    too): a copy of the master weights, one in-place subtraction (before -=
//    after) and three passes of the close's norm kernel
//    (kernels::grad_norm_partials, Note [Norm rows]) over each slot: 4 + 8 +
//    12 + 3 x 4 = 36 bytes per parameter and 3 launches per slot (+4.4% of a
//    GPT-2 124M window on an H100 at every window, bench/RESULTS.md).
// Either costs nothing in the windows not measured, and read() copies the
// figures to the host once. A sharded master (ZeRO-1 with a compute copy)
// holds only this rank's ranges, and is refused.
#pragma once

#include <string>
#include <vector>

#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"

namespace accrue::optim {

struct LayerReport {
  std::string name;
  double grad_norm = 0.0;
  double update_ratio = 0.0;
};

// The same figures over a parameter group's slots together.
struct GroupReport {
  int group = 0;  // as Optimizer::slot_groups numbers them
  double grad_norm = 0.0;
  double update_ratio = 0.0;
};

class LayerMonitor {
 public:
  // Separate passes; `arena` must outlive the monitor.
  explicit LayerMonitor(const ParamStore& arena);
  // Sums from the fused pass of `optimizer`, which steps `arena`; both must
  // outlive the monitor.
  LayerMonitor(const ParamStore& arena, Optimizer& optimizer);
  // Right before Window::close(): each slot's gradient norm and a copy of the weights.
  void before_close();
  // Right after Window::close(): each slot's update and weight norms.
  void after_close();
  // The measured window, read once (one host synchronization); `report` is
  // that window's (Window::report()).
  std::vector<LayerReport> read(const WindowReport& report) const;
  // The update ratio over all parameters together, from the last read().
  double total_update_ratio() const { return total_update_ratio_; }
  // Per parameter group, from the last read(): slot_group[i] is slot i's
  // group (Optimizer::slot_groups). One entry per group that has a slot, in
  // group order.
  std::vector<GroupReport> groups(const std::vector<int>& slot_group) const;

 private:
  // Partials of `what` (0: gradient, 1: update, 2: weights before) for slot i.
  Tensor rows_of(int what, size_t i) const;
  // Slot i's norm rows of `source` (a tensor laid out like the arena) into rows_of(what, i).
  void partials(const Tensor& source, int what, size_t i) const;

  // The three sums of every slot, f64 [slots, 3], on the host.
  std::vector<double> slot_squares() const;

  const ParamStore& arena_;
  // In-pass sums (Note [Step sums]); null for separate passes.
  Optimizer* optimizer_ = nullptr;
  Tensor step_sums_;          // f64 [arena chunks, 3]
  Tensor slot_chunks_;        // i64 [slots, 2]: each slot's chunk range, on the arena's device
  Tensor slot_sums_;          // f64 [slots, 3]
  int64_t steps_before_ = 0;  // optimizer_->steps_with_sums() at before_close
  // Separate passes:
  std::vector<int64_t> first_row_, rows_;  // each slot's range of partial rows
  int64_t table_rows_ = 0;                 // the sum of rows_
  // f64 [3 * table_rows_, 2]: the gradient's, the update's and the weights'
  // partials (Note [Norm rows]), one block of table_rows_ rows each.
  Tensor table_;
  Tensor before_;  // the master weights before the step; after_close: before - after
  bool measured_ = false;
  mutable double total_update_ratio_ = 0.0;
  // From the last read(): per slot |g|^2, |p_after - p_before|^2, |p_before|^2,
  // and the factor that brings the arena's gradient norm to the report's.
  mutable std::vector<double> squares_;
  mutable double grad_scale_ = 0.0;
};

}  // namespace accrue::optim
