// Dispatch of the reductions and softmax of kernels/ops.h: the reduced dims
// moved last and viewed as [rows, cols] (see Note [Dispatch shapes]).
#include <algorithm>
#include <limits>
#include <vector>

#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels {

// The shared checks and shaping of kernels/dispatch_util.h.
using namespace dispatch_util;

namespace {

// The reduced dims of `a` permuted to the end and viewed as [rows, cols] (see
// Note [Dispatch shapes]). dims empty means all dims.
struct RowPlan {
  Tensor permuted;  // the input with the reduced dims moved last
  // [rows, cols], contiguous: a copy unless the reduced dims were already last.
  // Made on demand, so that paths that read the input in place never pay for it.
  Tensor rows_view() const { return dense_view(permuted, {rows, cols}); }
  Shape out_shape;  // the result's shape (keepdim applied)
  Shape permuted_shape;
  std::vector<int64_t> perm;
  int64_t rows = 1, cols = 1;
};

RowPlan plan_rows(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  const int64_t rank = a.dim();
  std::vector<bool> reduced(static_cast<size_t>(rank), dims.empty());
  for (int64_t d : dims) {
    const int64_t r = std::max<int64_t>(rank, 1);
    ACCRUE_CHECK(d >= -r && d < r, op, ": dim ", d, " is out of range for input of shape ",
                 shape_str(a.shape()));
    const int64_t w = wrap_dim(d, rank, op);
    if (rank == 0) continue;  // dim 0 or -1 of a 0-d tensor: itself
    ACCRUE_CHECK(!reduced[w], op, ": dim ", d, " appears more than once in dims ", shape_str(dims),
                 " (input shape ", shape_str(a.shape()), ")");
    reduced[w] = true;
  }
  RowPlan p;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d]) p.perm.push_back(d);
  for (int64_t d = 0; d < rank; ++d)
    if (reduced[d]) p.perm.push_back(d);
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) {
      p.cols *= a.shape()[d];
      if (keepdim) p.out_shape.push_back(1);
    } else {
      p.rows *= a.shape()[d];
      p.out_shape.push_back(a.shape()[d]);
    }
  }
  p.permuted = a.permute(p.perm);
  p.permuted_shape = p.permuted.shape();
  return p;
}

// Undoes plan_rows for a [rows, cols] result of the same layout (softmax).
Tensor unplan_rows(const Tensor& rows_result, const RowPlan& p) {
  std::vector<int64_t> inverse(p.perm.size());
  for (size_t i = 0; i < p.perm.size(); ++i)
    inverse[p.perm[i]] = static_cast<int64_t>(i);
  return dense_view(rows_result, p.permuted_shape).permute(inverse).contiguous();
}

}  // namespace

// ---- reductions ------------------------------------------------------------------------

namespace {

// True when `dims` are exactly the first k < rank dims of a contiguous tensor.
bool reduces_leading_dims(const Tensor& a, const std::vector<int64_t>& dims) {
  if (!a.is_contiguous() || dims.empty() || static_cast<int64_t>(dims.size()) >= a.dim())
    return false;
  std::vector<bool> reduced(a.dim(), false);
  for (int64_t d : dims)
    reduced[wrap_dim(d, a.dim(), "sum")] = true;
  for (size_t i = 0; i < dims.size(); ++i)
    if (!reduced[i]) return false;
  return true;
}

Tensor reduce(ReduceOp op, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim,
              const char* name) {
  NoGradGuard no_grad;
  check_defined(a, name, "input");
  check_floating(a, name, "input");
  const RowPlan p = plan_rows(a, dims, keepdim, name);
  const DType out_dtype = op == ReduceOp::ArgMax ? DType::i64 : a.dtype();
  ACCRUE_CHECK(p.cols > 0 || (op != ReduceOp::Max && op != ReduceOp::ArgMax), name,
               ": cannot reduce over an empty extent (input shape ", shape_str(a.shape()),
               ", dims ", shape_str(dims), ")");
  Tensor out = empty(p.out_shape, out_dtype, a.device());
  if (out.numel() == 0) return out;
  if (p.cols == 0) {
    // Sum of nothing is 0; mean of nothing is 0/0.
    out.fill_(op == ReduceOp::Sum ? 0.0 : std::numeric_limits<double>::quiet_NaN());
    return out;
  }
  if ((op == ReduceOp::Sum || op == ReduceOp::Mean) && reduces_leading_dims(a, dims)) {
    // Summing the leading dims of a contiguous tensor (bias gradients, sum_to):
    // column sums read the input once, in place, instead of a transposed copy.
    const int64_t inner = out.numel(), outer = a.numel() / inner;
    ACCRUE_BACKEND_CALL(a.device(), sum_rows, dense_view(a, {outer, inner}),
                        dense_view(out, {inner}), /*accumulate=*/false);
    if (op == ReduceOp::Mean) {
      ACCRUE_BACKEND_CALL(a.device(), binary_scalar, BinaryOp::Div, out, static_cast<double>(outer),
                          false, out);
    }
    return out;
  }
  ACCRUE_BACKEND_CALL(a.device(), reduce_last, op, p.rows_view(), dense_view(out, {p.rows}));
  return out;
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(ReduceOp::Sum, a, dims, keepdim, "sum");
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(ReduceOp::Mean, a, dims, keepdim, "mean");
}

Tensor max(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(ReduceOp::Max, a, dims, keepdim, "max");
}

Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  if (dim) return reduce(ReduceOp::ArgMax, a, {*dim}, keepdim, "argmax");
  // Over the flattened tensor: the index is into a.flatten(), as in numpy.
  return reduce(ReduceOp::ArgMax, a, {}, keepdim, "argmax");
}

Tensor sum_to(const Tensor& a, const Shape& shape) {
  NoGradGuard no_grad;
  check_defined(a, "sum_to", "input");
  const int64_t rank = a.dim(), target_rank = static_cast<int64_t>(shape.size());
  const int64_t lead = rank - target_rank;
  bool fits = lead >= 0;
  for (int64_t i = 0; fits && i < target_rank; ++i)
    fits = shape[i] == a.shape()[lead + i] || shape[i] == 1;
  ACCRUE_CHECK(fits, "sum_to: shape ", shape_str(shape), " does not broadcast to ",
               shape_str(a.shape()), ", so ", shape_str(a.shape()), " cannot be summed to it");
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d)
    if (d < lead || (shape[d - lead] == 1 && a.shape()[d] != 1)) dims.push_back(d);
  // Nothing broadcast: the input itself (callers that mutate must clone).
  if (dims.empty()) return a.shape() == shape ? a : dense_view(a, shape);
  return dense_view(sum(a, dims, false), shape);
}

void sum_rows_into(const Tensor& a, const Tensor& out, bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "sum_rows_into";
  check_defined(a, name, "input");
  check_defined(out, name, "out");
  check_same_device(a, out, name);
  check_floating(a, name, "input");
  check_dtype_or_f32(out, a.dtype(), true, name, "out");
  ACCRUE_CHECK(a.dim() == 2 && out.dim() == 1 && out.size(0) == a.size(1), name, ": input [n, d] ",
               shape_str(a.shape()), " and out [d] ", shape_str(out.shape()), " do not match");
  check_contiguous(out, name, "out");
  if (out.numel() == 0) return;
  if (a.size(0) == 0) {
    if (!accumulate) fill(out, 0.0);
    return;
  }
  ACCRUE_BACKEND_CALL(a.device(), sum_rows, a.contiguous(), out, accumulate);
}

namespace {

Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  NoGradGuard no_grad;
  const char* name = log ? "log_softmax" : "softmax";
  check_defined(a, name, "input");
  check_floating(a, name, "input");
  const RowPlan p = plan_rows(a, {dim}, true, name);
  if (a.numel() == 0) return empty(a.shape(), a.dtype(), a.device());
  Tensor out = empty({p.rows, p.cols}, a.dtype(), a.device());
  ACCRUE_BACKEND_CALL(a.device(), softmax, p.rows_view(), out, log);
  return unplan_rows(out, p);
}

Tensor softmax_backward_impl(const Tensor& grad, const Tensor& output, int64_t dim, bool log) {
  NoGradGuard no_grad;
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  check_float_pair(grad, output, name, "grad", "output");
  check_same_shape(grad, output, name, "grad", "output");
  const RowPlan pg = plan_rows(grad, {dim}, true, name);
  if (grad.numel() == 0) return empty(grad.shape(), grad.dtype(), grad.device());
  const RowPlan py = plan_rows(output, {dim}, true, name);
  Tensor dx = empty({pg.rows, pg.cols}, grad.dtype(), grad.device());
  ACCRUE_BACKEND_CALL(grad.device(), softmax_backward, pg.rows_view(), py.rows_view(), dx, log);
  return unplan_rows(dx, pg);
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  return softmax_impl(a, dim, false);
}
Tensor log_softmax(const Tensor& a, int64_t dim) {
  return softmax_impl(a, dim, true);
}
Tensor softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim) {
  return softmax_backward_impl(grad, output, dim, false);
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim) {
  return softmax_backward_impl(grad, output, dim, true);
}

}  // namespace accrue::kernels
