// CPU reference of the FP8 family (Note [FP8 scaling]): element by element,
// the product x * scale in f32 and its one FP8 rounding by core's encoder.
#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "accrue/core/parallel.h"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cpu {

namespace {

// Calls f(Q{}) with Q the host type of an FP8 dtype.
template <class F>
void visit_fp8(DType t, const char* op, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_FP8_DTYPE(ACCRUE_HOST_DTYPE_CASE)
    default:
      ACCRUE_FAIL(op, ": dtype ", dtype_name(t), " is not an FP8 dtype");
  }
}

// max |x| over x (NaN when any is NaN) and, with Q not void, q = the codes of
// x * s. A max is exact and commutative: the chunks' order cannot change it.
template <class T, class Q>
float cast_and_amax(const T* px, int64_t n, float s, uint8_t* pq) {
  float max_abs = 0.0f;
  bool nan = false;
  std::mutex merge;
  parallel_for(0, n, kParallelWork, [&](int64_t i0, int64_t i1) {
    float chunk_max = 0.0f;
    bool chunk_nan = false;
    for (int64_t i = i0; i < i1; ++i) {
      const float v = static_cast<float>(px[i]);
      const float a = std::fabs(v);
      if (std::isnan(a))
        chunk_nan = true;
      else if (a > chunk_max)
        chunk_max = a;
      if constexpr (!std::is_void_v<Q>)
        pq[i] = Q::encode(v * s);  // one f32 rounding, as on the device
    }
    std::lock_guard<std::mutex> lock(merge);
    nan = nan || chunk_nan;
    if (chunk_max > max_abs) max_abs = chunk_max;
  });
  return nan ? std::numeric_limits<float>::quiet_NaN() : max_abs;
}

}  // namespace

void cast_to_fp8(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& amax) {
  const float s = scale.data<float>()[0];
  visit_float(x.dtype(), "cast_to_fp8", [&](auto tag) {
    using T = decltype(tag);
    visit_fp8(q.dtype(), "cast_to_fp8", [&](auto qtag) {
      amax.data<float>()[0] = cast_and_amax<T, decltype(qtag)>(ptr<T>(x), x.numel(), s,
                                                               static_cast<uint8_t*>(q.data_ptr()));
    });
  });
}

void fp8_amax(const Tensor& x, const Tensor& amax) {
  visit_float(x.dtype(), "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    amax.data<float>()[0] = cast_and_amax<T, void>(ptr<T>(x), x.numel(), 1.0f, nullptr);
  });
}

// Note [FP8 cast-transpose]: the codes of cast_to_fp8, then their transpose.
void cast_to_fp8_transpose(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& q_t,
                           const Tensor& amax, bool merge_amax) {
  if (merge_amax) {
    Tensor own = empty({1}, DType::f32);
    cast_to_fp8(x, scale, q, own);
    fp8_amax_merge(amax, own);
  } else {
    cast_to_fp8(x, scale, q, amax);
  }
  const int64_t m = x.size(0), k = x.size(1);
  const auto* pq = static_cast<const uint8_t*>(q.data_ptr());
  auto* pt = static_cast<uint8_t*>(q_t.data_ptr());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c)
      pt[c * m + r] = pq[r * k + c];
}

void cast_to_fp8_transpose_scaled(const Tensor& x, const Tensor& amax, float fp8_max, int margin,
                                  bool power_of_two, bool guard, const Tensor& q, const Tensor& q_t,
                                  const Tensor& scale_inv) {
  const float a = amax.data<float>()[0];
  const float s = fp8_scale_rule(a, fp8_max, margin, power_of_two);
  scale_inv.data<float>()[0] = fp8_inverse_scale(a, s, guard);
  Tensor unused = empty({1}, DType::f32);
  cast_to_fp8_transpose(x, from_vector<float>({s}, {1}), q, q_t, unused, false);
}

void fp8_amax_merge(const Tensor& running, const Tensor& amax) {
  float& r = running.data<float>()[0];
  const float a = std::fabs(amax.data<float>()[0]);  // a magnitude, as on the device
  r = std::isnan(r) || std::isnan(a) ? std::numeric_limits<float>::quiet_NaN() : std::max(r, a);
}

void fp8_delayed_scale_update(const Tensor& state, float fp8_max, int margin) {
  const int64_t rows = state.size(0), width = state.size(1), h = width - 3;
  float* p = state.data<float>();
  for (int64_t i = 0; i < rows; ++i) {
    float* row = p + i * width;
    const float window = row[2];
    row[2] = 0.0f;
    if (!std::isfinite(window)) continue;  // a skipped window: the scale stays
    float* history = row + 3;
    for (int64_t j = h - 1; j > 0; --j)
      history[j] = history[j - 1];
    history[0] = window;
    float m = 0.0f;
    for (int64_t j = 0; j < h; ++j)
      m = std::max(m, history[j]);
    row[0] = fp8_scale_rule(m, fp8_max, margin, /*power_of_two=*/false);
    row[1] = fp8_inverse_scale(m, row[0], /*guard=*/false);
  }
}

void cast_to_fp8_blockwise(const Tensor& x, int64_t tile_rows, int64_t tile_cols, float fp8_max,
                           bool power_of_two, const Tensor& q, const Tensor& scale_inv,
                           const Tensor& amax) {
  const int64_t m = x.size(0), k = x.size(1), tiles_c = scale_inv.size(1);
  float* ps = scale_inv.data<float>();
  float total = 0.0f;
  bool nan = false;
  visit_float(x.dtype(), "cast_to_fp8_blockwise", [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    visit_fp8(q.dtype(), "cast_to_fp8_blockwise", [&](auto qtag) {
      using Q = decltype(qtag);
      uint8_t* pq = static_cast<uint8_t*>(q.data_ptr());
      for (int64_t t = 0; t < scale_inv.numel(); ++t) {
        const int64_t r0 = (t / tiles_c) * tile_rows, c0 = (t % tiles_c) * tile_cols;
        const int64_t r1 = std::min(m, r0 + tile_rows), c1 = std::min(k, c0 + tile_cols);
        float tile_max = 0.0f;
        bool tile_nan = false;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            const float a = std::fabs(static_cast<float>(px[r * k + c]));
            if (std::isnan(a))
              tile_nan = true;
            else if (a > tile_max)
              tile_max = a;
          }
        const float s =
            fp8_scale_rule(tile_nan ? std::numeric_limits<float>::quiet_NaN() : tile_max, fp8_max,
                           0, power_of_two);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            pq[r * k + c] = Q::encode(static_cast<float>(px[r * k + c]) * s);
        ps[t] = 1.0f / s;
        nan = nan || tile_nan;
        total = std::max(total, tile_max);
      }
    });
  });
  amax.data<float>()[0] = nan ? std::numeric_limits<float>::quiet_NaN() : total;
}

// The reference: the contiguous transpose, cast as any matrix.
void cast_to_fp8_blockwise_of_transpose(const Tensor& base, float fp8_max, bool power_of_two,
                                        const Tensor& q_t, const Tensor& scale_inv,
                                        const Tensor& amax) {
  cast_to_fp8_blockwise(base.transpose(0, 1).contiguous(), 1, 128, fp8_max, power_of_two, q_t,
                        scale_inv, amax);
}

void fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, bool power_of_two,
                         bool guard, const Tensor& scale, const Tensor& scale_inv) {
  const float a = amax.data<float>()[0];
  const float s = fp8_scale_rule(a, fp8_max, margin, power_of_two);
  scale.data<float>()[0] = s;
  scale_inv.data<float>()[0] = fp8_inverse_scale(a, s, guard);
}

namespace {

// An FP8 tensor's values, in double.
std::vector<double> decoded(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == DType::f8e4m3 ? f8e4m3::decode(p[i]) : f8e5m2::decode(p[i]);
  return v;
}

// Each value of q [rows, K] times its tile's scale_inv (Note [FP8 block
// GEMM]), in double: exact, a code's 4 significant bits times an f32.
std::vector<double> scaled(const Tensor& q, const Tensor& scale_inv, int64_t rows_per_tile) {
  std::vector<double> v = decoded(q);
  const int64_t rows = q.size(0), k = q.size(1), blocks = scale_inv.size(1);
  const float* s = scale_inv.data<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t p = 0; p < k; ++p)
      v[static_cast<size_t>(i * k + p)] *= s[(i / rows_per_tile) * blocks + p / 128];
  return v;
}

// Note [FP8 GEMM]'s reference: out [m, n] = sum over p of da[i, p] db[j, p],
// every product exact in double (an FP8 value has at most 4 significant bits;
// with block scales, exact when the scales are powers of two, as they are by
// default), summed in p order in double, scaled, then one rounding to out's
// dtype (after adding the bias, or out when accumulating).
void exact_gemm(const std::vector<double>& da, const std::vector<double>& db, int64_t m, int64_t n,
                int64_t k, double scale, const Tensor& out, bool accumulate, const char* op,
                const Tensor& bias = Tensor()) {
  visit_float(out.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    T* po = ptr<T>(out);
    const T* pb = bias.defined() ? ptr<T>(bias) : nullptr;
    parallel_for(0, m, grain_for(n * k), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (int64_t p = 0; p < k; ++p)
            sum += da[static_cast<size_t>(i * k + p)] * db[static_cast<size_t>(j * k + p)];
          double v = sum * scale;
          if (pb != nullptr) v += to_double(pb[j]);
          if (accumulate) v += to_double(po[i * n + j]);
          po[i * n + j] = from_double<T>(v);
        }
    });
  });
}

}  // namespace

void fp8_matmul(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                const Tensor& bias, const Tensor& out, bool accumulate,
                bool /*fast_accumulation*/) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const double scale =
      static_cast<double>(scale_a.data<float>()[0]) * static_cast<double>(scale_b.data<float>()[0]);
  exact_gemm(decoded(a), decoded(b), m, n, k, scale, out, accumulate, "fp8_matmul", bias);
}

void fp8_matmul_gelu(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                     const Tensor& bias, const Tensor& pre, const Tensor& out,
                     bool fast_accumulation) {
  fp8_matmul(a, b, scale_a, scale_b, bias, pre, false, fast_accumulation);
  // As linear_gelu's reference: GELU of the stored pre with UnaryOp::Gelu's kernel.
  unary(UnaryOp::Gelu, pre, 0.0, out);
}

void fp8_block_matmul(const Tensor& a, const Tensor& scale_inv_a, int64_t a_rows_per_tile,
                      const Tensor& b, const Tensor& scale_inv_b, int64_t b_rows_per_tile,
                      const Tensor& out, bool accumulate) {
  exact_gemm(scaled(a, scale_inv_a, a_rows_per_tile), scaled(b, scale_inv_b, b_rows_per_tile),
             a.size(0), b.size(0), a.size(1), 1.0, out, accumulate, "fp8_block_matmul");
}

}  // namespace accrue::kernels::cpu
