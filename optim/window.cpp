#include "accrue/optim/window.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/ops.h"
#include "accrue/optim/layer_steps.h"

namespace accrue::optim {

namespace {
// Note [Scale calibration]: the scale the calibrated first window runs at.
constexpr double kCalibrationScale = 1.0;
}  // namespace

const char* unused_parameters_name(UnusedParameters policy) {
  switch (policy) {
    case UnusedParameters::step_with_zero:
      return "step_with_zero";
    case UnusedParameters::skip:
      return "skip";
  }
  return "unknown";
}

const char* unused_parameter_check_name(UnusedParameterCheck check) {
  switch (check) {
    case UnusedParameterCheck::warn:
      return "warn";
    case UnusedParameterCheck::error:
      return "error";
    case UnusedParameterCheck::ignore:
      return "ignore";
  }
  return "unknown";
}

namespace {

// Note [Unused parameters]: how many names one message spells out.
constexpr size_t kUnusedNamesShown = 10;

void check_options(const WindowOptions& options) {
  ACCRUE_CHECK(options.micro_steps() >= 1, "Window: micro_steps must be >= 1, got ",
               options.micro_steps());
  ACCRUE_CHECK(std::isfinite(options.max_grad_norm()), "Window: invalid max_grad_norm ",
               options.max_grad_norm());
  options.scaler().validate();
  const auto policy = static_cast<int>(options.unused_parameters());
  ACCRUE_CHECK(options.unused_parameters() == UnusedParameters::step_with_zero ||
                   options.unused_parameters() == UnusedParameters::skip,
               "Window: unknown unused_parameters policy ", policy,
               "; expected UnusedParameters::step_with_zero (0) or UnusedParameters::skip (1)");
  const auto check = static_cast<int>(options.unused_parameter_check());
  ACCRUE_CHECK(check >= 0 && check <= 2, "Window: unknown unused_parameter_check ", check,
               "; expected UnusedParameterCheck::warn (0), error (1) or ignore (2)");
  ACCRUE_CHECK(!options.close_steps_on_first_read() || options.close_under_forward(),
               "Window: close_steps_on_first_read is close_under_forward's test mode; turn "
               "close_under_forward on");
  if (options.noise_scale_every() > 0)
    ACCRUE_CHECK(
        options.micro_steps() >= 2 && options.normalization() == kernels::Normalization::ItemCount,
        "Window: the gradient noise scale needs K >= 2 micro-steps and item-count "
        "normalization (K = ",
        options.micro_steps(), ")");
}

// The device state and configuration the close's stages act on (Note [Close stages]).
std::unique_ptr<CloseContext> make_context(ParamStore& store, Optimizer& optimizer,
                                           const WindowOptions& options, GradientSync* sync) {
  auto ctx = std::make_unique<CloseContext>();
  CloseContext& c = *ctx;
  c.store = &store;
  c.optimizer = &optimizer;
  c.sync = sync;
  c.config.scaler = options.scaler().config();
  c.config.normalization = options.normalization();
  // Legacy mean-of-means divides the summed per-micro-batch means by every
  // micro-batch of the window, on every rank.
  c.config.micro_steps = options.micro_steps() * (sync ? sync->world_size() : 1);
  c.config.max_norm = options.max_grad_norm();
  const Device device = store.options().device();
  // Note [Scale calibration]: a calibrated scaler runs its first window at kCalibrationScale.
  const double initial = options.scaler().mode() == ScalerMode::None ? 1.0
                         : options.scaler().calibrates()             ? kCalibrationScale
                                                         : options.scaler().init_scale();
  c.state = kernels::make_window_state(initial, device);
  if (sync) c.ranges = sync->owned_ranges();
  if (c.sharded()) {
    int64_t packed = 0;
    for (const ArenaRange& r : c.ranges)
      packed += r.numel;
    ACCRUE_CHECK(store.options().moments() == 0 || store.moment_numel() == packed,
                 "Window: the sync owns ", packed, " elements of the arena but its moments hold ",
                 store.moment_numel(), " (construct the sync on this store before the Window)");
    // Note [ZeRO-1]: partial rows per owned range; the ranges have the same
    // sizes on every rank, so every rank's block has the same rows.
    int64_t rows = 0;
    for (const ArenaRange& r : c.ranges)
      rows += kernels::norm_partials_rows(store.grads().narrow(0, r.offset, r.numel));
    c.local_partials = empty({rows, 2}, DType::f64, device);
    c.partials = empty({sync->world_size() * rows, 2}, DType::f64, device);
  } else {
    c.partials = empty({kernels::norm_partials_rows(store.grads()), 2}, DType::f64, device);
  }
  c.loss_sum = zeros({}, DType::f64, device);
  c.last = zeros({CloseContext::kLastSize}, DType::f64, device);
  // Note [Unused parameters]
  if (options.unused_parameters() == UnusedParameters::skip) {
    c.slots = make_slot_tables(store);
    c.used_flags = c.slots.used;
  } else if (sync && options.unused_parameter_check() != UnusedParameterCheck::ignore) {
    c.used_flags = zeros({static_cast<int64_t>(store.size())}, DType::f64, device);
  }
  return ctx;
}

CloseFeatures features_of(const WindowOptions& options, const GradientSync* sync,
                          const ParamStore& store) {
  CloseFeatures f;
  f.fp8_copies = store.has_fp8_copies();
  f.fp8_scaling = store.has_fp8_delayed_scaling();
  f.skips_unused = options.unused_parameters() == UnusedParameters::skip;
  f.checks_unused_world =
      sync != nullptr && options.unused_parameter_check() != UnusedParameterCheck::ignore;
  f.norm_under_backward = options.norm_under_backward();
  f.noise_every = options.noise_scale_every();
  f.noise_ema = options.noise_scale_ema();
  f.calibrate = options.scaler().calibrates();
  f.calibration_scale = kCalibrationScale;
  f.calibration_margin = options.scaler().calibration_margin();
  f.close_under_forward = options.close_under_forward();
  f.close_layer_elements = options.close_layer_elements();
  f.close_max_blocks = options.close_max_blocks();
  f.close_steps_on_first_read = options.close_steps_on_first_read();
  return f;
}

}  // namespace

Window::Window(ParamStore& store, Optimizer& optimizer, const WindowOptions& options,
               GradientSync* sync)
    : store_(store), optimizer_(optimizer), options_(options), sync_(sync) {
  check_options(options);
  ctx_ = make_context(store, optimizer, options, sync);
  index_checks_ = std::make_unique<kernels::DeferredIndexChecks>(store.options().device(),
                                                                 field(kernels::kItems));
  const CloseFeatures features = features_of(options, sync, store);
  stages_ = make_close_stages(*ctx_, features);
  keeps_fp8_copies_ = features.fp8_copies;
  keeps_fp8_scaling_ = features.fp8_scaling;
  optimizer_.bind(store);
  // Note [Window FP8 weights]: from the weights as they start (a data-parallel
  // sync has broadcast rank 0's by now).
  store.refresh_fp8_copies();
}

void Window::backward(const Loss& loss) {
  const NvtxRange range("accrue micro-step backward");  // Note [NVTX ranges]
  ACCRUE_CHECK(micro_step_ < options_.micro_steps(),
               "Window::backward: the window already has its ", options_.micro_steps(),
               " micro-steps; call close() first");
  ACCRUE_CHECK(loss.sum.defined() && loss.count.defined() && loss.sum.numel() == 1,
               "Window::backward: expects a (sum, count) loss with a single-element sum");
  ACCRUE_CHECK(loss.sum.device() == ctx_->state.device(), "Window::backward: loss on ",
               loss.sum.device().str(), ", arena on ", ctx_->state.device().str());
  // Note [Close under the forward]: the last close's steps read the
  // gradients this backward overwrites.
  if (micro_step_ == 0) join_layer_steps("Window::backward", /*after_forward=*/true);
  if (micro_step_ == 0) store_.begin_window();
  if (sync_) sync_->before_backward(micro_step_, options_.micro_steps());
  Tensor seed;
  {
    NoGradGuard no_grad;
    const Tensor count = loss.count.to(DType::f64).reshape({});
    const Tensor sum = detach(loss.sum).to(DType::f64).reshape({});
    // Note [Ordered writes]: the adds keep the micro-steps' order on any stream.
    const StreamHandle stream = scalar_order_->stream(state().device().index);
    scalar_order_->before_write(0, stream);
    // Note [Normalization]: N counts items over the whole window; 1/N comes at close.
    kernels::axpy_(field(kernels::kItems), 1.0, count);
    kernels::axpy_(ctx_->loss_sum, 1.0, sum);
    scalar_order_->finished(0, stream);
    Tensor s = field(kernels::kScale);
    if (options_.normalization() == kernels::Normalization::MeanOfMicroBatchMeans)
      s = kernels::binary(kernels::BinaryOp::Div, s, count);
    seed = s.to(loss.sum.dtype()).reshape(loss.sum.shape());
  }
  // Note [Close stages]: the stages that act during the micro-steps (the norm
  // rows under the last backward, the calibration's observer, the noise
  // scale's micro-step 0), around the backward, undone in reverse.
  const MicroStep at = position();
  for (const auto& s : stages_)
    s->before_backward(at);
  try {
    accrue::backward(loss.sum, seed);
  } catch (...) {
    for (auto it = stages_.rbegin(); it != stages_.rend(); ++it)
      (*it)->abort_backward();
    throw;
  }
  for (auto it = stages_.rbegin(); it != stages_.rend(); ++it)
    (*it)->after_backward(at);
  ++micro_step_;
  index_checks_->set_position(windows_, micro_step_);
}

void Window::close() {
  const NvtxRange range("accrue window close");  // Note [NVTX ranges]
  ACCRUE_CHECK(ready(), "Window::close: ", micro_step_, " of ", options_.micro_steps(),
               " micro-steps done");
  // Note [Unused parameters]: on one process the host's flags are the world's.
  if (!sync_) check_unused(store_.written_flags(), windows_ + 1, "Window::close");
  ACCRUE_CHECK(store_.has_fp8_copies() == keeps_fp8_copies_,
               "Window::close: the store was asked to keep FP8 weight copies after this Window "
               "was built, so its close would not recast them (Note [Window FP8 weights]): call "
               "ParamStore::keep_fp8_copies before building the Window");
  ACCRUE_CHECK(store_.has_fp8_delayed_scaling() == keeps_fp8_scaling_,
               "Window::close: the store was asked to keep FP8 delayed scaling after this Window "
               "was built, so its close would not update the scales "
               "(Note [FP8 delayed scaling]): call ParamStore::keep_fp8_delayed_scaling before "
               "building the Window");
  close_device();
  close_host();
}

const LayerSteps* Window::layer_steps() const {
  LayerStepsStage* s = find_stage<LayerStepsStage>();
  return s ? &s->steps() : nullptr;
}

void Window::join_layer_steps(const char* where, bool after_forward) const {
  if (auto* s = find_stage<LayerStepsStage>()) s->steps().join(where, after_forward);
}

void Window::close_device() {
  NoGradGuard no_grad;
  for (const auto& s : stages_)  // Note [Close stages]
    s->run(windows_);
}

void Window::close_host() {
  ++windows_;
  micro_step_ = 0;
  index_checks_->set_position(windows_, micro_step_);
  for (WindowListener* l : listeners_)
    l->on_window_close();
}

void Window::replay_micro_step(const std::vector<bool>& written_after) {
  ACCRUE_CHECK(micro_step_ < options_.micro_steps(),
               "Window::backward: the window already has its ", options_.micro_steps(),
               " micro-steps; call close() first");
  if (micro_step_ == 0) {
    store_.begin_window();
    // Note [Close under the forward]: the replayed graph waited for the steps.
    if (auto* s = find_stage<LayerStepsStage>()) s->steps().joined_by_replay();
  }
  if (sync_) sync_->before_backward(micro_step_, options_.micro_steps());
  store_.set_written_flags(written_after);
  ++micro_step_;
  index_checks_->set_position(windows_, micro_step_);
}

const char* Window::why_close_not_capturable() const {
  for (const auto& stage : stages_)
    if (const char* why = stage->why_close_not_capturable()) return why;
  return nullptr;
}

const char* Window::why_not_capturable() const {
  for (const auto& stage : stages_)
    if (const char* why = stage->why_not_capturable()) return why;
  if (ctx_->state.device().is_cuda() &&
      cuda_allocator_mode() != CudaAllocatorMode::StreamOrderedPool)
    return "the CUDA allocator is in plain mode, whose cudaMalloc a graph does not record";
  return nullptr;
}

Window::WholeCapture Window::begin_whole_capture() const {
  // Note [Window captured whole]: what a replay of the whole window would get wrong.
  const char* op = "Window::begin_whole_capture";
  ACCRUE_CHECK(micro_step_ == 0, op, ": the window has ", micro_step_, " of ",
               options_.micro_steps(), " micro-steps done; capture from a window's start");
  ACCRUE_CHECK(sync_ == nullptr, op,
               ": a GradientSync launches its all-reduces from host hooks, which a replay "
               "does not run; capture one process's window");
  ACCRUE_CHECK(listeners_.empty(), op, ": the Window has ", listeners_.size(),
               " listener(s), which act on the host at close");
  if (const char* why = why_not_capturable()) ACCRUE_FAIL(op, ": ", why);
  if (const char* why = why_close_not_capturable()) ACCRUE_FAIL(op, ": ", why);
  ACCRUE_CHECK(ctx_->state.device().is_cuda(), op, ": the window's arena is on ",
               ctx_->state.device().str(), "; CUDA graphs are CUDA's");
  ACCRUE_CHECK(!calibrating(), op,
               ": the first window calibrates (the loss scaler's, Note [Scale calibration], or "
               "FP8 delayed scaling's, Note [FP8 delayed scaling]); capture after it");
  return {micro_step_, windows_, store_.written_flags()};
}

std::vector<bool> Window::end_whole_capture(const WholeCapture& before) {
  const int64_t closed = windows_ - before.windows, left = micro_step_;
  std::vector<bool> written = store_.written_flags();
  // Note [Window captured whole]: the capture ran nothing.
  windows_ = before.windows;
  micro_step_ = before.micro_step;
  store_.set_written_flags(before.written);
  index_checks_->set_position(windows_, micro_step_);
  ACCRUE_CHECK(closed == 1 && left == 0, "Window::end_whole_capture: the capture recorded ", closed,
               " close(s) and left ", left, " micro-step(s) open; it must hold exactly ",
               options_.micro_steps(), " backward() calls and one close()");
  return written;
}

void Window::before_whole_replay(const std::vector<bool>& written) {
  const char* op = "Window::before_whole_replay";
  ACCRUE_CHECK(micro_step_ == 0, op, ": the window has ", micro_step_,
               " micro-steps done eagerly; a replay is a whole window");
  ACCRUE_CHECK(written.size() == store_.size(), op, ": ", written.size(),
               " written flags for a store of ", store_.size(), " slots");
  // Note [Unused parameters]: before the replayed close steps, as before an eager one.
  check_unused(written, windows_ + 1, op);
  optimizer_.store_hyperparameters(windows_);
}

void Window::after_whole_replay(const std::vector<bool>& written) {
  for (int64_t k = 0; k < options_.micro_steps(); ++k)
    replay_micro_step(written);
  close_host();
}

void Window::add_listener(WindowListener* listener) {
  ACCRUE_CHECK(listener != nullptr, "Window::add_listener: a null listener");
  listeners_.push_back(listener);
}

void Window::remove_listener(WindowListener* listener) {
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

void Window::restart() {
  ACCRUE_CHECK(sync_ == nullptr,
               "Window::restart: under data parallelism every rank would have to restart");
  NoGradGuard no_grad;
  field(kernels::kItems).fill_(0.0);
  ctx_->loss_sum.fill_(0.0);
  store_.begin_window();
  micro_step_ = 0;
  index_checks_->set_position(windows_, micro_step_);
  for (WindowListener* l : listeners_)
    l->on_window_restart();
}

void Window::set_micro_steps(int64_t k) {
  ACCRUE_CHECK(micro_step_ == 0, "Window::set_micro_steps: the window is at micro-step ",
               micro_step_);
  ACCRUE_CHECK(k >= 1, "Window::set_micro_steps: micro_steps must be >= 1, got ", k);
  ACCRUE_CHECK(
      k == options_.micro_steps() || options_.normalization() == kernels::Normalization::ItemCount,
      "Window::set_micro_steps: with mean-of-micro-batch-means normalization the split "
      "changes the update (",
      options_.micro_steps(), " -> ", k, " micro-steps)");
  ACCRUE_CHECK(find_stage<NoiseScaleStage>() == nullptr || k >= 2,
               "Window::set_micro_steps: the gradient noise scale needs K >= 2, got ", k);
  options_.micro_steps(k);
  ctx_->config.micro_steps = k * (sync_ ? sync_->world_size() : 1);
}

int64_t Window::norm_rows_at_last_close() const {
  return find_stage<NormStage>()->rows_at_last_close();
}

bool Window::calibrating() const {
  const CalibrationStage* c = find_stage<CalibrationStage>();
  // Note [FP8 delayed scaling]: the first window's layers scale as they cast.
  const Fp8DelayedScaling* fp8 = store_.fp8_delayed_scaling();
  return (c != nullptr && c->active()) || (fp8 != nullptr && !fp8->calibrated());
}

void Window::check() const {
  index_checks_->raise_pending();
  // Note [Unused parameters]: under a sync, the world's flags of the last close.
  if (!ctx_->used_flags.defined() || !sync_ || windows_ == 0 ||
      unused_checked_window_ == windows_ ||
      options_.unused_parameter_check() == UnusedParameterCheck::ignore ||
      (options_.unused_parameter_check() == UnusedParameterCheck::warn && unused_warned_))
    return;
  std::vector<bool> used;
  for (double v : ctx_->used_flags.to_vector<double>())
    used.push_back(v > 0);
  sync_->check();  // the flags are the world's only if the reductions completed
  unused_checked_window_ = windows_;
  check_unused(used, windows_, "Window::check");
}

void Window::check_unused(const std::vector<bool>& written, int64_t window,
                          const char* where) const {
  const UnusedParameterCheck policy = options_.unused_parameter_check();
  if (policy == UnusedParameterCheck::ignore ||
      (policy == UnusedParameterCheck::warn && unused_warned_))
    return;
  std::vector<size_t> unused;
  for (size_t i = 0; i < written.size(); ++i)
    if (!written[i]) unused.push_back(i);
  if (unused.empty()) return;
  std::string names;
  for (size_t k = 0; k < unused.size() && k < kUnusedNamesShown; ++k)
    names += (k ? ", '" : "'") + store_.slots()[unused[k]].name + "'";
  if (unused.size() > kUnusedNamesShown)
    names += detail::str_cat(" and ", unused.size() - kUnusedNamesShown, " more");
  const std::string what =
      detail::str_cat(unused.size(), " of ", written.size(),
                      " parameters got no gradient in window ", window, ": ", names);
  const std::string how =
      detail::str_cat("UnusedParameters::", unused_parameters_name(options_.unused_parameters()),
                      options_.unused_parameters() == UnusedParameters::skip
                          ? " leaves them unchanged"
                          : " steps them with a zero gradient, so only weight decay moves them");
  if (policy == UnusedParameterCheck::error)
    ACCRUE_FAIL(where, ": ", what, " (UnusedParameterCheck::error",
                sync_ ? "; the window has stepped: " : ": nothing was stepped; under ::warn ", how,
                "; Note [Unused parameters])");
  unused_warned_ = true;
  const std::string line = detail::str_cat(
      "accrue: Window: ", what, " (", how,
      "; a gradient cut upstream looks the same). Said once; "
      "WindowOptions::unused_parameter_check(UnusedParameterCheck::ignore) silences it, ::error "
      "makes it an error");
  if (options_.unused_parameter_log())
    options_.unused_parameter_log()(line);
  else
    std::fprintf(stderr, "%s\n", line.c_str());
}

WindowReport Window::report() const {
  check();
  const std::vector<double> v = ctx_->last.to_vector<double>();
  if (sync_) sync_->check();  // after the read, which a communicator's abort unblocks
  WindowReport r;
  r.window = windows_;
  r.items = v[CloseContext::kLastItems];
  const double local_items = v[CloseContext::kLastLocalItems];
  r.loss = r.items > 0 ? v[CloseContext::kLastLoss] / r.items : 0.0;
  r.local_loss = local_items > 0 ? v[CloseContext::kLastLocalLoss] / local_items : 0.0;
  r.grad_norm = v[kernels::kGradNorm];
  r.clip_coef = v[kernels::kClipCoef];
  r.loss_scale = v[kernels::kScale];
  r.skipped = v[kernels::kFoundInf] != 0.0;
  r.skipped_windows = static_cast<int64_t>(v[kernels::kSkippedWindows]);
  r.optimizer_steps = static_cast<int64_t>(v[kernels::kStep]);
  r.noise_windows = static_cast<int64_t>(v[kernels::kNoiseWindows]);
  const NoiseScaleStage* noise = find_stage<NoiseScaleStage>();
  if (noise && r.noise_windows > 0) {
    const double correction = 1.0 - std::pow(noise->ema(), static_cast<double>(r.noise_windows));
    r.grad_sq = v[kernels::kNoiseGradSq] / correction;
    r.trace_sigma = v[kernels::kNoiseTrace] / correction;
    r.noise_scale = r.trace_sigma / r.grad_sq;
  }
  return r;
}

}  // namespace accrue::optim
