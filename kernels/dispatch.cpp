// The one dispatch point of kernels/ops.h: validate, allocate, shape the
// inputs as kernels/backend.h promises, and call the CPU or CUDA backend by
// the inputs' device.
//
// Note [Dispatch shapes]
// ~~~~~~~~~~~~~~~~~~~~~~
// The backends see only a few shapes, so each kernel is written once:
//  - elementwise: every input raw-expanded to the output shape (0 strides);
//    the output is a fresh contiguous tensor;
//  - reductions and softmax along any dims: the reduced dims permuted to the
//    end, made contiguous and viewed as [rows, cols];
//  - matmul: 3-D [B, M, K] @ [B, K, N] views whose last two dims are row- or
//    column-major (anything else is copied) and whose batch dims merge into
//    one stride (0 for a broadcast batch).
// Empty outputs never reach a backend (a CUDA launch of zero blocks is an
// error), and neither do reductions over nothing: sum of nothing is 0, mean
// NaN, and max throws.
//
// Every function runs under a NoGradGuard: the raw view methods of Tensor
// refuse tensors that require grad while grad mode is on (Note [Raw views]),
// and here they only shape data for a kernel; autograd records the op itself.
#include <algorithm>
#include <atomic>
#include <limits>
#include <string>

#include "core/grad_mode.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

namespace accrue::kernels {

// Calls the backend function `fn` of the device's backend.
#define ACCRUE_BACKEND_CALL(device, fn, ...) \
  ((device).is_cpu() ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))

namespace {

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_check_indices{true};

// ---- validation -------------------------------------------------------------

void check_defined(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

void check_floating(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(is_floating(t.dtype()), op, ": ", what, " of shape ", shape_str(t.shape()),
               " has dtype ", dtype_name(t.dtype()),
               "; expected a floating dtype (f32, f64, bf16 or f16)");
}

void check_index_dtype(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, op, ": ", what, " of shape ",
               shape_str(t.shape()), " has dtype ", dtype_name(t.dtype()), "; expected i32 or i64");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  ACCRUE_CHECK(a.device() == b.device(), op, ": devices ", a.device().str(), " and ",
               b.device().str(), " differ (shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), ")");
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  ACCRUE_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", dtype_name(a.dtype()), " and ",
               dtype_name(b.dtype()), " differ (shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), ")");
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                      const char* what_b) {
  ACCRUE_CHECK(a.shape() == b.shape(), op, ": ", what_a, " of shape ", shape_str(a.shape()),
               " and ", what_b, " of shape ", shape_str(b.shape()), " differ");
}

// Two floating operands of one op: defined, on one device, of one dtype.
void check_float_pair(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                      const char* what_b) {
  check_defined(a, op, what_a);
  check_defined(b, op, what_b);
  check_same_device(a, b, op);
  check_same_dtype(a, b, op);
  check_floating(a, op, what_a);
}

// A tensor of the compute dtype, or f32 where `f32_ok`. The parameter
// gradients (sum_rows_into, embedding and layer-norm backward) may always be
// f32: the gradient arena's slots (Note [Fused weight-gradient accumulation]).
// The GEMM output and layer-norm parameters may be f32 next to 16-bit compute
// only (fp32 accumulators and fp32 master weights).
void check_dtype_or_f32(const Tensor& t, DType compute, bool f32_ok, const char* op,
                        const char* what) {
  ACCRUE_CHECK(t.dtype() == compute || (f32_ok && t.dtype() == DType::f32), op, ": ", what,
               " of shape ", shape_str(t.shape()), " has dtype ", dtype_name(t.dtype()),
               "; expected ", dtype_name(compute),
               f32_ok && compute != DType::f32 ? " or f32" : "");
}

bool is_16_bit(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

void check_contiguous(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.is_contiguous(), op, ": ", what, " of shape ", shape_str(t.shape()),
               " and strides ", shape_str(t.strides()), " must be contiguous");
}

// Fills a caller's output tensor (the handle is const; its memory is not).
void fill(const Tensor& t, double value) {
  Tensor(t).fill_(value);
}

// The loss and layer-norm statistics dtype: f32, or f64 for f64 inputs.
DType widened(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// Verifies that every index lies in [0, bound) (ignore_index excepted). Always
// on the CPU; on CUDA only when check_indices(), since reading the count back
// synchronizes the host.
void check_index_range(const Tensor& indices, int64_t bound, int64_t ignore_index, bool use_ignore,
                       const char* op, const char* what) {
  if (indices.numel() == 0) return;
  if (indices.device().is_cuda() && !check_indices()) return;
  const int64_t bad = ACCRUE_BACKEND_CALL(indices.device(), count_out_of_range, indices, bound,
                                          ignore_index, use_ignore);
  if (bad == 0) return;
  // The error path only: find the first offender on the host to name it.
  const std::vector<int64_t> v = indices.to_vector<int64_t>();
  size_t first = 0;
  while (first < v.size() &&
         ((use_ignore && v[first] == ignore_index) || (v[first] >= 0 && v[first] < bound)))
    ++first;
  const int64_t value = first < v.size() ? v[first] : -1;
  ACCRUE_FAIL(op, ": ", what, " ", value, " (at flat position ", first, " of ", what, "s of shape ",
              shape_str(indices.shape()), ") out of range [0, ", bound, ")",
              use_ignore ? " and not ignore_index " + std::to_string(ignore_index) : std::string(),
              "; ", bad, " of ", v.size(), " are out of range");
}

// ---- shaping -------------------------------------------------------------------

// `t`, made contiguous, viewed as `shape` (same numel). Unlike Tensor::view
// this also takes 0-d tensors to [1] and back.
Tensor dense_view(const Tensor& t, const Shape& shape) {
  const Tensor c = t.contiguous();
  ACCRUE_CHECK(c.numel() == shape_numel(shape), "dense_view: ", shape_str(c.shape()), " has ",
               c.numel(), " elements, not the ", shape_numel(shape), " of ", shape_str(shape));
  return make_view(c, shape, contiguous_strides(shape), c.offset());
}

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

// A [B, R, C] view of `t` (shape batch + [R, C], batch already broadcast)
// fit for the backends' gemm: batch dims merged into one stride, the last two
// dims row-major (stride 1 along C) or column-major (stride 1 along R) with a
// leading dimension of at least the other extent. Size-1 dims get canonical
// strides, since their stride is never used but a BLAS checks it.
Tensor as_gemm_operand(Tensor t) {
  const int64_t rank = t.dim();
  const int64_t r = t.size(-2), c = t.size(-1);
  const int64_t batch = shape_numel(Shape(t.shape().begin(), t.shape().end() - 2));
  auto merged_batch_stride = [&](const Tensor& x, int64_t& stride) {
    stride = 0;
    int64_t expected = -1;
    for (int64_t d = rank - 3; d >= 0; --d) {
      if (x.shape()[d] == 1) continue;
      if (expected < 0) {
        stride = x.strides()[d];
      } else if (x.strides()[d] != expected) {
        return false;
      }
      expected = x.strides()[d] * x.shape()[d];
    }
    return true;
  };
  int64_t sb = 0;
  if (!merged_batch_stride(t, sb)) {
    t = t.contiguous();
    merged_batch_stride(t, sb);
  }
  int64_t sr = t.strides()[rank - 2], sc = t.strides()[rank - 1];
  const bool row_major = (c == 1 || sc == 1) && (r == 1 || sr >= std::max<int64_t>(c, 1));
  const bool col_major = (r == 1 || sr == 1) && (c == 1 || sc >= std::max<int64_t>(r, 1));
  if (row_major) {
    sc = 1;
    if (r == 1) sr = std::max<int64_t>(c, 1);
  } else if (col_major) {
    sr = 1;
    if (c == 1) sc = std::max<int64_t>(r, 1);
  } else {
    // Neither layout (e.g. a narrowed stride-2 view or expanded rows): copy.
    Tensor dense = make_view(t, {batch, r, c}, {sb, sr, sc}, t.offset()).contiguous();
    return make_view(dense, {batch, r, c}, {batch == 1 ? 0 : r * c, std::max<int64_t>(c, 1), 1},
                     dense.offset());
  }
  if (batch == 1) sb = 0;
  return make_view(t, {batch, r, c}, {sb, sr, sc}, t.offset());
}

}  // namespace

// ---- names and switches ----------------------------------------------------------

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return "neg";
    case UnaryOp::Exp:
      return "exp";
    case UnaryOp::Log:
      return "log";
    case UnaryOp::Sqrt:
      return "sqrt";
    case UnaryOp::Tanh:
      return "tanh";
    case UnaryOp::Relu:
      return "relu";
    case UnaryOp::Gelu:
      return "gelu";
    case UnaryOp::Sigmoid:
      return "sigmoid";
    case UnaryOp::Pow:
      return "pow";
  }
  return "unary";
}

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
  }
  return "binary";
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
}
bool allow_tf32() {
  return g_allow_tf32.load();
}
void set_check_indices(bool check) {
  g_check_indices.store(check);
}
bool check_indices() {
  return g_check_indices.load();
}

// ---- elementwise --------------------------------------------------------------------

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const char* name = op_name(op);
  check_float_pair(a, b, name, "a", "b");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), binary, op, a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  NoGradGuard no_grad;
  const char* name = op_name(op);
  check_defined(a, name, "a");
  check_floating(a, name, "a");
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), binary_scalar, op, a, s, scalar_first, out);
  return out;
}

Tensor unary(UnaryOp op, const Tensor& a, double param) {
  NoGradGuard no_grad;
  const char* name = op_name(op);
  check_defined(a, name, "input");
  check_floating(a, name, "input");
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), unary, op, a, param, out);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& input, const Tensor& output,
                      double param) {
  NoGradGuard no_grad;
  const std::string name_s = std::string(op_name(op)) + "_backward";
  const char* name = name_s.c_str();
  check_float_pair(grad, input, name, "grad", "input");
  check_same_shape(grad, input, name, "grad", "input");
  Tensor y = output;
  if (y.defined()) {
    check_same_device(y, input, name);
    check_same_dtype(y, input, name);
    check_same_shape(y, input, name, "output", "input");
  } else {
    y = unary(op, input, param);
  }
  Tensor out = empty(input.shape(), input.dtype(), input.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(input.device(), unary_backward, op, grad, input, y, param, out);
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  check_defined(a, "compare", "a");
  check_defined(b, "compare", "b");
  check_same_device(a, b, "compare");
  check_same_dtype(a, b, "compare");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "compare");
  Tensor out = empty(shape, DType::boolean, a.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), compare, op, a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  check_defined(cond, "where", "cond");
  check_defined(a, "where", "a");
  check_defined(b, "where", "b");
  ACCRUE_CHECK(cond.dtype() == DType::boolean, "where: cond of shape ", shape_str(cond.shape()),
               " has dtype ", dtype_name(cond.dtype()), "; expected bool");
  check_same_device(cond, a, "where");
  check_same_device(a, b, "where");
  check_same_dtype(a, b, "where");
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = empty(shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), where, cond.expand(shape), a.expand(shape), b.expand(shape), out);
  return out;
}

void axpy_(const Tensor& dst, double alpha, const Tensor& src) {
  NoGradGuard no_grad;
  check_float_pair(dst, src, "axpy_", "dst", "src");
  const Shape shape = broadcast_shapes(dst.shape(), src.shape(), "axpy_");
  ACCRUE_CHECK(shape == dst.shape(), "axpy_: src of shape ", shape_str(src.shape()),
               " does not broadcast to dst of shape ", shape_str(dst.shape()));
  // An expanded destination would add into one element several times.
  for (int64_t d = 0; d < dst.dim(); ++d)
    ACCRUE_CHECK(dst.shape()[d] <= 1 || dst.strides()[d] != 0, "axpy_: dst of shape ",
                 shape_str(dst.shape()), " and strides ", shape_str(dst.strides()),
                 " overlaps itself (an expanded view)");
  if (dst.numel() == 0) return;
  ACCRUE_BACKEND_CALL(dst.device(), axpy, dst, alpha, src.expand(shape));
}

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

// ---- matrix products ----------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  check_float_pair(a, b, "matmul", "a", "b");
  ACCRUE_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must have at least 1 dim, got ",
               shape_str(a.shape()), " @ ", shape_str(b.shape()));
  // numpy semantics: a 1-D a is a row [1, K], a 1-D b a column [K, 1], and
  // the added dim is dropped from the result.
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  ACCRUE_CHECK(b2.size(-2) == k, "matmul: inner dims differ: ", shape_str(a.shape()), " @ ",
               shape_str(b.shape()));
  const Shape batch_a(a2.shape().begin(), a2.shape().end() - 2);
  const Shape batch_b(b2.shape().begin(), b2.shape().end() - 2);
  const size_t rank = std::max(batch_a.size(), batch_b.size());
  Shape batch(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - batch_a.size() ? 1 : batch_a[i - (rank - batch_a.size())];
    const int64_t db = i < rank - batch_b.size() ? 1 : batch_b[i - (rank - batch_b.size())];
    ACCRUE_CHECK(da == db || da == 1 || db == 1, "matmul: batch dims of ", shape_str(a.shape()),
                 " and ", shape_str(b.shape()), " cannot be broadcast together");
    batch[i] = da == 1 ? db : da;
  }
  Shape result = batch;
  if (a.dim() > 1) result.push_back(m);
  if (b.dim() > 1) result.push_back(n);
  Shape full = batch;
  full.push_back(m);
  full.push_back(n);
  Tensor out = empty(full, a.dtype(), a.device());
  if (out.numel() == 0) return dense_view(out, result);
  if (k == 0) return dense_view(out.fill_(0.0), result);
  Shape shape_a = batch, shape_b = batch;
  shape_a.insert(shape_a.end(), {m, k});
  shape_b.insert(shape_b.end(), {k, n});
  const int64_t nb = shape_numel(batch);
  ACCRUE_BACKEND_CALL(a.device(), gemm, as_gemm_operand(a2.expand(shape_a)),
                      as_gemm_operand(b2.expand(shape_b)), dense_view(out, {nb, m, n}), 1.0, 0.0);
  return dense_view(out, result);
}

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& out,
          double alpha, double beta) {
  NoGradGuard no_grad;
  check_float_pair(a, b, "gemm", "a", "b");
  check_defined(out, "gemm", "out");
  check_same_device(a, out, "gemm");
  ACCRUE_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2,
               "gemm: expects 2-D a, b and out, got shapes ", shape_str(a.shape()), ", ",
               shape_str(b.shape()), " and ", shape_str(out.shape()));
  check_dtype_or_f32(out, a.dtype(), is_16_bit(a.dtype()), "gemm", "out");
  const Tensor opa = transpose_a ? a.transpose(0, 1) : a;
  const Tensor opb = transpose_b ? b.transpose(0, 1) : b;
  const int64_t m = opa.size(0), k = opa.size(1), n = opb.size(1);
  ACCRUE_CHECK(opb.size(0) == k, "gemm: inner dims differ: ", shape_str(opa.shape()), " @ ",
               shape_str(opb.shape()), " (a ", shape_str(a.shape()),
               transpose_a ? " transposed" : "", ", b ", shape_str(b.shape()),
               transpose_b ? " transposed" : "", ")");
  ACCRUE_CHECK(out.size(0) == m && out.size(1) == n, "gemm: out shape ", shape_str(out.shape()),
               " does not match ", shape_str(opa.shape()), " @ ", shape_str(opb.shape()), " = ",
               shape_str({m, n}));
  check_contiguous(out, "gemm", "out");
  if (out.numel() == 0) return;
  if (k == 0) {
    // An empty product: out = beta * out (and beta == 0 never reads out).
    if (beta == 0.0) {
      fill(out, 0.0);
    } else if (beta != 1.0) {
      Tensor(out).copy_(binary_scalar(BinaryOp::Mul, out, beta));
    }
    return;
  }
  ACCRUE_BACKEND_CALL(a.device(), gemm, as_gemm_operand(opa.unsqueeze(0)),
                      as_gemm_operand(opb.unsqueeze(0)), dense_view(out, {1, m, n}), alpha, beta);
}

// ---- neural-network kernels ---------------------------------------------------------------

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  NoGradGuard no_grad;
  const char* name = "embedding";
  check_defined(weight, name, "weight");
  check_defined(indices, name, "indices");
  check_same_device(weight, indices, name);
  check_floating(weight, name, "weight");
  check_index_dtype(indices, name, "indices");
  ACCRUE_CHECK(weight.dim() == 2, "embedding: weight must be 2-D [V, D], got shape ",
               shape_str(weight.shape()));
  const int64_t v = weight.size(0), d = weight.size(1), n = indices.numel();
  Shape shape = indices.shape();
  shape.push_back(d);
  Tensor out = empty(shape, weight.dtype(), weight.device());
  const Tensor idx = dense_view(indices, {n});
  check_index_range(dense_view(idx, indices.shape()), v, 0, false, name, "index");
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(weight.device(), embedding, weight.contiguous(), idx,
                      dense_view(out, {n, d}));
  return out;
}

void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& grad_weight,
                        bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "embedding_backward";
  check_defined(grad, name, "grad");
  check_defined(indices, name, "indices");
  check_defined(grad_weight, name, "grad_weight");
  check_same_device(grad, indices, name);
  check_same_device(grad, grad_weight, name);
  check_floating(grad, name, "grad");
  check_index_dtype(indices, name, "indices");
  check_dtype_or_f32(grad_weight, grad.dtype(), true, name, "grad_weight");
  ACCRUE_CHECK(grad_weight.dim() == 2, "embedding_backward: grad_weight must be 2-D [V, D], got ",
               shape_str(grad_weight.shape()));
  check_contiguous(grad_weight, name, "grad_weight");
  const int64_t v = grad_weight.size(0), d = grad_weight.size(1), n = indices.numel();
  Shape expected = indices.shape();
  expected.push_back(d);
  ACCRUE_CHECK(grad.shape() == expected, "embedding_backward: grad of shape ",
               shape_str(grad.shape()), " does not match indices of shape ",
               shape_str(indices.shape()), " and grad_weight of shape ",
               shape_str(grad_weight.shape()), " (expected ", shape_str(expected), ")");
  const Tensor idx = dense_view(indices, {n});
  check_index_range(dense_view(idx, indices.shape()), v, 0, false, name, "index");
  if (grad_weight.numel() == 0) return;
  if (n == 0) {
    if (!accumulate) fill(grad_weight, 0.0);
    return;
  }
  ACCRUE_BACKEND_CALL(grad.device(), embedding_backward, dense_view(grad, {n, d}), idx, grad_weight,
                      accumulate);
}

namespace {

// logits [N, C] floating, targets [N] i32/i64, on one device.
void check_cross_entropy_inputs(const Tensor& logits, const Tensor& targets, const char* name) {
  check_defined(logits, name, "logits");
  check_defined(targets, name, "targets");
  check_same_device(logits, targets, name);
  check_floating(logits, name, "logits");
  check_index_dtype(targets, name, "targets");
  ACCRUE_CHECK(logits.dim() == 2, name, ": logits must be 2-D [N, C], got shape ",
               shape_str(logits.shape()));
  ACCRUE_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), name, ": targets of shape ",
               shape_str(targets.shape()), " do not match logits of shape ",
               shape_str(logits.shape()), " (expected [", logits.size(0), "])");
}

}  // namespace

LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  NoGradGuard no_grad;
  const char* name = "cross_entropy";
  check_cross_entropy_inputs(logits, targets, name);
  const Tensor t = targets.contiguous();
  check_index_range(t, logits.size(1), ignore_index, true, name, "target");
  LossSum loss{empty({}, widened(logits.dtype()), logits.device()),
               empty({}, DType::i64, logits.device())};
  if (logits.numel() == 0) {
    // No rows, or no classes (then every target is ignore_index, as checked above).
    loss.sum.fill_(0.0);
    loss.count.fill_(0.0);
    return loss;
  }
  ACCRUE_BACKEND_CALL(logits.device(), cross_entropy, logits.contiguous(), t, ignore_index,
                      loss.sum, loss.count);
  return loss;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& grad_sum) {
  NoGradGuard no_grad;
  const char* name = "cross_entropy_backward";
  check_cross_entropy_inputs(logits, targets, name);
  check_defined(grad_sum, name, "grad_sum");
  check_same_device(logits, grad_sum, name);
  check_floating(grad_sum, name, "grad_sum");
  ACCRUE_CHECK(grad_sum.numel() == 1, name, ": grad_sum must be a 0-d tensor, got shape ",
               shape_str(grad_sum.shape()));
  const Tensor t = targets.contiguous();
  check_index_range(t, logits.size(1), ignore_index, true, name, "target");
  Tensor dx = empty(logits.shape(), logits.dtype(), logits.device());
  if (dx.numel() == 0) return dx;
  const Tensor seed = dense_view(grad_sum, {}).to(widened(logits.dtype()));
  ACCRUE_BACKEND_CALL(logits.device(), cross_entropy_backward, logits.contiguous(), t, ignore_index,
                      seed, dx);
  return dx;
}

namespace {

// weight or bias: undefined, or [D] on x's device, of x's dtype or f32 (fp32
// master weights next to 16-bit activations).
void check_norm_param(const Tensor& p, const Tensor& x, const char* name, const char* what) {
  if (!p.defined()) return;
  check_same_device(p, x, name);
  check_floating(p, name, what);
  check_dtype_or_f32(p, x.dtype(), is_16_bit(x.dtype()), name, what);
  ACCRUE_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), name, ": ", what, " of shape ",
               shape_str(p.shape()), " does not match the normalized dim of input ",
               shape_str(x.shape()), " (expected [", x.size(-1), "])");
}

void check_norm_input(const Tensor& x, const char* name) {
  check_defined(x, name, "input");
  check_floating(x, name, "input");
  ACCRUE_CHECK(x.dim() >= 1 && x.size(-1) > 0, name,
               ": input must have a non-empty last dim to normalize, got shape ",
               shape_str(x.shape()));
}

Tensor contiguous_or_undefined(const Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

}  // namespace

LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  NoGradGuard no_grad;
  const char* name = "layer_norm";
  check_norm_input(x, name);
  check_norm_param(weight, x, name, "weight");
  check_norm_param(bias, x, name, "bias");
  ACCRUE_CHECK(eps >= 0.0, "layer_norm: eps must be >= 0, got ", eps);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const Shape stats_shape(x.shape().begin(), x.shape().end() - 1);
  LayerNormOutput r{empty(x.shape(), x.dtype(), x.device()),
                    empty(stats_shape, widened(x.dtype()), x.device()),
                    empty(stats_shape, widened(x.dtype()), x.device())};
  if (rows == 0) return r;
  ACCRUE_BACKEND_CALL(x.device(), layer_norm, dense_view(x, {rows, d}),
                      contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps,
                      dense_view(r.out, {rows, d}), dense_view(r.mean, {rows}),
                      dense_view(r.rstd, {rows}));
  return r;
}

Tensor layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dweight,
                           const Tensor& dbias, bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "layer_norm_backward";
  check_norm_input(x, name);
  check_float_pair(grad, x, name, "grad", "input");
  check_same_shape(grad, x, name, "grad", "input");
  check_norm_param(weight, x, name, "weight");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const DType stats = widened(x.dtype());
  for (const Tensor* s : {&mean, &rstd}) {
    const char* what = s == &mean ? "mean" : "rstd";
    check_defined(*s, name, what);
    check_same_device(*s, x, name);
    ACCRUE_CHECK(s->dtype() == stats && s->numel() == rows, name, ": ", what, " of shape ",
                 shape_str(s->shape()), " and dtype ", dtype_name(s->dtype()),
                 " does not match input ", shape_str(x.shape()), " (expected ", rows, " values of ",
                 dtype_name(stats), ")");
  }
  for (const Tensor* g : {&dweight, &dbias}) {
    if (!g->defined()) continue;
    const char* what = g == &dweight ? "dweight" : "dbias";
    check_same_device(*g, x, name);
    check_dtype_or_f32(*g, x.dtype(), true, name, what);
    ACCRUE_CHECK(g->dim() == 1 && g->size(0) == d, name, ": ", what, " of shape ",
                 shape_str(g->shape()), " does not match the normalized dim of input ",
                 shape_str(x.shape()), " (expected [", d, "])");
    check_contiguous(*g, name, what);
  }
  Tensor dx = empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) {
    if (!accumulate) {
      if (dweight.defined()) fill(dweight, 0.0);
      if (dbias.defined()) fill(dbias, 0.0);
    }
    return dx;
  }
  ACCRUE_BACKEND_CALL(x.device(), layer_norm_backward, dense_view(grad, {rows, d}),
                      dense_view(x, {rows, d}), contiguous_or_undefined(weight),
                      dense_view(mean, {rows}), dense_view(rstd, {rows}), dense_view(dx, {rows, d}),
                      dweight, dbias, accumulate);
  return dx;
}

}  // namespace accrue::kernels
