#include "accrue/optim/param_store.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "accrue/core/grad_mode.h"

namespace accrue::optim {

namespace {

GradArenaOptions grad_options(const ParamStoreOptions& o) {
  return GradArenaOptions()
      .device(o.device())
      .dtype(o.master_dtype())
      .shard_ranks(o.shard_ranks())
      .name(o.name())
      .shareable(o.shareable_gradients());
}

void check_options(const ParamStoreOptions& o) {
  ACCRUE_CHECK(o.master_dtype() == DType::f32 || o.master_dtype() == DType::f64,
               "ParamStore: master dtype must be f32 or f64, got ", dtype_name(o.master_dtype()));
  ACCRUE_CHECK(o.compute_dtype() == o.master_dtype() || o.compute_dtype() == DType::bf16 ||
                   o.compute_dtype() == DType::f16,
               "ParamStore: compute dtype ", dtype_name(o.compute_dtype()),
               " must be the master dtype ", dtype_name(o.master_dtype()), ", bf16 or f16");
  ACCRUE_CHECK(o.moments() >= 0 && o.moments() <= 3, "ParamStore: moments must be 0..3, got ",
               o.moments());
}

// Checked before the gradient arena is built, so a bad option is named as the
// store's; an unset device becomes the parameters' one.
ParamStoreOptions checked(ParamStoreOptions o, const std::vector<Tensor>& params) {
  check_options(o);
  if (!o.has_device() && !params.empty()) {
    const Device d = params.front().device();
    for (const Tensor& p : params)
      ACCRUE_CHECK(p.device() == d, "ParamStore: parameters on ", d.str(), " and ",
                   p.device().str(),
                   "; set ParamStoreOptions::device to say where the store lives");
    o.device(d);
  }
  return o;
}

std::vector<Tensor> tensors_of(const std::vector<NamedParameter>& params) {
  std::vector<Tensor> tensors;
  for (const NamedParameter& p : params)
    tensors.push_back(p.tensor);
  return tensors;
}

std::string bytes_str(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  for (; u < 3 && v >= 1024.0; ++u)
    v /= 1024.0;
  std::ostringstream os;
  os << std::fixed << std::setprecision(u == 0 ? 0 : 1) << v << " " << units[u];
  return os.str();
}

}  // namespace

ParamStore::ParamStore(const std::vector<Tensor>& params, const ParamStoreOptions& options)
    : options_(checked(options, params)), grads_(params, grad_options(options_)) {
  adopt(params);
}

ParamStore::ParamStore(const std::vector<NamedParameter>& params, const ParamStoreOptions& options)
    : options_(checked(options, tensors_of(params))), grads_(params, grad_options(options_)) {
  adopt(tensors_of(params));
}

void ParamStore::adopt(const std::vector<Tensor>& params) {
  const ParamStoreOptions& options = options_;
  // Padding must read as zero forever: the norm pass and the optimizer sweep it.
  master_ = zeros({padded_numel()}, options.master_dtype(), options.device());
  moment_numel_ = padded_numel();
  for (int i = 0; i < options.moments(); ++i)
    moments_.push_back(zeros({padded_numel()}, options.master_dtype(), options.device()));
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i)
    master_view(i).copy_(params[i]);
  const bool has_copy = options.compute_dtype() != options.master_dtype();
  if (has_copy) compute_ = master_.to(options.compute_dtype());
  // Re-point each parameter at its slot: every handle the model holds sees the store.
  for (size_t i = 0; i < params.size(); ++i) {
    point_at(i, forward_weights());
    set_parameter_owner(params[i], this);
  }
}

void ParamStore::point_at(size_t i, const Tensor& arena) {
  TensorImpl& impl = *params()[i].impl();
  impl.storage = arena.storage();
  impl.offset = slots()[i].offset;
  impl.strides = slots()[i].strides;
  impl.dtype = arena.dtype();
}

ParamStore::~ParamStore() {
  for (const Tensor& p : params())
    set_parameter_owner(p, nullptr);
}

const Tensor& ParamStore::moment(int i) const {
  join("ParamStore::moment");
  ACCRUE_CHECK(i >= 0 && i < static_cast<int>(moments_.size()), "ParamStore::moment: index ", i,
               " but the store has ", moments_.size(), " moment arenas");
  return moments_[i];
}

std::string StoreMemory::describe() const {
  return "master " + bytes_str(master) + (master_sharded ? " (sharded)" : "") + ", grads " +
         bytes_str(grads) + ", compute " + bytes_str(compute) + ", moments " + bytes_str(moments) +
         (moments_sharded ? " (sharded)" : "") +
         (fp8 > 0 ? ", fp8 copies " + bytes_str(fp8) +
                        (fp8_in_compute ? " (codes in the compute slots)" : "")
                  : "") +
         ", total " + bytes_str(total());
}

StoreMemory ParamStore::memory() const {
  auto bytes = [](const Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(element_size(t.dtype())) : int64_t{0};
  };
  StoreMemory m;
  m.master = bytes(master_);
  m.grads = bytes(grads());
  m.compute = bytes(compute_);
  for (const Tensor& t : moments_)
    m.moments += bytes(t);
  m.fp8 = (fp8_ ? fp8_->bytes() : 0) + (fp8_scaling_ ? fp8_scaling_->bytes() : 0);
  m.master_sharded = master_sharded_;
  m.moments_sharded = moments_sharded();
  m.fp8_in_compute = fp8_ && fp8_->any_in_slot();
  return m;
}

void ParamStore::keep_fp8_copies(const std::vector<Tensor>& weights, DType dtype, int margin,
                                 Fp8Recipe recipe) {
  ACCRUE_CHECK(is_fp8(dtype), "ParamStore::keep_fp8_copies: dtype ", dtype_name(dtype),
               " is not an FP8 dtype (f8e4m3 or f8e5m2)");
  auto recipe_name = [](Fp8Recipe r) { return r == Fp8Recipe::block ? "block" : "tensor"; };
  ACCRUE_CHECK(
      !fp8_ || (fp8_->dtype() == dtype && fp8_->margin() == margin && fp8_->recipe() == recipe),
      "ParamStore::keep_fp8_copies: the store keeps ", fp8_ ? dtype_name(fp8_->dtype()) : "",
      " copies with margin ", fp8_ ? fp8_->margin() : 0, ", recipe ",
      fp8_ ? recipe_name(fp8_->recipe()) : "", "; asked for ", dtype_name(dtype), " with margin ",
      margin, ", recipe ", recipe_name(recipe));
  if (!fp8_) fp8_ = std::make_unique<Fp8WeightCopies>(dtype, margin, recipe);
  for (const Tensor& w : weights) {
    const size_t i = slot_of(w, "keep_fp8_copies");
    if (!codes_fit_compute_slot(i)) {
      fp8_->add(i, slots()[i].name, params()[i]);
      continue;
    }
    // Note [FP8 codes in the compute slots]: the codes overwrite the slot,
    // so the parameter moves to its master slot.
    const Slot& s = slots()[i];
    fp8_->add_in_slot(i, s.name, master_view(i), compute_.narrow(0, s.offset, s.numel));
    point_at(i, master_);
  }
}

bool ParamStore::codes_fit_compute_slot(size_t i) const {
  return options_.fp8_codes_in_compute_slots() && compute_.defined() &&
         element_size(compute_.dtype()) == 2 && !master_sharded_ && slots()[i].numel > 0;
}

void ParamStore::move_fp8_codes_out_of_compute() {
  if (!fp8_) return;
  NoGradGuard no_grad;
  for (size_t i = 0; i < size(); ++i) {
    if (!fp8_->in_slot(i)) continue;
    const Slot& s = slots()[i];
    compute_.narrow(0, s.offset, s.numel).copy_(master_.narrow(0, s.offset, s.numel));
    point_at(i, compute_);
    fp8_->move_out_of_slot(i, params()[i]);
  }
}

void ParamStore::keep_fp8_delayed_scaling(const std::vector<Tensor>& weights,
                                          const Fp8DelayedOptions& options) {
  ACCRUE_CHECK(!fp8_scaling_,
               "ParamStore::keep_fp8_delayed_scaling: the store keeps delayed "
               "scaling already (once, for every FP8 layer)");
  std::vector<std::pair<size_t, std::string>> layers;
  for (const Tensor& w : weights) {
    const size_t i = slot_of(w, "keep_fp8_delayed_scaling");
    layers.emplace_back(i, slots()[i].name);
  }
  fp8_scaling_ = std::make_unique<Fp8DelayedScaling>(layers, options, options_.device());
}

const Fp8DelayedRows* ParamStore::fp8_scaling(const Tensor& param) const {
  if (!fp8_scaling_) return nullptr;
  const int i = index_of(param);
  return i < 0 ? nullptr : fp8_scaling_->find(static_cast<size_t>(i));
}

void ParamStore::refresh_fp8_copies() {
  if (fp8_) fp8_->refresh();
}

const Fp8Weight* ParamStore::fp8_copy(const Tensor& param) const {
  if (!fp8_) return nullptr;
  const int i = index_of(param);
  return i < 0 ? nullptr : fp8_->find(static_cast<size_t>(i));
}

void ParamStore::shard_moments(int64_t numel) {
  ACCRUE_CHECK(numel >= 0 && numel <= padded_numel(), "ParamStore::shard_moments: ", numel,
               " elements; the store has ", padded_numel());
  moment_numel_ = numel;
  for (Tensor& m : moments_) {
    m = Tensor();  // freed before the shard is allocated: the peak never holds both
    m = zeros({numel}, options_.master_dtype(), options_.device());
  }
}

void ParamStore::shard_master(const std::vector<ArenaRange>& owned) {
  ACCRUE_CHECK(compute_.defined(), "ParamStore::shard_master: the store has no compute copy, so ",
               "the forward reads the master weights and every rank needs them whole");
  ACCRUE_CHECK(!master_sharded_, "ParamStore::shard_master: already sharded");
  int64_t packed = 0;
  for (const ArenaRange& r : owned) {
    ACCRUE_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset + r.numel <= padded_numel(),
                 "ParamStore::shard_master: range [", r.offset, ", ", r.offset + r.numel,
                 ") is outside the store's ", padded_numel(), " elements");
    packed += r.numel;
  }
  // Note [FP8 codes in the compute slots]: the codes are cast from the whole
  // master, which is about to go; they move out, the parameters back.
  move_fp8_codes_out_of_compute();
  NoGradGuard no_grad;
  Tensor shard = empty({packed}, options_.master_dtype(), options_.device());
  int64_t at = 0;
  for (const ArenaRange& r : owned) {
    shard.narrow(0, at, r.numel).copy_(master_.narrow(0, r.offset, r.numel));
    at += r.numel;
  }
  master_ = shard;  // the whole master is freed here
  master_sharded_ = true;
  owned_ = owned;
}

void ParamStore::set_join_hook(std::function<void(const char*)> hook) {
  // Note [Close under the forward]: one Window steps the store beside the forward at a time.
  ACCRUE_CHECK(!hook || !join_,
               "ParamStore: a second Window with close_under_forward on this store; one steps it "
               "beside the forward at a time");
  join_ = std::move(hook);
}

Tensor ParamStore::master_view(size_t i) const {
  join("ParamStore::master_view");
  ACCRUE_CHECK(
      !master_sharded_, "ParamStore::master_view: the master weights are sharded ",
      "(Note [ZeRO-1]); read the compute copy, or Window::state_dict for this rank's shard");
  return grads_.slot_view(master_, i);
}

size_t ParamStore::slot_of(const Tensor& param, const char* op) const {
  const int i = index_of(param);
  ACCRUE_CHECK(i >= 0, "ParamStore::", op, ": tensor of shape ", shape_str(param.shape()),
               " is not a parameter of this store");
  return static_cast<size_t>(i);
}

void ParamStore::load(const std::string& name, const Tensor& value) {
  for (size_t i = 0; i < size(); ++i)
    if (slots()[i].name == name) return load_slot(i, value, "load");
  ACCRUE_FAIL("ParamStore::load: no parameter named '", name, "' (the store holds ", size(),
              " parameters)");
}

void ParamStore::load(const Tensor& param, const Tensor& value) {
  load_slot(slot_of(param, "load"), value, "load");
}

Tensor ParamStore::value(const Tensor& param) const {
  join("ParamStore::value");
  const size_t i = slot_of(param, "value");
  return master_sharded_ ? param : master_view(i);
}

void ParamStore::load_slot(size_t i, const Tensor& value, const char* op) {
  join("ParamStore::load");
  const Slot& s = slots()[i];
  ACCRUE_CHECK(value.defined() && value.shape() == s.shape, "ParamStore::", op, ": '", s.name,
               "' has shape ", shape_str(s.shape), ", the value ",
               value.defined() ? shape_str(value.shape()) : std::string("undefined"));
  NoGradGuard no_grad;
  // Note [One load path]: the master's values (the value cast once to the
  // master dtype), then the compute copy cast from them.
  Tensor flat = empty({s.numel}, options_.master_dtype(), options_.device());
  make_view(flat, s.shape, s.strides, 0).copy_(value);
  if (!master_sharded_) {
    master_.narrow(0, s.offset, s.numel).copy_(flat);
  } else {
    int64_t at = 0;  // the packed master's position of each owned range
    for (const ArenaRange& r : owned_) {
      const int64_t lo = std::max(r.offset, s.offset);
      const int64_t hi = std::min(r.offset + r.numel, s.offset + s.numel);
      if (lo < hi)
        master_.narrow(0, at + lo - r.offset, hi - lo)
            .copy_(flat.narrow(0, lo - s.offset, hi - lo));
      at += r.numel;
    }
  }
  if (compute_.defined()) compute_.narrow(0, s.offset, s.numel).copy_(flat);
  if (fp8_) fp8_->refresh_slot(i);  // Note [Window FP8 weights]
}

void ParamStore::load_master(const Tensor& master, const std::vector<ArenaRange>& owned) {
  join("ParamStore::load_master");
  NoGradGuard no_grad;
  if (owned.empty()) {
    ACCRUE_CHECK(!master_sharded_, "ParamStore::load_master: the master is sharded; ",
                 "give the owned ranges the packed values cover");
    master_.copy_(master);
    refresh_compute();
    return;
  }
  // Note [ZeRO-1]: this rank's owned ranges only; the gather brings the rest
  // of the forward's weights (and its caller then recasts the FP8 copies).
  ACCRUE_CHECK(master_sharded_ || !fp8_ || !fp8_->any_in_slot(),
               "ParamStore::load_master: owned ranges of a whole master whose FP8 codes live in "
               "the compute slots (Note [FP8 codes in the compute slots]); give the whole master");
  int64_t at = 0;
  for (const ArenaRange& r : owned) {
    const Tensor part = master.narrow(0, at, r.numel);
    if (!master_sharded_) master_.narrow(0, r.offset, r.numel).copy_(part);
    if (compute_.defined()) compute_.narrow(0, r.offset, r.numel).copy_(part);
    at += r.numel;
  }
  if (master_sharded_) master_.copy_(master);
}

void ParamStore::refresh_compute() {
  join("ParamStore::refresh_compute");
  ACCRUE_CHECK(!master_sharded_, "ParamStore::refresh_compute: the master is sharded; ",
               "the forward's weights come from the ranks' gather");
  NoGradGuard no_grad;
  if (compute_.defined()) compute_.copy_(master_);
  refresh_fp8_copies();
}

}  // namespace accrue::optim
