// The differentiable operations: what models are written with.
//
// Each function computes through kernels/ops.h and, when grad mode is on and
// an input requires grad, records a node whose backward formula is next to
// the forward in the .cpp files. Every op here passes the float64
// finite-difference gradcheck (tests/autograd).
#pragma once

#include <optional>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue {

// ---- elementwise (numpy broadcasting) -----------------------------------------
// Operands of one op share a dtype: nothing is promoted (Note [Broadcasting
// and dtypes] in kernels/dispatch_util.h); to_dtype converts.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor sub(double s, const Tensor& a);
Tensor div(double s, const Tensor& a);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor relu(const Tensor& a);
// GELU, tanh approximation (GPT-2's).
Tensor gelu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
// x * sigmoid(x) (SwiGLU's gate).
Tensor silu(const Tensor& a);
// 1 / sqrt(a).
Tensor rsqrt(const Tensor& a);
Tensor sin(const Tensor& a);
Tensor cos(const Tensor& a);
// Its gradient at 0 is 0 (PyTorch's sign convention).
Tensor abs(const Tensor& a);
// min(max(a, min), max) with either bound absent (not both); min > max throws.
// The gradient passes where min <= a <= max, bounds included, as PyTorch's.
Tensor clamp(const Tensor& a, std::optional<double> min, std::optional<double> max);
// Elementwise, broadcasting; NaN propagates. At ties each operand gets half
// the gradient, as PyTorch's.
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
// cond ? a : b; cond is a bool tensor and receives no gradient.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// The same with a scalar operand, taking the tensor operand's dtype.
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
// a with `value` where mask (bool, broadcast to a's shape) is true; the
// gradient is zero there.
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);
// The lower (upper) triangle of the last two dims, the rest zero: element
// (i, j) is kept where j - i <= diagonal (j - i >= diagonal for triu).
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);

// ---- reductions -----------------------------------------------------------------
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// The gradient is split evenly among tied maxima.
Tensor max(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);

// ---- shapes (differentiable versions of Tensor's raw views) ---------------------
Tensor view(const Tensor& a, const Shape& shape);
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor expand(const Tensor& a, const Shape& shape);
Tensor contiguous(const Tensor& a);
// A new tensor with a's values (always a copy); the gradient passes through.
Tensor clone(const Tensor& a);
// A cast between float dtypes; the gradient is cast back.
Tensor to_dtype(const Tensor& a, DType dtype);
// A copy on another device; the gradient is copied back.
Tensor to_device(const Tensor& a, Device device);

// ---- matrix products and neural-network ops --------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] @ weight[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Returns the summed loss (differentiable, 0-d) and the number of counted
// targets (0-d i64): see Note [Losses return sum and count] in kernels/ops.h.
struct Loss {
  Tensor sum;
  Tensor count;
};
Loss cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// Normalized over the last dim; weight and bias may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace accrue
