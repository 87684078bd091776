// The dispatch point of dropout (kernels/dropout.h): validate, then apply the
// counter mask on the input's device. See Note [Dropout mask from the counter].
#include <cmath>

#include "core/grad_mode.h"
#include "kernels/dropout.h"
#include "kernels/dropout_backend.h"

namespace accrue::kernels {

namespace {

Tensor apply_mask(const char* op, const char* what, const Tensor& in, double p, uint64_t seed,
                  uint64_t offset) {
  NoGradGuard no_grad;
  ACCRUE_CHECK(in.defined(), op, ": ", what, " is an undefined tensor");
  ACCRUE_CHECK(is_floating(in.dtype()), op, ": ", what, " of shape ", shape_str(in.shape()),
               " has dtype ", dtype_name(in.dtype()),
               "; expected a floating dtype (f32, f64, bf16 or f16)");
  // Written so that NaN fails too.
  ACCRUE_CHECK(p >= 0.0 && p < 1.0, op, ": p = ", p, " is outside [0, 1) (", what, " of shape ",
               shape_str(in.shape()), ")");
  Tensor out = empty(in.shape(), in.dtype(), in.device());
  if (out.numel() == 0) return out;
  // Element i is the i-th in row-major order, whatever the input's strides.
  const Tensor dense = in.contiguous();
  const DropoutMask mask{seed, offset, dropout_threshold(p), 1.0 / (1.0 - p)};
  if (in.device().is_cpu()) {
    cpu::dropout(dense, mask, out);
  } else {
#ifdef ACCRUE_WITH_CUDA
    cuda::dropout(dense, mask, out);
#else
    ACCRUE_FAIL(op, ": a CUDA tensor, but accrue was built without CUDA");
#endif
  }
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  return apply_mask("dropout", "input", x, p, seed, offset);
}

Tensor dropout_backward(const Tensor& grad, double p, uint64_t seed, uint64_t offset) {
  return apply_mask("dropout_backward", "grad", grad, p, seed, offset);
}

}  // namespace accrue::kernels
