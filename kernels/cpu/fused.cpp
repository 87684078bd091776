// CPU reference of the transformer fusions: plain compositions, written so
// that each equals its unfused counterpart on the CPU (tests/kernels/cpu_fused_test.cpp),
// and the loops of RMSNorm, the rotary embedding and SwiGLU in index order,
// sums in double (Note [Determinism]).
#include <algorithm>
#include <cmath>
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
    // Threads split the rows (Note [CPU threads]).
    parallel_for(0, n, grain_for(in * out_features), [&](int64_t i0, int64_t i1) {
      std::vector<double> acc(static_cast<size_t>(out_features));
      for (int64_t i = i0; i < i1; ++i) {
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

namespace {

// A [D] parameter (any float dtype, any strides) as doubles; empty when undefined.
std::vector<double> read_param(const Tensor& p, const char* op) {
  std::vector<double> v;
  if (!p.defined()) return v;
  v.resize(static_cast<size_t>(p.numel()));
  visit_float(p.dtype(), op, [&](auto tag) {
    using P = decltype(tag);
    const Indexer ip(p);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = load_double(ptr<P>(p)[ip(static_cast<int64_t>(i))]);
  });
  return v;
}

// Where row r of an [O, I, D] x starts, in elements from its data pointer.
struct RowLevels {
  int64_t inner, outer_stride, inner_stride;
  explicit RowLevels(const Tensor& x)
      : inner(x.size(1)), outer_stride(x.stride(0)), inner_stride(x.stride(1)) {}
  int64_t operator()(int64_t r) const {
    return (r / inner) * outer_stride + (r % inner) * inner_stride;
  }
};

// RMSNorm of the rows of x ([O, I, D], T) into out ([rows, D]), rstd per row
// in S. Threads split the rows (Note [CPU threads]).
template <class T, class S>
void rms_norm_rows(const T* x, const RowLevels& levels, const std::vector<double>& w, double eps,
                   int64_t rows, int64_t d, T* out, S* rstd) {
  parallel_for(0, rows, grain_for(3 * d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + levels(r);
      T* yr = out + r * d;
      double ss = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        const double v = load_double(xr[c]);
        ss += v * v;
      }
      const double rs = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      for (int64_t c = 0; c < d; ++c) {
        double y = load_double(xr[c]) * rs;
        if (!w.empty()) y *= w[c];
        yr[c] = store_double<T>(y);
      }
      rstd[r] = store_double<S>(rs);
    }
  });
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
              const Tensor& rstd) {
  const std::vector<double> w = read_param(weight, "rms_norm");
  visit_float(x.dtype(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    visit_float(rstd.dtype(), "rms_norm", [&](auto s_tag) {
      using S = decltype(s_tag);
      rms_norm_rows(ptr<T>(x), RowLevels(x), w, eps, out.size(0), out.size(1), ptr<T>(out),
                    ptr<S>(rstd));
    });
  });
}

void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                  const Tensor& sum, const Tensor& out, const Tensor& rstd) {
  // Exactly kernels::binary(Add), then rms_norm of the stored (rounded) sum.
  binary(BinaryOp::Add, x, residual, sum);
  const int64_t rows = sum.size(0), d = sum.size(1);
  rms_norm(make_view(sum, {1, rows, d}, {rows * d, d, 1}, sum.offset()), weight, eps, out, rstd);
}

void rms_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                const Tensor& rstd, const Tensor& dx, const Tensor& dx_add,
                                bool want_dweight, NormPartials* partials) {
  const int64_t rows = dx.size(0), d = dx.size(1);
  const RowLevels levels(x);
  const std::vector<double> w = read_param(weight, "rms_norm_backward");
  std::vector<double> dw(static_cast<size_t>(d), 0.0);
  visit_float(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    visit_float(rstd.dtype(), "rms_norm_backward", [&](auto s_tag) {
      using S = decltype(s_tag);
      // dx: threads split the rows.
      parallel_for(0, rows, grain_for(4 * d), [&](int64_t r0, int64_t r1) {
        std::vector<double> xhat(static_cast<size_t>(d)), gw(static_cast<size_t>(d));
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = ptr<T>(x) + levels(r);
          const T* gr = ptr<T>(grad) + r * d;
          T* dxr = ptr<T>(dx) + r * d;
          const T* addr = dx_add.defined() ? ptr<T>(dx_add) + r * d : nullptr;
          const double rs = load_double(ptr<S>(rstd)[r]);
          // With xhat = x * rstd and gw = dy * w:
          //   dx = rstd * (gw - xhat * mean(gw * xhat)),  dw = sum over rows of dy * xhat.
          double sum_gw_xhat = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            const double g = load_double(gr[c]);
            xhat[c] = load_double(xr[c]) * rs;
            gw[c] = w.empty() ? g : g * w[c];
            sum_gw_xhat += gw[c] * xhat[c];
          }
          const double mean_gw_xhat = sum_gw_xhat / static_cast<double>(d);
          for (int64_t c = 0; c < d; ++c) {
            const double v = rs * (gw[c] - xhat[c] * mean_gw_xhat);
            dxr[c] = store_double<T>(addr ? v + load_double(addr[c]) : v);
          }
        }
      });
      // dweight: threads split the columns; each column sums its rows in
      // order, recomputing xhat exactly as above.
      if (!want_dweight) return;
      parallel_for(0, d, grain_for(2 * rows), [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < rows; ++r) {
          const T* xr = ptr<T>(x) + levels(r);
          const T* gr = ptr<T>(grad) + r * d;
          const double rs = load_double(ptr<S>(rstd)[r]);
          for (int64_t c = c0; c < c1; ++c)
            dw[c] += load_double(gr[c]) * (load_double(xr[c]) * rs);
        }
      });
    });
  });
  // The CPU's partial sums are the whole sums, in f64: one chunk
  // (norm_param_totals writes or adds them, kernels/cpu/nn.cpp).
  partials->chunks = 1;
  if (want_dweight) partials->dweight = from_vector<double>(dw, {d});
}

void rope(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
          const RopeScaling& scaling, bool inverse, const Tensor& out) {
  const int64_t b_n = x.size(0), t_n = x.size(1), h_n = x.size(2), d = x.size(3), half = d / 2;
  const int64_t sb = x.stride(0), st = x.stride(1), sh = x.stride(2);
  const int64_t pb = positions.stride(0), pt = positions.stride(1);
  const int64_t* pos = ptr<int64_t>(positions);
  visit_float(x.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    // Frequencies, angles, cos and sin in F (Note [Rotary embedding]); the
    // rotation in the math type, rounded once.
    using F = math_t<T>;
    std::vector<F> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv_freq[i] = rope_inv_freq<F>(i, d, theta, scaling);
    const T* px = ptr<T>(x);
    T* po = ptr<T>(out);
    // Threads split the (b, t) rows; each rotates all heads of its position.
    parallel_for(0, b_n * t_n, grain_for(h_n * d * 3 + d), [&](int64_t bt0, int64_t bt1) {
      std::vector<F> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
      for (int64_t bt = bt0; bt < bt1; ++bt) {
        const int64_t b = bt / t_n, t = bt % t_n;
        const F p = static_cast<F>(pos[b * pb + t * pt]);
        for (int64_t i = 0; i < half; ++i) {
          const F angle = p * inv_freq[i];
          cs[i] = std::cos(angle);
          sn[i] = inverse ? -std::sin(angle) : std::sin(angle);
        }
        for (int64_t h = 0; h < h_n; ++h) {
          const T* xr = px + b * sb + t * st + h * sh;
          T* yr = po + b * out.stride(0) + t * out.stride(1) + h * out.stride(2);
          for (int64_t i = 0; i < half; ++i) {
            const int64_t ia = style == RopeStyle::RotateHalf ? i : 2 * i;
            const int64_t ib = style == RopeStyle::RotateHalf ? i + half : 2 * i + 1;
            const F a = load(xr[ia]), bv = load(xr[ib]);
            yr[ia] = store<T>(a * cs[i] - bv * sn[i]);
            yr[ib] = store<T>(bv * cs[i] + a * sn[i]);
          }
        }
      }
    });
  });
}

namespace {

// silu(g) * u and its two derivatives, in the math type M.
template <class M>
M sigmoid_of(M g) {
  return M(1) / (M(1) + std::exp(-g));
}

}  // namespace

void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t rows = gate.size(0), f = gate.size(1);
  const int64_t sg = gate.stride(0), su = up.stride(0), so = out.stride(0);
  visit_float(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    // Threads split the rows (Note [CPU threads]).
    parallel_for(0, rows, grain_for(4 * f), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* g = ptr<T>(gate) + r * sg;
        const T* u = ptr<T>(up) + r * su;
        T* o = ptr<T>(out) + r * so;
        for (int64_t c = 0; c < f; ++c) {
          const M gv = load(g[c]);
          o[c] = store<T>(gv * sigmoid_of(gv) * load(u[c]));
        }
      }
    });
  });
}

void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  const int64_t rows = gate.size(0), f = gate.size(1);
  visit_float(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    parallel_for(0, rows, grain_for(8 * f), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* dy = ptr<T>(grad) + r * grad.stride(0);
        const T* g = ptr<T>(gate) + r * gate.stride(0);
        const T* u = ptr<T>(up) + r * up.stride(0);
        T* dg = ptr<T>(dgate) + r * dgate.stride(0);
        T* du = ptr<T>(dup) + r * dup.stride(0);
        for (int64_t c = 0; c < f; ++c) {
          // silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
          const M gv = load(g[c]), uv = load(u[c]), dyv = load(dy[c]);
          const M s = sigmoid_of(gv);
          dg[c] = store<T>(dyv * uv * (s * (M(1) + gv * (M(1) - s))));
          du[c] = store<T>(dyv * gv * s);
        }
      }
    });
  });
}

}  // namespace accrue::kernels::cpu
