// CPU reference of scaled dot-product attention, forward and backward.
//
// Plain loops over (b, h, query row), every sum in double in a fixed order
// (a kv head's gradient over its query heads in head order), split across
// threads only where that order stays whole (Note [CPU threads]),
// each result rounded once to its dtype (bf16/f16 inputs widen exactly, so
// they compute like the others). The attention matrix is never stored: a
// row of scores at a time, recomputed in backward from q, k and the saved
// lse, like the fused kernels do. Masks and dropout follow Note [Attention
// masks] (kernels/attention_backend.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "accrue/kernels/attention_backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

namespace {

// A 4-D tensor [B, H, rows, cols] whose last stride is 1 (checked by dispatch).
template <class T>
struct Rows {
  T* data;
  int64_t s0, s1, s2;
  T* row(int64_t b, int64_t h, int64_t i) const { return data + b * s0 + h * s1 + i * s2; }
};

template <class T>
Rows<T> rows_of(const Tensor& t) {
  return {ptr<T>(t), t.stride(0), t.stride(1), t.stride(2)};
}

// lse's dtype for inputs of type T: f64 for f64, f32 otherwise.
template <class T>
using stats_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
void load_row(const T* src, int64_t n, std::vector<double>& dst) {
  for (int64_t c = 0; c < n; ++c)
    dst[c] = load_double(src[c]);
}

template <class T>
double dot(const std::vector<double>& x, const T* y, int64_t n) {
  double s = 0.0;
  for (int64_t c = 0; c < n; ++c)
    s += x[c] * load_double(y[c]);
  return s;
}

// The dropout factor of probability (b, h, i, j): 1 / (1 - p) when kept, 0 when dropped.
double dropout_factor(const AttentionParams& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.dropout_p == 0.0) return 1.0;
  const int64_t element = ((b * p.H + h) * p.Tq + i) * p.Tk + j;
  return attention_keep(p.seed, p.offset, element, p.dropout_p) ? 1.0 / (1.0 - p.dropout_p) : 0.0;
}

// The additive bias or boolean mask of row (b, h, i) (Note [Attention masks]):
// term(j) is what the scaled score gets added, -inf where masked.
template <class T>
struct BiasRow {
  const T* bias = nullptr;        // additive, or
  const uint8_t* mask = nullptr;  // bool
  double term(int64_t j) const {
    if (mask) return mask[j] ? 0.0 : -std::numeric_limits<double>::infinity();
    return bias ? load_double(bias[j]) : 0.0;
  }
};

template <class T>
BiasRow<T> bias_row(const AttentionParams& p, int64_t b, int64_t h, int64_t i) {
  BiasRow<T> r;
  if (!p.bias.defined()) return r;
  const int64_t off = b * p.bias.stride(0) + h * p.bias.stride(1) + i * p.bias.stride(2);
  if (p.bias_is_mask)
    r.mask = static_cast<const uint8_t*>(p.bias.data_ptr()) + off;
  else
    r.bias = ptr<T>(p.bias) + off;
  return r;
}

template <class T>
void forward(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const AttentionParams& p,
             const Tensor& out_t, const Tensor& lse_t) {
  using S = stats_t<T>;
  const Rows<T> q = rows_of<T>(q_t), k = rows_of<T>(k_t), v = rows_of<T>(v_t),
                out = rows_of<T>(out_t);
  S* lse = ptr<S>(lse_t);
  const AttentionMaskSpec spec = attention_mask_spec(p);
  const int64_t g = p.group();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Threads split the (b, h, query row) rows: each output row and its lse
  // are computed by one thread, in the same order as with one (Note [CPU threads]).
  const int64_t rows = p.B * p.H * p.Tq;
  parallel_for(0, rows, grain_for(p.Tk * (p.d + p.dv) + 1), [&](int64_t r0, int64_t r1) {
    std::vector<double> qi(p.d), s(p.Tk), acc(p.dv);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (p.H * p.Tq), h = (r / p.Tq) % p.H, i = r % p.Tq;
      const int64_t hk = h / g;
      const AttentionRow row = attention_row(spec, b, i);
      const BiasRow<T> bias = bias_row<T>(p, b, h, i);
      load_row(q.row(b, h, i), p.d, qi);
      double m = neg_inf;
      for (int64_t j = row.lo; j < row.hi; ++j) {
        const double t = bias.term(j);
        s[j] = t == neg_inf ? neg_inf : p.scale * dot(qi, k.row(b, hk, j), p.d) + t;
        m = std::fmax(m, s[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double l = neg_inf;  // an empty row: output 0, lse -inf
      if (m != neg_inf) {
        double sum = 0.0;
        for (int64_t j = row.lo; j < row.hi; ++j)
          sum += std::exp(s[j] - m);
        l = m + std::log(sum);
        for (int64_t j = row.lo; j < row.hi; ++j) {
          const double pj = std::exp(s[j] - l) * dropout_factor(p, b, h, i, j);
          if (pj == 0.0) continue;
          const T* vj = v.row(b, hk, j);
          for (int64_t c = 0; c < p.dv; ++c)
            acc[c] += pj * load_double(vj[c]);
        }
      }
      T* o = out.row(b, h, i);
      for (int64_t c = 0; c < p.dv; ++c)
        o[c] = store_double<T>(acc[c]);
      lse[r] = static_cast<S>(l);
    }
  });
}

// With P = softmax(S) (undropped), Z the dropout factors and O = (P * Z) V:
//   dV = (P * Z)^T dO,  dP = (dO V^T) * Z,  dS = P * (dP - D),
//   D_i = sum_j P_ij dP_ij = sum_j (P * Z)_ij (dO_i . v_j) = dO_i . O_i,
//   dQ = scale dS K,  dK = scale dS^T Q,  dBias = dS (summed over its
//   broadcast dims). Grouped-query heads: dK and dV of kv head hk sum over
//   the query heads of its group, in head order.
template <class T>
void backward(const Tensor& g_t, const Tensor& q_t, const Tensor& k_t, const Tensor& v_t,
              const Tensor& out_t, const Tensor& lse_t, const AttentionParams& p,
              const Tensor& dq_t, const Tensor& dk_t, const Tensor& dv_t, const Tensor& dbias_t) {
  using S = stats_t<T>;
  const Rows<T> g = rows_of<T>(g_t), q = rows_of<T>(q_t), k = rows_of<T>(k_t), v = rows_of<T>(v_t),
                out = rows_of<T>(out_t), dq = rows_of<T>(dq_t), dk = rows_of<T>(dk_t),
                dv = rows_of<T>(dv_t);
  const S* lse = ptr<S>(lse_t);
  const AttentionMaskSpec spec = attention_mask_spec(p);
  const int64_t group = p.group();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // dbias in double, contiguous like dbias: [Bb, Hb, Tq, Tk].
  const bool want_dbias = dbias_t.defined();
  const int64_t Bb = want_dbias ? dbias_t.size(0) : 0, Hb = want_dbias ? dbias_t.size(1) : 0;
  std::vector<double> dbias_acc(want_dbias ? dbias_t.numel() : 0, 0.0);
  // Threads split the (b, kv head) pairs: dK and dV of a kv head sum over its
  // query heads and rows in one thread, in the order of one thread, and dQ's
  // rows belong to one pair (Note [CPU threads]). A dbias broadcast over b
  // (or over the heads of several kv heads) sums across pairs: then one thread.
  const bool dbias_shared = want_dbias && ((Bb == 1 && p.B > 1) || (Hb == 1 && p.Hkv > 1));
  const int64_t pair_work = group * p.Tq * p.Tk * (2 * p.d + 2 * p.dv) + 1;
  const int64_t pairs = p.B * p.Hkv;
  parallel_for(0, pairs, dbias_shared ? pairs : grain_for(pair_work), [&](int64_t u0, int64_t u1) {
    std::vector<double> qi(p.d), gi(p.dv), dqi(p.d);
    std::vector<double> dk_acc(p.Tk * p.d), dv_acc(p.Tk * p.dv);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / p.Hkv, hk = u % p.Hkv;
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i = 0; i < p.Tq; ++i) {
          const AttentionRow row = attention_row(spec, b, i);
          const BiasRow<T> bias = bias_row<T>(p, b, h, i);
          const double l = static_cast<double>(lse[(b * p.H + h) * p.Tq + i]);
          std::fill(dqi.begin(), dqi.end(), 0.0);
          if (l != neg_inf) {
            load_row(q.row(b, h, i), p.d, qi);
            load_row(g.row(b, h, i), p.dv, gi);
            const double D = dot(gi, out.row(b, h, i), p.dv);
            double* db_row =
                want_dbias ? dbias_acc.data() +
                                 (((Bb == 1 ? 0 : b) * Hb + (Hb == 1 ? 0 : h)) * p.Tq + i) * p.Tk
                           : nullptr;
            for (int64_t j = row.lo; j < row.hi; ++j) {
              const double t = bias.term(j);
              if (t == neg_inf) continue;
              const T* kj = k.row(b, hk, j);
              const double pj = std::exp(p.scale * dot(qi, kj, p.d) + t - l);
              const double z = dropout_factor(p, b, h, i, j);
              const double dpj = dot(gi, v.row(b, hk, j), p.dv) * z;
              double* dvj = dv_acc.data() + j * p.dv;
              for (int64_t c = 0; c < p.dv; ++c)
                dvj[c] += pj * z * gi[c];
              const double dsr = pj * (dpj - D);
              if (db_row) db_row[j] += dsr;
              const double ds = p.scale * dsr;
              double* dkj = dk_acc.data() + j * p.d;
              for (int64_t c = 0; c < p.d; ++c) {
                dqi[c] += ds * load_double(kj[c]);
                dkj[c] += ds * qi[c];
              }
            }
          }
          T* dq_row = dq.row(b, h, i);
          for (int64_t c = 0; c < p.d; ++c)
            dq_row[c] = store_double<T>(dqi[c]);
        }
      }
      for (int64_t j = 0; j < p.Tk; ++j) {
        T* dk_row = dk.row(b, hk, j);
        for (int64_t c = 0; c < p.d; ++c)
          dk_row[c] = store_double<T>(dk_acc[j * p.d + c]);
        T* dv_row = dv.row(b, hk, j);
        for (int64_t c = 0; c < p.dv; ++c)
          dv_row[c] = store_double<T>(dv_acc[j * p.dv + c]);
      }
    }
  });
  if (want_dbias) {
    T* db = ptr<T>(dbias_t);
    for (size_t e = 0; e < dbias_acc.size(); ++e)
      db[e] = store_double<T>(dbias_acc[e]);
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       const Tensor& out, const Tensor& lse) {
  visit_float(q.dtype(), "scaled_dot_product_attention",
              [&](auto tag) { forward<decltype(tag)>(q, k, v, p, out, lse); });
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionParams& p,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  visit_float(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    backward<decltype(tag)>(grad_out, q, k, v, out, lse, p, dq, dk, dv, dbias);
  });
}

}  // namespace accrue::kernels::cpu
