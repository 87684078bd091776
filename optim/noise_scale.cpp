#include "accrue/optim/noise_scale.h"

#include <cmath>

#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "accrue/kernels/window_close.h"

namespace accrue::optim {

namespace {

using kernels::BinaryOp;

Tensor field(const Tensor& state, int f) {
  return state.narrow(0, f, 1).reshape({});
}
Tensor op(BinaryOp o, const Tensor& a, const Tensor& b) {
  return kernels::binary(o, a, b);
}
Tensor op(BinaryOp o, const Tensor& a, double s, bool scalar_first = false) {
  return kernels::binary_scalar(o, a, s, scalar_first);
}
// x - x is 0 exactly when x is finite.
Tensor finite(const Tensor& x) {
  return kernels::compare(kernels::CompareOp::Eq, op(BinaryOp::Sub, x, x),
                          op(BinaryOp::Mul, x, 0.0));
}

}  // namespace

NoiseScale::NoiseScale(const GradArena& arena, int64_t every, double ema)
    : every_(every), ema_(ema) {
  ACCRUE_CHECK(every >= 1, "NoiseScale: measure every n >= 1 windows, got ", every);
  ACCRUE_CHECK(ema >= 0.0 && ema < 1.0, "NoiseScale: ema = ", ema, " must lie in [0, 1)");
  partials_ =
      empty({kernels::norm_partials_rows(arena.grads()), 2}, DType::f64, arena.options().device());
}

void NoiseScale::after_first_micro_step(GradArena& arena, const Tensor& state) {
  NoGradGuard no_grad;
  arena.zero_unwritten();  // no stale gradient in |G_small|^2
  kernels::grad_norm_partials(arena.grads(), partials_);
  const Tensor sumsq = kernels::sum(partials_.narrow(1, 0, 1));
  const Tensor scale = field(state, kernels::kScale);
  field(state, kernels::kNoiseSmall)
      .copy_(op(BinaryOp::Div, sumsq, op(BinaryOp::Mul, scale, scale)).reshape({}));
  field(state, kernels::kNoiseSmallItems).copy_(field(state, kernels::kItems));
}

void NoiseScale::after_close(const Tensor& state) const {
  NoGradGuard no_grad;
  const Tensor b_small = field(state, kernels::kNoiseSmallItems);
  const Tensor b_big = field(state, kernels::kItems);
  // |G_small|^2: the sum's squared norm over B_small^2; |G_big|^2: the close's norm squared.
  const Tensor small =
      op(BinaryOp::Div, field(state, kernels::kNoiseSmall), op(BinaryOp::Mul, b_small, b_small));
  const Tensor norm = field(state, kernels::kGradNorm);
  const Tensor big = op(BinaryOp::Mul, norm, norm);
  const Tensor grad_sq =
      op(BinaryOp::Div,
         op(BinaryOp::Sub, op(BinaryOp::Mul, b_big, big), op(BinaryOp::Mul, b_small, small)),
         op(BinaryOp::Sub, b_big, b_small));
  const Tensor trace = op(BinaryOp::Div, op(BinaryOp::Sub, small, big),
                          op(BinaryOp::Sub, op(BinaryOp::Div, b_small, 1.0, true),
                             op(BinaryOp::Div, b_big, 1.0, true)));
  // A sum is finite only when all three are (a skipped window's norm is not).
  const Tensor ok = finite(op(BinaryOp::Add, op(BinaryOp::Add, grad_sq, trace), norm));
  auto update = [&](int f, const Tensor& estimate) {
    const Tensor old = field(state, f);
    const Tensor smoothed =
        op(BinaryOp::Add, op(BinaryOp::Mul, old, ema_), op(BinaryOp::Mul, estimate, 1.0 - ema_));
    old.copy_(kernels::where(ok, smoothed, old).reshape({}));
  };
  update(kernels::kNoiseGradSq, grad_sq);
  update(kernels::kNoiseTrace, trace);
  const Tensor count = field(state, kernels::kNoiseWindows);
  count.copy_(kernels::where(ok, op(BinaryOp::Add, count, 1.0), count).reshape({}));
}

}  // namespace accrue::optim
