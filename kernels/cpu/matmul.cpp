// CPU reference: batched GEMM, out[b] = alpha * a[b] @ b[b] + beta * out[b].
//
// Accumulates in double (the oracle for cuBLAS, whatever the storage dtype),
// each output over k in increasing order, in register blocks
// (Note [CPU GEMM block]). The output rows of all batches are split across
// threads (Note [CPU threads]): each output is computed whole by one thread.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

namespace {

// Note [CPU GEMM block]
// ~~~~~~~~~~~~~~~~~~~~
// The product is computed kRows x kCols outputs at a time, their sums held in
// registers across the whole k loop. Each output still starts at 0.0 and adds
// a[i][kk] * b[kk][j] for kk = 0, 1, ... in order, with the expression of the
// plain i-k-j loop (x86-64 without -march has no fused multiply-add to
// contract it into), so its bits are that loop's, whatever the blocking and
// whichever thread computes it (Note [CPU threads]).
constexpr int64_t kRows = 4, kCols = 8;

// Sums of kRows rows of a (packed: ap[kk * kRows + rr]) times b, whose row kk
// brow(kk) returns (T = float or double), handed to store(c, j0, cols) one
// column block at a time.
template <class BRow, class Store>
void row_block(const double* ap, int64_t k, int64_t n, BRow brow, Store store) {
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    double c[kRows][kCols] = {};
    if (n - j0 >= kCols) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const auto* b = brow(kk) + j0;
        double bv[kCols];
        for (int64_t jj = 0; jj < kCols; ++jj)
          bv[jj] = static_cast<double>(b[jj]);
        for (int64_t rr = 0; rr < kRows; ++rr) {
          const double av = ap[kk * kRows + rr];
          for (int64_t jj = 0; jj < kCols; ++jj)
            c[rr][jj] += av * bv[jj];
        }
      }
      store(c, j0, kCols);
    } else {
      const int64_t cols = n - j0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const auto* b = brow(kk) + j0;
        for (int64_t rr = 0; rr < kRows; ++rr) {
          const double av = ap[kk * kRows + rr];
          for (int64_t jj = 0; jj < cols; ++jj)
            c[rr][jj] += av * static_cast<double>(b[jj]);
        }
      }
      store(c, j0, cols);
    }
  }
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  const int64_t sab = a.stride(0), sam = a.stride(1), sak = a.stride(2);
  const int64_t sbb = b.stride(0), sbk = b.stride(1), sbn = b.stride(2);
  if (batch == 0 || m == 0 || n == 0) return;
  visit_float(a.dtype(), "gemm", [&](auto a_tag) {
    using T = decltype(a_tag);
    visit_float(out.dtype(), "gemm", [&](auto out_tag) {
      using O = decltype(out_tag);
      const T* pa = ptr<T>(a);
      const T* pb = ptr<T>(b);
      O* po = ptr<O>(out);
      // An f32/f64 b with contiguous rows is read in place: widening a float
      // as it is read gives the double the dense copy would hold.
      constexpr bool kWide = std::is_same_v<T, float> || std::is_same_v<T, double>;
      const bool in_place = kWide && sbn == 1;
      // A multiply-add costs a fraction of an elementwise op's load and
      // store: a chunk gets 4x kParallelWork of them (tens of microseconds).
      parallel_for(0, batch * m, grain_for(n * k / 4), [&](int64_t r0, int64_t r1) {
        std::vector<double> bd(in_place ? 0 : static_cast<size_t>(k * n));  // b[bi], dense
        std::vector<double> ap(static_cast<size_t>(k * kRows));  // kRows rows of a[bi], packed
        int64_t loaded = -1;
        for (int64_t r = r0; r < r1;) {
          const int64_t bi = r / m, i = r % m;
          const int64_t rows = std::min({kRows, r1 - r, m - i});  // within one batch
          if (!in_place && bi != loaded) {
            for (int64_t kk = 0; kk < k; ++kk)
              for (int64_t j = 0; j < n; ++j)
                bd[kk * n + j] = load_double(pb[bi * sbb + kk * sbk + j * sbn]);
            loaded = bi;
          }
          for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t rr = 0; rr < kRows; ++rr)
              ap[kk * kRows + rr] =
                  rr < rows ? load_double(pa[bi * sab + (i + rr) * sam + kk * sak]) : 0.0;
          auto store_block = [&](const double(&c)[kRows][kCols], int64_t j0, int64_t cols) {
            for (int64_t rr = 0; rr < rows; ++rr) {
              O* orow = po + (r + rr) * n + j0;
              for (int64_t jj = 0; jj < cols; ++jj) {
                // beta == 0 must not read out: it may hold garbage or NaN (Note [Overwrite first]).
                const double prev = beta == 0.0 ? 0.0 : beta * load_double(orow[jj]);
                orow[jj] = store_double<O>(alpha * c[rr][jj] + prev);
              }
            }
          };
          if constexpr (kWide) {
            if (in_place) {
              row_block(
                  ap.data(), k, n, [&](int64_t kk) { return pb + bi * sbb + kk * sbk; },
                  store_block);
              r += rows;
              continue;
            }
          }
          row_block(
              ap.data(), k, n, [&](int64_t kk) { return bd.data() + kk * n; }, store_block);
          r += rows;
        }
      });
    });
  });
}

}  // namespace accrue::kernels::cpu
