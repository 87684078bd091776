#include "optim/window.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "core/grad_mode.h"
#include "core/nvtx.h"
#include "kernels/ops.h"

namespace accrue::optim {

namespace {
// Note [Scale calibration]: the scale the calibrated first window runs at.
constexpr double kCalibrationScale = 1.0;
// last_ holds the state, then this rank's loss sum and item count, then N over all ranks.
constexpr int kLastLoss = kernels::kWindowStateSize, kLastLocalItems = kLastLoss + 1,
              kLastItems = kLastLoss + 2, kLastSize = kLastLoss + 3;

// slot_steps rows (t, 1 - beta1^t, sqrt(1 - beta2^t)) with the given counts;
// the bias columns are rewritten by advance_slot_steps before any pass reads them.
std::vector<double> slot_rows(const std::vector<double>& counts) {
  std::vector<double> rows(3 * counts.size(), 0.0);
  for (size_t i = 0; i < counts.size(); ++i)
    rows[3 * i] = counts[i];
  return rows;
}
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

Window::Window(ParamStore& store, Optimizer& optimizer, const WindowOptions& options,
               GradientSync* sync)
    : store_(store), optimizer_(optimizer), options_(options), sync_(sync) {
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
  close_config_.scaler = options.scaler().config();
  close_config_.normalization = options.normalization();
  // Legacy mean-of-means divides the summed per-micro-batch means by every
  // micro-batch of the window, on every rank.
  close_config_.micro_steps = options.micro_steps() * (sync ? sync->world_size() : 1);
  close_config_.max_norm = options.max_grad_norm();
  const Device device = store.options().device;
  // Note [Scale calibration]: a calibrated scaler runs its first window at kCalibrationScale.
  const bool calibrate = options.scaler().calibrates();
  const double initial = options.scaler().mode() == ScalerMode::None ? 1.0
                         : calibrate                                 ? kCalibrationScale
                                     : options.scaler().init_scale();
  state_ = kernels::make_window_state(initial, device);
  if (calibrate) calibration_ = std::make_unique<ScaleCalibration>(device);
  if (sync) ranges_ = sync->owned_ranges();
  if (sharded()) {
    int64_t packed = 0;
    for (const ArenaRange& r : ranges_)
      packed += r.numel;
    ACCRUE_CHECK(store.options().moments == 0 || store.moment_numel() == packed,
                 "Window: the sync owns ", packed, " elements of the arena but its moments hold ",
                 store.moment_numel(), " (construct the sync on this arena before the Window)");
    // Note [ZeRO-1]: partial rows per owned range; the ranges have the same
    // sizes on every rank, so every rank's block has the same rows.
    int64_t rows = 0;
    for (const ArenaRange& r : ranges_)
      rows += kernels::norm_partials_rows(store.grads().narrow(0, r.offset, r.numel));
    local_partials_ = empty({rows, 2}, DType::f64, device);
    partials_ = empty({sync->world_size() * rows, 2}, DType::f64, device);
    if (options.norm_under_backward())
      norm_rows_ = std::make_shared<NormRowTracker>(store.grad_arena(), ranges_, local_partials_);
  } else {
    partials_ = empty({kernels::norm_partials_rows(store.grads()), 2}, DType::f64, device);
    if (options.norm_under_backward())
      norm_rows_ = std::make_shared<NormRowTracker>(store.grad_arena(), partials_);
  }
  // Note [Norm under the backward]: one device counts slots as their hooks
  // fire; under a sync, ranges as their reductions are issued.
  if (norm_rows_) {
    const std::weak_ptr<NormRowTracker> tracker = norm_rows_;
    if (sync == nullptr) {
      for (size_t i = 0; i < store.size(); ++i)
        register_grad_ready_hook(store.params()[i], [tracker, i](const Tensor&) {
          if (auto t = tracker.lock()) t->on_final(i);
        });
    } else if (!sync->set_reduced_listener([tracker](const ArenaRange& range) {
                 if (auto t = tracker.lock()) t->on_reduced(range);
               })) {
      norm_rows_.reset();  // the sync cannot say when a range is reduced: all rows at close
    }
  }
  loss_sum_ = zeros({}, DType::f64, device);
  last_ = zeros({kLastSize}, DType::f64, device);
  if (skips_unused()) {  // Note [Unused parameters]
    slots_ = make_slot_tables(store);
  }
  index_checks_ = std::make_unique<kernels::DeferredIndexChecks>(device, field(kernels::kItems));
  if (options.noise_scale_every() > 0) {
    ACCRUE_CHECK(
        options.micro_steps() >= 2 && options.normalization() == kernels::Normalization::ItemCount,
        "Window: the gradient noise scale needs K >= 2 micro-steps and item-count "
        "normalization (K = ",
        options.micro_steps(), ")");
    noise_ =
        std::make_unique<NoiseScale>(store.grad_arena(), options.noise_scale_every(), options.noise_scale_ema());
  }
  optimizer_.bind(store);
}

Tensor Window::field(int f) const {
  return state_.narrow(0, f, 1).reshape({});
}

void Window::backward(const Loss& loss) {
  const NvtxRange range("accrue micro-step backward");  // Note [NVTX ranges]
  ACCRUE_CHECK(micro_step_ < options_.micro_steps(),
               "Window::backward: the window already has its ", options_.micro_steps(),
               " micro-steps; call close() first");
  ACCRUE_CHECK(loss.sum.defined() && loss.count.defined() && loss.sum.numel() == 1,
               "Window::backward: expects a (sum, count) loss with a single-element sum");
  ACCRUE_CHECK(loss.sum.device() == state_.device(), "Window::backward: loss on ",
               loss.sum.device().str(), ", arena on ", state_.device().str());
  if (micro_step_ == 0) store_.begin_window();
  if (sync_) sync_->before_backward(micro_step_, options_.micro_steps());
  Tensor seed;
  {
    NoGradGuard no_grad;
    const Tensor count = loss.count.to(DType::f64).reshape({});
    // Note [Normalization]: N counts items over the whole window; 1/N comes at close.
    kernels::axpy_(field(kernels::kItems), 1.0, count);
    kernels::axpy_(loss_sum_, 1.0, detach(loss.sum).to(DType::f64).reshape({}));
    Tensor s = field(kernels::kScale);
    if (options_.normalization() == kernels::Normalization::MeanOfMicroBatchMeans)
      s = kernels::binary(kernels::BinaryOp::Div, s, count);
    seed = s.to(loss.sum.dtype()).reshape(loss.sum.shape());
  }
  // Note [Norm under the backward]: the last micro-step's hooks count.
  const bool last = micro_step_ + 1 == options_.micro_steps();
  if (norm_rows_ && last) norm_rows_->begin_last_backward();
  try {
    std::optional<autograd::GradientObserverScope> observe;  // Note [Scale calibration]
    if (calibration_) observe.emplace(calibration_.get());
    accrue::backward(loss.sum, seed);
  } catch (...) {
    if (norm_rows_) norm_rows_->end_last_backward();
    throw;
  }
  if (norm_rows_ && last) norm_rows_->end_last_backward();
  if (noise_ && micro_step_ == 0 && noise_->measures(windows_))
    noise_->after_first_micro_step(store_.grad_arena(), state_);
  ++micro_step_;
  index_checks_->set_position(windows_, micro_step_);
}

void Window::close() {
  const NvtxRange range("accrue window close");  // Note [NVTX ranges]
  ACCRUE_CHECK(ready(), "Window::close: ", micro_step_, " of ", options_.micro_steps(),
               " micro-steps done");
  close_device();
  close_host();
}

void Window::close_device() {
  NoGradGuard no_grad;
  // Note [Unused parameters]: the written flags, before anything marks the
  // zeroed slots written, and the world's (a parameter any rank wrote is used).
  if (skips_unused()) {
    kernels::store_slot_flags(store_.written_flags(), slots_.used);
    if (sync_) sync_->reduce_flags(slots_.used);
  }
  // Note [Overwrite first]: unused parameters read 0, before any reduction sums them.
  store_.zero_unwritten();
  // The loss report is this rank's own mean: its loss sum over its own items.
  last_.narrow(0, kLastLocalItems, 1).copy_(field(kernels::kItems).reshape({1}));
  if (sync_) sync_->finish(field(kernels::kItems));  // N becomes the sum over ranks
  norm_partials();
  kernels::window_scalar_step(partials_, state_, close_config_);
  if (noise_ && noise_->measures(windows_)) noise_->after_close(state_);
  if (skips_unused())
    kernels::advance_slot_steps(optimizer_.config_at(windows_), slots_.used, slots_.steps, state_);
  optimizer_.step(store_, state_, windows_, ranges_, slots_);
  if (calibration_) {  // Note [Scale calibration]: the next window's scale, the world's
    const Tensor amax = calibration_->amax();
    if (sync_) sync_->reduce_max(amax);
    kernels::calibrate_loss_scale(amax, state_, close_config_.scaler, kCalibrationScale,
                                  options_.scaler().calibration_margin());
    calibration_.reset();
  }
  // Note [ZeRO-1]: each rank stepped its shard; the forward needs them all.
  if (sharded()) sync_->gather_parameters(forward_params());
  // Keep what report() shows, then start the next window's counters.
  last_.narrow(0, 0, kernels::kWindowStateSize).copy_(state_);
  last_.narrow(0, kLastLoss, 1).copy_(loss_sum_.reshape({1}));
  last_.narrow(0, kLastItems, 1).copy_(field(kernels::kItems).reshape({1}));
  field(kernels::kItems).fill_(0.0);
  loss_sum_.fill_(0.0);
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
  if (micro_step_ == 0) store_.begin_window();
  if (sync_) sync_->before_backward(micro_step_, options_.micro_steps());
  store_.set_written_flags(written_after);
  ++micro_step_;
  index_checks_->set_position(windows_, micro_step_);
}

void Window::add_listener(WindowListener* listener) {
  ACCRUE_CHECK(listener != nullptr, "Window::add_listener: a null listener");
  listeners_.push_back(listener);
}

void Window::remove_listener(WindowListener* listener) {
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

Tensor Window::owned_ranges_table() const {
  std::vector<int64_t> flat;
  for (const ArenaRange& r : ranges_) {
    flat.push_back(r.offset);
    flat.push_back(r.numel);
  }
  return from_vector<int64_t>(flat, {static_cast<int64_t>(ranges_.size()), 2});
}

std::string Window::ranges_str(const std::vector<int64_t>& table) {
  std::ostringstream s;
  for (size_t i = 0; i + 1 < table.size(); i += 2)
    s << (i == 0 ? "" : ", ") << "[" << table[i] << ", " << table[i] + table[i + 1] << ")";
  return table.empty() ? "nothing" : s.str();
}

void Window::restart() {
  ACCRUE_CHECK(sync_ == nullptr,
               "Window::restart: under data parallelism every rank would have to restart");
  NoGradGuard no_grad;
  field(kernels::kItems).fill_(0.0);
  loss_sum_.fill_(0.0);
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
  ACCRUE_CHECK(noise_ == nullptr || k >= 2,
               "Window::set_micro_steps: the gradient noise scale needs K >= 2, got ", k);
  options_.micro_steps(k);
  close_config_.micro_steps = k * (sync_ ? sync_->world_size() : 1);
}

int64_t Window::norm_rows_at_last_close() const {
  if (norm_rows_) return norm_rows_->rows_at_last_close();
  return sharded() ? local_partials_.size(0) : partials_.size(0);
}

void Window::norm_partials() {
  if (norm_rows_) {
    norm_rows_->finish();  // the rows the backward left (Note [Norm under the backward])
  } else if (!sharded()) {
    kernels::grad_norm_partials(store_.grads(), partials_);
  } else {
    int64_t row = 0;
    for (const ArenaRange& r : ranges_) {
      const Tensor grads = store_.grads().narrow(0, r.offset, r.numel);
      const int64_t rows = kernels::norm_partials_rows(grads);
      kernels::grad_norm_partials(grads, local_partials_.narrow(0, row, rows));
      row += rows;
    }
  }
  if (!sharded()) return;
  // The global norm is the sum over every rank's partials, summed in the same
  // fixed order on every rank: all agree on it, on the clip and on found_inf.
  sync_->gather_partials(local_partials_, partials_);
}

const Tensor& Window::forward_params() const {
  return store_.forward_weights();
}

Tensor Window::pack_owned(const Tensor& flat) const {
  int64_t total = 0;
  for (const ArenaRange& r : ranges_)
    total += r.numel;
  Tensor packed = empty({total}, flat.dtype(), flat.device());
  int64_t at = 0;
  for (const ArenaRange& r : ranges_) {
    packed.narrow(0, at, r.numel).copy_(flat.narrow(0, r.offset, r.numel));
    at += r.numel;
  }
  return packed;
}

void Window::check() const {
  index_checks_->raise_pending();
}

WindowReport Window::report() const {
  check();
  const std::vector<double> v = last_.to_vector<double>();
  WindowReport r;
  r.window = windows_;
  r.items = v[kLastItems];
  r.loss = v[kLastLocalItems] > 0 ? v[kLastLoss] / v[kLastLocalItems] : 0.0;
  r.grad_norm = v[kernels::kGradNorm];
  r.clip_coef = v[kernels::kClipCoef];
  r.loss_scale = v[kernels::kScale];
  r.skipped = v[kernels::kFoundInf] != 0.0;
  r.skipped_windows = static_cast<int64_t>(v[kernels::kSkippedWindows]);
  r.optimizer_steps = static_cast<int64_t>(v[kernels::kStep]);
  r.noise_windows = static_cast<int64_t>(v[kernels::kNoiseWindows]);
  if (noise_ && r.noise_windows > 0) {
    const double correction = 1.0 - std::pow(noise_->ema(), static_cast<double>(r.noise_windows));
    r.grad_sq = v[kernels::kNoiseGradSq] / correction;
    r.trace_sigma = v[kernels::kNoiseTrace] / correction;
    r.noise_scale = r.trace_sigma / r.grad_sq;
  }
  return r;
}

namespace {

// Note [Parameter layouts]: the slots laid out channels-last, by index. The
// flat master and moments read right only in the layouts they were saved in.
std::vector<int64_t> channels_last_slots(const ParamStore& arena) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < arena.size(); ++i)
    if (arena.slots()[i].strides != contiguous_strides(arena.slots()[i].shape))
      out.push_back(static_cast<int64_t>(i));
  return out;
}

}  // namespace

std::map<std::string, Tensor> Window::state_dict() const {
  std::map<std::string, Tensor> d;
  const std::vector<int64_t> channels_last = channels_last_slots(store_);
  if (!channels_last.empty())
    d["channels_last_slots"] =
        from_vector(channels_last, {static_cast<int64_t>(channels_last.size())});
  d["master"] =
      sharded() && !store_.master_sharded() ? pack_owned(store_.master()) : store_.master();
  for (int i = 0; i < store_.options().moments; ++i)
    d["moment" + std::to_string(i)] = store_.moment(i);
  d["window_state"] = state_;
  d["windows_closed"] = full({}, static_cast<double>(windows_), DType::i64);
  if (skips_unused()) d["param_steps"] = slots_.steps.select(1, 0).contiguous();
  if (sharded()) d["zero1_ranges"] = owned_ranges_table();
  if (micro_step_ > 0) {  // Note [Mid-window checkpoints]
    d["micro_step"] = full({}, static_cast<double>(micro_step_), DType::i64);
    d["grads"] = store_.grads();
    const std::vector<bool>& flags = store_.written_flags();
    std::vector<int64_t> written(flags.begin(), flags.end());
    d["grads_written"] = from_vector<int64_t>(written, {static_cast<int64_t>(written.size())});
    d["loss_sum"] = loss_sum_;
  }
  return d;
}

void Window::load_state_dict(const std::map<std::string, Tensor>& state) {
  ACCRUE_CHECK(micro_step_ == 0, "Window::load_state_dict: this window is at micro-step ",
               micro_step_, "; load between windows");
  auto get = [&](const std::string& key, const Tensor& like) -> const Tensor& {
    auto it = state.find(key);
    ACCRUE_CHECK(it != state.end(), "Window::load_state_dict: missing '", key, "'");
    ACCRUE_CHECK(it->second.shape() == like.shape(), "Window::load_state_dict: '", key,
                 "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(like.shape()));
    return it->second;
  };
  NoGradGuard no_grad;
  // Every entry is found and checked before anything changes: a bad
  // checkpoint leaves the window as it was.
  // Note [ZeRO-1]: a shard holds the owned ranges of one rank of one world
  // size; elsewhere its numbers would land in the wrong places.
  const bool saved_sharded = state.count("zero1_ranges") != 0;
  ACCRUE_CHECK(saved_sharded == sharded(), "Window::load_state_dict: the checkpoint ",
               saved_sharded ? "is one rank's ZeRO-1 shard" : "holds the whole arena",
               ", this window ", sharded() ? "steps a ZeRO-1 shard" : "steps the whole arena");
  if (sharded()) {
    const std::vector<int64_t> saved =
        state.at("zero1_ranges").to(Device::cpu()).to(DType::i64).to_vector<int64_t>();
    const std::vector<int64_t> mine = owned_ranges_table().to_vector<int64_t>();
    ACCRUE_CHECK(saved == mine, "Window::load_state_dict: the ZeRO-1 shard covers ",
                 ranges_str(saved), " of the arena, this rank owns ", ranges_str(mine),
                 ": load each rank's own shard, on the world size that saved it (re-sharding is "
                 "not supported)");
  }
  // Note [Parameter layouts]: a checkpoint without the key has none.
  const std::vector<int64_t> saved_layouts =
      state.count("channels_last_slots") != 0
          ? state.at("channels_last_slots").to(Device::cpu()).to(DType::i64).to_vector<int64_t>()
          : std::vector<int64_t>{};
  ACCRUE_CHECK(saved_layouts == channels_last_slots(store_),
               "Window::load_state_dict: the checkpoint's channels-last parameters are slots ",
               shape_str(saved_layouts), ", this arena's are ",
               shape_str(channels_last_slots(store_)),
               " (Note [Parameter layouts]: call to_channels_last on the model as the run that "
               "saved it did, before building the window)");
  const bool packed = sharded() && !store_.master_sharded();
  const Tensor& master = get("master", packed ? pack_owned(store_.master()) : store_.master());
  std::vector<const Tensor*> moments;
  for (int i = 0; i < store_.options().moments; ++i)
    moments.push_back(&get("moment" + std::to_string(i), store_.moment(i)));
  const Tensor& window_state = get("window_state", state_);
  const auto windows =
      static_cast<int64_t>(get("windows_closed", full({}, 0.0, DType::i64)).item());
  // Note [Unused parameters]: per-parameter step counts exist under skip only.
  // A checkpoint of step_with_zero loads into skip with every parameter at the
  // window's count, which is what step_with_zero gave each one; the other way
  // the counts would be lost, so it is refused.
  const bool saved_counts = state.count("param_steps") != 0;
  ACCRUE_CHECK(!saved_counts || skips_unused(),
               "Window::load_state_dict: the checkpoint holds per-parameter step counts "
               "('param_steps', saved under UnusedParameters::skip) but this window's policy is ",
               unused_parameters_name(options_.unused_parameters()),
               "; construct it with WindowOptions().unused_parameters(UnusedParameters::skip)");
  std::vector<double> param_steps;
  if (skips_unused()) {
    const auto slots = static_cast<int64_t>(store_.size());
    if (saved_counts) {
      param_steps = get("param_steps", zeros({slots}, DType::f64))
                        .to(Device::cpu())
                        .to(DType::f64)
                        .to_vector<double>();
      for (size_t i = 0; i < param_steps.size(); ++i)
        ACCRUE_CHECK(param_steps[i] >= 0 && param_steps[i] == std::floor(param_steps[i]),
                     "Window::load_state_dict: param_steps[", i, "] = ", param_steps[i],
                     " is not a step count");
    } else {
      const double window_steps =
          window_state.to(Device::cpu()).to_vector<double>()[kernels::kStep];
      param_steps.assign(static_cast<size_t>(slots), window_steps);
    }
  }
  // Note [Mid-window checkpoints]: a checkpoint without "micro_step" was taken between windows.
  int64_t m = 0;
  std::vector<bool> flags;
  const Tensor* grads = nullptr;
  const Tensor* loss_sum = nullptr;
  if (state.count("micro_step") != 0) {
    m = static_cast<int64_t>(get("micro_step", full({}, 0.0, DType::i64)).item());
    ACCRUE_CHECK(m > 0 && m < options_.micro_steps(),
                 "Window::load_state_dict: the checkpoint is at micro-step ", m,
                 ", this window has ", options_.micro_steps(), " micro-steps");
    const int64_t slots = static_cast<int64_t>(store_.written_flags().size());
    const std::vector<int64_t> written = get("grads_written", zeros({slots}, DType::i64))
                                             .to(Device::cpu())
                                             .to(DType::i64)
                                             .to_vector<int64_t>();
    flags.assign(written.begin(), written.end());
    grads = &get("grads", store_.grads());
    loss_sum = &get("loss_sum", loss_sum_);
  }

  // Note [One load path]: the master, then the compute copy from it (under
  // ZeRO-1 the owned ranges; the gather below does the rest).
  store_.load_master(master, sharded() ? ranges_ : std::vector<ArenaRange>{});
  for (int i = 0; i < store_.options().moments; ++i)
    store_.moment(i).copy_(*moments[static_cast<size_t>(i)]);
  state_.copy_(window_state);
  if (skips_unused())
    slots_.steps.copy_(from_vector(slot_rows(param_steps),
                                   {static_cast<int64_t>(param_steps.size()), 3}, DType::f64));
  // Note [ZeRO-1]: this rank loaded its shard; the others' come by gathering.
  if (sharded()) sync_->gather_parameters(forward_params());
  windows_ = windows;
  if (windows > 0) calibration_.reset();  // Note [Scale calibration]: the checkpoint has the scale
  if (m > 0) {
    store_.grads().copy_(*grads);
    store_.set_written_flags(flags);
    loss_sum_.copy_(*loss_sum);
    micro_step_ = m;
  }
  index_checks_->set_position(windows_, micro_step_);
}

std::vector<int64_t> Window::parameter_steps() const {
  ACCRUE_CHECK(skips_unused(),
               "Window::parameter_steps: per-parameter step counts exist under "
               "UnusedParameters::skip; this window's policy is ",
               unused_parameters_name(options_.unused_parameters()),
               " (every parameter has report().optimizer_steps)");
  std::vector<int64_t> out;
  for (double t : slots_.steps.select(1, 0).contiguous().to(Device::cpu()).to_vector<double>())
    out.push_back(static_cast<int64_t>(t));
  return out;
}

}  // namespace accrue::optim
