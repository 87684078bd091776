// The dispatch point of attention (kernels/attention.h): validate, allocate,
// choose the path, call the backend (kernels/attention_backend.h).
//
// Note [Attention paths]
// ~~~~~~~~~~~~~~~~~~~~~~
// Three implementations, one contract:
//  - CPU: the reference (kernels/cpu/attention.cpp), every dtype, sums in double.
//  - cuDNN (kernels/cuda/attention_cudnn.cpp): fused flash attention for
//    bf16/f16 on CUDA, taken when accrue was built with the cuDNN frontend,
//    dropout_p == 0, the device has compute capability 8.0+ and cuDNN is
//    9.5.1 or newer (cudnn::device_supported says why), dv == d, a multiple
//    of 8 up to 128 (what cuDNN 9 serves forward and backward on every
//    architecture), not Tq == Tk == 1 (no backward engine),
//    and every operand (q, k, v, out; in backward also grad_out, dq, dk, dv)
//    starts on a 16-byte boundary with the strides of its non-unit dims
//    nonzero multiples of 16 bytes (no broadcast heads), and lse starts on
//    one (the frontend's tensor alignment: its kernels move 16-byte
//    vectors). GPT-2's packed qkv views meet this whenever d % 8 == 0.
//  - composed (kernels/cuda/attention.cu): everything else on CUDA: f32
//    (true fp32 unless TF32 is allowed), f64, bf16/f16 without cuDNN, any
//    dropout, unaligned views.
// Dropout always takes the composed path: its mask must be accrue's Philox
// stream (Note [Attention masks] in kernels/attention_backend.h), identical
// on the CPU, and cuDNN draws its own. ACCRUE_ATTENTION_COMPOSED=1 in the
// environment sends every call to the composed path (and makes
// cudnn_attention_available() false): compute-sanitizer's synccheck aborts
// cuDNN's flash-attention backward and racecheck spends minutes in its
// forward, so tools/gpu_check.sh sets it for its synccheck and racecheck runs
// (Note [Sanitizer exclusions]); unset, it costs one cached getenv per call.
//
// The paths are interchangeable per call, forward and backward: lse is the
// same quantity on all of them, the natural-log log-sum-exp of the scaled,
// masked scores of each query row, max + log(sum(exp(s - max))). That is
// exactly cuDNN's Stats output (fp32 [B, H, Tq, 1], natural log unless
// stats_use_log2 is set, which accrue never does), whose packed layout is
// that of accrue's contiguous [B, H, Tq] lse. So a backward may take another
// path than its forward (say, a gradient view that is not 16-byte aligned)
// and still consume the forward's lse.
//
// Causal attention aligns the diagonal to the bottom right (key j visible
// from query i iff j <= i + Tk - Tq) and requires Tq <= Tk, so that no query
// row is fully masked: every lse is finite and no path needs a convention
// for an empty softmax.
#include <cmath>
#include <cstdint>
#include <vector>

#include "accrue/core/env_flag.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/attention.h"
#include "accrue/kernels/attention_backend.h"
#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

constexpr const char* kForward = "scaled_dot_product_attention";
constexpr const char* kBackward = "scaled_dot_product_attention_backward";

// ---- validation -------------------------------------------------------------

void check_rank4(const Tensor& t, const char* op, const char* what, const char* layout) {
  ACCRUE_CHECK(t.dim() == 4, op, ": ", what, " must be 4-D ", layout, ", got shape ",
               shape_str(t.shape()));
}

void check_like(const Tensor& t, const Tensor& q, const Shape& shape, const char* op,
                const char* what) {
  check_defined(t, op, what);
  ACCRUE_CHECK(t.device() == q.device(), op, ": ", what, " is on ", t.device().str(),
               " but q is on ", q.device().str());
  ACCRUE_CHECK(t.dtype() == q.dtype(), op, ": ", what, " has dtype ", dtype_name(t.dtype()),
               " but q has dtype ", dtype_name(q.dtype()));
  ACCRUE_CHECK(t.shape() == shape, op, ": ", what, " of shape ", shape_str(t.shape()),
               " does not match the expected ", shape_str(shape));
  check_unit_last_stride(t, op, what);
}

// The statistics dtype: f32, or f64 for f64 inputs.
DType stats_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

void check_lse(const Tensor& lse, const Tensor& q, const Shape& shape, const char* op) {
  check_defined(lse, op, "lse");
  ACCRUE_CHECK(lse.device() == q.device(), op, ": lse is on ", lse.device().str(), " but q is on ",
               q.device().str());
  ACCRUE_CHECK(lse.dtype() == stats_dtype(q.dtype()), op, ": lse has dtype ",
               dtype_name(lse.dtype()), "; expected ", dtype_name(stats_dtype(q.dtype())), " for ",
               dtype_name(q.dtype()), " inputs");
  ACCRUE_CHECK(lse.shape() == shape, op, ": lse of shape ", shape_str(lse.shape()),
               " does not match the expected ", shape_str(shape));
  check_contiguous(lse, op, "lse");
}

// Validates q, k, v and the options; returns the problem with the scale resolved.
AttentionParams check_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& o, const char* op) {
  check_defined(q, op, "q");
  check_defined(k, op, "k");
  check_defined(v, op, "v");
  check_rank4(q, op, "q", "[B, H, Tq, d]");
  check_rank4(k, op, "k", "[B, H, Tk, d]");
  check_rank4(v, op, "v", "[B, H, Tk, dv]");
  check_floating(q, op, "q");
  for (const Tensor* t : {&k, &v}) {
    const char* what = t == &k ? "k" : "v";
    ACCRUE_CHECK(t->device() == q.device(), op, ": devices of q (", q.device().str(), ") and ",
                 what, " (", t->device().str(), ") differ");
    ACCRUE_CHECK(t->dtype() == q.dtype(), op, ": dtypes of q (", dtype_name(q.dtype()), ") and ",
                 what, " (", dtype_name(t->dtype()), ") differ");
    ACCRUE_CHECK(t->size(0) == q.size(0) && t->size(1) == q.size(1), op, ": q of shape ",
                 shape_str(q.shape()), " and ", what, " of shape ", shape_str(t->shape()),
                 " differ in batch or heads [B, H, ...]");
  }
  ACCRUE_CHECK(k.size(3) == q.size(3), op, ": q of shape ", shape_str(q.shape()),
               " and k of shape ", shape_str(k.shape()), " differ in the head dim d");
  ACCRUE_CHECK(v.size(2) == k.size(2), op, ": k of shape ", shape_str(k.shape()),
               " and v of shape ", shape_str(v.shape()), " differ in the key count Tk");
  ACCRUE_CHECK(q.size(3) >= 1 && v.size(3) >= 1 && k.size(2) >= 1, op,
               ": needs d >= 1, dv >= 1 and at least one key, got q ", shape_str(q.shape()), ", k ",
               shape_str(k.shape()), ", v ", shape_str(v.shape()));
  check_unit_last_stride(q, op, "q");
  check_unit_last_stride(k, op, "k");
  check_unit_last_stride(v, op, "v");
  ACCRUE_CHECK(o.dropout_p >= 0.0 && o.dropout_p < 1.0, op, ": dropout_p = ", o.dropout_p,
               " must lie in [0, 1)");
  ACCRUE_CHECK(!o.scale || std::isfinite(*o.scale), op, ": scale = ", o.scale.value_or(0.0),
               " is not finite");

  AttentionParams p;
  p.B = q.size(0);
  p.H = q.size(1);
  p.Tq = q.size(2);
  p.Tk = k.size(2);
  p.d = q.size(3);
  p.dv = v.size(3);
  // See Note [Attention paths]: no query row may be fully masked.
  ACCRUE_CHECK(!o.causal || p.Tq <= p.Tk, op, ": causal attention needs Tq <= Tk (the mask is ",
               "aligned to the bottom right), got Tq = ", p.Tq, " and Tk = ", p.Tk, " (q ",
               shape_str(q.shape()), ", k ", shape_str(k.shape()), ")");
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(p.d));
  p.causal = o.causal;
  p.dropout_p = o.dropout_p;
  p.seed = o.seed;
  p.offset = o.offset;
  return p;
}

// ---- path choice --------------------------------------------------------------

#ifdef ACCRUE_WITH_CUDNN_FRONTEND
// ACCRUE_ATTENTION_COMPOSED=1 (Note [Attention paths]), read once.
bool composed_forced() {
  static const bool forced = env_flag("ACCRUE_ATTENTION_COMPOSED");
  return forced;
}

// cuDNN's operand alignment (Note [Attention paths]).
bool cudnn_aligned(const Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(element_size(t.dtype()));
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int64_t i = 0; i < 3; ++i)
    if (t.size(i) > 1 && (t.stride(i) == 0 || (t.stride(i) * bytes) % 16 != 0)) return false;
  return true;
}

// operands: q first, then every other [B, H, T, d] tensor of the call.
bool use_cudnn(const std::vector<const Tensor*>& operands, const Tensor& lse,
               const AttentionParams& p) {
  const Tensor& q = *operands.front();
  if (!q.device().is_cuda() || composed_forced()) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  if (p.dropout_p > 0.0) return false;
  if (p.d % 8 != 0 || p.d > 128 || p.dv != p.d) return false;
  if (p.Tq == 1 && p.Tk == 1) return false;
  for (const Tensor* t : operands)
    if (!cudnn_aligned(*t)) return false;
  if (reinterpret_cast<uintptr_t>(lse.data_ptr()) % 16 != 0) return false;
  return cudnn::device_supported(q.device().index);
}
#endif

// The path of Note [Attention paths]: cuDNN where it admits the call, else
// the backend of the device.
void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                 const Tensor& out, const Tensor& lse) {
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  if (use_cudnn({&q, &k, &v, &out}, lse, p)) return cudnn::attention_forward(q, k, v, p, out, lse);
#endif
  ACCRUE_BACKEND_CALL(q.device(), attention_forward, q, k, v, p, out, lse);
}

void run_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse, const AttentionParams& p, const Tensor& dq,
                  const Tensor& dk, const Tensor& dv) {
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  if (use_cudnn({&q, &k, &v, &out, &g, &dq, &dk, &dv}, lse, p))
    return cudnn::attention_backward(g, q, k, v, out, lse, p, dq, dk, dv);
#endif
  ACCRUE_BACKEND_CALL(q.device(), attention_backward, g, q, k, v, out, lse, p, dq, dk, dv);
}

}  // namespace

bool cudnn_attention_available() {
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  return !composed_forced();
#else
  return false;
#endif
}

void attention_into(const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionOptions& options, const Tensor& out, const Tensor& lse) {
  NoGradGuard no_grad;
  const AttentionParams p = check_inputs(q, k, v, options, kForward);
  check_like(out, q, {p.B, p.H, p.Tq, p.dv}, kForward, "out");
  check_lse(lse, q, {p.B, p.H, p.Tq}, kForward);
  if (p.B * p.H * p.Tq == 0) return;
  run_forward(q, k, v, p, out, lse);
}

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionOptions& options) {
  NoGradGuard no_grad;
  const AttentionParams p = check_inputs(q, k, v, options, kForward);
  // [B, Tq, H, dv] in memory, so that out.transpose(1, 2) is contiguous.
  AttentionResult r{empty({p.B, p.Tq, p.H, p.dv}, q.dtype(), q.device()).transpose(1, 2),
                    empty({p.B, p.H, p.Tq}, stats_dtype(q.dtype()), q.device())};
  attention_into(q, k, v, options, r.out, r.lse);
  return r;
}

void attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionOptions& options, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv) {
  NoGradGuard no_grad;
  const AttentionParams p = check_inputs(q, k, v, options, kBackward);
  const Shape out_shape{p.B, p.H, p.Tq, p.dv};
  check_like(grad_out, q, out_shape, kBackward, "grad_out");
  check_like(out, q, out_shape, kBackward, "out");
  check_lse(lse, q, {p.B, p.H, p.Tq}, kBackward);
  check_like(dq, q, q.shape(), kBackward, "dq");
  check_like(dk, q, k.shape(), kBackward, "dk");
  check_like(dv, q, v.shape(), kBackward, "dv");
  if (p.B * p.H == 0) return;
  if (p.Tq == 0) {
    // No query: nothing flows to the keys and values.
    Tensor(dk).fill_(0.0);
    Tensor(dv).fill_(0.0);
    return;
  }
  run_backward(grad_out, q, k, v, out, lse, p, dq, dk, dv);
}

}  // namespace accrue::kernels
