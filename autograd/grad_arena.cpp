#include "autograd/grad_arena.h"

#include <iomanip>
#include <sstream>

#include "core/allocator.h"
#include "core/grad_mode.h"
#include "kernels/ops.h"

namespace accrue {

namespace {

// Slot offsets are multiples of 256 bytes (Note [Grad arena]), times
// shard_ranks (Note [ZeRO-1]).
int64_t align_elements(int64_t n, DType dtype, int shard_ranks) {
  const int64_t per =
      static_cast<int64_t>(kAllocationAlignment / element_size(dtype)) * shard_ranks;
  return (n + per - 1) / per * per;
}

}  // namespace

GradArena::GradArena(const std::vector<Tensor>& params, const std::vector<std::string>& names,
                     const ArenaOptions& options)
    : options_(options) {
  ACCRUE_CHECK(options.master_dtype == DType::f32 || options.master_dtype == DType::f64,
               "GradArena: master dtype must be f32 or f64, got ",
               dtype_name(options.master_dtype));
  ACCRUE_CHECK(options.compute_dtype == options.master_dtype ||
                   options.compute_dtype == DType::bf16 || options.compute_dtype == DType::f16,
               "GradArena: compute dtype ", dtype_name(options.compute_dtype),
               " must be the master dtype ", dtype_name(options.master_dtype), ", bf16 or f16");
  ACCRUE_CHECK(options.moments >= 0 && options.moments <= 3,
               "GradArena: moments must be 0..3, got ", options.moments);
  ACCRUE_CHECK(options.shard_ranks >= 1 && options.shard_ranks <= 4096,
               "GradArena: shard_ranks must be 1..4096, got ", options.shard_ranks);
  ACCRUE_CHECK(names.empty() || names.size() == params.size(), "GradArena: ", names.size(),
               " names for ", params.size(), " parameters");
  ACCRUE_CHECK(!params.empty(), "GradArena: no parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    ACCRUE_CHECK(p.defined() && is_leaf(p) && p.requires_grad(), "GradArena: parameter ", i,
                 " must be a leaf that requires grad");
    ACCRUE_CHECK(index_.count(p.impl()) == 0, "GradArena: parameter ", i, " is registered twice");
    index_[p.impl()] = i;
    Slot s;
    s.name = names.empty() ? "param" + std::to_string(i) : names[i];
    s.shape = p.shape();
    // Note [Parameter layouts]: channels-last stays channels-last; any other
    // layout is copied in row-major.
    s.strides = p.is_channels_last() ? p.strides() : contiguous_strides(p.shape());
    s.numel = p.numel();
    s.offset = padded_numel_;
    padded_numel_ += align_elements(s.numel, options.master_dtype, options.shard_ranks);
    numel_ += s.numel;
    slots_.push_back(std::move(s));
  }
  // Padding must read as zero forever: the norm pass and the optimizer sweep it.
  master_ = zeros({padded_numel_}, options.master_dtype, options.device);
  grads_ = zeros({padded_numel_}, options.master_dtype, options.device);
  moment_numel_ = padded_numel_;
  for (int i = 0; i < options.moments; ++i)
    moments_.push_back(zeros({padded_numel_}, options.master_dtype, options.device));
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i)
    master_view(i).copy_(params[i]);
  const bool has_copy = options.compute_dtype != options.master_dtype;
  if (has_copy) compute_ = master_.to(options.compute_dtype);
  const Tensor& home = has_copy ? compute_ : master_;
  // Re-point each parameter at its slot: every handle the model holds sees the arena.
  for (size_t i = 0; i < params.size(); ++i) {
    TensorImpl& impl = *params[i].impl();
    impl.storage = home.storage();
    impl.offset = slots_[i].offset;
    impl.strides = slots_[i].strides;
    impl.dtype = home.dtype();
    params_.push_back(params[i]);
    set_grad(params[i], grad_view(i));
    set_grad_sink(params[i], this);
  }
  written_.assign(params.size(), false);
}

GradArena::~GradArena() {
  for (const Tensor& p : params_)
    set_grad_sink(p, nullptr);
}

const Tensor& GradArena::moment(int i) const {
  ACCRUE_CHECK(i >= 0 && i < static_cast<int>(moments_.size()), "GradArena::moment: index ", i,
               " but the arena has ", moments_.size(), " moment arenas");
  return moments_[i];
}

namespace {
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

std::string ArenaMemory::describe() const {
  return "master " + bytes_str(master) + (master_sharded ? " (sharded)" : "") + ", grads " +
         bytes_str(grads) + ", compute " + bytes_str(compute) + ", moments " + bytes_str(moments) +
         (moments_sharded ? " (sharded)" : "") + ", total " + bytes_str(total());
}

ArenaMemory GradArena::memory() const {
  auto bytes = [](const Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(element_size(t.dtype())) : int64_t{0};
  };
  ArenaMemory m;
  m.master = bytes(master_);
  m.grads = bytes(grads_);
  m.compute = bytes(compute_);
  for (const Tensor& t : moments_)
    m.moments += bytes(t);
  m.master_sharded = master_sharded_;
  m.moments_sharded = moments_sharded();
  return m;
}

void GradArena::shard_moments(int64_t numel) {
  ACCRUE_CHECK(numel >= 0 && numel <= padded_numel_, "GradArena::shard_moments: ", numel,
               " elements; the arena has ", padded_numel_);
  moment_numel_ = numel;
  for (Tensor& m : moments_) {
    m = Tensor();  // freed before the shard is allocated: the peak never holds both
    m = zeros({numel}, options_.master_dtype, options_.device);
  }
}

void GradArena::shard_master(const std::vector<ArenaRange>& owned) {
  ACCRUE_CHECK(compute_.defined(), "GradArena::shard_master: the arena has no compute copy, so ",
               "the forward reads the master weights and every rank needs them whole");
  ACCRUE_CHECK(!master_sharded_, "GradArena::shard_master: already sharded");
  int64_t packed = 0;
  for (const ArenaRange& r : owned) {
    ACCRUE_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset + r.numel <= padded_numel_,
                 "GradArena::shard_master: range [", r.offset, ", ", r.offset + r.numel,
                 ") is outside the arena's ", padded_numel_, " elements");
    packed += r.numel;
  }
  NoGradGuard no_grad;
  Tensor shard = empty({packed}, options_.master_dtype, options_.device);
  int64_t at = 0;
  for (const ArenaRange& r : owned) {
    shard.narrow(0, at, r.numel).copy_(master_.narrow(0, r.offset, r.numel));
    at += r.numel;
  }
  master_ = shard;  // the whole master is freed here
  master_sharded_ = true;
}

Tensor GradArena::master_view(size_t i) const {
  ACCRUE_CHECK(
      !master_sharded_, "GradArena::master_view: the master weights are sharded ",
      "(Note [ZeRO-1]); read the compute copy, or Window::state_dict for this rank's shard");
  return make_view(master_, slots_[i].shape, slots_[i].strides, slots_[i].offset);
}

Tensor GradArena::grad_view(size_t i) const {
  return make_view(grads_, slots_[i].shape, slots_[i].strides, slots_[i].offset);
}

int GradArena::index_of(const Tensor& param) const {
  auto it = index_.find(param.impl());
  return it == index_.end() ? -1 : static_cast<int>(it->second);
}

size_t GradArena::slot_of(const Tensor& leaf, const char* op) const {
  const int i = index_of(leaf);
  ACCRUE_CHECK(i >= 0, "GradArena::", op, ": tensor of shape ", shape_str(leaf.shape()),
               " is not registered in this arena");
  return static_cast<size_t>(i);
}

void GradArena::begin_window() {
  written_.assign(written_.size(), false);
}

void GradArena::set_written_flags(const std::vector<bool>& flags) {
  ACCRUE_CHECK(flags.size() == written_.size(), "GradArena::set_written_flags: ", flags.size(),
               " flags for ", written_.size(), " slots");
  written_ = flags;
}

int GradArena::zero_unwritten() {
  int zeroed = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (written_[i]) continue;
    grad_view(i).fill_(0.0);
    written_[i] = true;
    ++zeroed;
  }
  return zeroed;
}

void GradArena::accumulate(const Tensor& leaf, const Tensor& grad) {
  const size_t i = slot_of(leaf, "accumulate");
  Tensor slot = grad_view(i);
  if (!written_[i]) {
    slot.copy_(grad);  // first contribution of the window: write (casting to the master dtype)
    written_[i] = true;
  } else {
    kernels::axpy_(slot, 1.0, grad);  // converted to the slot's dtype: Note [Mixed axpy]
  }
}

double GradArena::next_beta(const Tensor& leaf) const {
  return written_[slot_of(leaf, "next_beta")] ? 1.0 : 0.0;
}

Tensor GradArena::claim(const Tensor& leaf, double* beta) {
  const size_t i = slot_of(leaf, "claim");
  *beta = written_[i] ? 1.0 : 0.0;
  written_[i] = true;
  return grad_view(i);
}

}  // namespace accrue
