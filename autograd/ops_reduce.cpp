// Differentiable reductions and softmax.
#include <algorithm>

#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/saved.h"
#include "accrue/kernels/ops.h"

namespace accrue {

using autograd::record;
using autograd::saved;

namespace {

// The reduced dims, normalized and sorted; empty `dims` means all.
std::vector<int64_t> reduced_dims(const std::vector<int64_t>& dims, int64_t rank, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d)
      out.push_back(d);
  } else {
    for (int64_t d : dims)
      out.push_back(wrap_dim(d, rank, op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A gradient of a reduction's result, reshaped with the reduced dims kept (size 1).
Tensor keepdim_view(const Tensor& g, const Shape& input_shape, const std::vector<int64_t>& dims) {
  Shape kept = input_shape;
  for (int64_t d : dims)
    kept[d] = 1;
  return g.reshape(kept);
}

// Broadcasts a reduction's gradient back over the input's shape.
Tensor expand_back(const Tensor& g, const Shape& input_shape, const std::vector<int64_t>& dims) {
  return keepdim_view(g, input_shape, dims).expand(input_shape).contiguous();
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= shape[d];
  return n;
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::sum(a, dims, keepdim);
  const Shape shape = a.shape();
  const std::vector<int64_t> rd = reduced_dims(dims, a.dim(), "sum");
  return record("SumBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {expand_back(g, shape, rd)};
  });
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::mean(a, dims, keepdim);
  const Shape shape = a.shape();
  const std::vector<int64_t> rd = reduced_dims(dims, a.dim(), "mean");
  const double n = static_cast<double>(reduced_count(shape, rd));
  return record("MeanBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::binary_scalar(kernels::BinaryOp::Div, expand_back(g, shape, rd), n)};
  });
}

Tensor max(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::max(a, dims, keepdim);
  const Shape shape = a.shape();
  const std::vector<int64_t> rd = reduced_dims(dims, a.dim(), "max");
  Tensor sa = saved(a), so = saved(out);
  return record("MaxBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    // Ties share the gradient evenly (as torch.amax does).
    Tensor is_max =
        kernels::compare(kernels::CompareOp::Eq, sa, keepdim_view(so, shape, rd)).to(g.dtype());
    Tensor ties = kernels::sum(is_max, rd, /*keepdim=*/true);
    Tensor share = kernels::binary(kernels::BinaryOp::Div, keepdim_view(g, shape, rd), ties);
    return {kernels::binary(kernels::BinaryOp::Mul, is_max, share)};
  });
}

Tensor softmax(const Tensor& a, int64_t dim) {
  Tensor out = kernels::softmax(a, dim);
  Tensor so = saved(out);
  return record("SoftmaxBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::softmax_backward(g, so, dim)};
  });
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  Tensor out = kernels::log_softmax(a, dim);
  Tensor so = saved(out);
  return record("LogSoftmaxBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::log_softmax_backward(g, so, dim)};
  });
}

}  // namespace accrue
