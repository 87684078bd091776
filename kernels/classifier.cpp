// The dispatch point of the fused classifier (kernels/classifier.h): validate
// (errors name the op and the values), allocate, run the chunk loop of Note
// [Fused classifier], and call the backend of the inputs' device.
#include <algorithm>
#include <string>
#include <vector>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/classifier.h"
#include "accrue/kernels/classifier_backend.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

// Note [Classifier chunk rows]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Forward computes the logits of at most kChunkRows token rows per GEMM. A
// 4096 x V x D GEMM (V in the tens of thousands, D in the hundreds) has
// thousands of output tiles, enough to run cuBLASLt at full speed on any GPU,
// and W is streamed once per chunk, N / 4096 times in all: small next to the
// logits traffic. Smaller chunks whose logits would stay in L2 for the row
// kernel (about 256 rows of 50304 bf16 classes on an H100) would re-read W
// more often than they save. The chunk size bounds no memory: every chunk
// writes into its rows of the one dlogits buffer, and N <= 4096 rows is one
// GEMM and one launch of the row kernel.
constexpr int64_t kChunkRows = 4096;

// hidden [N, D] and weight [V_padded, D] of one float dtype, on one device.
void check_hidden_weight(const Tensor& hidden, const Tensor& weight, const char* op) {
  check_float_pair(hidden, weight, op, "hidden", "weight");
  ACCRUE_CHECK(hidden.dim() == 2, op, ": hidden must be 2-D [N, D], got shape ",
               shape_str(hidden.shape()));
  ACCRUE_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(1), op, ": weight of shape ",
               shape_str(weight.shape()), " does not match hidden of shape ",
               shape_str(hidden.shape()), " (expected [V_padded, ", hidden.size(1), "])");
}

}  // namespace

ClassifierOutput classifier_forward(const Tensor& hidden, const Tensor& weight,
                                    const Tensor& targets, int64_t valid_classes,
                                    int64_t ignore_index) {
  NoGradGuard no_grad;
  const char* name = "classifier_forward";
  check_hidden_weight(hidden, weight, name);
  check_defined(targets, name, "targets");
  check_same_device(hidden, targets, name, "hidden", "targets");
  ACCRUE_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64, name,
               ": targets of shape ", shape_str(targets.shape()), " have dtype ",
               dtype_name(targets.dtype()), "; expected i32 or i64");
  const int64_t n = hidden.size(0), padded = weight.size(0);
  ACCRUE_CHECK(targets.dim() == 1 && targets.size(0) == n, name, ": targets of shape ",
               shape_str(targets.shape()), " do not match hidden of shape ",
               shape_str(hidden.shape()), " (expected [", n, "])");
  ACCRUE_CHECK(valid_classes > 0 && valid_classes <= padded, name, ": valid_classes ",
               valid_classes, " must lie in [1, ", padded, "] (the rows of weight of shape ",
               shape_str(weight.shape()), ")");
  const Tensor t = targets.contiguous();
  check_index_range(t, valid_classes, ignore_index, true, name, "target");

  const Device device = hidden.device();
  const DType loss_dtype = widened(hidden.dtype());
  ClassifierOutput r{empty({}, loss_dtype, device), empty({}, DType::i64, device),
                     empty({n, padded}, hidden.dtype(), device)};
  if (n == 0) {
    r.sum.fill_(0.0);
    r.count.fill_(0.0);
    return r;
  }
  Tensor row_loss = empty({n}, loss_dtype, device);
  // See Note [Classifier chunk rows].
  for (int64_t start = 0; start < n; start += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, n - start);
    const Tensor logits = r.dlogits.narrow(0, start, rows);  // contiguous rows
    gemm(hidden.narrow(0, start, rows), false, weight, true, logits, 1.0, 0.0);
    ACCRUE_BACKEND_CALL(device, classifier_rows, logits, t.narrow(0, start, rows), valid_classes,
                        ignore_index, row_loss.narrow(0, start, rows));
  }
  ACCRUE_BACKEND_CALL(device, classifier_total, row_loss, t, ignore_index, r.sum, r.count);
  return r;
}

Tensor classifier_backward(const Tensor& dlogits, const Tensor& hidden, const Tensor& weight,
                           const Tensor& grad_sum, bool need_dh, const Tensor& dweight,
                           double beta) {
  NoGradGuard no_grad;
  const char* name = "classifier_backward";
  check_hidden_weight(hidden, weight, name);
  const int64_t n = hidden.size(0), d = hidden.size(1), padded = weight.size(0);
  const Device device = hidden.device();
  const DType dtype = hidden.dtype();
  check_defined(dlogits, name, "dlogits");
  check_same_device(dlogits, hidden, name, "dlogits", "hidden");
  ACCRUE_CHECK(dlogits.dtype() == dtype && dlogits.shape() == Shape({n, padded}), name,
               ": dlogits of shape ", shape_str(dlogits.shape()), " and dtype ",
               dtype_name(dlogits.dtype()), " do not match hidden ", shape_str(hidden.shape()),
               " and weight ", shape_str(weight.shape()), " (expected [", n, ", ", padded, "] ",
               dtype_name(dtype), ")");
  check_defined(grad_sum, name, "grad_sum");
  check_same_device(grad_sum, hidden, name, "grad_sum", "hidden");
  ACCRUE_CHECK(is_floating(grad_sum.dtype()) && grad_sum.numel() == 1, name,
               ": grad_sum must be a 0-d floating tensor, got shape ", shape_str(grad_sum.shape()),
               " of dtype ", dtype_name(grad_sum.dtype()));
  if (dweight.defined()) {
    check_same_device(dweight, hidden, name, "dweight", "hidden");
    check_dtype_or_f32(dweight, dtype, is_16_bit(dtype), name, "dweight");
    ACCRUE_CHECK(dweight.shape() == weight.shape(), name, ": dweight of shape ",
                 shape_str(dweight.shape()), " does not match weight of shape ",
                 shape_str(weight.shape()));
    check_contiguous(dweight, name, "dweight");
    ACCRUE_CHECK(beta == 0.0 || beta == 1.0, name, ": beta ", beta,
                 " must be 0 (write dweight) or 1 (add to it)");
  }
  // The seed stays on the device: at most a device-side conversion.
  const Tensor seed = grad_sum.reshape({}).to(widened(dtype)).contiguous();
  const Tensor dl = dlogits.contiguous();

  if (dweight.defined()) {
    // dW (= or +=) dlogits^T @ (g * h); see Note [Fused classifier].
    Tensor scaled_hidden = empty({n, d}, dtype, device);
    if (scaled_hidden.numel() > 0)
      ACCRUE_BACKEND_CALL(device, scale_by_seed, hidden.contiguous(), seed, scaled_hidden);
    gemm(dl, true, scaled_hidden, false, dweight, 1.0, beta);
  }
  if (!need_dh) return Tensor();
  // dh = g * (dlogits @ W): the product in fp32 for bf16/f16, scaled and rounded once.
  Tensor product = empty({n, d}, is_16_bit(dtype) ? DType::f32 : dtype, device);
  gemm(dl, false, weight, false, product, 1.0, 0.0);
  Tensor dh = product.dtype() == dtype ? product : empty({n, d}, dtype, device);
  if (dh.numel() > 0) ACCRUE_BACKEND_CALL(device, scale_by_seed, product, seed, dh);
  return dh;
}

}  // namespace accrue::kernels
