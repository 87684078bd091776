// The dispatch point of dropout (kernels/dropout.h): validate, then apply the
// counter mask on the input's device. See Note [Dropout mask from the counter].
#include <cmath>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/dropout.h"
#include "accrue/kernels/dropout_backend.h"

namespace accrue::kernels {

namespace {

Tensor apply_mask(const char* op, const char* what, const Tensor& in, double p, uint64_t seed,
                  uint64_t offset) {
  NoGradGuard no_grad;
  dispatch_util::check_defined(in, op, what);
  dispatch_util::check_floating(in, op, what);
  // Written so that NaN fails too.
  ACCRUE_CHECK(p >= 0.0 && p < 1.0, op, ": p = ", p, " is outside [0, 1) (", what, " of shape ",
               shape_str(in.shape()), ")");
  Tensor out = empty(in.shape(), in.dtype(), in.device());
  if (out.numel() == 0) return out;
  // Element i is the i-th in row-major order, whatever the input's strides.
  const Tensor dense = in.contiguous();
  const DropoutMask mask{seed, offset, dropout_threshold(p), 1.0 / (1.0 - p)};
  ACCRUE_BACKEND_CALL(in.device(), dropout, dense, mask, out);
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
