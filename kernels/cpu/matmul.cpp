// CPU reference: batched GEMM, out[b] = alpha * a[b] @ b[b] + beta * out[b].
//
// Accumulates in double (the oracle for cuBLAS, whatever the storage dtype),
// in the i-k-j loop order so the inner loop runs along contiguous rows. The
// output rows of all batches are split across threads (Note [CPU threads]):
// each row is computed whole by one thread, in the same order as with one.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

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
        std::vector<double> ad(static_cast<size_t>(k));                     // one row of a[bi]
        std::vector<double> acc(static_cast<size_t>(n));  // one row of the product
        int64_t loaded = -1;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t bi = r / m, i = r % m;
          if (!in_place && bi != loaded) {
            for (int64_t kk = 0; kk < k; ++kk)
              for (int64_t j = 0; j < n; ++j)
                bd[kk * n + j] = load_double(pb[bi * sbb + kk * sbk + j * sbn]);
            loaded = bi;
          }
          for (int64_t kk = 0; kk < k; ++kk)
            ad[kk] = load_double(pa[bi * sab + i * sam + kk * sak]);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t kk = 0; kk < k; ++kk) {
            const double aik = ad[kk];
            if constexpr (kWide) {
              if (in_place) {
                const T* brow = pb + bi * sbb + kk * sbk;
                for (int64_t j = 0; j < n; ++j)
                  acc[j] += aik * static_cast<double>(brow[j]);
                continue;
              }
            }
            const double* brow = bd.data() + kk * n;
            for (int64_t j = 0; j < n; ++j)
              acc[j] += aik * brow[j];
          }
          O* orow = po + r * n;
          for (int64_t j = 0; j < n; ++j) {
            // beta == 0 must not read out: it may hold garbage or NaN (Note [Overwrite first]).
            const double prev = beta == 0.0 ? 0.0 : beta * load_double(orow[j]);
            orow[j] = store_double<O>(alpha * acc[j] + prev);
          }
        }
      });
    });
  });
}

}  // namespace accrue::kernels::cpu
