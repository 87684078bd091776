// CPU reference: reductions over the last dim of a contiguous [rows, cols]
// view, column sums (sum_rows) and softmax. The dispatch point has permuted
// the reduced dims to the end, so every kernel here is a loop over rows.
//
// As the oracle for the GPU kernels, every sum accumulates in double, in
// increasing index order, and is rounded once to the output dtype. Threads
// split the rows (the columns for sum_rows), never one sum (Note [CPU threads]).
#include <cmath>
#include <limits>
#include <vector>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

void reduce_last(ReduceOp op, const Tensor& in, const Tensor& out) {
  const int64_t rows = in.size(0), cols = in.size(1);
  visit_float(in.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* pin = ptr<T>(in);
    parallel_for(0, rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = pin + r * cols;
        if (op == ReduceOp::Sum || op == ReduceOp::Mean) {
          double s = 0.0;
          for (int64_t c = 0; c < cols; ++c)
            s += load_double(row[c]);
          // Mean of nothing is 0/0 = NaN, as in numpy.
          if (op == ReduceOp::Mean) s /= static_cast<double>(cols);
          ptr<T>(out)[r] = store_double<T>(s);
          continue;
        }
        // Max and ArgMax: NaN wins (and the first NaN is the argmax); ties keep the first.
        int64_t best = 0;
        double best_v = cols > 0 ? load_double(row[0]) : -std::numeric_limits<double>::infinity();
        for (int64_t c = 1; c < cols && !std::isnan(best_v); ++c) {
          const double v = load_double(row[c]);
          if (std::isnan(v) || v > best_v) {
            best = c;
            best_v = v;
          }
        }
        if (op == ReduceOp::Max) {
          ptr<T>(out)[r] = store_double<T>(best_v);
        } else {
          ptr<int64_t>(out)[r] = best;
        }
      }
    });
  });
}

void sum_rows(const Tensor& in, const Tensor& out, bool accumulate) {
  const int64_t n = in.size(0), d = in.size(1);
  std::vector<double> acc(static_cast<size_t>(d), 0.0);
  visit_float(in.dtype(), "sum_rows", [&](auto tag) {
    using T = decltype(tag);
    const T* pin = ptr<T>(in);
    // Each thread sums whole columns [j0, j1), every one over all rows in order.
    parallel_for(0, d, grain_for(n), [&](int64_t j0, int64_t j1) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = j0; j < j1; ++j)
          acc[j] += load_double(pin[i * d + j]);
    });
  });
  visit_float(out.dtype(), "sum_rows", [&](auto tag) {
    using O = decltype(tag);
    const Indexer io(out);
    O* po = ptr<O>(out);
    for (int64_t j = 0; j < d; ++j) {
      O& o = po[io(j)];
      o = store_double<O>(accumulate ? load_double(o) + acc[j] : acc[j]);
    }
  });
}

void softmax(const Tensor& in, const Tensor& out, bool log) {
  const int64_t rows = in.size(0), cols = in.size(1);
  visit_float(in.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* pin = ptr<T>(in);
    T* pout = ptr<T>(out);
    parallel_for(0, rows, grain_for(3 * cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* x = pin + r * cols;
        T* y = pout + r * cols;
        // Subtracting the row max keeps exp() in range (stable for inputs like 1000).
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < cols; ++c)
          m = std::fmax(m, load_double(x[c]));
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c)
          s += std::exp(load_double(x[c]) - m);
        const double log_s = std::log(s);
        for (int64_t c = 0; c < cols; ++c) {
          const double z = load_double(x[c]) - m;
          y[c] = store_double<T>(log ? z - log_s : std::exp(z) / s);
        }
      }
    });
  });
}

void softmax_backward(const Tensor& grad, const Tensor& output, const Tensor& grad_in, bool log) {
  const int64_t rows = grad.size(0), cols = grad.size(1);
  visit_float(grad.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    parallel_for(0, rows, grain_for(2 * cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* dy = ptr<T>(grad) + r * cols;
        const T* y = ptr<T>(output) + r * cols;
        T* dx = ptr<T>(grad_in) + r * cols;
        if (log) {
          // dx = dy - exp(y) * sum(dy)
          double s = 0.0;
          for (int64_t c = 0; c < cols; ++c)
            s += load_double(dy[c]);
          for (int64_t c = 0; c < cols; ++c)
            dx[c] = store_double<T>(load_double(dy[c]) - std::exp(load_double(y[c])) * s);
        } else {
          // dx = y * (dy - sum(dy * y))
          double s = 0.0;
          for (int64_t c = 0; c < cols; ++c)
            s += load_double(dy[c]) * load_double(y[c]);
          for (int64_t c = 0; c < cols; ++c)
            dx[c] = store_double<T>(load_double(y[c]) * (load_double(dy[c]) - s));
        }
      }
    });
  });
}

}  // namespace accrue::kernels::cpu
