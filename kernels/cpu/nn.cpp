// CPU reference: embedding, cross-entropy and layer norm, forward and backward.
// Every sum accumulates in double in a fixed order and is rounded once. Threads
// split rows, columns or embedding rows, never one sum (Note [CPU threads]).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

namespace {

// Host copy of an index tensor (any strides) as i64.
std::vector<int64_t> read_indices(const Tensor& indices, const char* op) {
  std::vector<int64_t> v(static_cast<size_t>(indices.numel()));
  visit_index_dtype(indices.dtype(), op, [&](auto tag) {
    using I = decltype(tag);
    const Indexer ii(indices);
    const I* p = ptr<I>(indices);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<int64_t>(p[ii(static_cast<int64_t>(i))]);
  });
  return v;
}

// Reads the double value of element i of a float tensor of dtype unknown at compile time
// (the per-row statistics and the loss seed: not in any inner loop).
double read_scalar(const Tensor& t, int64_t i) {
  return visit_float(t.dtype(), "read", [&](auto tag) {
    using T = decltype(tag);
    return load_double(ptr<T>(t)[i]);
  });
}

// A [D] parameter (any float dtype, any strides) as doubles; empty when undefined.
std::vector<double> read_param(const Tensor& p) {
  std::vector<double> v;
  if (!p.defined()) return v;
  v.resize(static_cast<size_t>(p.numel()));
  visit_float(p.dtype(), "layer_norm", [&](auto tag) {
    using P = decltype(tag);
    const Indexer ip(p);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = load_double(ptr<P>(p)[ip(static_cast<int64_t>(i))]);
  });
  return v;
}

// log(sum(exp(x))) of one row, computed stably around the row max.
template <class T>
double log_sum_exp(const T* x, int64_t cols) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < cols; ++c)
    m = std::fmax(m, load_double(x[c]));
  double s = 0.0;
  for (int64_t c = 0; c < cols; ++c)
    s += std::exp(load_double(x[c]) - m);
  return m + std::log(s);
}

}  // namespace

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  const int64_t d = weight.size(1);
  const std::vector<int64_t> idx = read_indices(indices, "embedding");
  visit_float(weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    const T* pw = ptr<T>(weight);
    T* po = ptr<T>(out);
    const int64_t v = weight.size(0);
    parallel_for(0, static_cast<int64_t>(idx.size()), grain_for(d), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        T* row = po + i * d;
        const int64_t k = idx[static_cast<size_t>(i)];
        if (k >= 0 && k < v) {
          std::copy(pw + k * d, pw + (k + 1) * d, row);
        } else {  // a deferred check's bad index (Note [Deferred index checks]): a NaN row
          std::fill(row, row + d, store_double<T>(std::numeric_limits<double>::quiet_NaN()));
        }
      }
    });
  });
}

int64_t count_out_of_range(const Tensor& indices, int64_t bound, int64_t ignore_index,
                           bool use_ignore) {
  int64_t bad = 0;
  for (int64_t v : read_indices(indices, "count_out_of_range"))
    if (!(use_ignore && v == ignore_index) && (v < 0 || v >= bound)) ++bad;
  return bad;
}

void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& grad_weight,
                        bool accumulate) {
  const int64_t n = grad.size(0), d = grad.size(1), v = grad_weight.size(0);
  const std::vector<int64_t> idx = read_indices(indices, "embedding_backward");
  // Positions grouped by index, increasing position within a group: each row's
  // sum then runs in a fixed order that does not depend on anything but the data.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return idx[x] < idx[y]; });
  // Where each group of equal indices starts in `order` (and its end): groups
  // write distinct rows, so threads split the groups.
  std::vector<size_t> starts;
  for (size_t i = 0; i < order.size(); ++i)
    if (i == 0 || idx[order[i]] != idx[order[i - 1]]) starts.push_back(i);
  starts.push_back(order.size());
  const int64_t groups = static_cast<int64_t>(starts.size()) - 1;
  visit_float(grad.dtype(), "embedding_backward", [&](auto g_tag) {
    using G = decltype(g_tag);
    visit_float(grad_weight.dtype(), "embedding_backward", [&](auto w_tag) {
      using W = decltype(w_tag);
      const G* pg = ptr<G>(grad);
      W* pw = ptr<W>(grad_weight);
      if (!accumulate) {
        parallel_for(0, v * d, kParallelWork, [&](int64_t i0, int64_t i1) {
          std::fill(pw + i0, pw + i1, store_double<W>(0.0));
        });
      }
      parallel_for(0, groups, grain_for(d), [&](int64_t g0, int64_t g1) {
        std::vector<double> acc(static_cast<size_t>(d));
        for (int64_t g = g0; g < g1; ++g) {
          const size_t start = starts[static_cast<size_t>(g)];
          const size_t end = starts[static_cast<size_t>(g) + 1];
          const int64_t row = idx[order[start]];
          if (row < 0 || row >= v) continue;  // a deferred check's bad index: no row to add to
          std::fill(acc.begin(), acc.end(), 0.0);
          for (size_t e = start; e < end; ++e)
            for (int64_t j = 0; j < d; ++j)
              acc[j] += load_double(pg[order[e] * d + j]);
          W* out = pw + row * d;
          for (int64_t j = 0; j < d; ++j)
            out[j] = store_double<W>(accumulate ? load_double(out[j]) + acc[j] : acc[j]);
        }
      });
    });
  });
}

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                   const Tensor& loss_sum, const Tensor& count) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const std::vector<int64_t> t = read_indices(targets, "cross_entropy");
  // Each row's term on its own thread, then their sum in row order on this one.
  std::vector<double> terms(static_cast<size_t>(rows));
  visit_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    parallel_for(0, rows, grain_for(2 * cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (t[r] == ignore_index) continue;
        const T* x = ptr<T>(logits) + r * cols;
        // A deferred check's bad target (Note [Deferred index checks]) makes the loss NaN.
        terms[r] = t[r] >= 0 && t[r] < cols ? log_sum_exp(x, cols) - load_double(x[t[r]])
                                            : std::numeric_limits<double>::quiet_NaN();
      }
    });
  });
  double loss = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == ignore_index) continue;
    loss += terms[r];
    ++counted;
  }
  visit_float(loss_sum.dtype(), "cross_entropy", [&](auto tag) {
    using L = decltype(tag);
    *ptr<L>(loss_sum) = store_double<L>(loss);
  });
  *ptr<int64_t>(count) = counted;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            const Tensor& grad_sum, const Tensor& grad_logits) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const std::vector<int64_t> t = read_indices(targets, "cross_entropy_backward");
  const double g = read_scalar(grad_sum, 0);
  visit_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    parallel_for(0, rows, grain_for(3 * cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* x = ptr<T>(logits) + r * cols;
        T* dx = ptr<T>(grad_logits) + r * cols;
        if (t[r] == ignore_index) {
          std::fill(dx, dx + cols, store_double<T>(0.0));
          continue;
        }
        if (t[r] < 0 || t[r] >= cols) {  // a deferred check's bad target: a NaN row
          std::fill(dx, dx + cols, store_double<T>(std::numeric_limits<double>::quiet_NaN()));
          continue;
        }
        // d(lse(x) - x[t]) / dx = softmax(x) - onehot(t)
        const double lse = log_sum_exp(x, cols);
        for (int64_t c = 0; c < cols; ++c) {
          const double p = std::exp(load_double(x[c]) - lse);
          dx[c] = store_double<T>(g * (p - (c == t[r] ? 1.0 : 0.0)));
        }
      }
    });
  });
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = x.size(0), d = x.size(1);
  // weight and bias may be x's dtype or f32 master weights: read once as doubles.
  const std::vector<double> w = read_param(weight), b = read_param(bias);
  visit_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    visit_float(mean.dtype(), "layer_norm", [&](auto s_tag) {
      using S = decltype(s_tag);
      parallel_for(0, rows, grain_for(4 * d), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = ptr<T>(x) + r * d;
          T* yr = ptr<T>(out) + r * d;
          // Two passes: the mean, then the biased variance around it.
          double mu = 0.0;
          for (int64_t c = 0; c < d; ++c)
            mu += load_double(xr[c]);
          mu /= static_cast<double>(d);
          double var = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            const double z = load_double(xr[c]) - mu;
            var += z * z;
          }
          var /= static_cast<double>(d);
          const double rs = 1.0 / std::sqrt(var + eps);
          for (int64_t c = 0; c < d; ++c) {
            double y = (load_double(xr[c]) - mu) * rs;
            if (!w.empty()) y *= w[c];
            if (!b.empty()) y += b[c];
            yr[c] = store_double<T>(y);
          }
          ptr<S>(mean)[r] = store_double<S>(mu);
          ptr<S>(rstd)[r] = store_double<S>(rs);
        }
      });
    });
  });
}

void layer_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                  const Tensor& dx_add, bool want_dweight, bool want_dbias,
                                  NormPartials* partials) {
  const int64_t rows = x.size(0), d = x.size(1);
  std::vector<double> dw(static_cast<size_t>(d), 0.0), db(static_cast<size_t>(d), 0.0);
  const std::vector<double> w = read_param(weight);
  std::vector<double> mus(static_cast<size_t>(rows)), rss(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    mus[r] = read_scalar(mean, r);
    rss[r] = read_scalar(rstd, r);
  }
  visit_float(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    // dx: threads split the rows.
    parallel_for(0, rows, grain_for(4 * d), [&](int64_t r0, int64_t r1) {
      std::vector<double> xhat(static_cast<size_t>(d)), gw(static_cast<size_t>(d));
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = ptr<T>(x) + r * d;
        const T* gr = ptr<T>(grad) + r * d;
        T* dxr = ptr<T>(dx) + r * d;
        const T* addr = dx_add.defined() ? ptr<T>(dx_add) + r * d : nullptr;
        const double mu = mus[r], rs = rss[r];
        // With xhat = (x - mean) * rstd and gw = dy * w:
        //   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)).
        double sum_gw = 0.0, sum_gw_xhat = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          const double g = load_double(gr[c]);
          xhat[c] = (load_double(xr[c]) - mu) * rs;
          gw[c] = w.empty() ? g : g * w[c];
          sum_gw += gw[c];
          sum_gw_xhat += gw[c] * xhat[c];
        }
        const double inv_d = 1.0 / static_cast<double>(d);
        for (int64_t c = 0; c < d; ++c) {
          const double v = rs * (gw[c] - sum_gw * inv_d - xhat[c] * sum_gw_xhat * inv_d);
          dxr[c] = store_double<T>(addr ? v + load_double(addr[c]) : v);
        }
      }
    });
    // dweight and dbias: threads split the columns; each column sums its rows
    // in order, recomputing xhat exactly as above.
    if (!want_dweight && !want_dbias) return;
    parallel_for(0, d, grain_for(2 * rows), [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = ptr<T>(x) + r * d;
        const T* gr = ptr<T>(grad) + r * d;
        const double mu = mus[r], rs = rss[r];
        for (int64_t c = c0; c < c1; ++c) {
          const double g = load_double(gr[c]);
          dw[c] += g * ((load_double(xr[c]) - mu) * rs);
          db[c] += g;
        }
      }
    });
  });
  // The CPU's partial sums are the whole sums, in f64: one chunk.
  partials->chunks = 1;
  if (want_dweight) partials->dweight = from_vector<double>(dw, {d});
  if (want_dbias) partials->dbias = from_vector<double>(db, {d});
}

void norm_param_totals(const NormPartials& partials, const Tensor& dweight, const Tensor& dbias,
                       bool accumulate) {
  // dweight and dbias: written, or added to (Note [Overwrite first]).
  auto write = [&](const Tensor& t, const Tensor& sums) {
    if (!t.defined()) return;
    const double* v = ptr<double>(sums);
    visit_float(t.dtype(), "layer_norm_backward", [&](auto tag) {
      using O = decltype(tag);
      const Indexer io(t);
      O* p = ptr<O>(t);
      for (int64_t c = 0; c < partials.d; ++c) {
        O& o = p[io(c)];
        o = store_double<O>(accumulate ? load_double(o) + v[c] : v[c]);
      }
    });
  };
  write(dweight, partials.dweight);
  write(dbias, partials.dbias);
}

}  // namespace accrue::kernels::cpu
