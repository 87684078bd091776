// The backend side of the window close (kernels/window_close.h): the functions
// that kernels/cpu/window_close.cpp and kernels/cuda/window_close_*.cu implement
// (listed in kernels/window_close_functions.inc), and the formulas both share.
// Private to kernels/.
//
// The scalar step and the per-element optimizer updates are written once here,
// as ACCRUE_HD functions: the CPU reference loops over them and the CUDA
// kernels inline them, so both backends round the same operations in the same
// order (the GPU may still fuse a multiply-add: they agree to about an ulp).
// window_close.cpp has validated everything before a backend is called.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "accrue/core/host_device.h"
#include "accrue/kernels/backend_fn.h"
#include "accrue/kernels/window_close.h"

namespace accrue::kernels {

// ---- (b) the scalar step ------------------------------------------------------------------

// Note [Window scalar step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// One thread folds the norm partials in row order (so the result is fixed by
// the rows: Note [Norm partials], kernels/cuda/window_close_norm.cu) and updates
// the window state:
//   found_inf  = any non-finite gradient element, or a non-finite sum of squares;
//   scale_used = state[kScale] (1 when the scaler mode is None);
//   inv_N      = 1 / state[kItems] (ItemCount) or 1 / micro_steps (legacy mean of
//                means). A window that counted no item (kItems <= 0) gets inv_N = 0:
//                its coefficient is 0 and the step still happens (AdamW still
//                decays, moments still age), exactly as if every gradient were 0.
//                It is not a skip: nothing non-finite was seen;
//   norm       = sqrt(sumsq) / scale_used * inv_N: the norm of the unscaled,
//                normalized gradient (what torch.nn.utils.clip_grad_norm_ sees);
//   clip       = max_norm > 0 ? min(1, max_norm / (norm + clip_eps)) : 1;
//   coef       = (1 / scale_used) * inv_N * clip: the one factor the optimizer
//                applies to the raw gradient.
// A clean window writes kFoundInf = 0 and counts a step. A non-finite one
// writes kFoundInf = 1, counts a skipped window, keeps the step count, and
// writes coef = 0; kGradNorm then holds the non-finite norm as computed and
// kClipCoef the formula's value for it. Non-finite gradients skip the step in
// every scaler mode (None included): applying them would ruin the weights.
// The dynamic scale moves exactly as torch.amp.GradScaler's update
// (_amp_update_scale_), with the scale kept in [min_scale, max_scale]:
//   found_inf: scale = max(scale * backoff, min_scale), tracker = 0;
//   else:      tracker += 1; when it reaches growth_interval,
//              scale = min(scale * growth, max_scale) (kept only if finite), tracker = 0.
// Static and None modes leave kScale and kGrowthTracker as they are.
ACCRUE_HD void window_scalar_update(const double* partials, int64_t rows, double* state,
                                    const CloseConfig& config) {
  double sumsq = 0.0, nonfinite = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    sumsq += partials[2 * r];
    nonfinite += partials[2 * r + 1];
  }
  // A non-finite N is a skip too: Note [Deferred index checks] marks a window
  // that saw a bad index with N = NaN (summed over ranks, so all ranks agree).
  const bool found_inf = nonfinite > 0.0 || !std::isfinite(sumsq) || !std::isfinite(state[kItems]);

  const double scale = state[kScale];
  const double scale_used = config.scaler.scaled ? scale : 1.0;
  double inv_n = 1.0 / static_cast<double>(config.micro_steps);
  if (config.normalization == Normalization::ItemCount) {
    const double items = state[kItems];
    inv_n = items > 0.0 ? 1.0 / items : 0.0;
  }
  const double norm = std::sqrt(sumsq) / scale_used * inv_n;
  double clip = 1.0;
  if (config.max_norm > 0.0) {
    const double ratio = config.max_norm / (norm + config.clip_eps);
    clip = ratio < 1.0 ? ratio : 1.0;
  }
  state[kGradNorm] = norm;
  state[kClipCoef] = clip;

  const bool dynamic = config.scaler.dynamic;
  if (found_inf) {
    state[kFoundInf] = 1.0;
    state[kCoef] = 0.0;
    state[kSkippedWindows] += 1.0;
    if (dynamic) {
      const double backed_off = scale * config.scaler.backoff_factor;
      state[kScale] = backed_off > config.scaler.min_scale ? backed_off : config.scaler.min_scale;
      state[kGrowthTracker] = 0.0;
    }
    return;
  }
  state[kFoundInf] = 0.0;
  state[kCoef] = (1.0 / scale_used) * inv_n * clip;
  state[kStep] += 1.0;
  if (dynamic) {
    const double clean = state[kGrowthTracker] + 1.0;
    if (clean >= static_cast<double>(config.scaler.growth_interval)) {
      const double grown = scale * config.scaler.growth_factor;
      const double capped = grown < config.scaler.max_scale ? grown : config.scaler.max_scale;
      if (std::isfinite(capped)) state[kScale] = capped;
      state[kGrowthTracker] = 0.0;
    } else {
      state[kGrowthTracker] = clean;
    }
  }
}

// ---- (c) the optimizer element update -----------------------------------------------------

// The optimizer's hyperparameters in the math type M (float for f32 params,
// double for f64), rounded once from the config's doubles. Plain data: the
// CUDA kernel takes it by value (__grid_constant__).
template <class M>
struct OptimizerParams {
  bool decoupled_weight_decay;
  int groups;
  // Per group, in double: Adam's step size lr / (1 - beta1^t) and AdamW's
  // decay 1 - lr * weight_decay are formed in double, as torch does.
  double lr[kMaxGroups];
  double weight_decay[kMaxGroups];
  double beta1, beta2;  // in double for the bias corrections beta^t
  M b1, one_minus_b1, b2, one_minus_b2, eps;
  bool amsgrad;
  M momentum, one_minus_dampening;
  bool nesterov;
  // Note [Hyperparameters on the device]: when set, lr and weight_decay come from here.
  const double* hyper;
};

template <class M>
OptimizerParams<M> make_optimizer_params(const OptimizerConfig& c) {
  OptimizerParams<M> o{};
  o.decoupled_weight_decay = c.decoupled_weight_decay;
  o.groups = static_cast<int>(c.groups.size());
  for (int k = 0; k < o.groups; ++k) {
    o.lr[k] = c.groups[k].lr;
    o.weight_decay[k] = c.groups[k].weight_decay;
  }
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.b1 = static_cast<M>(c.beta1);
  o.one_minus_b1 = static_cast<M>(1.0 - c.beta1);
  o.b2 = static_cast<M>(c.beta2);
  o.one_minus_b2 = static_cast<M>(1.0 - c.beta2);
  o.eps = static_cast<M>(c.eps);
  o.amsgrad = c.amsgrad;
  o.momentum = static_cast<M>(c.momentum);
  o.one_minus_dampening = static_cast<M>(1.0 - c.dampening);
  o.nesterov = c.nesterov;
  o.hyper = nullptr;
  return o;
}

// Which optional buffers an optimizer reads and writes.
inline bool uses_exp_avg(const OptimizerConfig& c) {
  return c.adam || c.momentum != 0.0;
}
inline bool uses_exp_avg_sq(const OptimizerConfig& c) {
  return c.adam;
}
inline bool uses_max_exp_avg_sq(const OptimizerConfig& c) {
  return c.adam && c.amsgrad;
}

// A group's per-step scalars.
template <class M>
struct GroupScalars {
  M lr;
  M weight_decay;
  M decay;      // AdamW: 1 - lr * weight_decay
  M step_size;  // Adam/AdamW: lr / (1 - beta1^t)
};

// What the state gives a step: read once (per CUDA block), after the scalar step.
template <class M>
struct StepScalars {
  M coef;                   // state[kCoef]: inv_scale * inv_N * clip
  bool first_step;          // t == 1: SGD's momentum buffer starts as d (torch: buf is None)
  M bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  GroupScalars<M> group[kMaxGroups];
  double lr[kMaxGroups];  // each group's lr in double, for a slot's own step size
};

// What one element's update reads: the window's scalars and its group's.
template <class M>
struct UpdateScalars {
  M coef;
  bool first_step;
  M bias_correction2_sqrt;
  GroupScalars<M> group;
};

template <class M>
ACCRUE_HD UpdateScalars<M> window_scalars(const StepScalars<M>& s, int group) {
  return {s.coef, s.first_step, s.bias_correction2_sqrt, s.group[group]};
}

// Note [Unused parameters]: a slot's own step count (row = its slot_steps row:
// t, 1 - beta1^t, sqrt(1 - beta2^t)) in place of the window's, rounded as
// make_step_scalars rounds the window's.
template <class M>
ACCRUE_HD UpdateScalars<M> slot_scalars(const StepScalars<M>& s, int group, const double* row) {
  UpdateScalars<M> u = window_scalars(s, group);
  u.first_step = row[0] == 1.0;
  u.bias_correction2_sqrt = static_cast<M>(row[2]);
  u.group.step_size = static_cast<M>(s.lr[group] / row[1]);
  return u;
}

// A slot's step: t += 1 and its bias corrections, formed in double as
// make_step_scalars forms the window's.
ACCRUE_HD void advance_slot_row(double beta1, double beta2, double* row) {
  const double t = row[0] + 1.0;
  row[0] = t;
  row[1] = 1.0 - std::pow(beta1, t);
  row[2] = std::sqrt(1.0 - std::pow(beta2, t));
}

// The bias corrections in double from t = state[kStep], as torch's Adam and
// fused Adam form them, then rounded to M. Written in place: the CUDA kernel
// fills its block's shared copy.
template <class M>
ACCRUE_HD void make_step_scalars(const OptimizerParams<M>& o, const double* state,
                                 StepScalars<M>& s) {
  const double t = state[kStep];
  s.coef = static_cast<M>(state[kCoef]);
  s.first_step = t == 1.0;
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  s.bias_correction2_sqrt = static_cast<M>(std::sqrt(bias_correction2));
  for (int k = 0; k < o.groups; ++k) {
    const double lr = o.hyper ? o.hyper[2 * k] : o.lr[k];
    const double wd = o.hyper ? o.hyper[2 * k + 1] : o.weight_decay[k];
    s.group[k].lr = static_cast<M>(lr);
    s.group[k].weight_decay = static_cast<M>(wd);
    s.group[k].decay = static_cast<M>(1.0 - lr * wd);
    s.group[k].step_size = static_cast<M>(lr / bias_correction1);
    s.lr[k] = lr;
  }
}

// torch.optim.SGD on one element; buf is the momentum buffer (untouched without momentum).
template <class M>
ACCRUE_HD void sgd_update(const OptimizerParams<M>& o, const UpdateScalars<M>& s, M grad, M& p,
                          M& buf) {
  const GroupScalars<M>& gs = s.group;
  M d = grad * s.coef;
  if (gs.weight_decay != M(0)) d = d + gs.weight_decay * p;
  if (o.momentum != M(0)) {
    buf = s.first_step ? d : o.momentum * buf + o.one_minus_dampening * d;
    d = o.nesterov ? d + o.momentum * buf : buf;
  }
  p = p - gs.lr * d;
}

// torch.optim.Adam / AdamW on one element, in the operation order of PyTorch's
// fused Adam CUDA kernel (fused=True); vmax is read and written only with amsgrad.
template <class M>
ACCRUE_HD void adam_update(const OptimizerParams<M>& o, const UpdateScalars<M>& s, M grad, M& p,
                           M& m, M& v, M& vmax) {
  const GroupScalars<M>& gs = s.group;
  M g = grad * s.coef;
  if (gs.weight_decay != M(0)) {
    if (o.decoupled_weight_decay) {
      p = p * gs.decay;
    } else {
      g = g + gs.weight_decay * p;
    }
  }
  m = o.b1 * m + o.one_minus_b1 * g;
  v = o.b2 * v + o.one_minus_b2 * g * g;
  M v_hat = v;
  if (o.amsgrad) {
    vmax = vmax < v ? v : vmax;
    v_hat = vmax;
  }
  const M denom = std::sqrt(v_hat) / s.bias_correction2_sqrt + o.eps;
  p = p - gs.step_size * m / denom;
}

// ---- the backends -------------------------------------------------------------------------
//
// grads, partials, state and every buffer are contiguous and on one device;
// grads and params are f32 or f64; partials f64 [rows, 2]; state f64
// [kWindowStateSize]; numel > 0 for the optimizer step.

// The hyper buffer's values for a config: group k's (lr, weight decay) at 2k, 2k + 1.
struct HyperValues {
  double v[kHyperSize];
};
inline HyperValues hyper_values(const OptimizerConfig& c) {
  HyperValues h{};
  for (size_t k = 0; k < c.groups.size(); ++k) {
    h.v[2 * k] = c.groups[k].lr;
    h.v[2 * k + 1] = c.groups[k].weight_decay;
  }
  return h;
}

// Note [Scale calibration]: the new state[kScale] and state[kGrowthTracker].
inline constexpr double kF16Max = 65504.0;
ACCRUE_HD void calibrate_scale_update(double amax, double* state, ScalerConfig scaler,
                                      double scale_used, double margin) {
  if (state[kFoundInf] != 0.0) return;
  if (!(amax > 0.0) || !std::isfinite(amax)) return;
  const double target = kF16Max / (amax / scale_used * margin);
  double scale = std::exp2(std::floor(std::log2(target)));
  if (scale > scaler.max_scale) scale = scaler.max_scale;
  if (scale < scaler.min_scale) scale = scaler.min_scale;
  state[kScale] = scale;
  state[kGrowthTracker] = 0.0;
}

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/window_close_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/window_close_functions.inc"
}  // namespace accrue::kernels::cuda
