#include "accrue/optim/fp8_weights.h"

#include "accrue/autograd/variable.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/fp8.h"

namespace accrue::optim {

namespace {

constexpr int64_t kBlock = 128;  // the block recipe's weight blocks, 128 x 128

// A contiguous FP8 tensor of `shape` over the bytes of `home` from byte `at`
// (Note [FP8 codes in the compute slots]); the codes must fit in home.
Tensor codes_in(const Tensor& home, DType dtype, int64_t at, const Shape& shape) {
  ACCRUE_CHECK(element_size(dtype) == 1 && home.is_contiguous() &&
                   at + shape_numel(shape) <= static_cast<int64_t>(home.nbytes()),
               "ParamStore::keep_fp8_copies: codes of shape ", shape_str(shape), " at byte ", at,
               " overrun their compute slot of ", home.nbytes(), " bytes");
  const int64_t begin = home.offset() * static_cast<int64_t>(element_size(home.dtype())) + at;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = home.storage();
  impl->offset = begin;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace

Fp8WeightCopies::Fp8WeightCopies(DType dtype, int margin, Fp8Recipe recipe)
    : dtype_(dtype), margin_(margin), recipe_(recipe) {
  ACCRUE_CHECK(is_fp8(dtype), "ParamStore::keep_fp8_copies: dtype ", dtype_name(dtype),
               " is not an FP8 dtype (f8e4m3 or f8e5m2)");
  ACCRUE_CHECK(recipe == Fp8Recipe::tensor || margin == 0,
               "ParamStore::keep_fp8_copies: the block recipe's scales take no margin (Note "
               "[FP8 block scaling]); got margin ",
               margin);
}

Fp8WeightCopies::Copy Fp8WeightCopies::make(size_t slot, const std::string& name,
                                            const Tensor& param) const {
  ACCRUE_CHECK(find(slot) == nullptr, "ParamStore::keep_fp8_copies: '", name,
               "' already has an FP8 copy");
  ACCRUE_CHECK(param.dim() == 2 && param.size(0) % 16 == 0 && param.size(1) % 16 == 0,
               "ParamStore::keep_fp8_copies: '", name, "' of shape ", shape_str(param.shape()),
               " is not a 2-D weight whose sizes are multiples of 16 (the FP8 GEMMs' rule)");
  const int64_t n = param.size(0), k = param.size(1);
  const Device d = param.device();
  Copy c{slot, param, {}, accrue::empty({1}, DType::f32, d), Tensor()};
  if (recipe_ == Fp8Recipe::block) {
    const int64_t bn = (n + kBlock - 1) / kBlock, bk = (k + kBlock - 1) / kBlock;
    c.weight.scale_inv = accrue::empty({bn, bk}, DType::f32, d);
    c.weight.scale_inv_t = accrue::empty({bk, bn}, DType::f32, d);
    c.weight.amax = c.amax;
  } else {
    c.weight.scale_inv = accrue::empty({1}, DType::f32, d);
  }
  return c;
}

void Fp8WeightCopies::add(size_t slot, const std::string& name, const Tensor& param) {
  Copy c = make(slot, name, param);
  const int64_t n = param.size(0), k = param.size(1);
  c.weight.q = accrue::empty({n, k}, dtype_, param.device());
  c.weight.q_t = accrue::empty({k, n}, dtype_, param.device());
  cast(c);
  index_.emplace(slot, copies_.size());
  copies_.push_back(std::move(c));
}

void Fp8WeightCopies::add_in_slot(size_t slot, const std::string& name, const Tensor& master,
                                  const Tensor& home) {
  Copy c = make(slot, name, master);
  ACCRUE_CHECK(
      home.defined() && home.dim() == 1 && home.numel() == master.numel() && home.is_contiguous() &&
          element_size(home.dtype()) == 2 && home.device() == master.device(),
      "ParamStore::keep_fp8_copies: '", name, "' needs a contiguous 16-bit compute slot of ",
      master.numel(), " elements for its codes (Note [FP8 codes in the compute slots])");
  ACCRUE_CHECK(!staging_.defined() || staging_.dtype() == home.dtype(),
               "ParamStore::keep_fp8_copies: compute slots of ", dtype_name(staging_.dtype()),
               " and ", dtype_name(home.dtype()));
  const int64_t n = master.size(0), k = master.size(1);
  c.home = home;
  c.weight.q = codes_in(home, dtype_, 0, {n, k});
  c.weight.q_t = codes_in(home, dtype_, n * k, {k, n});
  if (!staging_.defined() || staging_.numel() < n * k)
    staging_ = accrue::empty({n * k}, home.dtype(), home.device());
  cast(c);
  index_.emplace(slot, copies_.size());
  copies_.push_back(std::move(c));
  ++in_slot_;
}

bool Fp8WeightCopies::in_slot(size_t slot) const {
  const auto it = index_.find(slot);
  return it != index_.end() && copies_[it->second].home.defined();
}

bool Fp8WeightCopies::any_in_slot() const {
  return in_slot_ > 0;
}

void Fp8WeightCopies::move_out_of_slot(size_t slot, const Tensor& param) {
  Copy* c = find_copy(slot);
  ACCRUE_CHECK(c != nullptr && c->home.defined() && param.shape() == c->param.shape(),
               "Fp8WeightCopies::move_out_of_slot: slot ", slot,
               " has no copy in its compute slot");
  c->home = Tensor();
  c->param = param;
  c->weight.q = accrue::empty(c->weight.q.shape(), dtype_, param.device());
  c->weight.q_t = accrue::empty(c->weight.q_t.shape(), dtype_, param.device());
  cast(*c);
  if (--in_slot_ == 0) staging_ = Tensor();
}

void Fp8WeightCopies::cast(Copy& c) const {
  NoGradGuard no_grad;
  // Note [FP8 codes in the compute slots]: the master rounded as the step
  // rounds the compute copy, staged apart from the slot the codes overwrite.
  Tensor w = detach(c.param);
  if (c.home.defined()) {
    const Tensor staged = make_view(staging_, w.shape(), contiguous_strides(w.shape()), 0);
    staged.copy_(w);
    w = staged;
  }
  if (recipe_ == Fp8Recipe::block) {
    // Note [FP8 block recipe]: W's blocks, and W^T's cast from W^T (the same
    // codes and scales, transposed), into the copy's buffers; the amax twice,
    // the same value. The reader guards the scales with it.
    kernels::cast_to_fp8_blockwise_into(w, kBlock, kBlock, /*power_of_two=*/true, c.weight.q,
                                        c.weight.scale_inv, c.amax);
    kernels::cast_to_fp8_blockwise_into(w.transpose(0, 1), kBlock, kBlock, /*power_of_two=*/true,
                                        c.weight.q_t, c.weight.scale_inv_t, c.amax);
    return;
  }
  // Current scaling (Note [FP8 scaling]): the amax of the weight as it is now,
  // one read of it into the copy's own amax: no allocation in the close.
  kernels::fp8_amax_into(w, c.amax);
  // The cast makes the scale from it (Note [FP8 overflow]: a non-finite
  // weight makes every GEMM reading it NaN).
  kernels::cast_to_fp8_transpose_scaled_into(w, c.amax, margin_, /*power_of_two=*/false,
                                             /*nan_on_overflow=*/true, c.weight.q, c.weight.q_t,
                                             c.weight.scale_inv);
}

void Fp8WeightCopies::refresh() {
  for (Copy& c : copies_)
    cast(c);
}

void Fp8WeightCopies::refresh_slot(size_t slot) {
  if (Copy* c = find_copy(slot)) cast(*c);
}

Fp8WeightCopies::Copy* Fp8WeightCopies::find_copy(size_t slot) {
  const auto it = index_.find(slot);
  return it == index_.end() ? nullptr : &copies_[it->second];
}

const Fp8Weight* Fp8WeightCopies::find(size_t slot) const {
  const auto it = index_.find(slot);
  return it == index_.end() ? nullptr : &copies_[it->second].weight;
}

int64_t Fp8WeightCopies::bytes() const {
  int64_t b = 0;
  for (const Copy& c : copies_) {
    // Codes and their transpose, unless they live in the compute slot.
    if (!c.home.defined()) b += c.weight.q.numel() + c.weight.q_t.numel();
    const int64_t scales_t = c.weight.blocks() ? c.weight.scale_inv_t.numel() : 0;
    b += 4 * (c.weight.scale_inv.numel() + scales_t + 1);  // the scales and the amax
  }
  if (staging_.defined())
    b += staging_.numel() * static_cast<int64_t>(element_size(staging_.dtype()));
  return b;
}

}  // namespace accrue::optim
