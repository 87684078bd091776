#include "accrue/nn/batch_norm.h"

#include <cmath>

#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/batch_norm.h"
#include "accrue/kernels/ops.h"

namespace accrue::nn {

BatchNorm::BatchNorm(int64_t channels, const ParamOptions& params, const BatchNormOptions& options)
    : channels_(channels), options_(options) {
  ACCRUE_CHECK(channels > 0, "BatchNorm: channels must be > 0, got ", channels);
  ACCRUE_CHECK(options.eps > 0.0, "BatchNorm: eps must be > 0, got ", options.eps);
  ACCRUE_CHECK(options.momentum > 0.0 && options.momentum <= 1.0,
               "BatchNorm: momentum must lie in (0, 1], got ", options.momentum);
  weight_ = register_parameter("weight", full({channels}, 1.0, params.dtype, params.device));
  bias_ = register_parameter("bias", zeros({channels}, params.dtype, params.device));
  // Note [BatchNorm in f32]: f64 on purpose, whatever the model's dtype.
  const auto f64_state = BufferOptions().keep_dtype(true);
  running_mean_ =
      register_buffer("running_mean", zeros({channels}, DType::f64, params.device), f64_state);
  running_var_ =
      register_buffer("running_var", full({channels}, 1.0, DType::f64, params.device), f64_state);
  pending_count_ =
      register_buffer("pending_count", zeros({1}, DType::f64, params.device), f64_state);
  pending_mean_ =
      register_buffer("pending_mean", zeros({channels}, DType::f64, params.device), f64_state);
  pending_m2_ =
      register_buffer("pending_m2", zeros({channels}, DType::f64, params.device), f64_state);
}

std::vector<int64_t> BatchNorm::reduce_dims(const Tensor& x) const {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < x.dim(); ++d)
    dims.push_back(d);
  return dims;
}

void BatchNorm::move_running(const Tensor& mean, const Tensor& unbiased_var) {
  const double m = options_.momentum;
  running_mean_.copy_(running_mean_ * (1.0 - m) + mean * m);
  running_var_.copy_(running_var_ * (1.0 - m) + unbiased_var * m);
}

Tensor BatchNorm::forward(const Tensor& x) {
  const NvtxRange range("accrue BatchNorm forward");  // Note [NVTX ranges]
  ACCRUE_CHECK(x.defined() && x.dim() >= 2 && x.size(1) == channels_, "BatchNorm: input of shape ",
               x.defined() ? shape_str(x.shape()) : "(undefined)", " for ", channels_,
               " channels (expected [N, ", channels_, ", ...])");
  ACCRUE_CHECK(x.device() == weight_.device(), "BatchNorm: input on ", x.device().str(),
               ", parameters on ", weight_.device().str());
  Shape per_channel(static_cast<size_t>(x.dim()), 1);
  per_channel[1] = channels_;
  auto w = [&] { return reshape(weight_, per_channel); };
  auto b = [&] { return reshape(bias_, per_channel); };
  const double eps = options_.eps;
  // Note [BatchNorm in f32]: 16-bit inputs are normalized in f32.
  const bool narrow_float = x.dtype() == DType::bf16 || x.dtype() == DType::f16;
  auto widened = [&] { return narrow_float ? to_dtype(x, DType::f32) : x; };
  if (!training()) {
    const Tensor xs = widened();
    const Tensor mean = running_mean_.to(xs.dtype()).reshape(per_channel);
    const Tensor var = running_var_.to(xs.dtype()).reshape(per_channel);
    Tensor normalized = (xs - mean) / sqrt(var + eps);
    if (narrow_float) normalized = to_dtype(normalized, x.dtype());
    return normalized * w() + b();
  }
  const int64_t n = x.numel() / channels_;
  ACCRUE_CHECK(n > 1, "BatchNorm: training needs more than one value per channel, got ", n,
               " in an input of shape ", shape_str(x.shape()));
  if (options_.sync == nullptr) {
    // Note [Fused batch norm]: one node, x and two [C] vectors saved.
    const BatchNormResult r = batch_norm(x, weight_, bias_, eps);
    // Note [Window statistics]: record this micro-batch's statistics, on the
    // device; inside a group of micro-steps in flight, at the group's end
    // (Note [Concurrent micro-batches]).
    if (in_group_) {
      kept_.push_back({r.mean, r.var, n});
    } else {
      record_statistics(r.mean, r.var, n);
    }
    return r.out;
  }

  // sync: the values per channel behind the statistics are all ranks'.
  const std::vector<int64_t> dims = reduce_dims(x);
  Tensor count = full({1}, static_cast<double>(n), DType::f64, x.device());
  const Tensor xs = widened();
  StatisticsSync& sync = *options_.sync;
  {
    NoGradGuard no_grad;
    sync.all_reduce_sum(count);
  }
  const Tensor total_count = count.to(xs.dtype()).reshape({});
  const Tensor mean = all_reduce_sum(sum(xs, dims, /*keepdim=*/true), sync) / total_count;
  const Tensor centered = xs - mean;
  const Tensor var =
      all_reduce_sum(sum(centered * centered, dims, /*keepdim=*/true), sync) / total_count;
  Tensor normalized = centered / sqrt(var + eps);
  if (narrow_float) normalized = to_dtype(normalized, x.dtype());
  const Tensor y = normalized * w() + b();

  // Note [Window statistics]: record this micro-batch's statistics, on the device.
  NoGradGuard no_grad;
  const Tensor batch_mean = detach(mean).reshape({channels_}).to(DType::f64);
  const Tensor batch_var = detach(var).reshape({channels_}).to(DType::f64);  // biased
  const Tensor nb = count.expand({channels_});
  if (options_.statistics == BatchNormStatistics::PerMicroBatch) {
    move_running(batch_mean, batch_var * (nb / (nb - 1.0)));
    return y;
  }
  const Tensor na = pending_count_.expand({channels_});
  const Tensor total = na + nb;
  const Tensor delta = batch_mean - pending_mean_;
  const Tensor merged_mean = pending_mean_ + delta * nb / total;
  const Tensor merged_m2 = pending_m2_ + batch_var * nb + delta * delta * na * nb / total;
  pending_mean_.copy_(merged_mean);
  pending_m2_.copy_(merged_m2);
  pending_count_.copy_(pending_count_ + count);
  ++pending_forwards_;
  return y;
}

void BatchNorm::record_statistics(const Tensor& mean, const Tensor& var, int64_t n) {
  NoGradGuard no_grad;
  if (options_.statistics == BatchNormStatistics::PerMicroBatch) {
    move_running(mean.to(DType::f64), var.to(DType::f64) * (static_cast<double>(n) / (n - 1)));
    return;
  }
  kernels::batch_norm_merge_statistics(pending_count_, pending_mean_, pending_m2_, mean, var,
                                       static_cast<double>(n));
  ++pending_forwards_;
}

void BatchNorm::on_group_begin() {
  kept_.clear();
  in_group_ = true;
}

void BatchNorm::on_group_end() {
  in_group_ = false;
  for (const Kept& k : kept_)
    record_statistics(k.mean, k.var, k.n);
  kept_.clear();
}

void BatchNorm::on_group_abandon() {
  in_group_ = false;
  kept_.clear();
}

void BatchNorm::adopt_pending(double momentum) {
  // One launch (kernels::batch_norm_adopt_statistics): no forward since the
  // last adoption (count 0) leaves the running statistics alone; the test is
  // on the device, the host never looks. The pending statistics restart.
  kernels::batch_norm_adopt_statistics(running_mean_, running_var_, pending_count_, pending_mean_,
                                       pending_m2_, momentum);
  pending_forwards_ = 0;
}

void BatchNorm::on_window_close() {
  if (options_.statistics != BatchNormStatistics::Window) return;
  const double m = options_.momentum;
  adopt_pending(options_.compound_momentum && pending_forwards_ > 0
                    ? 1.0 - std::pow(1.0 - m, static_cast<double>(pending_forwards_))
                    : m);
}

const char* BatchNorm::why_not_capturable() const {
  if (options_.sync != nullptr) return "BatchNorm's statistics sync all-reduces from the host";
  if (options_.statistics == BatchNormStatistics::Window && options_.compound_momentum)
    return "BatchNorm's compound_momentum counts its forwards on the host";
  return nullptr;
}

void BatchNorm::begin_recompute() {
  saved_statistics_ = options_.statistics;
  options_.statistics = BatchNormStatistics::Window;
  on_window_restart();
}

void BatchNorm::end_recompute(bool adopt) {
  options_.statistics = saved_statistics_;
  if (adopt) {
    adopt_pending(1.0);
  } else {
    on_window_restart();
  }
}

void recompute_batch_norm_statistics(Module& model, const std::function<void()>& run_batches) {
  std::vector<BatchNorm*> layers;
  for (Module* m : model.modules())
    if (auto* bn = dynamic_cast<BatchNorm*>(m)) layers.push_back(bn);
  ACCRUE_CHECK(!layers.empty(), "recompute_batch_norm_statistics: the model has no BatchNorm");
  const bool was_training = model.training();
  // Restores the modes however run_batches() ends; the statistics move only if it returns.
  struct Restore {
    Module& model;
    bool training;
    std::vector<BatchNorm*>& layers;
    bool done = false;
    ~Restore() {
      if (!done)
        for (BatchNorm* bn : layers)
          bn->end_recompute(/*adopt=*/false);
      model.train(training);
    }
  } restore{model, was_training, layers};
  for (BatchNorm* bn : layers)
    bn->begin_recompute();
  model.train(true);
  {
    NoGradGuard no_grad;
    run_batches();
  }
  for (size_t i = 0; i < layers.size(); ++i)
    ACCRUE_CHECK(layers[i]->pending_finite(), "recompute_batch_norm_statistics: BatchNorm ", i,
                 " of ", layers.size(),
                 " saw statistics that are not finite over the batches run (a NaN or infinite "
                 "input?); the running statistics are left as they were");
  for (BatchNorm* bn : layers)
    bn->end_recompute(/*adopt=*/true);
  restore.done = true;
}

bool BatchNorm::pending_finite() const {
  for (const Tensor& t : {pending_mean_, pending_m2_})
    for (double v : t.to(Device::cpu()).to_vector<double>())
      if (!std::isfinite(v)) return false;
  return true;
}

void BatchNorm::on_window_restart() {
  pending_forwards_ = 0;
  pending_count_.fill_(0.0);
  pending_mean_.fill_(0.0);
  pending_m2_.fill_(0.0);
}

}  // namespace accrue::nn
