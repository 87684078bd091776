#include "accrue/core/random.h"

#include "accrue/core/random_draw.h"

namespace accrue {

uint64_t Generator::reserve(int64_t n) {
  const uint64_t base = offset_;
  offset_ += philox::blocks_for(n);
  return base;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) {
  default_generator().set_state(seed, 0);
}

namespace {

Tensor draw(const Shape& shape, DType dtype, Device device, Generator* gen, detail::DrawSpec spec,
            const char* op) {
  Tensor out = empty(shape, dtype, device);
  Generator& g = gen ? *gen : default_generator();
  spec.seed = g.seed();
  spec.base = g.reserve(out.numel());
  if (out.numel() == 0) return out;
  if (device.is_cpu()) {
    detail::draw_cpu(out, spec);
  } else {
    detail::draw_cuda(out, spec);
  }
  (void)op;
  return out;
}

}  // namespace

Tensor rand(const Shape& shape, DType dtype, Device device, Generator* gen) {
  ACCRUE_CHECK(is_floating(dtype), "rand: dtype ", dtype_name(dtype), " is not a floating dtype");
  return draw(shape, dtype, device, gen, {detail::Distribution::Uniform, 0, 0}, "rand");
}

Tensor randn(const Shape& shape, DType dtype, Device device, Generator* gen) {
  ACCRUE_CHECK(is_floating(dtype), "randn: dtype ", dtype_name(dtype), " is not a floating dtype");
  return draw(shape, dtype, device, gen, {detail::Distribution::Normal, 0, 0}, "randn");
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype, Device device,
               Generator* gen) {
  ACCRUE_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  ACCRUE_CHECK(dtype != DType::boolean, "randint: dtype bool is not supported");
  return draw(shape, dtype, device, gen, {detail::Distribution::Integer, 0, 0, low, high},
              "randint");
}

namespace detail {

void draw_cpu(const Tensor& out, const DrawSpec& spec) {
  visit_dtype(out.dtype(), [&](auto d) {
    using D = decltype(d);
    D* p = out.data<D>();
    for (int64_t i = 0, n = out.numel(); i < n; ++i)
      p[i] = from_double<D>(draw_element(spec, i, std::is_same_v<D, double>));
  });
}

#ifndef ACCRUE_WITH_CUDA
void draw_cuda(const Tensor&, const DrawSpec&) {
  ACCRUE_FAIL("random draw on a CUDA tensor: accrue was built without CUDA");
}
#endif

}  // namespace detail

}  // namespace accrue
