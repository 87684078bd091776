#include "accrue/optim/fp8_weights.h"

#include "accrue/autograd/variable.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/fp8.h"

namespace accrue::optim {

namespace {
constexpr int64_t kBlock = 128;  // the block recipe's weight blocks, 128 x 128
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

void Fp8WeightCopies::add(size_t slot, const std::string& name, const Tensor& param) {
  ACCRUE_CHECK(find(slot) == nullptr, "ParamStore::keep_fp8_copies: '", name,
               "' already has an FP8 copy");
  ACCRUE_CHECK(param.dim() == 2 && param.size(0) % 16 == 0 && param.size(1) % 16 == 0,
               "ParamStore::keep_fp8_copies: '", name, "' of shape ", shape_str(param.shape()),
               " is not a 2-D weight whose sizes are multiples of 16 (the FP8 GEMMs' rule)");
  const int64_t n = param.size(0), k = param.size(1);
  const Device d = param.device();
  Copy c{slot, param, {}, accrue::empty({1}, DType::f32, d)};
  c.weight.q = accrue::empty({n, k}, dtype_, d);
  c.weight.q_t = accrue::empty({k, n}, dtype_, d);
  if (recipe_ == Fp8Recipe::block) {
    const int64_t bn = (n + kBlock - 1) / kBlock, bk = (k + kBlock - 1) / kBlock;
    c.weight.scale_inv = accrue::empty({bn, bk}, DType::f32, d);
    c.weight.scale_inv_t = accrue::empty({bk, bn}, DType::f32, d);
    c.weight.amax = c.amax;
  } else {
    c.weight.scale_inv = accrue::empty({1}, DType::f32, d);
  }
  cast(c);
  copies_.push_back(std::move(c));
}

void Fp8WeightCopies::cast(Copy& c) const {
  NoGradGuard no_grad;
  const Tensor w = detach(c.param);
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
  for (Copy& c : copies_)
    if (c.slot == slot) cast(c);
}

const Fp8Weight* Fp8WeightCopies::find(size_t slot) const {
  for (const Copy& c : copies_)
    if (c.slot == slot) return &c.weight;
  return nullptr;
}

int64_t Fp8WeightCopies::bytes() const {
  int64_t b = 0;
  for (const Copy& c : copies_) {
    b += c.weight.q.numel() + c.weight.q_t.numel();  // codes and their transpose
    const int64_t scales_t = c.weight.blocks() ? c.weight.scale_inv_t.numel() : 0;
    b += 4 * (c.weight.scale_inv.numel() + scales_t + 1);  // the scales and the amax
  }
  return b;
}

}  // namespace accrue::optim
