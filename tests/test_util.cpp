#include "tests/test_util.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "accrue/kernels/ops.h"

namespace accrue::test {

namespace {
Generator& test_generator() {
  static Generator gen(20261126);
  return gen;
}
}  // namespace

Tensor random_normal(const Shape& shape, DType dtype, Device device, double scale) {
  Tensor t = randn(shape, DType::f64, Device::cpu(), &test_generator());
  std::vector<double> v = t.to_vector<double>();
  for (double& x : v) {
    x *= scale;
    if (x == 0.0) x = scale * 0.5;  // never an exact zero
  }
  return from_vector(v, shape, dtype, device);
}

Tensor random_uniform(const Shape& shape, double lo, double hi, DType dtype, Device device) {
  Tensor t = rand(shape, DType::f64, Device::cpu(), &test_generator());
  std::vector<double> v = t.to_vector<double>();
  for (double& x : v)
    x = lo + (hi - lo) * x;
  return from_vector(v, shape, dtype, device);
}

Tensor random_integers(const Shape& shape, int lo, int hi, DType dtype, Device device) {
  Tensor t = randint(lo, hi + 1, shape, DType::i64, Device::cpu(), &test_generator());
  return t.to(dtype).to(device);
}

Tensor random_powers_of_two(const Shape& shape, int lo, int hi, Device device) {
  std::vector<double> e = random_integers(shape, lo, hi, DType::f64).to_vector<double>();
  for (double& v : e)
    v = std::ldexp(1.0, static_cast<int>(v));
  return from_vector<double>(e, shape).to(DType::f32).to(device);
}

double default_rtol(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    case DType::bf16:
      return 1.6e-2;
    default:
      return 0.0;
  }
}

double default_atol(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-6;
    case DType::f16:
      return 1e-3;
    case DType::bf16:
      return 1e-2;
    default:
      return 0.0;
  }
}

double normalized_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-2;  // bf16
  }
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(actual.shape())
                                         << " vs expected " << shape_str(expected.shape());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  int64_t worst = -1, bad = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    if (std::isinf(e[i]) && a[i] == e[i]) continue;
    const double diff = std::fabs(a[i] - e[i]);
    const double allowed = atol + rtol * std::fabs(e[i]);
    if (!(diff <= allowed)) {
      ++bad;
      const double excess =
          std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff - allowed;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << a.size() << " elements differ beyond atol=" << atol << " rtol=" << rtol
     << "; worst at flat index " << worst << ": actual " << a[worst] << ", expected " << e[worst];
  return ::testing::AssertionFailure() << os.str();
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected) {
  return all_close(actual, expected, default_rtol(actual.dtype()), default_atol(actual.dtype()));
}

::testing::AssertionResult all_equal(const Tensor& actual, const Tensor& expected) {
  return all_close(actual, expected, 0.0, 0.0);
}

double relative_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>();
  const std::vector<double> y = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, double tol) {
  const double err = relative_error(actual, expected);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err << " > " << tol;
}

Tf32Scope::Tf32Scope(bool allow) : previous_(kernels::allow_tf32()) {
  kernels::set_allow_tf32(allow);
}
Tf32Scope::~Tf32Scope() {
  kernels::set_allow_tf32(previous_);
}

CheckIndicesScope::CheckIndicesScope(bool check) : previous_(kernels::check_indices()) {
  kernels::set_check_indices(check);
}
CheckIndicesScope::~CheckIndicesScope() {
  kernels::set_check_indices(previous_);
}

Tensor as_channels_last(const Tensor& t) {
  return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

GraphPoolScope::GraphPoolScope() : previous_(cuda_allocator_mode()) {
  set_cuda_allocator_mode(CudaAllocatorMode::StreamOrderedPool);
}

GraphPoolScope::~GraphPoolScope() {
  set_cuda_allocator_mode(previous_);
}

void poison(const Tensor& t) {
  if (is_floating(t.dtype())) {
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  } else if (t.dtype() != DType::boolean) {
    t.fill_(-777);
  }
}

}  // namespace accrue::test
