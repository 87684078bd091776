// Per-layer gradient norms and update-to-weight ratios, for the health
// monitor (optim/metrics_log.h).
//
//   optim::LayerMonitor layers(arena);
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
// It costs a copy of the master weights and a few small reductions per slot
// on the device, in the windows it measures, and nothing in the others; the
// host reads the numbers only in read(). A sharded master (ZeRO-1 with a
// compute copy) holds only this rank's ranges, and is refused.
#pragma once

#include <string>
#include <vector>

#include "autograd/grad_arena.h"
#include "optim/window.h"

namespace accrue::optim {

struct LayerReport {
  std::string name;
  double grad_norm = 0.0;
  double update_ratio = 0.0;
};

class LayerMonitor {
 public:
  // `arena` must outlive the monitor.
  explicit LayerMonitor(const GradArena& arena);
  // Right before Window::close(): each slot's gradient norm and a copy of the weights.
  void before_close();
  // Right after Window::close(): each slot's update and weight norms.
  void after_close();
  // The measured window, read once (one host synchronization); `report` is
  // that window's (Window::report()).
  std::vector<LayerReport> read(const WindowReport& report) const;
  // The update ratio over all parameters together, from the last read().
  double total_update_ratio() const { return total_update_ratio_; }

 private:
  const GradArena& arena_;
  Tensor squares_;  // f64 [slots, 3]: |g|^2, |p_after - p_before|^2, |p_before|^2
  Tensor before_;   // the master weights before the step
  bool measured_ = false;
  mutable double total_update_ratio_ = 0.0;
};

}  // namespace accrue::optim
