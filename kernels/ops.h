// Every numeric operation of accrue, without autograd: the one dispatch point.
//
// Each function validates its inputs (shapes, dtypes, devices: a failure
// throws accrue::Error naming the op and the values), allocates the result,
// and hands plain, pre-shaped tensors to the CPU reference (kernels/cpu/) or
// the CUDA path (kernels/cuda/), chosen by the inputs' device. The backends
// share one interface, kernels/backend.h.
//
// Floating ops accept f32, f64, bf16 and f16; bf16/f16 compute in fp32.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

enum class UnaryOp {
  Neg,
  Exp,
  Log,
  Sqrt,
  Tanh,
  Relu,
  Gelu,
  Sigmoid,
  Pow,
  Silu,   // x * sigmoid(x)
  Rsqrt,  // 1 / sqrt(x)
  Sin,
  Cos,
  Abs,  // its gradient at 0 is 0, as PyTorch's sign
};
// Min and Max are elementwise minimum and maximum; a NaN in either operand
// gives NaN, as PyTorch's minimum and maximum.
enum class BinaryOp { Add, Sub, Mul, Div, Min, Max };
enum class CompareOp { Eq, Ne, Lt, Le, Gt, Ge };
enum class ReduceOp { Sum, Mean, Max, ArgMax };

const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);

// ---- elementwise, with numpy broadcasting -----------------------------------
// Broadcasting as NumPy's; operands of one op share a dtype, never promoted
// (Note [Broadcasting and dtypes] in kernels/dispatch_util.h).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// a op s, or s op a when scalar_first.
Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first = false);
// param is the exponent for Pow and unused otherwise.
Tensor unary(UnaryOp op, const Tensor& a, double param = 0.0);
// The gradient of a unary op: grad * f'(input). `output` is f(input) (used by
// Tanh, Sigmoid, Exp, Sqrt); pass it when you have it, else it is recomputed.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& input, const Tensor& output,
                      double param = 0.0);
// The gradient of minimum/maximum (op Min or Max) with respect to its operand
// x, the other being y (x, y and grad broadcast together): grad where x wins,
// 0 where y wins, grad / 2 at ties; a NaN passes grad to both operands, as
// PyTorch's. The result has the broadcast shape (sum_to it to x's shape).
Tensor minmax_backward(BinaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y);
// min(max(x, lo), hi) with either bound absent (at least one given); lo > hi
// throws. NaN stays NaN.
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi);
// grad where lo <= x <= hi (bounds included, as PyTorch), 0 elsewhere and at NaN.
Tensor clamp_backward(const Tensor& grad, const Tensor& x, std::optional<double> lo,
                      std::optional<double> hi);
// Returns a bool tensor.
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);
// cond ? a : b, all three broadcast together; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// The same with one operand a scalar, converted to the tensor operand's dtype.
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
// x with `value` where mask (bool, broadcast to x's shape) is true. x of any dtype.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// The lower (tril) or upper (triu) triangle of the last two dims of x (dim >=
// 2, any dtype), the rest zero: element (i, j) is kept where j - i <= diagonal
// (tril) or j - i >= diagonal (triu).
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
// dst += alpha * src in place (src broadcast to dst's shape). dst may be a strided view.
// src of another floating dtype is converted to dst's first (as src.to(dst.dtype())
// would), a 16-bit src into an f32 dst in the same pass (Note [Mixed axpy]).
void axpy_(const Tensor& dst, double alpha, const Tensor& src);

// ---- reductions ---------------------------------------------------------------
// dims empty means all dims. Results keep the input dtype (accumulation in
// fp32, f64 for f64 inputs), except argmax which is i64.
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Index of the first maximum along dim; without a dim, over the flattened tensor.
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// Sums `a` down to `shape` (the reverse of broadcasting `shape` to a.shape()).
Tensor sum_to(const Tensor& a, const Shape& shape);
// out (= or +=) the sum over the rows of a 2-D [n, d] tensor; out is [d].
// The bias gradient of Linear (see Note [Overwrite first] in the arena).
void sum_rows_into(const Tensor& a, const Tensor& out, bool accumulate);

Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// Given the forward output y: dx = y * (dy - sum(dy * y)) for softmax,
// dx = dy - exp(y) * sum(dy) for log_softmax.
Tensor softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim);

// ---- matrix products ------------------------------------------------------------
// 1-D, 2-D and batched: a [..., M, K] @ b [..., K, N] with broadcast batch dims.
// f32 runs in true fp32 unless TF32 is allowed; bf16/f16 accumulate in fp32.
Tensor matmul(const Tensor& a, const Tensor& b);
// out = alpha * op(a) @ op(b) + beta * out for 2-D tensors, op = transpose when
// the flag is set. out may be f32 while a and b are bf16/f16: the fused
// weight-gradient GEMM that writes (beta 0) or adds (beta 1) into an fp32 slot.
void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& out,
          double alpha, double beta);
void set_allow_tf32(bool allow);
bool allow_tf32();
// Note [GEMM autotuning] (kernels/cuda/gemm_tuning.cpp): a file path turns on timed
// choices among cuBLASLt's candidates for plain CUDA GEMMs, read from and
// recorded in that file; "" (the default, unless ACCRUE_GEMM_TUNING names a
// file) keeps cuBLASLt's first heuristic choice. Affects GEMM problems first
// seen after the call.
void set_gemm_tuning_file(const std::string& path);
std::string gemm_tuning_file();
// Note [GEMM autotuning] without a file: on, GEMM problems first seen after
// the call are timed as with a tuning file and each choice is kept for the
// process only, so another process may choose otherwise and compute other
// bits. Off by default; a tuning file turns timing on whatever this says.
void set_gemm_tuning_in_process(bool on);
bool gemm_tuning_in_process();
// Note [GEMM SM margin] (kernels/cuda/cublaslt_state.cu): while `sms` > 0,
// cuBLASLt GEMMs on CUDA device `device` are planned for that many fewer SMs
// than the device has, leaving them to a concurrent stream (the reducer's
// collectives under the last backward). 0 (the default) plans for every SM.
// Plans are kept per margin, so switching back and forth re-plans nothing.
// Throws for a device index outside [0, 64) or sms outside [0, 1024).
void set_gemm_sm_margin(int device, int sms);
int gemm_sm_margin(int device);

// ---- neural-network kernels ------------------------------------------------------
// weight [V, D], indices i32/i64 of any shape -> [..., D]. Out-of-range indices throw.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// grad_weight (= or +=) the scatter-add of grad [..., D] into rows `indices`,
// deterministic (fixed summation order per row). Rows no index hits are 0
// when !accumulate and untouched when accumulate.
void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& grad_weight,
                        bool accumulate);

// Note [Losses return sum and count]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A loss returns the sum of its per-item losses and the number of items it
// counted (targets != ignore_index), never their mean. A mean per micro-batch
// would fix the divisor too early: the optimizer must divide the window's
// summed gradient by the items of the whole window (and of every rank), which
// only the count makes exact with padding or variable lengths (Note
// [Normalization] in optim/window.h). The count stays a device tensor, so
// nothing waits for the host.
struct LossSum {
  Tensor sum;    // 0-d, the logits' dtype widened to f32 (f64 for f64)
  Tensor count;  // 0-d i64, the number of targets != ignore_index
};
// logits [N, C], targets [N] (i32/i64). Targets out of [0, C) other than ignore_index throw.
LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// d(grad_sum * loss_sum)/d(logits): grad_sum is a 0-d tensor (the seed).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& grad_sum);

struct LayerNormOutput {
  Tensor out;
  Tensor mean;  // f32 (f64 for f64 input), one per row
  Tensor rstd;
};
// Normalizes over the last dim. weight and bias [D] may be undefined.
LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// Returns dx. dweight and dbias (either may be undefined) are written, or added
// to when accumulate, with fixed-order (deterministic) sums.
Tensor layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dweight,
                           const Tensor& dbias, bool accumulate);
// A norm's backward in two halves, so that the parameters' half can run
// elsewhere (Note [Weight gradients on a branch] in autograd/weight_grad_branch.h):
// dx and the parameters' fixed-order partial sums (layer_norm_backward_partials
// here, rms_norm_backward_partials in kernels/fused.h), then their totals
// written or added into dweight and dbias (norm_param_totals). Together they
// compute the bits layer_norm_backward and rms_norm_backward compute.
struct NormPartials {
  Tensor dweight, dbias;  // the backend's partial sums, where wanted
  DType x_dtype = DType::f32;
  int64_t d = 0;
  int64_t chunks = 0;  // 0: no rows (the totals are zeros)
};
// dx_add, where defined (x's shape, dtype and device), is added to dx in the
// same pass, rounded once: the gradient that other uses of x sent back
// (Note [Fan-out sums in the backward] in autograd/engine.cpp).
Tensor layer_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, bool want_dweight,
                                    bool want_dbias, NormPartials* partials,
                                    const Tensor& dx_add = Tensor());
void norm_param_totals(const NormPartials& partials, const Tensor& dweight, const Tensor& dbias,
                       bool accumulate);

// Whether CUDA kernels with data-dependent bounds (embedding indices, targets)
// verify them: one host synchronization per call outside a Window, none inside
// one (Note [Deferred index checks] in kernels/index_checks.h). On by default.
void set_check_indices(bool check);
bool check_indices();

}  // namespace accrue::kernels
