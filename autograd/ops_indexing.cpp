// The differentiable indexing ops of autograd/indexing_ops.h, backward next to
// forward; the kernels are kernels/indexing.h's.
#include <vector>

#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/saved.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"

namespace accrue {

using autograd::record;
using autograd::saved;

namespace {

// The dim an op works along, as a non-negative number (a 0-d tensor has one).
int64_t dim_of(const Tensor& x, int64_t dim, const char* op) {
  return wrap_dim(dim, x.dim(), op);
}

// grad scattered into zeros of `shape` at index along dim: the gradient of a
// gather, and of sort's and topk's values.
Tensor scatter_into_zeros(const Tensor& g, const Shape& shape, int64_t dim, const Tensor& index) {
  return kernels::scatter_add(zeros(shape, g.dtype(), g.device()), dim, index, g);
}

}  // namespace

// ---- joining and splitting ----------------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = kernels::cat(tensors, dim);
  const int64_t d = dim_of(out, dim, "cat");
  std::vector<int64_t> lengths;
  for (const Tensor& t : tensors)
    lengths.push_back(t.size(d));
  return record("CatBackward", out, tensors, [lengths, d](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t at = 0;
    for (int64_t length : lengths) {
      grads.push_back(g.narrow(d, at, length));
      at += length;
    }
    return grads;
  });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = kernels::stack(tensors, dim);
  const int64_t d = dim_of(out, dim, "stack");
  const size_t n = tensors.size();
  return record("StackBackward", out, tensors, [n, d](const Tensor& g) {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < n; ++i)
      grads.push_back(g.select(d, static_cast<int64_t>(i)));
    return grads;
  });
}

std::vector<Tensor> split(const Tensor& x, const SplitSizes& sizes, int64_t dim) {
  const std::vector<int64_t> lengths = kernels::split_lengths(x, sizes, dim);
  std::vector<Tensor> pieces;
  int64_t at = 0;
  for (int64_t length : lengths) {
    pieces.push_back(narrow(x, dim, at, length));
    at += length;
  }
  return pieces;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const std::vector<int64_t> lengths = kernels::chunk_lengths(x, chunks, dim);
  return split(x, SplitSizes(lengths), dim);
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  ACCRUE_CHECK(x.defined(), "unbind: input is an undefined tensor");
  ACCRUE_CHECK(x.dim() > 0, "unbind: the input is 0-d; there is no dim to unbind");
  const int64_t d = dim_of(x, dim, "unbind");
  std::vector<Tensor> slices;
  for (int64_t i = 0; i < x.size(d); ++i)
    slices.push_back(select(x, d, i));
  return slices;
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim) {
  Tensor out = kernels::repeat_interleave(x, repeats, dim);
  const Shape in = x.shape();
  return record("RepeatInterleaveBackward", out, {x},
                [in, repeats, dim](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::repeat_interleave_backward(g, repeats, dim, in)};
                });
}

// ---- gathers and scatter-adds ---------------------------------------------------------

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = kernels::gather(x, dim, index);
  const Shape shape = x.shape();
  const Tensor idx = saved(index);
  return record("GatherBackward", out, {x}, [shape, dim, idx](const Tensor& g) {
    return std::vector<Tensor>{scatter_into_zeros(g, shape, dim, idx)};
  });
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = kernels::scatter_add(x, dim, index, src);
  const Tensor idx = saved(index);
  const Shape src_shape = src.shape();
  const bool src_grad = autograd::wants_grad(src);
  return record("ScatterAddBackward", out, {x, src},
                [idx, dim, src_shape, src_grad](const Tensor& g) -> std::vector<Tensor> {
                  if (!src_grad) return {g, Tensor()};
                  Tensor gs = kernels::gather(g, dim, idx);
                  if (gs.shape() != src_shape) {
                    // src's elements beyond the index's shape were unused: 0.
                    Tensor padded = zeros(src_shape, g.dtype(), g.device());
                    Tensor region = padded;
                    for (int64_t e = 0; e < idx.dim(); ++e)
                      region = region.narrow(e, 0, idx.size(e));
                    region.copy_(gs);
                    gs = padded;
                  }
                  return {g, gs};
                });
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = kernels::index_select(x, dim, index);
  const Shape shape = x.shape();
  const Tensor idx = saved(index);
  return record("IndexSelectBackward", out, {x},
                [shape, dim, idx](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::index_add(zeros(shape, g.dtype(), g.device()), dim, idx, g)};
                });
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha) {
  Tensor out = kernels::index_add(x, dim, index, src, alpha);
  const Tensor idx = saved(index);
  const bool src_grad = autograd::wants_grad(src);
  return record("IndexAddBackward", out, {x, src},
                [idx, dim, alpha, src_grad](const Tensor& g) -> std::vector<Tensor> {
                  if (!src_grad) return {g, Tensor()};
                  Tensor gs = kernels::index_select(g, dim, idx);
                  if (alpha != 1.0) gs = kernels::binary_scalar(kernels::BinaryOp::Mul, gs, alpha);
                  return {g, gs};
                });
}

Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype) {
  return kernels::one_hot(index, num_classes, dtype);
}

// ---- scans and orderings --------------------------------------------------------------

Tensor cumsum(const Tensor& x, int64_t dim) {
  Tensor out = kernels::cumsum(x, dim);
  return record("CumsumBackward", out, {x}, [dim](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::cumsum(g, dim, /*reverse=*/true)};
  });
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  NoGradGuard no_grad;  // an index: nothing to differentiate
  return kernels::argmax(x, dim, keepdim);
}

namespace {

// values (differentiable) and indices of a sort or topk of x along dim.
SortResult record_values(const Tensor& x, int64_t dim, SortResult r, const char* name) {
  const Shape shape = x.shape();
  const Tensor idx = saved(r.indices);
  r.values = record(name, r.values, {x}, [shape, dim, idx](const Tensor& g) {
    return std::vector<Tensor>{scatter_into_zeros(g, shape, dim, idx)};
  });
  return r;
}

}  // namespace

SortResult sort(const Tensor& x, int64_t dim, bool descending) {
  return record_values(x, dim, kernels::sort(x, dim, descending), "SortBackward");
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return kernels::argsort(x, dim, descending);
}

SortResult topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  return record_values(x, dim, kernels::topk(x, k, dim, largest, sorted), "TopkBackward");
}

}  // namespace accrue
