// Dispatch of the indexing ops of kernels/indexing.h (Note [Indexing ops]):
// joins and splits as copies and views, the gathers and scatter-adds over an
// IndexedDim, cumsum as [outer, n, inner] and the sorts as [rows, n].
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/indexing_backend.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

std::string operand(size_t i) {
  return "tensor " + std::to_string(i);
}

// The operands of cat and stack: at least one, defined, on one device, of one dtype.
void check_operands(const std::vector<Tensor>& tensors, const char* op) {
  ACCRUE_CHECK(!tensors.empty(), op, ": expected at least one tensor, got an empty list");
  for (size_t i = 0; i < tensors.size(); ++i)
    check_defined(tensors[i], op, operand(i).c_str());
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    check_device(tensors[i], first.device(), op, operand(i).c_str(), "tensor 0");
    check_same_dtype(first, tensors[i], op, "tensor 0", operand(i).c_str());
  }
}

// a * b, or an error naming the op when it overflows int64.
int64_t checked_mul(int64_t a, int64_t b, const char* op, const Shape& shape) {
  int64_t r = 0;
  ACCRUE_CHECK(!__builtin_mul_overflow(a, b, &r), op, ": ", a, " x ", b,
               " overflows int64 (input of shape ", shape_str(shape), ")");
  return r;
}

// Note [Indexing ops]: where element j of an index of shape `shape` lands in
// t, indexed along dim d (t 0-d: one element, a dim of size 1).
IndexedDim indexed_dim(const Tensor& t, int64_t d, const Shape& shape, const char* op) {
  ACCRUE_CHECK(static_cast<int64_t>(shape.size()) <= kMaxDims, op, ": ", shape.size(),
               "-d tensors exceed the ", kMaxDims, " dims of the indexing kernels");
  IndexedDim at;
  at.lines.rank = static_cast<int32_t>(shape.size());
  for (size_t e = 0; e < shape.size(); ++e) {
    at.lines.sizes[e] = shape[e];
    at.lines.strides[e] = static_cast<int64_t>(e) == d ? 0 : t.strides()[e];
  }
  at.stride = t.dim() == 0 ? 0 : t.stride(d);
  at.size = t.dim() == 0 ? 1 : t.size(d);
  at.dim = static_cast<int32_t>(t.dim() == 0 ? 0 : d);
  return at;
}

void check_index(const Tensor& x, const Tensor& index, const char* op, const char* what_x) {
  check_defined(x, op, what_x);
  check_defined(index, op, "index");
  check_device(index, x.device(), op, "index", what_x);
  check_dtype(index, DType::i64, op, "index");
}

// The dtypes a scatter-add sums: floating, or i32/i64 (counts), never bool.
void check_summable(const Tensor& x, const char* op) {
  ACCRUE_CHECK(is_floating(x.dtype()) || x.dtype() == DType::i64 || x.dtype() == DType::i32, op,
               ": input of shape ", shape_str(x.shape()), " has dtype ", dtype_name(x.dtype()),
               "; expected a floating dtype, i32 or i64");
}

// A 1-D view of index_select's and index_add's index (a 0-d index is one element).
Tensor index_vector(const Tensor& index, const char* op) {
  ACCRUE_CHECK(index.dim() <= 1, op, ": index of shape ", shape_str(index.shape()),
               " must be 1-D (or 0-d)");
  return index.dim() == 1 ? index : index.reshape({1});
}

// index (1-D, n elements) seen at every position of `shape`, whose dim d has n.
Tensor expand_index(const Tensor& index, const Shape& shape, int64_t d) {
  Shape strides(shape.size(), 0);
  strides[d] = index.stride(0);
  return make_view(index, shape, strides, index.offset());
}

}  // namespace

// ---- joining and splitting ----------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  NoGradGuard no_grad;
  const char* op = "cat";
  check_operands(tensors, op);
  const Tensor& first = tensors[0];
  const int64_t rank = first.dim();
  ACCRUE_CHECK(rank > 0,
               "cat: tensor 0 is 0-d; cat joins tensors of at least 1 dim (stack "
               "joins 0-d tensors)");
  const int64_t d = wrap_dim(dim, rank, op);
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    ACCRUE_CHECK(t.dim() == rank, "cat: tensor ", i, " of shape ", shape_str(t.shape()), " has ",
                 t.dim(), " dims, tensor 0 of shape ", shape_str(first.shape()), " has ", rank);
    for (int64_t e = 0; e < rank; ++e)
      ACCRUE_CHECK(e == d || t.size(e) == first.size(e), "cat: tensor ", i, " of shape ",
                   shape_str(t.shape()), " and tensor 0 of shape ", shape_str(first.shape()),
                   " differ in dim ", e, " (", t.size(e), " vs ", first.size(e),
                   "); only the joined dim ", d, " may differ");
    ACCRUE_CHECK(!__builtin_add_overflow(shape[d], t.size(d), &shape[d]), "cat: the sizes of dim ",
                 d, " overflow int64");
  }
  Tensor out = empty(shape, first.dtype(), first.device());
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) out.narrow(d, at, t.size(d)).copy_(t);
    at += t.size(d);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  NoGradGuard no_grad;
  const char* op = "stack";
  check_operands(tensors, op);
  const Tensor& first = tensors[0];
  const int64_t d = wrap_dim(dim, first.dim() + 1, op);
  std::vector<Tensor> lifted;
  lifted.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ACCRUE_CHECK(tensors[i].shape() == first.shape(), "stack: tensor ", i, " of shape ",
                 shape_str(tensors[i].shape()), " and tensor 0 of shape ", shape_str(first.shape()),
                 " differ; stack takes tensors of one shape");
    lifted.push_back(tensors[i].unsqueeze(d));
  }
  return cat(lifted, d);
}

std::vector<int64_t> split_lengths(const Tensor& x, const SplitSizes& sizes, int64_t dim,
                                   const char* op) {
  check_defined(x, op, "input");
  ACCRUE_CHECK(x.dim() > 0, op, ": the input is 0-d; there is no dim to split");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.size(d);
  std::vector<int64_t> lengths;
  if (sizes.by_size) {
    ACCRUE_CHECK(sizes.each > 0 || (sizes.each == 0 && n == 0), op, ": split size ", sizes.each,
                 " must be positive (dim ", d, " of size ", n, ", input of shape ",
                 shape_str(x.shape()), ")");
    if (n == 0) return {0};
    for (int64_t left = n; left > 0; left -= std::min(sizes.each, left))
      lengths.push_back(std::min(sizes.each, left));
    return lengths;
  }
  int64_t total = 0;
  for (size_t i = 0; i < sizes.sizes.size(); ++i) {
    const int64_t s = sizes.sizes[i];
    ACCRUE_CHECK(s >= 0 && s <= n - total, op, ": sizes ", shape_str(sizes.sizes),
                 " do not add up to the ", n, " of dim ", d, " of the input of shape ",
                 shape_str(x.shape()), " (size ", s, " at position ", i, ")");
    total += s;
  }
  ACCRUE_CHECK(total == n, op, ": sizes ", shape_str(sizes.sizes), " add up to ", total,
               ", not the ", n, " of dim ", d, " of the input of shape ", shape_str(x.shape()));
  return sizes.sizes;
}

std::vector<int64_t> chunk_lengths(const Tensor& x, int64_t chunks, int64_t dim) {
  const char* op = "chunk";
  check_defined(x, op, "input");
  ACCRUE_CHECK(chunks > 0, "chunk: chunks = ", chunks, " must be positive (input of shape ",
               shape_str(x.shape()), ")");
  ACCRUE_CHECK(x.dim() > 0, "chunk: the input is 0-d; there is no dim to split");
  const int64_t n = x.size(wrap_dim(dim, x.dim(), op));
  if (n == 0) return std::vector<int64_t>(static_cast<size_t>(chunks), 0);
  const int64_t each = n / chunks + (n % chunks != 0 ? 1 : 0);
  return split_lengths(x, SplitSizes(each), dim, op);
}

namespace {

std::vector<Tensor> narrow_pieces(const Tensor& x, const std::vector<int64_t>& lengths,
                                  int64_t dim) {
  NoGradGuard no_grad;
  std::vector<Tensor> pieces;
  int64_t at = 0;
  for (int64_t length : lengths) {
    pieces.push_back(x.narrow(dim, at, length));
    at += length;
  }
  return pieces;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, const SplitSizes& sizes, int64_t dim) {
  return narrow_pieces(x, split_lengths(x, sizes, dim), dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  return narrow_pieces(x, chunk_lengths(x, chunks, dim), dim);
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim) {
  NoGradGuard no_grad;
  const char* op = "repeat_interleave";
  check_defined(x, op, "input");
  ACCRUE_CHECK(repeats >= 0, "repeat_interleave: repeats = ", repeats,
               " must be >= 0 (input of shape ", shape_str(x.shape()), ")");
  const Tensor t = x.dim() == 0 ? x.reshape({1}) : x;
  const int64_t d = wrap_dim(dim, t.dim(), op);
  Shape lifted = t.shape();
  lifted.insert(lifted.begin() + d + 1, repeats);
  Shape shape = t.shape();
  shape[d] = checked_mul(shape[d], repeats, op, x.shape());
  Tensor out = empty(shape, x.dtype(), x.device());
  if (out.numel() > 0) out.view(lifted).copy_(t.unsqueeze(d + 1).expand(lifted));
  return out;
}

Tensor repeat_interleave_backward(const Tensor& grad, int64_t repeats, int64_t dim,
                                  const Shape& input_shape) {
  NoGradGuard no_grad;
  const char* op = "repeat_interleave_backward";
  check_defined(grad, op, "grad");
  check_floating(grad, op, "grad");
  Shape in = input_shape.empty() ? Shape{1} : input_shape;
  const int64_t d = wrap_dim(dim, static_cast<int64_t>(in.size()), op);
  Shape expected = in;
  expected[d] = checked_mul(in[d], repeats, op, input_shape);
  ACCRUE_CHECK(repeats >= 0 && grad.shape() == expected, op, ": grad of shape ",
               shape_str(grad.shape()), " is not the input shape ", shape_str(input_shape),
               " repeated ", repeats, " times along dim ", d, " (expected ", shape_str(expected),
               ")");
  Shape lifted = in;
  lifted.insert(lifted.begin() + d + 1, repeats);
  return dense_view(sum(grad.reshape(lifted), {d + 1}), input_shape);
}

// ---- gathers and scatter-adds ---------------------------------------------------------

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  NoGradGuard no_grad;
  const char* op = "gather";
  check_index(x, index, op, "input");
  ACCRUE_CHECK(index.dim() == x.dim(), "gather: index of shape ", shape_str(index.shape()),
               " and input of shape ", shape_str(x.shape()), " must have the same number of dims");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  for (int64_t e = 0; e < x.dim(); ++e)
    ACCRUE_CHECK(e == d || index.size(e) <= x.size(e), "gather: index of shape ",
                 shape_str(index.shape()), " is larger than the input of shape ",
                 shape_str(x.shape()), " in dim ", e, " (", index.size(e), " > ", x.size(e), ")");
  const IndexedDim at = indexed_dim(x, d, index.shape(), op);
  check_index_range(index, at.size, 0, false, op, "index");
  Tensor out = empty(index.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), gather, x, at, index, out);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  NoGradGuard no_grad;
  const char* op = "scatter_add";
  check_index(x, index, op, "input");
  check_defined(src, op, "src");
  check_device(src, x.device(), op, "src", "the input");
  check_summable(x, op);
  check_same_dtype(x, src, op, "input", "src");
  ACCRUE_CHECK(index.dim() == x.dim() && src.dim() == x.dim(), "scatter_add: input of shape ",
               shape_str(x.shape()), ", index of shape ", shape_str(index.shape()),
               " and src of shape ", shape_str(src.shape()), " must have the same number of dims");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  for (int64_t e = 0; e < x.dim(); ++e) {
    ACCRUE_CHECK(index.size(e) <= src.size(e), "scatter_add: index of shape ",
                 shape_str(index.shape()), " is larger than src of shape ", shape_str(src.shape()),
                 " in dim ", e, " (", index.size(e), " > ", src.size(e), ")");
    ACCRUE_CHECK(e == d || index.size(e) <= x.size(e), "scatter_add: index of shape ",
                 shape_str(index.shape()), " is larger than the input of shape ",
                 shape_str(x.shape()), " in dim ", e, " (", index.size(e), " > ", x.size(e), ")");
  }
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  const IndexedDim at = indexed_dim(out, d, index.shape(), op);
  check_index_range(index, at.size, 0, false, op, "index");
  if (out.numel() > 0) out.copy_(x);
  if (index.numel() == 0) return out;
  Tensor used = src;
  for (int64_t e = 0; e < src.dim(); ++e)
    used = used.narrow(e, 0, index.size(e));
  ACCRUE_BACKEND_CALL(x.device(), scatter_add, index, used.contiguous(), 1.0, at, out);
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  NoGradGuard no_grad;
  const char* op = "index_select";
  check_index(x, index, op, "input");
  ACCRUE_CHECK(x.dim() > 0, "index_select: the input is 0-d; it needs a dim to select along");
  const Tensor idx = index_vector(index, op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  Shape shape = x.shape();
  shape[d] = idx.size(0);
  check_index_range(idx, x.size(d), 0, false, op, "index");
  Tensor out = empty(shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), gather, x, indexed_dim(x, d, shape, op),
                      expand_index(idx, shape, d), out);
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha) {
  NoGradGuard no_grad;
  const char* op = "index_add";
  check_index(x, index, op, "input");
  check_defined(src, op, "src");
  check_device(src, x.device(), op, "src", "the input");
  check_summable(x, op);
  check_same_dtype(x, src, op, "input", "src");
  ACCRUE_CHECK(is_floating(x.dtype()) || alpha == std::trunc(alpha), "index_add: alpha = ", alpha,
               " must be a whole number for an input of dtype ", dtype_name(x.dtype()));
  ACCRUE_CHECK(x.dim() > 0, "index_add: the input is 0-d; it needs a dim to add along");
  const Tensor idx = index_vector(index, op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  Shape expected = x.shape();
  expected[d] = idx.size(0);
  ACCRUE_CHECK(src.shape() == expected, "index_add: src of shape ", shape_str(src.shape()),
               " does not match the input of shape ", shape_str(x.shape()), " and index of ",
               idx.size(0), " elements along dim ", d, " (expected ", shape_str(expected), ")");
  check_index_range(idx, x.size(d), 0, false, op, "index");
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0) out.copy_(x);
  if (src.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), scatter_add, expand_index(idx, expected, d), src.contiguous(),
                      alpha, indexed_dim(out, d, expected, op), out);
  return out;
}

Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype) {
  NoGradGuard no_grad;
  const char* op = "one_hot";
  check_defined(index, op, "index");
  check_dtype(index, DType::i64, op, "index");
  ACCRUE_CHECK(num_classes >= -1, "one_hot: num_classes = ", num_classes,
               " must be >= 0, or -1 to take max(index) + 1");
  if (num_classes == -1) {
    ACCRUE_CHECK(index.numel() > 0,
                 "one_hot: num_classes = -1 cannot be inferred from an empty "
                 "index of shape ",
                 shape_str(index.shape()));
    // Note [Capturable code]: a replay would keep the class count of the capture.
    refuse_in_graph("one_hot with num_classes = -1 reads the index on the host");
    const std::vector<int64_t> v = index.to_vector<int64_t>();
    num_classes = *std::max_element(v.begin(), v.end()) + 1;
    ACCRUE_CHECK(num_classes > 0, "one_hot: every index is negative (max ", num_classes - 1, ")");
  }
  check_index_range(index, num_classes, 0, false, op, "index");
  const Tensor classes =
      arange(0.0, static_cast<double>(num_classes), 1.0, DType::i64, index.device());
  const Tensor hot = compare(CompareOp::Eq, index.unsqueeze(-1), classes);
  return dtype == DType::boolean ? hot : hot.to(dtype);
}

// ---- scans and orderings --------------------------------------------------------------

Tensor cumsum(const Tensor& x, int64_t dim, bool reverse) {
  NoGradGuard no_grad;
  const char* op = "cumsum";
  check_defined(x, op, "input");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const Tensor in = is_floating(x.dtype()) ? x : x.to(DType::i64);
  Tensor out = empty(x.shape(), in.dtype(), x.device());
  if (out.numel() == 0) return out;
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t e = 0; e < x.dim(); ++e)
    (e < d ? outer : e == d ? n : inner) *= x.size(e);
  ACCRUE_BACKEND_CALL(x.device(), cumsum, dense_view(in, {outer, n, inner}), reverse,
                      dense_view(out, {outer, n, inner}));
  return out;
}

namespace {

// x's dim d moved last, made contiguous, sorted as [rows, n]; the first k of
// each row come back in x's dim order. values is skipped when !with_values.
SortResult sort_along(const Tensor& x, int64_t dim, bool descending, int64_t k, bool with_values,
                      const char* op) {
  const Tensor t = x.dim() == 0 ? x.reshape({1}) : x;
  const int64_t d = wrap_dim(dim, t.dim(), op);
  const int64_t n = t.size(d);
  std::vector<int64_t> perm;
  for (int64_t e = 0; e < t.dim(); ++e)
    if (e != d) perm.push_back(e);
  perm.push_back(d);
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  const Tensor moved = t.permute(perm);
  Shape shape = moved.shape();
  shape.back() = k;
  SortResult r;
  Tensor values = with_values ? empty(shape, x.dtype(), x.device()) : Tensor();
  Tensor indices = empty(shape, DType::i64, x.device());
  const int64_t rows = n == 0 ? 0 : moved.numel() / n;
  if (rows > 0 && k > 0)
    ACCRUE_BACKEND_CALL(x.device(), sort_rows, dense_view(moved, {rows, n}), descending,
                        with_values ? dense_view(values, {rows, k}) : Tensor(),
                        dense_view(indices, {rows, k}));
  const auto back = [&](const Tensor& v) {
    const Tensor p = v.permute(inverse);
    return x.dim() == 0 ? p.reshape({}) : p;
  };
  if (with_values) r.values = back(values);
  r.indices = back(indices);
  return r;
}

}  // namespace

SortResult sort(const Tensor& x, int64_t dim, bool descending) {
  NoGradGuard no_grad;
  check_defined(x, "sort", "input");
  const int64_t n = x.dim() == 0 ? 1 : x.size(wrap_dim(dim, x.dim(), "sort"));
  return sort_along(x, dim, descending, n, true, "sort");
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  NoGradGuard no_grad;
  check_defined(x, "argsort", "input");
  const int64_t n = x.dim() == 0 ? 1 : x.size(wrap_dim(dim, x.dim(), "argsort"));
  return sort_along(x, dim, descending, n, false, "argsort").indices;
}

SortResult topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  NoGradGuard no_grad;
  (void)sorted;  // always sorted: a valid order for !sorted too
  check_defined(x, "topk", "input");
  const int64_t d = wrap_dim(dim, x.dim(), "topk");
  const int64_t n = x.dim() == 0 ? 1 : x.size(d);
  ACCRUE_CHECK(k >= 0 && k <= n, "topk: k = ", k, " is outside [0, ", n, "] (dim ", d,
               " of the input of shape ", shape_str(x.shape()), ")");
  return sort_along(x, dim, largest, k, true, "topk");
}

}  // namespace accrue::kernels
