// CPU reference of the fused classifier's row kernel, total and seed scaling
// (Note [Fused classifier]). Row sums accumulate in double and are rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "accrue/kernels/classifier_backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

namespace {

// Host copy of a contiguous index tensor as i64.
std::vector<int64_t> read_targets(const Tensor& targets) {
  std::vector<int64_t> v(static_cast<size_t>(targets.numel()));
  visit_index_dtype(targets.dtype(), "classifier", [&](auto tag) {
    using I = decltype(tag);
    const I* p = ptr<I>(targets);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<int64_t>(p[i]);
  });
  return v;
}

}  // namespace

void classifier_rows(const Tensor& logits, const Tensor& targets, int64_t valid_classes,
                     int64_t ignore_index, const Tensor& row_loss) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const std::vector<int64_t> t = read_targets(targets);
  visit_float(logits.dtype(), "classifier_rows", [&](auto tag) {
    using T = decltype(tag);
    visit_float(row_loss.dtype(), "classifier_rows", [&](auto loss_tag) {
      using L = decltype(loss_tag);
      for (int64_t r = 0; r < rows; ++r) {
        T* x = ptr<T>(logits) + r * cols;
        L& loss = ptr<L>(row_loss)[r];
        if (t[r] == ignore_index) {
          std::fill(x, x + cols, store_double<T>(0.0));
          loss = store_double<L>(0.0);
          continue;
        }
        // log-sum-exp over the valid columns, stably around their max.
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < valid_classes; ++c)
          m = std::fmax(m, load_double(x[c]));
        double s = 0.0;
        for (int64_t c = 0; c < valid_classes; ++c)
          s += std::exp(load_double(x[c]) - m);
        const double lse = m + std::log(s);
        // Dispatch checked the targets; a bad one would still not read out of the row.
        const bool valid = t[r] >= 0 && t[r] < valid_classes;
        loss = store_double<L>(valid ? lse - load_double(x[t[r]])
                                     : std::numeric_limits<double>::quiet_NaN());
        // Overwrite the row: d(lse - x[t]) / dx = softmax(x) - onehot(t).
        for (int64_t c = 0; c < valid_classes; ++c) {
          const double p = std::exp(load_double(x[c]) - lse);
          x[c] = store_double<T>(c == t[r] ? p - 1.0 : p);
        }
        std::fill(x + valid_classes, x + cols, store_double<T>(0.0));
      }
    });
  });
}

void classifier_total(const Tensor& row_loss, const Tensor& targets, int64_t ignore_index,
                      const Tensor& sum, const Tensor& count) {
  const std::vector<int64_t> t = read_targets(targets);
  visit_float(row_loss.dtype(), "classifier_total", [&](auto tag) {
    using L = decltype(tag);
    double total = 0.0;
    for (int64_t r = 0; r < row_loss.numel(); ++r)
      total += load_double(ptr<L>(row_loss)[r]);
    *ptr<L>(sum) = store_double<L>(total);
  });
  int64_t counted = 0;
  for (int64_t v : t)
    counted += v != ignore_index;
  *ptr<int64_t>(count) = counted;
}

void scale_by_seed(const Tensor& x, const Tensor& seed, const Tensor& out) {
  const int64_t n = out.numel();
  visit_float(out.dtype(), "scale_by_seed", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;  // the CUDA kernel's arithmetic type: one rounding, the same one
    visit_float(x.dtype(), "scale_by_seed", [&](auto x_tag) {
      using X = decltype(x_tag);
      visit_float(seed.dtype(), "scale_by_seed", [&](auto s_tag) {
        using S = decltype(s_tag);
        const M g = static_cast<M>(load_double(*ptr<S>(seed)));
        const X* px = ptr<X>(x);
        T* po = ptr<T>(out);
        for (int64_t i = 0; i < n; ++i)
          po[i] = store<T>(static_cast<M>(load_double(px[i])) * g);
      });
    });
  });
}

}  // namespace accrue::kernels::cpu
