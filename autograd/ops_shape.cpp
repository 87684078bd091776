// Differentiable views and casts: the raw Tensor methods plus a backward.
#include <numeric>

#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/saved.h"
#include "accrue/kernels/ops.h"

namespace accrue {

using autograd::record;

namespace {

// Runs a raw view method on a tensor that may require grad (Note [Raw views]:
// the raw methods refuse that while grad mode is on; here the graph is recorded).
template <class F>
Tensor raw(const Tensor& a, F&& f) {
  NoGradGuard no_grad;
  return f(a);
}

// The gradient of a tensor that was a sub-view of an input: zeros with g placed in the view.
template <class ViewFn>
Tensor scatter_into_zeros(const Tensor& g, const Shape& shape, DType dtype, ViewFn&& view_of) {
  Tensor out = zeros(shape, dtype, g.device());
  Tensor region = view_of(out);
  region.copy_(g);
  return out;
}

}  // namespace

Tensor view(const Tensor& a, const Shape& shape) {
  const Shape in = a.shape();
  return record("ViewBackward", raw(a, [&](const Tensor& t) { return t.view(shape); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(in)}; });
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  const Shape in = a.shape();
  return record("ReshapeBackward", raw(a, [&](const Tensor& t) { return t.reshape(shape); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(in)}; });
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  return record("TransposeBackward", raw(a, [&](const Tensor& t) { return t.transpose(d0, d1); }),
                {a},
                [d0, d1](const Tensor& g) -> std::vector<Tensor> { return {g.transpose(d0, d1)}; });
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  Tensor out = raw(a, [&](const Tensor& t) { return t.permute(dims); });
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[wrap_dim(dims[i], a.dim(), "permute")] = static_cast<int64_t>(i);
  return record("PermuteBackward", out, {a},
                [inverse](const Tensor& g) -> std::vector<Tensor> { return {g.permute(inverse)}; });
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  Tensor out = raw(a, [&](const Tensor& t) { return t.narrow(dim, start, length); });
  const Shape shape = a.shape();
  const DType dtype = a.dtype();
  return record("NarrowBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {scatter_into_zeros(g, shape, dtype,
                               [&](const Tensor& z) { return z.narrow(dim, start, length); })};
  });
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  Tensor out = raw(a, [&](const Tensor& t) { return t.select(dim, index); });
  const Shape shape = a.shape();
  const DType dtype = a.dtype();
  return record("SelectBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {
        scatter_into_zeros(g, shape, dtype, [&](const Tensor& z) { return z.select(dim, index); })};
  });
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  const Shape in = a.shape();
  return record("UnsqueezeBackward", raw(a, [&](const Tensor& t) { return t.unsqueeze(dim); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(in)}; });
}

Tensor squeeze(const Tensor& a, int64_t dim) {
  const Shape in = a.shape();
  return record("SqueezeBackward", raw(a, [&](const Tensor& t) { return t.squeeze(dim); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(in)}; });
}

Tensor expand(const Tensor& a, const Shape& shape) {
  const Shape in = a.shape();
  return record("ExpandBackward", raw(a, [&](const Tensor& t) { return t.expand(shape); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {kernels::sum_to(g, in)}; });
}

Tensor contiguous(const Tensor& a) {
  return record("ContiguousBackward", raw(a, [](const Tensor& t) { return t.contiguous(); }), {a},
                [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor clone(const Tensor& a) {
  return record("CloneBackward", raw(a, [](const Tensor& t) { return t.clone(); }), {a},
                [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor to_device(const Tensor& a, Device device) {
  const Device in = a.device();
  return record("ToDeviceBackward", raw(a, [&](const Tensor& t) { return t.to(device); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {g.to(in)}; });
}

Tensor to_dtype(const Tensor& a, DType dtype) {
  ACCRUE_CHECK(is_floating(dtype) || !a.requires_grad(),
               "to_dtype: casting a tensor that "
               "requires grad to ",
               dtype_name(dtype), " would cut its gradient");
  const DType in = a.dtype();
  return record("ToDtypeBackward", raw(a, [&](const Tensor& t) { return t.to(dtype); }), {a},
                [in](const Tensor& g) -> std::vector<Tensor> { return {g.to(in)}; });
}

}  // namespace accrue
