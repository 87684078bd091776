#include "accrue/optim/fp8_scaling.h"

#include <limits>

#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/fp8.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"

namespace accrue::optim {

namespace {

// Row i's scale, scale_inv and window amax, as f32 [1] views.
Fp8ScaleRow row_of(const Tensor& state, int64_t i) {
  const Tensor row = state.select(0, i);
  return {row.narrow(0, 0, 1), row.narrow(0, 1, 1), row.narrow(0, 2, 1)};
}

}  // namespace

Fp8DelayedScaling::Fp8DelayedScaling(const std::vector<std::pair<size_t, std::string>>& layers,
                                     const Fp8DelayedOptions& options, Device device)
    : options_(options) {
  const char* op = "ParamStore::keep_fp8_delayed_scaling";
  ACCRUE_CHECK(options.history() >= 1 && options.history() <= 1024, op, ": history ",
               options.history(), " is outside [1, 1024]");
  // The margins fp8_delayed_scale_update takes (Note [FP8 scaling]).
  ACCRUE_CHECK(options.margin() >= 0 && options.margin() <= 6, op, ": margin ", options.margin(),
               " is outside [0, 6]");
  ACCRUE_CHECK(is_fp8(options.x_dtype()) && is_fp8(options.dy_dtype()), op, ": dtypes ",
               dtype_name(options.x_dtype()), " and ", dtype_name(options.dy_dtype()),
               " must be FP8 dtypes (f8e4m3 or f8e5m2)");
  ACCRUE_CHECK(!layers.empty(), op, ": no weights given");
  const auto n = static_cast<int64_t>(layers.size());
  NoGradGuard no_grad;
  // scale 1, scale_inv 1, window amax 0, history 0: what the first close overwrites.
  x_state_ = zeros({n, 3 + options.history()}, DType::f32, device);
  x_state_.narrow(1, 0, 2).fill_(1.0);
  dy_state_ = x_state_.clone();
  rows_.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      ACCRUE_CHECK(layers[j].first != layers[i].first, op, ": '", layers[i].second,
                   "' is given twice");
    slots_.push_back(layers[i].first);
    const auto r = static_cast<int64_t>(i);
    rows_.push_back({row_of(x_state_, r), row_of(dy_state_, r), options.x_dtype(),
                     options.dy_dtype(), options.margin(), &calibrated_});
  }
}

const Fp8DelayedRows* Fp8DelayedScaling::find(size_t slot) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i] == slot) return &rows_[i];
  return nullptr;
}

void Fp8DelayedScaling::update(const std::function<void(const Tensor&)>& max_over_ranks) {
  if (max_over_ranks) {
    NoGradGuard no_grad;
    const int64_t n = x_state_.numel();
    Tensor both = kernels::cat({x_state_.reshape({-1}), dy_state_.reshape({-1})}, 0);
    // NaN as infinity: a max over ranks may drop a NaN, not an infinity. In f64, as the
    // syncs' collectives take it (GradientSync::all_reduce_max).
    both = kernels::where(kernels::compare(kernels::CompareOp::Ne, both, both),
                          std::numeric_limits<double>::infinity(), both)
               .to(DType::f64);
    max_over_ranks(both);
    x_state_.copy_(both.narrow(0, 0, n).reshape(x_state_.shape()));
    dy_state_.copy_(both.narrow(0, n, n).reshape(dy_state_.shape()));
  }
  kernels::fp8_delayed_scale_update(x_state_, options_.x_dtype(), options_.margin());
  kernels::fp8_delayed_scale_update(dy_state_, options_.dy_dtype(), options_.margin());
  calibrated_ = true;
}

int64_t Fp8DelayedScaling::bytes() const {
  return 4 * (x_state_.numel() + dy_state_.numel());
}

}  // namespace accrue::optim
