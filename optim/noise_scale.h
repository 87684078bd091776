// NoiseScale: the gradient noise scale of McCandlish et al. (2018, "An
// Empirical Model of Large-Batch Training"), measured by the accumulation
// window at the cost of one extra norm pass.
//
// Note [Gradient noise scale]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After micro-step 0 the arena holds the gradient of B_small = its items alone
// (Note [Overwrite first]; slots that micro-step did not reach are zeroed
// first so that no stale gradient enters); at close it holds the window's,
// over B_big = N items. With |G_B|^2 the squared norm of the mean gradient of
// B items (unscaled), the unbiased estimators are
//   |G|^2     = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
//   tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)
// and B_simple = tr(Sigma) / |G|^2 estimates the critical batch size. Each
// estimate is noisy, so both are smoothed with an EMA (bias-corrected when
// reported) before their ratio is taken. Everything stays on the device
// (WindowField kNoise*) and is read with report(). Under data parallelism
// micro-step 0 is this rank's alone and the window's N is global, which is
// the same pair of batch sizes. Needs K >= 2 and item-count normalization;
// windows whose estimates are not finite (a skipped window) are left out.
#pragma once

#include <cstdint>

#include "accrue/autograd/grad_arena.h"

namespace accrue::optim {

class NoiseScale {
 public:
  // every: measure one window in `every`; ema: the EMAs' decay in [0, 1).
  NoiseScale(const GradArena& arena, int64_t every, double ema);

  bool measures(int64_t window) const { return window % every_ == 0; }
  // After micro-step 0's backward of a measured window.
  void after_first_micro_step(GradArena& arena, const Tensor& state);
  // At close, after the scalar step (kGradNorm, the global kItems), before kItems resets.
  void after_close(const Tensor& state) const;
  double ema() const { return ema_; }

 private:
  int64_t every_;
  double ema_;
  Tensor partials_;  // the extra norm pass's rows
};

}  // namespace accrue::optim
