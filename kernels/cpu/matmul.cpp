// CPU reference: batched GEMM, out[b] = alpha * a[b] @ b[b] + beta * out[b].
//
// Accumulates in double (the oracle for cuBLAS, whatever the storage dtype),
// in the i-k-j loop order so the inner loop runs along contiguous rows.
#include <algorithm>
#include <vector>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  const int64_t sab = a.stride(0), sam = a.stride(1), sak = a.stride(2);
  const int64_t sbb = b.stride(0), sbk = b.stride(1), sbn = b.stride(2);
  std::vector<double> bd(static_cast<size_t>(k * n));  // b[batch] as a dense double [k, n]
  std::vector<double> ad(static_cast<size_t>(k));      // one row of a[batch]
  std::vector<double> acc(static_cast<size_t>(n));     // one row of the product
  visit_float(a.dtype(), "gemm", [&](auto a_tag) {
    using T = decltype(a_tag);
    visit_float(out.dtype(), "gemm", [&](auto out_tag) {
      using O = decltype(out_tag);
      const T* pa = ptr<T>(a);
      const T* pb = ptr<T>(b);
      O* po = ptr<O>(out);
      for (int64_t bi = 0; bi < batch; ++bi) {
        for (int64_t kk = 0; kk < k; ++kk)
          for (int64_t j = 0; j < n; ++j)
            bd[kk * n + j] = load_double(pb[bi * sbb + kk * sbk + j * sbn]);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t kk = 0; kk < k; ++kk)
            ad[kk] = load_double(pa[bi * sab + i * sam + kk * sak]);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t kk = 0; kk < k; ++kk) {
            const double aik = ad[kk];
            const double* brow = bd.data() + kk * n;
            for (int64_t j = 0; j < n; ++j)
              acc[j] += aik * brow[j];
          }
          O* orow = po + (bi * m + i) * n;
          for (int64_t j = 0; j < n; ++j) {
            // beta == 0 must not read out: it may hold garbage or NaN (Note [Overwrite first]).
            const double prev = beta == 0.0 ? 0.0 : beta * load_double(orow[j]);
            orow[j] = store_double<O>(alpha * acc[j] + prev);
          }
        }
      }
    });
  });
}

}  // namespace accrue::kernels::cpu
