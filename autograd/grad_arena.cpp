#include "accrue/autograd/grad_arena.h"

#include <optional>

#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/core/allocator.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"

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

namespace {

std::vector<NamedParameter> numbered(const std::vector<Tensor>& params) {
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back({"param" + std::to_string(i), params[i]});
  return out;
}

}  // namespace

GradArena::GradArena(const std::vector<Tensor>& params, const GradArenaOptions& options)
    : GradArena(numbered(params), options) {}

GradArena::GradArena(const std::vector<NamedParameter>& named, const GradArenaOptions& options)
    : options_(options) {
  std::vector<Tensor> params;
  for (const NamedParameter& p : named)
    params.push_back(p.tensor);
  ACCRUE_CHECK(options.dtype() == DType::f32 || options.dtype() == DType::f64,
               "GradArena: gradient dtype must be f32 or f64, got ", dtype_name(options.dtype()));
  ACCRUE_CHECK(options.shard_ranks() >= 1 && options.shard_ranks() <= 4096,
               "GradArena: shard_ranks must be 1..4096, got ", options.shard_ranks());
  ACCRUE_CHECK(!params.empty(), "GradArena: no parameters");
  auto name_of = [&](size_t i) { return named[i].name; };
  // Note [One owner]: checked for all before anything changes.
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) continue;
    const GradSink* holder = autograd::sink_of(params[i]);
    ACCRUE_CHECK(
        holder == nullptr, "GradArena", options.name().empty() ? "" : " '", options.name(),
        options.name().empty() ? "" : "'", ": parameter '", name_of(i), "' is already held by ",
        holder->describe(params[i]),
        "; a second arena would take its gradients over and leave the first with none ",
        "(its window would report grad_norm 0 and never move it). Build one arena or ",
        "ParamStore over all the parameters, or destroy the first before building another ",
        "(Note [One owner])");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    ACCRUE_CHECK(p.defined() && is_leaf(p) && p.requires_grad(), "GradArena: parameter ", i,
                 " must be a leaf that requires grad");
    ACCRUE_CHECK(index_.count(p.impl()) == 0, "GradArena: parameter ", i, " is registered twice");
    index_[p.impl()] = i;
    Slot s;
    s.name = name_of(i);
    s.shape = p.shape();
    // Note [Parameter layouts]: channels-last stays channels-last; any other
    // layout is copied in row-major.
    s.strides = p.is_channels_last() ? p.strides() : contiguous_strides(p.shape());
    s.numel = p.numel();
    s.offset = padded_numel_;
    padded_numel_ += align_elements(s.numel, options.dtype(), options.shard_ranks());
    numel_ += s.numel;
    slots_.push_back(std::move(s));
  }
  // Padding must read as zero forever: the norm pass and the optimizer sweep it.
  {
    std::optional<CudaAllocatorModeScope> own_allocation;
    if (options.shareable() && options.device().is_cuda())
      own_allocation.emplace(CudaAllocatorMode::Plain);
    grads_ = zeros({padded_numel_}, options.dtype(), options.device());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    params_.push_back(params[i]);
    set_grad(params[i], grad_view(i));
    set_grad_sink(params[i], this);
  }
  written_.assign(params.size(), false);
  order_ = std::make_unique<WriteOrder>(params.size());
}

GradArena::~GradArena() {
  for (const Tensor& p : params_)
    if (autograd::sink_of(p) == this) set_grad_sink(p, nullptr);
}

std::string GradArena::describe(const Tensor& leaf) const {
  const int i = index_of(leaf);
  return detail::str_cat("the gradient arena",
                         options_.name().empty() ? "" : " '" + options_.name() + "'", " (",
                         slots_.size(), slots_.size() == 1 ? " parameter)" : " parameters)",
                         i >= 0 ? ", as its '" + slots_[i].name + "'" : std::string());
}

Tensor GradArena::slot_view(const Tensor& flat, size_t i) const {
  return make_view(flat, slots_[i].shape, slots_[i].strides, slots_[i].offset);
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
  order_->before_write(i, order_->stream(options_.device().index));
  Tensor slot = grad_view(i);
  // Note [Weight gradients on a branch]: after the branch's writes into this slot.
  if (auto* branch = autograd::WeightGradBranch::current()) branch->slot_write(slot.data_ptr());
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
  order_->before_write(i, order_->stream(options_.device().index));
  Tensor slot = grad_view(i);
  // Note [Weight gradients on a branch]: noted as the branch's write, or ordered after them.
  if (auto* branch = autograd::WeightGradBranch::current()) branch->slot_write(slot.data_ptr());
  *beta = written_[i] ? 1.0 : 0.0;
  written_[i] = true;
  return slot;
}

void GradArena::finished(const Tensor& leaf) {
  if (order_->active())
    order_->finished(slot_of(leaf, "finished"), order_->stream(options_.device().index));
}

}  // namespace accrue
