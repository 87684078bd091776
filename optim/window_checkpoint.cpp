// Window::state_dict and load_state_dict: the window checkpoint (Note
// [Mid-window checkpoints] in optim/window.h), apart from the loop's code.
#include <cmath>
#include <sstream>

#include "accrue/core/grad_mode.h"
#include "accrue/optim/window.h"

namespace accrue::optim {

namespace {

// slot_steps rows (t, 1 - beta1^t, sqrt(1 - beta2^t)) with the given counts;
// the bias columns are rewritten by advance_slot_steps before any pass reads them.
std::vector<double> slot_rows(const std::vector<double>& counts) {
  std::vector<double> rows(3 * counts.size(), 0.0);
  for (size_t i = 0; i < counts.size(); ++i)
    rows[3 * i] = counts[i];
  return rows;
}

// Note [Parameter layouts]: the slots laid out channels-last, by index. The
// flat master and moments read right only in the layouts they were saved in.
std::vector<int64_t> channels_last_slots(const ParamStore& arena) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < arena.size(); ++i)
    if (arena.slots()[i].strides != contiguous_strides(arena.slots()[i].shape))
      out.push_back(static_cast<int64_t>(i));
  return out;
}

// A step or window count as the state holds it: a whole number that a double
// holds exactly and an int64 can take (report() and parameter_steps() cast it).
bool is_count(double v) {
  return v >= 0 && v <= 9007199254740992.0 && v == std::floor(v);
}

// A 0-d integer entry read as an integer (item() goes through a double, which
// rounds a value near 2^63 out of int64's range), or a whole-valued float.
int64_t integer_value(const Tensor& t, const char* key) {
  if (!is_floating(t.dtype()))
    return t.reshape({1}).to(Device::cpu()).to(DType::i64).to_vector<int64_t>()[0];
  const double v = t.item();
  ACCRUE_CHECK(is_count(v), "Window::load_state_dict: '", key, "' = ", v, " is not a count");
  return static_cast<int64_t>(v);
}

// The fields of a loaded window state that later code trusts (fuzz_window_state
// found report() casting a counter of 5.8e252 to int64): every counter a count,
// the loss scale finite and positive. N may be NaN: a bad index before the save
// travels that way (Note [Mid-window checkpoints]).
void check_window_state(const Tensor& window_state) {
  const std::vector<double> v = window_state.to(Device::cpu()).to(DType::f64).to_vector<double>();
  for (int f :
       {kernels::kGrowthTracker, kernels::kStep, kernels::kSkippedWindows, kernels::kNoiseWindows})
    ACCRUE_CHECK(is_count(v[f]), "Window::load_state_dict: window_state[", f, "] = ", v[f],
                 " is not a count (a whole number in [0, 2^53])");
  ACCRUE_CHECK(std::isfinite(v[kernels::kScale]) && v[kernels::kScale] > 0,
               "Window::load_state_dict: the loss scale window_state[", kernels::kScale,
               "] = ", v[kernels::kScale], " is not finite and positive");
  ACCRUE_CHECK(std::isnan(v[kernels::kItems]) || v[kernels::kItems] >= 0,
               "Window::load_state_dict: the item count window_state[", kernels::kItems,
               "] = ", v[kernels::kItems], " is negative");
}

// Note [FP8 delayed scaling]'s rows as later casts trust them: scale and
// scale_inv finite and positive, the history finite and >= 0; the window's
// amax >= 0 (infinite or NaN: an overflow this window, which skips it).
void check_fp8_scaling_state(const Tensor& state, const char* key) {
  const std::vector<float> v = state.to(Device::cpu()).to_vector<float>();
  const int64_t width = state.size(1);
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t col = static_cast<int64_t>(i) % width, row = static_cast<int64_t>(i) / width;
    const bool ok = col < 2    ? std::isfinite(v[i]) && v[i] > 0
                    : col == 2 ? std::isnan(v[i]) || v[i] >= 0
                               : std::isfinite(v[i]) && v[i] >= 0;
    ACCRUE_CHECK(ok, "Window::load_state_dict: '", key, "'[", row, ", ", col, "] = ", v[i],
                 " is not a ",
                 col < 2    ? "finite positive scale"
                 : col == 2 ? "non-negative amax"
                            : "finite non-negative amax",
                 " (Note [FP8 delayed scaling])");
  }
}

}  // namespace

std::map<std::string, Tensor> Window::state_dict() const {
  join_layer_steps("Window::state_dict");  // Note [Close under the forward]
  std::map<std::string, Tensor> d;
  const std::vector<int64_t> channels_last = channels_last_slots(store_);
  if (!channels_last.empty())
    d["channels_last_slots"] =
        from_vector(channels_last, {static_cast<int64_t>(channels_last.size())});
  d["master"] =
      sharded() && !store_.master_sharded() ? pack_owned(store_.master()) : store_.master();
  for (int i = 0; i < store_.options().moments(); ++i)
    d["moment" + std::to_string(i)] = store_.moment(i);
  d["window_state"] = ctx_->state;
  d["windows_closed"] = full({}, static_cast<double>(windows_), DType::i64);
  if (skips_unused()) d["param_steps"] = ctx_->slots.steps.select(1, 0).contiguous();
  if (sharded()) d["zero1_ranges"] = owned_ranges_table();
  // Note [FP8 delayed scaling]: scales, histories and this window's amaxes so far.
  if (const Fp8DelayedScaling* fp8 = store_.fp8_delayed_scaling()) {
    d["fp8_scaling_x"] = fp8->x_state();
    d["fp8_scaling_dy"] = fp8->dy_state();
  }
  if (micro_step_ > 0) {  // Note [Mid-window checkpoints]
    d["micro_step"] = full({}, static_cast<double>(micro_step_), DType::i64);
    d["grads"] = store_.grads();
    const std::vector<bool>& flags = store_.written_flags();
    std::vector<int64_t> written(flags.begin(), flags.end());
    d["grads_written"] = from_vector<int64_t>(written, {static_cast<int64_t>(written.size())});
    d["loss_sum"] = ctx_->loss_sum;
  }
  return d;
}

void Window::load_state_dict(const std::map<std::string, Tensor>& state) {
  ACCRUE_CHECK(micro_step_ == 0, "Window::load_state_dict: this window is at micro-step ",
               micro_step_, "; load between windows");
  join_layer_steps("Window::load_state_dict");  // Note [Close under the forward]
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
  for (int i = 0; i < store_.options().moments(); ++i)
    moments.push_back(&get("moment" + std::to_string(i), store_.moment(i)));
  const Tensor& window_state = get("window_state", ctx_->state);
  check_window_state(window_state);
  const auto windows =
      integer_value(get("windows_closed", full({}, 0.0, DType::i64)), "windows_closed");
  ACCRUE_CHECK(windows >= 0 && windows <= (int64_t{1} << 53),
               "Window::load_state_dict: windows_closed = ", windows,
               " is not a count (a whole number in [0, 2^53])");
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
        ACCRUE_CHECK(is_count(param_steps[i]), "Window::load_state_dict: param_steps[", i,
                     "] = ", param_steps[i], " is not a step count");
    } else {
      const double window_steps =
          window_state.to(Device::cpu()).to_vector<double>()[kernels::kStep];
      param_steps.assign(static_cast<size_t>(slots), window_steps);
    }
  }
  Fp8DelayedScaling* fp8 = store_.fp8_delayed_scaling();
  const bool saved_fp8 = state.count("fp8_scaling_x") != 0;
  ACCRUE_CHECK(saved_fp8 == (fp8 != nullptr), "Window::load_state_dict: the checkpoint ",
               saved_fp8 ? "holds" : "has no", " FP8 delayed scaling state ('fp8_scaling_x'), ",
               "this window's store ", fp8 ? "keeps" : "does not keep",
               " one (Note [FP8 delayed scaling]: ParamStore::keep_fp8_delayed_scaling as the "
               "run that saved it)");
  const Tensor* fp8_x = fp8 ? &get("fp8_scaling_x", fp8->x_state()) : nullptr;
  const Tensor* fp8_dy = fp8 ? &get("fp8_scaling_dy", fp8->dy_state()) : nullptr;
  if (fp8) {
    check_fp8_scaling_state(*fp8_x, "fp8_scaling_x");
    check_fp8_scaling_state(*fp8_dy, "fp8_scaling_dy");
  }
  // Note [Mid-window checkpoints]: a checkpoint without "micro_step" was taken between windows.
  int64_t m = 0;
  std::vector<bool> flags;
  const Tensor* grads = nullptr;
  const Tensor* loss_sum = nullptr;
  if (state.count("micro_step") != 0) {
    m = integer_value(get("micro_step", full({}, 0.0, DType::i64)), "micro_step");
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
    loss_sum = &get("loss_sum", ctx_->loss_sum);
  }

  // Note [One load path]: the master, then the compute copy from it (under
  // ZeRO-1 the owned ranges; the gather below does the rest).
  store_.load_master(master, sharded() ? ctx_->ranges : std::vector<ArenaRange>{});
  for (int i = 0; i < store_.options().moments(); ++i)
    store_.moment(i).copy_(*moments[static_cast<size_t>(i)]);
  ctx_->state.copy_(window_state);
  if (skips_unused())
    ctx_->slots.steps.copy_(from_vector(slot_rows(param_steps),
                                        {static_cast<int64_t>(param_steps.size()), 3}, DType::f64));
  // Note [ZeRO-1]: this rank loaded its shard; the others' come by gathering.
  if (sharded()) sync_->all_gather_owned(store_.forward_weights());
  store_.refresh_fp8_copies();  // Note [Window FP8 weights]: from the loaded weights
  if (fp8) {  // Note [FP8 delayed scaling]: past the first close, the scales exist
    fp8->x_state().copy_(*fp8_x);
    fp8->dy_state().copy_(*fp8_dy);
    fp8->set_calibrated(windows > 0);
  }
  windows_ = windows;
  // Note [Scale calibration]: the checkpoint has the scale.
  if (CalibrationStage* c = find_stage<CalibrationStage>(); c && windows > 0) c->spend();
  if (m > 0) {
    store_.grads().copy_(*grads);
    store_.set_written_flags(flags);
    ctx_->loss_sum.copy_(*loss_sum);
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
  for (double t : ctx_->slots.steps.select(1, 0).contiguous().to(Device::cpu()).to_vector<double>())
    out.push_back(static_cast<int64_t>(t));
  return out;
}

Tensor Window::owned_ranges_table() const {
  std::vector<int64_t> flat;
  for (const ArenaRange& r : ctx_->ranges) {
    flat.push_back(r.offset);
    flat.push_back(r.numel);
  }
  return from_vector<int64_t>(flat, {static_cast<int64_t>(ctx_->ranges.size()), 2});
}

std::string Window::ranges_str(const std::vector<int64_t>& table) {
  std::ostringstream s;
  for (size_t i = 0; i + 1 < table.size(); i += 2)
    s << (i == 0 ? "" : ", ") << "[" << table[i] << ", " << table[i] + table[i + 1] << ")";
  return table.empty() ? "nothing" : s.str();
}

Tensor Window::pack_owned(const Tensor& flat) const {
  int64_t total = 0;
  for (const ArenaRange& r : ctx_->ranges)
    total += r.numel;
  Tensor packed = empty({total}, flat.dtype(), flat.device());
  int64_t at = 0;
  for (const ArenaRange& r : ctx_->ranges) {
    packed.narrow(0, at, r.numel).copy_(flat.narrow(0, r.offset, r.numel));
    at += r.numel;
  }
  return packed;
}

}  // namespace accrue::optim
