// CPU reference of the transformer fusions: plain compositions, written so
// that each equals its unfused counterpart on the CPU (tests/kernels/cpu_fused_test.cpp).
#include <algorithm>
#include <vector>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"
#include "accrue/kernels/fused_backend.h"

namespace accrue::kernels::cpu {

void linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                 const Tensor& out) {
  const int64_t n = x.size(0), in = x.size(1), out_features = weight.size(0);
  visit_float(x.dtype(), "linear_gelu", [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    const T* pw = ptr<T>(weight);
    const T* pb = ptr<T>(bias);
    T* pp = ptr<T>(pre);
    // weight^T as a dense double [in, out]: the i-k-j loop below then runs its
    // inner loop along contiguous memory, as the reference GEMM does.
    std::vector<double> wt(static_cast<size_t>(in * out_features));
    for (int64_t o = 0; o < out_features; ++o)
      for (int64_t k = 0; k < in; ++k)
        wt[k * out_features + o] = load_double(pw[o * in + k]);
    std::vector<double> acc(static_cast<size_t>(out_features));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t o = 0; o < out_features; ++o)
        acc[o] = load_double(pb[o]);
      for (int64_t k = 0; k < in; ++k) {
        const double xik = load_double(px[i * in + k]);
        const double* row = wt.data() + k * out_features;
        for (int64_t o = 0; o < out_features; ++o)
          acc[o] += xik * row[o];
      }
      for (int64_t o = 0; o < out_features; ++o)
        pp[i * out_features + o] = store_double<T>(acc[o]);
    }
  });
  // GELU of the stored pre-activation with UnaryOp::Gelu's own kernel, so
  // that out == unary(Gelu, pre) bit for bit.
  unary(UnaryOp::Gelu, pre, 0.0, out);
}

void residual_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                         const Tensor& bias, double eps, const Tensor& sum, const Tensor& out,
                         const Tensor& mean, const Tensor& rstd) {
  // Exactly kernels::binary(Add) then kernels::layer_norm of the stored sum.
  binary(BinaryOp::Add, x, residual, sum);
  layer_norm(sum, weight, bias, eps, out, mean, rstd);
}

}  // namespace accrue::kernels::cpu
