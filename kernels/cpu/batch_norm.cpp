// The CPU reference of the fused batch normalization (Note [Fused batch norm
// kernels]): two passes per channel, sums in double in index order, every
// result rounded once to its dtype.
#include <cmath>
#include <vector>

#include "accrue/kernels/batch_norm_backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

namespace {

// Calls f(o, c, offset) for every element of channel c, in index order.
template <class F>
void for_channel(const BatchNormLayout& l, int64_t c, F&& f) {
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i)
      f((o * l.channels + c) * l.inner + i);
}

// The [C] vector `v` (dtype f32 or f64) read as double.
std::vector<double> to_doubles(const Tensor& v) {
  std::vector<double> out(static_cast<size_t>(v.numel()));
  visit_float(v.dtype(), "batch_norm", [&](auto tag) {
    using A = decltype(tag);
    for (size_t c = 0; c < out.size(); ++c)
      out[c] = load_double(ptr<A>(v)[c]);
  });
  return out;
}

// Writes the doubles into the [C] vector `v` (f32 or f64), each rounded once.
void from_doubles(const std::vector<double>& values, const Tensor& v) {
  visit_float(v.dtype(), "batch_norm", [&](auto tag) {
    using A = decltype(tag);
    for (size_t c = 0; c < values.size(); ++c)
      ptr<A>(v)[c] = store_double<A>(values[c]);
  });
}

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const BatchNormLayout& layout, const Tensor& out, const Tensor& mean,
                        const Tensor& var, const Tensor& invstd) {
  const int64_t channels = layout.channels;
  const double n = static_cast<double>(layout.outer * layout.inner);
  std::vector<double> means(channels), vars(channels), invstds(channels);
  visit_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* xs = ptr<T>(x);
    T* ys = ptr<T>(out);
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0.0;
      for_channel(layout, c, [&](int64_t k) { sum += load_double(xs[k]); });
      const double m = sum / n;
      double squares = 0.0;
      for_channel(layout, c, [&](int64_t k) {
        const double d = load_double(xs[k]) - m;
        squares += d * d;
      });
      means[c] = m;
      vars[c] = squares / n;
      invstds[c] = 1.0 / std::sqrt(vars[c] + eps);
      const double w = load_double(ptr<T>(weight)[c]), b = load_double(ptr<T>(bias)[c]);
      for_channel(layout, c, [&](int64_t k) {
        ys[k] = store_double<T>((load_double(xs[k]) - m) * invstds[c] * w + b);
      });
    }
  });
  from_doubles(means, mean);
  from_doubles(vars, var);
  from_doubles(invstds, invstd);
}

void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, const BatchNormLayout& layout,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const int64_t channels = layout.channels;
  const double n = static_cast<double>(layout.outer * layout.inner);
  const std::vector<double> means = to_doubles(mean), invstds = to_doubles(invstd);
  std::vector<double> dweights(channels), dbiases(channels);
  visit_float(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gs = ptr<T>(grad);
    const T* xs = ptr<T>(x);
    for (int64_t c = 0; c < channels; ++c) {
      const double m = means[c], r = invstds[c];
      double sum_g = 0.0, sum_gx = 0.0;  // sum(g), sum(g (x - mean))
      for_channel(layout, c, [&](int64_t k) {
        const double g = load_double(gs[k]);
        sum_g += g;
        sum_gx += g * (load_double(xs[k]) - m);
      });
      dbiases[c] = sum_g;
      dweights[c] = sum_gx * r;
      if (!dx.defined()) continue;
      const double w = load_double(ptr<T>(weight)[c]);
      const double a = w * r, b = -w * r * r * r * sum_gx / n, g_mean = sum_g / n;
      T* dxs = ptr<T>(dx);
      for_channel(layout, c, [&](int64_t k) {
        dxs[k] = store_double<T>(a * (load_double(gs[k]) - g_mean) + b * (load_double(xs[k]) - m));
      });
    }
  });
  from_doubles(dweights, dweight);
  from_doubles(dbiases, dbias);
}

void batch_norm_merge_statistics(const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 const Tensor& batch_mean, const Tensor& batch_var,
                                 double batch_count) {
  const std::vector<double> bm = to_doubles(batch_mean), bv = to_doubles(batch_var);
  double* counts = ptr<double>(count);
  double* means = ptr<double>(mean);
  double* m2s = ptr<double>(m2);
  const double na = counts[0], nb = batch_count, total = na + nb;
  for (size_t c = 0; c < bm.size(); ++c) {
    const double delta = bm[c] - means[c];
    means[c] += delta * nb / total;
    m2s[c] += bv[c] * nb + delta * delta * na * nb / total;
  }
  counts[0] = total;
}

void batch_norm_adopt_statistics(const Tensor& running_mean, const Tensor& running_var,
                                 const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 double momentum) {
  double* rm = ptr<double>(running_mean);
  double* rv = ptr<double>(running_var);
  double* means = ptr<double>(mean);
  double* m2s = ptr<double>(m2);
  double* n = ptr<double>(count);
  // Note [Non-finite window statistics]: all channels or none.
  bool finite = true;
  for (int64_t c = 0; c < mean.numel(); ++c)
    finite = finite && std::isfinite(means[c]) && std::isfinite(m2s[c]);
  for (int64_t c = 0; c < mean.numel(); ++c) {
    if (n[0] > 0.0 && finite) {
      const double unbiased = m2s[c] / (n[0] - 1.0);
      if (momentum == 1.0) {  // replaced outright: mends non-finite running statistics too
        rm[c] = means[c];
        rv[c] = unbiased;
      } else {
        rm[c] = rm[c] * (1.0 - momentum) + means[c] * momentum;
        rv[c] = rv[c] * (1.0 - momentum) + unbiased * momentum;
      }
    }
    means[c] = 0.0;
    m2s[c] = 0.0;
  }
  n[0] = 0.0;
}

}  // namespace accrue::kernels::cpu
