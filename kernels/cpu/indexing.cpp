// CPU reference of the indexing ops (Note [Indexing ops]): loops in index
// order, sums in double rounded once. Gathers, running sums and sorts split
// their independent outputs over threads (Note [CPU threads]); the
// scatter-add's reference stays on one thread.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "accrue/core/parallel.h"
#include "accrue/kernels/cpu/cpu_util.h"
#include "accrue/kernels/indexing_backend.h"

namespace accrue::kernels::cpu {

namespace {

// What a gather reads for a bad index (Note [Indexing ops]): all-ones bytes.
template <class T>
T all_ones() {
  if constexpr (std::is_same_v<T, bool>) {
    return true;
  } else {
    T v;
    std::memset(static_cast<void*>(&v), 0xff, sizeof(T));
    return v;
  }
}

// The value a sort compares: integers as themselves, floats as double.
template <class T>
auto sort_key(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return load_double(v);
  }
}

// Note [Indexing ops]: NaN above every number.
template <class K>
bool key_less(K a, K b) {
  if constexpr (std::is_floating_point_v<K>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

}  // namespace

void gather(const Tensor& x, const IndexedDim& at, const Tensor& index, const Tensor& out) {
  const Indexer ii(index);
  const int64_t* pi = ptr<int64_t>(index);
  const int64_t n = out.numel();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    T* po = ptr<T>(out);
    parallel_for(0, n, kParallelWork, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t v = pi[ii(j)];
        po[j] = v >= 0 && v < at.size ? px[at.lines.offset_of(j) + v * at.stride] : all_ones<T>();
      }
    });
  });
}

void scatter_add(const Tensor& index, const Tensor& src, double alpha, const IndexedDim& at,
                 const Tensor& out) {
  const Indexer ii(index);
  const int64_t* pi = ptr<int64_t>(index);
  const int64_t n = src.numel();
  // Sums in double for floats, int64 for integers (wrapping as the integer add would).
  const auto scatter = [&](auto tag, auto zero) {
    using T = decltype(tag);
    using S = decltype(zero);
    const T* ps = ptr<T>(src);
    T* po = ptr<T>(out);
    std::vector<S> sums(static_cast<size_t>(out.numel()), zero);
    std::vector<bool> hit(sums.size(), false);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = pi[ii(j)];
      if (v < 0 || v >= at.size) continue;  // a deferred check's bad index: dropped
      const auto key = static_cast<size_t>(at.lines.offset_of(j) + v * at.stride);
      if constexpr (std::is_integral_v<S>) {
        sums[key] = static_cast<S>(static_cast<uint64_t>(sums[key]) + static_cast<uint64_t>(ps[j]));
      } else {
        sums[key] += load_double(ps[j]);
      }
      hit[key] = true;
    }
    for (size_t key = 0; key < sums.size(); ++key) {
      if (!hit[key]) continue;
      if constexpr (std::is_integral_v<S>) {
        const auto scaled =
            static_cast<uint64_t>(sums[key]) * static_cast<uint64_t>(static_cast<int64_t>(alpha));
        po[key] = static_cast<T>(static_cast<uint64_t>(po[key]) + scaled);
      } else {
        po[key] = store_double<T>(load_double(po[key]) + alpha * sums[key]);
      }
    }
  };
  if (is_floating(out.dtype())) {
    visit_float(out.dtype(), "scatter_add", [&](auto tag) { scatter(tag, 0.0); });
  } else {
    visit_index_dtype(out.dtype(), "scatter_add", [&](auto tag) { scatter(tag, int64_t{0}); });
  }
}

void cumsum(const Tensor& x, bool reverse, const Tensor& out) {
  const int64_t outer = x.size(0), n = x.size(1), inner = x.size(2);
  const auto scan = [&](auto tag, auto zero) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    T* po = ptr<T>(out);
    // Note [CPU threads]: lines are independent; each one sums in order on one thread.
    parallel_for(0, outer * inner, grain_for(n), [&](int64_t l0, int64_t l1) {
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t o = l / inner, c = l - o * inner;
        auto acc = zero;
        for (int64_t step = 0; step < n; ++step) {
          const int64_t i = reverse ? n - 1 - step : step;
          const int64_t at = (o * n + i) * inner + c;
          if constexpr (std::is_same_v<T, int64_t>) {
            acc += px[at];
            po[at] = acc;
          } else {
            acc += load_double(px[at]);
            po[at] = store_double<T>(acc);
          }
        }
      }
    });
  };
  if (x.dtype() == DType::i64) {
    scan(int64_t{}, int64_t{0});
  } else {
    visit_float(x.dtype(), "cumsum", [&](auto tag) { scan(tag, 0.0); });
  }
}

void sort_rows(const Tensor& x, bool descending, const Tensor& values, const Tensor& indices) {
  const int64_t rows = x.size(0), n = x.size(1), k = indices.size(1);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    T* pv = values.defined() ? ptr<T>(values) : nullptr;
    int64_t* pi = ptr<int64_t>(indices);
    // Note [CPU threads]: rows are independent.
    parallel_for(0, rows, grain_for(n * 16), [&](int64_t r0, int64_t r1) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = px + r * n;
        std::iota(order.begin(), order.end(), int64_t{0});
        // Stable: equal keys (and NaNs among themselves) keep their positions' order.
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          const auto ka = sort_key(row[a]), kb = sort_key(row[b]);
          return descending ? key_less(kb, ka) : key_less(ka, kb);
        });
        for (int64_t i = 0; i < k; ++i) {
          pi[r * k + i] = order[static_cast<size_t>(i)];
          if (pv) pv[r * k + i] = row[order[static_cast<size_t>(i)]];
        }
      }
    });
  });
}

}  // namespace accrue::kernels::cpu
