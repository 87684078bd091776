// The FP8 family's CPU reference (kernels/fp8.h, Note [FP8 scaling]) against
// independent computations: the nearest FP8 value found by a search over
// every code's decoded value, the max by a plain loop, the scale in double.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "accrue/kernels/fp8.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::cast_to_fp8;
using kernels::fp8_scale_from_amax;

Tensor scalar(float v, Device device = Device::cpu()) {
  return from_vector<float>({v}, {1}).to(device);
}

float decode(DType d, uint8_t c) {
  return d == DType::f8e4m3 ? f8e4m3::decode(c) : f8e5m2::decode(c);
}

// The code nearest to p among all finite codes (ties to the even code),
// saturating at +-max: a search, not the encoder's arithmetic.
uint8_t nearest_code(DType d, float p) {
  const double max = fp8_max(d);
  if (p >= max) return d == DType::f8e4m3 ? 0x7e : 0x7b;
  if (p <= -max) return d == DType::f8e4m3 ? 0xfe : 0xfb;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = decode(d, static_cast<uint8_t>(c));
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(p)) continue;
    const double err = std::fabs(static_cast<double>(v) - p);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

// scale in double, then rounded to f32: the division of two f32 values is
// correctly rounded either way (53 >= 2 * 24 + 2 bits).
float expected_scale(float amax, double max, int margin, bool pow2) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  double s = static_cast<double>(static_cast<float>(max / amax));
  if (std::isinf(static_cast<float>(max / amax))) s = FLT_MAX;
  s /= std::pow(2.0, margin);
  if (pow2) s = std::pow(2.0, std::floor(std::log2(s)));
  return static_cast<float>(s);
}

// Checks q and amax of cast_to_fp8(x, scale) element by element.
void expect_cast(const Tensor& x, float scale, DType d) {
  const auto r = cast_to_fp8(x, scalar(scale), d);
  ASSERT_EQ(r.q.dtype(), d);
  ASSERT_EQ(r.q.shape(), x.shape());
  const Tensor xf = x.to(DType::f32).contiguous();
  const float* px = xf.data<float>();
  const auto* pq = static_cast<const uint8_t*>(r.q.data_ptr());
  float amax = 0;
  bool nan = false;
  for (int64_t i = 0; i < x.numel(); ++i) {
    nan = nan || std::isnan(px[i]);
    if (std::fabs(px[i]) > amax) amax = std::fabs(px[i]);
    const float p = px[i] * scale;
    if (std::isnan(p)) {
      EXPECT_TRUE(std::isnan(decode(d, pq[i]))) << i;
      continue;
    }
    ASSERT_EQ(pq[i], nearest_code(d, p))
        << dtype_name(x.dtype()) << " -> " << dtype_name(d) << " element " << i << " x = " << px[i]
        << " scale = " << scale;
  }
  const float got = r.amax.data<float>()[0];
  if (nan) {
    EXPECT_TRUE(std::isnan(got));
  } else {
    EXPECT_EQ(got, amax);
  }
}

TEST(Fp8Cast, rounds_each_scaled_element_to_the_nearest_code) {
  for (DType xd : {DType::f32, DType::bf16, DType::f16}) {
    for (DType d : {DType::f8e4m3, DType::f8e5m2}) {
      Tensor x = test::random_normal({37, 129}, xd, Device::cpu(), 3.0);
      expect_cast(x, 1.0f, d);
      expect_cast(x, 37.3f, d);  // not a power of two: the f32 product rounds first
      expect_cast(x, 0.125f, d);
      // A scale that saturates the tails.
      expect_cast(x, static_cast<float>(fp8_max(d)) / 2.0f, d);
    }
  }
}

TEST(Fp8Cast, strided_input_and_planted_values) {
  Tensor base = test::random_normal({64, 48}, DType::f32, Device::cpu(), 10.0);
  Tensor x = base.transpose(0, 1);  // transposed view
  expect_cast(x, 5.0f, DType::f8e4m3);
  Tensor y = test::random_normal({300}, DType::f32, Device::cpu(), 1.0);
  y.data<float>()[7] = -1e5f;  // amax and saturation
  expect_cast(y, 1.0f, DType::f8e4m3);
  expect_cast(y, 1.0f, DType::f8e5m2);
  y.data<float>()[11] = std::numeric_limits<float>::infinity();
  {
    const auto r = cast_to_fp8(y, scalar(1.0f), DType::f8e4m3);
    EXPECT_EQ(r.amax.data<float>()[0], std::numeric_limits<float>::infinity());
    EXPECT_EQ(static_cast<const uint8_t*>(r.q.data_ptr())[11], 0x7e);  // saturated, no inf
  }
  y.data<float>()[200] = std::numeric_limits<float>::quiet_NaN();
  expect_cast(y, 1.0f, DType::f8e5m2);
  EXPECT_TRUE(std::isnan(cast_to_fp8(y, scalar(2.0f), DType::f8e4m3).amax.data<float>()[0]));
  // Nothing to cast: amax 0.
  EXPECT_EQ(cast_to_fp8(empty({0, 4}), scalar(1.0f), DType::f8e4m3).amax.data<float>()[0], 0.0f);
}

// fp8_amax is the cast's amax without the codes: the same bits on random,
// strided, 16-bit and planted inputs, 0 for an empty x.
TEST(Fp8Amax, equals_the_casts_amax) {
  auto same = [](const Tensor& x) {
    const float want = cast_to_fp8(x, scalar(3.0f), DType::f8e4m3).amax.data<float>()[0];
    const float got = kernels::fp8_amax(x).data<float>()[0];
    return std::memcmp(&want, &got, 4) == 0 || (std::isnan(want) && std::isnan(got));
  };
  for (DType xd : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor x = test::random_normal({3001}, xd, Device::cpu(), 40.0);
    EXPECT_TRUE(same(x)) << dtype_name(xd);
    EXPECT_GT(kernels::fp8_amax(x).data<float>()[0], 0.0f);
  }
  EXPECT_TRUE(same(test::random_normal({64, 48}, DType::f32).transpose(0, 1)));
  Tensor y = test::random_normal({300}, DType::f32);
  y.data<float>()[7] = -1e5f;
  EXPECT_EQ(kernels::fp8_amax(y).data<float>()[0], 1e5f);
  y.data<float>()[11] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(kernels::fp8_amax(y).data<float>()[0], std::numeric_limits<float>::infinity());
  y.data<float>()[200] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(kernels::fp8_amax(y).data<float>()[0]));
  EXPECT_EQ(kernels::fp8_amax(empty({0, 4})).data<float>()[0], 0.0f);
  // Into the caller's amax, whatever it held.
  Tensor amax = full({1}, 7.0, DType::f32);
  kernels::fp8_amax_into(from_vector<float>({-2.0f, 1.0f}, {2}), amax);
  EXPECT_EQ(amax.data<float>()[0], 2.0f);
}

TEST(Fp8Amax, bad_inputs_name_the_op_and_values) {
  const Tensor x = test::random_normal({4, 8});
  EXPECT_ERROR(kernels::fp8_amax(x.to(DType::f64)), "fp8_amax", "f64", "f32, bf16 or f16");
  EXPECT_ERROR(kernels::fp8_amax(x.to(DType::i32)), "fp8_amax", "i32");
  EXPECT_ERROR(kernels::fp8_amax(Tensor()), "fp8_amax", "x", "undefined");
  EXPECT_ERROR(kernels::fp8_amax_into(x, empty({2}, DType::f32)), "fp8_amax", "amax", "[2]");
  EXPECT_ERROR(kernels::fp8_amax_into(x, Tensor()), "fp8_amax", "amax", "undefined");
}

// nan_on_overflow (Note [FP8 overflow]): the same scale and scale_inv bits
// for a finite amax, scale 1 and scale_inv NaN for an infinite or NaN one.
TEST(Fp8Scale, nan_on_overflow_marks_only_a_non_finite_amax) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float a : {0.0f, 1e-38f, 0.37f, 448.0f, 1e30f, FLT_MAX})
    for (bool pow2 : {false, true}) {
      const auto plain = fp8_scale_from_amax(scalar(a), DType::f8e4m3, 1, pow2);
      const auto guarded = fp8_scale_from_amax(scalar(a), DType::f8e4m3, 1, pow2, true);
      EXPECT_EQ(std::memcmp(plain.scale.data_ptr(), guarded.scale.data_ptr(), 4), 0) << a;
      EXPECT_EQ(std::memcmp(plain.scale_inv.data_ptr(), guarded.scale_inv.data_ptr(), 4), 0) << a;
    }
  for (float a : {inf, std::numeric_limits<float>::quiet_NaN()}) {
    const auto guarded = fp8_scale_from_amax(scalar(a), DType::f8e5m2, 0, false, true);
    EXPECT_EQ(guarded.scale.data<float>()[0], 1.0f) << a;
    EXPECT_TRUE(std::isnan(guarded.scale_inv.data<float>()[0])) << a;
    EXPECT_EQ(fp8_scale_from_amax(scalar(a), DType::f8e5m2).scale_inv.data<float>()[0], 1.0f);
  }
}

TEST(Fp8Scale, current_scaling_rule_and_guards) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor draws = test::random_uniform({20}, 1e-3, 1e3);
  std::vector<float> amaxes = {0.0f, nan, inf, 1e-38f, FLT_MIN, 1.0f, 3.0f, 448.0f, 1e30f, FLT_MAX};
  for (int64_t i = 0; i < draws.numel(); ++i)
    amaxes.push_back(draws.data<float>()[i]);
  for (DType d : {DType::f8e4m3, DType::f8e5m2})
    for (int margin : {0, 1, 6})
      for (bool pow2 : {false, true})
        for (float a : amaxes) {
          const auto r = fp8_scale_from_amax(scalar(a), d, margin, pow2);
          const float want = expected_scale(a, fp8_max(d), margin, pow2);
          const float s = r.scale.data<float>()[0];
          EXPECT_EQ(s, want) << dtype_name(d) << " amax " << a << " margin " << margin << pow2;
          EXPECT_EQ(r.scale_inv.data<float>()[0], 1.0f / want);
          EXPECT_TRUE(std::isfinite(s) && s > 0);
        }
  // The scale puts the largest element at the format's max (up to one f32 rounding).
  const auto r = fp8_scale_from_amax(scalar(3.0f), DType::f8e4m3);
  EXPECT_NEAR(3.0 * r.scale.data<float>()[0], 448.0, 448.0 * 1e-7);
  EXPECT_EQ(fp8_scale_from_amax(scalar(3.0f), DType::f8e4m3, 0, true).scale.data<float>()[0],
            128.0f);
}

// Note [FP8 block scaling] against loops over each tile: its amax, its scale
// by the double rule, every code by the nearest-code search.
void expect_blockwise(const Tensor& x, int64_t tr, int64_t tc, DType d, bool pow2) {
  const auto r = kernels::cast_to_fp8_blockwise(x, tr, tc, d, pow2);
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t tiles_r = (m + tr - 1) / tr, tiles_c = (k + tc - 1) / tc;
  ASSERT_EQ(r.scale_inv.shape(), (Shape{tiles_r, tiles_c}));
  ASSERT_EQ(r.q.shape(), x.shape());
  const Tensor xf = x.to(DType::f32).contiguous();
  const float* px = xf.data<float>();
  const auto* pq = static_cast<const uint8_t*>(r.q.data_ptr());
  float all = 0;
  for (int64_t ti = 0; ti < tiles_r; ++ti)
    for (int64_t tj = 0; tj < tiles_c; ++tj) {
      float amax = 0;
      for (int64_t i = ti * tr; i < std::min(m, (ti + 1) * tr); ++i)
        for (int64_t j = tj * tc; j < std::min(k, (tj + 1) * tc); ++j)
          amax = std::max(amax, std::fabs(px[i * k + j]));
      all = std::max(all, amax);
      const float scale = expected_scale(amax, fp8_max(d), 0, pow2);
      ASSERT_EQ(r.scale_inv.data<float>()[ti * tiles_c + tj], 1.0f / scale) << ti << ", " << tj;
      for (int64_t i = ti * tr; i < std::min(m, (ti + 1) * tr); ++i)
        for (int64_t j = tj * tc; j < std::min(k, (tj + 1) * tc); ++j)
          ASSERT_EQ(pq[i * k + j], nearest_code(d, px[i * k + j] * scale))
              << "tile " << ti << ", " << tj << " element " << i << ", " << j;
    }
  EXPECT_EQ(r.amax.data<float>()[0], all);
}

TEST(Fp8Cast, blockwise_tiles_each_get_their_own_scale) {
  for (DType xd : {DType::f32, DType::bf16}) {
    Tensor x = test::random_normal({130, 300}, xd, Device::cpu(), 1.0);
    // An outlier in one tile: only that tile's scale moves.
    Tensor xf = x.to(DType::f32);
    xf.data<float>()[5 * 300 + 7] = 500.0f;
    x = xf.to(xd);
    expect_blockwise(x, 1, 128, DType::f8e4m3, true);     // activations, partial last tile
    expect_blockwise(x, 128, 128, DType::f8e4m3, true);   // weights, partial edges
    expect_blockwise(x, 128, 128, DType::f8e5m2, false);  // any scale
    // A transposed view: cast from its base (Note [FP8 block cast of a transpose]).
    expect_blockwise(x.transpose(0, 1), 1, 128, DType::f8e4m3, true);
  }
  const auto r =
      kernels::cast_to_fp8_blockwise(test::random_normal({2, 256}), 1, 128, DType::f8e4m3);
  EXPECT_EQ(r.scale_inv.shape(), (Shape{2, 2}));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.nbytes())) == 0;
}

TEST(Fp8Cast, cast_transpose_gives_the_codes_and_their_transpose) {
  for (DType xd : {DType::f32, DType::bf16, DType::f16})
    for (DType d : {DType::f8e4m3, DType::f8e5m2}) {
      Tensor x = test::random_normal({45, 70}, xd, Device::cpu(), 20.0);
      const auto r = kernels::cast_to_fp8_transpose(x, scalar(11.0f), d);
      const auto plain = cast_to_fp8(x, scalar(11.0f), d);
      EXPECT_TRUE(same_bytes(r.q, plain.q));
      ASSERT_EQ(r.q_t.shape(), (Shape{70, 45}));
      EXPECT_TRUE(same_bytes(r.q_t, plain.q.transpose(0, 1)));
      EXPECT_EQ(r.amax.data<float>()[0], plain.amax.data<float>()[0]);
    }
}

// The scaled cast-transpose makes its scale from amax inside the cast: the
// codes and scale_inv of fp8_scale_from_amax then cast_to_fp8_transpose, bit
// for bit, for every guard of the rule (a NaN or infinite amax included).
TEST(Fp8Cast, scaled_cast_transpose_equals_the_scale_then_the_cast) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = test::random_normal({48, 80}, DType::bf16, Device::cpu(), 20.0);
  const float real = kernels::fp8_amax(x).data<float>()[0];
  for (float a : {real, 0.0f, inf, std::numeric_limits<float>::quiet_NaN(), 3.0f})
    for (DType d : {DType::f8e4m3, DType::f8e5m2})
      for (int margin : {0, 2})
        for (bool pow2 : {false, true})
          for (bool guard : {false, true}) {
            SCOPED_TRACE(std::to_string(a) + " " + dtype_name(d) + " margin " +
                         std::to_string(margin) + (pow2 ? " pow2" : "") + (guard ? " guard" : ""));
            const Tensor amax = scalar(a);
            const auto s = fp8_scale_from_amax(amax, d, margin, pow2, guard);
            const auto two_step = kernels::cast_to_fp8_transpose(x, s.scale, d);
            const auto one = kernels::cast_to_fp8_transpose_scaled(x, amax, d, margin, pow2, guard);
            EXPECT_TRUE(same_bytes(one.q, two_step.q));
            EXPECT_TRUE(same_bytes(one.q_t, two_step.q_t));
            EXPECT_TRUE(same_bytes(one.scale_inv, s.scale_inv));
          }
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled(x, scalar(1), DType::f8e4m3, 7),
               "cast_to_fp8_transpose_scaled", "margin = 7");
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled(x, zeros({2}), DType::f8e4m3),
               "cast_to_fp8_transpose_scaled", "amax", "[2]");
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled(test::random_normal({2, 3, 4}), scalar(1),
                                                     DType::f8e4m3),
               "cast_to_fp8_transpose_scaled", "2-D", "[2, 3, 4]");
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled(x, scalar(1), DType::bf16),
               "cast_to_fp8_transpose_scaled", "bf16");
}

// Note [FP8 delayed scaling]: casts merging their amax into a running one,
// and the close's update of scale and history.
TEST(Fp8Delayed, casts_merge_their_amax_into_the_running_one) {
  const Tensor a = test::random_normal({32, 48}, DType::bf16, Device::cpu(), 2.0);
  const Tensor b = test::random_normal({32, 48}, DType::bf16, Device::cpu(), 9.0);
  const Tensor s = scalar(4.0f);
  const auto plain = kernels::cast_to_fp8_transpose(b, s, DType::f8e4m3);
  Tensor running = scalar(0.5f);
  const auto q = empty({32, 48}, DType::f8e4m3), qt = empty({48, 32}, DType::f8e4m3);
  kernels::cast_to_fp8_transpose_into(a, s, q, qt, running, /*merge_amax=*/true);
  kernels::cast_to_fp8_transpose_into(b, s, q, qt, running, /*merge_amax=*/true);
  EXPECT_TRUE(same_bytes(q, plain.q));  // the codes do not depend on the merge
  EXPECT_TRUE(same_bytes(qt, plain.q_t));
  const float both =
      std::max(kernels::fp8_amax(a).data<float>()[0], kernels::fp8_amax(b).data<float>()[0]);
  EXPECT_EQ(running.data<float>()[0], both);
  // A NaN stays: in the running amax, and from it.
  Tensor nan_x = a.clone();
  nan_x.data<bf16>()[7] = bf16(std::numeric_limits<float>::quiet_NaN());
  kernels::cast_to_fp8_transpose_into(nan_x, s, q, qt, running, true);
  EXPECT_TRUE(std::isnan(running.data<float>()[0]));
  kernels::cast_to_fp8_transpose_into(a, s, q, qt, running, true);
  EXPECT_TRUE(std::isnan(running.data<float>()[0]));
  // fp8_amax_merge_ is the same max.
  Tensor r = scalar(3.0f);
  kernels::fp8_amax_merge_(r, scalar(2.0f));
  EXPECT_EQ(r.data<float>()[0], 3.0f);
  kernels::fp8_amax_merge_(r, scalar(5.0f));
  EXPECT_EQ(r.data<float>()[0], 5.0f);
  kernels::fp8_amax_merge_(r, scalar(-7.0f));  // a magnitude: its sign is dropped
  EXPECT_EQ(r.data<float>()[0], 7.0f);
  Tensor zero = scalar(0.0f);
  kernels::fp8_amax_merge_(zero, scalar(-0.0f));
  EXPECT_FALSE(std::signbit(zero.data<float>()[0]));
  kernels::fp8_amax_merge_(r, scalar(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_TRUE(std::isnan(r.data<float>()[0]));
  EXPECT_ERROR(kernels::fp8_amax_merge_(zeros({2}), scalar(1.0f)), "fp8_amax_merge_", "running",
               "[2]");
}

TEST(Fp8Delayed, the_close_pushes_the_window_amax_and_scales_from_the_history_max) {
  const float inf = std::numeric_limits<float>::infinity();
  // Rows: scale, scale_inv, window amax, history (H = 3) newest first.
  Tensor state = from_vector<float>({1, 1, 6,   2, 9, 4,   // 6 pushed: history 6 2 9, max 9
                                     1, 1, 12,  2, 9, 4,   // 12: history 12 2 9, max 12
                                     7, 8, inf, 2, 9, 4,   // skipped: all stays
                                     7, 8, 0,   0, 0, 0},  // nothing seen: scale rule of 0
                                    {4, 6});
  kernels::fp8_delayed_scale_update(state, DType::f8e4m3, 1);
  auto rule = [](float amax) { return fp8_scale_from_amax(scalar(amax), DType::f8e4m3, 1); };
  const float* p = state.data<float>();
  const std::vector<std::vector<float>> history = {{6, 2, 9}, {12, 2, 9}, {2, 9, 4}, {0, 0, 0}};
  const std::vector<float> max_of = {9, 12, 0, 0};
  for (int row = 0; row < 4; ++row) {
    SCOPED_TRACE("row " + std::to_string(row));
    EXPECT_EQ(p[row * 6 + 2], 0.0f);  // the window's amax, reset
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(p[row * 6 + 3 + j], history[row][j]);
    if (row == 2) {
      EXPECT_EQ(p[row * 6 + 0], 7.0f);
      EXPECT_EQ(p[row * 6 + 1], 8.0f);
      continue;
    }
    const auto r = rule(max_of[row]);
    EXPECT_EQ(p[row * 6 + 0], r.scale.data<float>()[0]);
    EXPECT_EQ(p[row * 6 + 1], r.scale_inv.data<float>()[0]);
  }
  const char* op = "fp8_delayed_scale_update";
  EXPECT_ERROR(kernels::fp8_delayed_scale_update(zeros({2, 3}), DType::f8e4m3), op, "3 + H",
               "[2, 3]");
  EXPECT_ERROR(kernels::fp8_delayed_scale_update(zeros({2, 4}), DType::bf16), op, "bf16");
  EXPECT_ERROR(kernels::fp8_delayed_scale_update(zeros({2, 4}), DType::f8e5m2, 9), op,
               "margin = 9");
}

// Note [FP8 bias gradient in the cast]: on the CPU the cast, then sum_rows_into.
TEST(Fp8Cast, cast_with_column_sums_is_the_cast_and_the_row_sum) {
  const Tensor x = test::random_normal({48, 80}, DType::bf16, Device::cpu(), 20.0);
  const Tensor amax = kernels::fp8_amax(x);
  const auto plain = kernels::cast_to_fp8_transpose_scaled(x, amax, DType::f8e5m2, 0, false, true);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    const Tensor start = test::random_normal({80}, DType::f32, Device::cpu(), 3.0);
    Tensor fused = start.clone(), separate = start.clone();
    const auto one = kernels::cast_to_fp8_transpose_scaled_with_column_sums(
        x, amax, DType::f8e5m2, 0, false, true, fused, accumulate);
    kernels::sum_rows_into(x, separate, accumulate);
    EXPECT_TRUE(same_bytes(one.q, plain.q));
    EXPECT_TRUE(same_bytes(one.q_t, plain.q_t));
    EXPECT_TRUE(same_bytes(one.scale_inv, plain.scale_inv));
    EXPECT_TRUE(same_bytes(fused, separate));
  }
  // The same with a given scale and a running amax (delayed scaling's cast).
  for (bool accumulate : {false, true}) {
    const Tensor start = test::random_normal({80}, DType::f32, Device::cpu(), 3.0);
    Tensor fused = start.clone(), separate = start.clone();
    Tensor running = scalar(2.0f), running_plain = scalar(2.0f);
    const Tensor q = empty({48, 80}, DType::f8e4m3), qt = empty({80, 48}, DType::f8e4m3);
    const Tensor q2 = empty({48, 80}, DType::f8e4m3), qt2 = empty({80, 48}, DType::f8e4m3);
    kernels::cast_to_fp8_transpose_with_column_sums_into(x, scalar(3.0f), q, qt, running, true,
                                                         fused, accumulate);
    kernels::cast_to_fp8_transpose_into(x, scalar(3.0f), q2, qt2, running_plain, true);
    kernels::sum_rows_into(x, separate, accumulate);
    EXPECT_TRUE(same_bytes(q, q2));
    EXPECT_TRUE(same_bytes(qt, qt2));
    EXPECT_TRUE(same_bytes(running, running_plain));
    EXPECT_TRUE(same_bytes(fused, separate));
  }
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_with_column_sums_into(
                   x, scalar(3.0f), empty({48, 80}, DType::f8e4m3), empty({80, 48}, DType::f8e4m3),
                   scalar(0.0f), false, zeros({81}), false),
               "cast_to_fp8_transpose_with_column_sums_into", "dbias", "[81]");
  const char* op = "cast_to_fp8_transpose_scaled_with_column_sums";
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled_with_column_sums(
                   x, amax, DType::f8e5m2, 0, false, true, zeros({79}), false),
               op, "dbias", "f32 [80]", "[79]");
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled_with_column_sums(
                   x, amax, DType::f8e5m2, 0, false, true, zeros({80}, DType::bf16), false),
               op, "dbias", "bf16");
  EXPECT_ERROR(kernels::cast_to_fp8_transpose_scaled_with_column_sums(x, amax, DType::f8e5m2, 0,
                                                                      false, true, Tensor(), false),
               op, "dbias");
  EXPECT_ERROR(
      kernels::cast_to_fp8_transpose_scaled_with_column_sums(
          test::random_normal({2, 3, 4}), amax, DType::f8e5m2, 0, false, true, zeros({4}), false),
      op, "2-D", "[2, 3, 4]");
}

TEST(Fp8Cast, bad_inputs_name_the_op_and_values) {
  Tensor x = test::random_normal({4, 8});
  EXPECT_ERROR(cast_to_fp8(x.to(DType::f64), scalar(1), DType::f8e4m3), "cast_to_fp8", "f64",
               "f32, bf16 or f16");
  EXPECT_ERROR(cast_to_fp8(x.to(DType::i32), scalar(1), DType::f8e4m3), "cast_to_fp8", "i32");
  EXPECT_ERROR(cast_to_fp8(x.to(DType::f8e4m3), scalar(1), DType::f8e4m3), "cast_to_fp8", "f8e4m3");
  EXPECT_ERROR(cast_to_fp8(x, scalar(1), DType::bf16), "cast_to_fp8", "out_dtype", "bf16", "FP8");
  EXPECT_ERROR(cast_to_fp8(x, scalar(1).to(DType::f64), DType::f8e4m3), "cast_to_fp8", "scale",
               "f64", "[1]");
  EXPECT_ERROR(cast_to_fp8(x, from_vector<float>({1, 2}, {2}), DType::f8e4m3), "cast_to_fp8",
               "scale", "[2]");
  EXPECT_ERROR(cast_to_fp8(x, Tensor(), DType::f8e4m3), "cast_to_fp8", "scale", "undefined");
  EXPECT_ERROR(cast_to_fp8(Tensor(), scalar(1), DType::f8e4m3), "cast_to_fp8", "x", "undefined");
  EXPECT_ERROR(kernels::cast_to_fp8_blockwise(x, 0, 128, DType::f8e4m3), "cast_to_fp8_blockwise",
               "tile 0 x 128");
  EXPECT_ERROR(kernels::cast_to_fp8_blockwise(x, 1, 2048, DType::f8e4m3), "cast_to_fp8_blockwise",
               "tile 1 x 2048");
  EXPECT_ERROR(
      kernels::cast_to_fp8_blockwise(test::random_normal({2, 2, 2}), 1, 128, DType::f8e4m3),
      "cast_to_fp8_blockwise", "2-D", "[2, 2, 2]");
  EXPECT_ERROR(kernels::cast_to_fp8_blockwise(x.to(DType::f64), 1, 128, DType::f8e4m3),
               "cast_to_fp8_blockwise", "f64");
  EXPECT_ERROR(kernels::cast_to_fp8_blockwise(x, 1, 128, DType::f16), "cast_to_fp8_blockwise",
               "f16", "FP8");
  {  // the buffers of cast_to_fp8_blockwise_into
    const Tensor xb = test::random_normal({130, 260});
    const Tensor q = empty({130, 260}, DType::f8e4m3), scale_inv = empty({2, 3}, DType::f32);
    const Tensor amax = empty({1}, DType::f32);
    EXPECT_ERROR(
        kernels::cast_to_fp8_blockwise_into(xb, 128, 128, true, q, empty({2, 2}, DType::f32), amax),
        "cast_to_fp8_blockwise", "scale_inv", "[2, 2]", "[2, 3]");
    EXPECT_ERROR(kernels::cast_to_fp8_blockwise_into(
                     xb, 128, 128, true, empty({260, 130}, DType::f8e4m3), scale_inv, amax),
                 "cast_to_fp8_blockwise", "q", "[260, 130]", "[130, 260]");
    EXPECT_ERROR(
        kernels::cast_to_fp8_blockwise_into(xb, 128, 128, true, q, empty({2, 3}, DType::f64), amax),
        "cast_to_fp8_blockwise", "scale_inv", "f64");
    EXPECT_ERROR(kernels::cast_to_fp8_blockwise_into(xb, 128, 128, true, q, scale_inv, Tensor()),
                 "cast_to_fp8_blockwise", "amax", "undefined");
  }
  EXPECT_ERROR(kernels::cast_to_fp8_transpose(test::random_normal({8}), scalar(1), DType::f8e4m3),
               "cast_to_fp8_transpose", "2-D", "[8]");
  EXPECT_ERROR(kernels::cast_to_fp8_transpose(x, zeros({1, 1}), DType::f8e4m3),
               "cast_to_fp8_transpose", "scale", "[1, 1]");
  EXPECT_ERROR(fp8_scale_from_amax(scalar(1), DType::f8e4m3, 7), "fp8_scale_from_amax",
               "margin = 7");
  EXPECT_ERROR(fp8_scale_from_amax(scalar(1), DType::f8e4m3, -1), "fp8_scale_from_amax",
               "margin = -1");
  EXPECT_ERROR(fp8_scale_from_amax(scalar(1), DType::f32), "fp8_scale_from_amax", "f32", "FP8");
  EXPECT_ERROR(fp8_scale_from_amax(zeros({2}), DType::f8e4m3), "fp8_scale_from_amax", "amax",
               "[2]");
  // Compute ops refuse FP8 tensors by name.
  Tensor q = x.to(DType::f8e4m3);
  EXPECT_ERROR((void)kernels::matmul(q, q.transpose(0, 1)), "matmul", "f8e4m3");
  // Pure data movement built on copies (cat) takes FP8; ops of any dtype
  // that reach a visitor of compute dtypes refuse it, saying what to use.
  const Tensor both = kernels::cat({q, q}, 0);
  EXPECT_TRUE(same_bytes(both.narrow(0, 4, 4), q));
  EXPECT_ERROR((void)kernels::compare(kernels::CompareOp::Lt, q, q), "f8e4m3", "FP8", "fp8_matmul");
  EXPECT_ERROR((void)kernels::index_select(q, 0, from_vector<int64_t>({1, 0}, {2})), "f8e4m3",
               "FP8");
}

using kernels::fp8_matmul;
using kernels::fp8_matmul_into;

// Integers in [-lo, hi] cast to FP8 (exact: |v| <= 16 has at most 4 bits).
Tensor integer_codes(const Shape& shape, DType d, int lo = -8, int hi = 8) {
  return test::random_integers(shape, lo, hi, DType::f32).to(d);
}

// (a @ b^T) * sa * sb through f64 tensors and kernels::matmul: an independent path.
Tensor reference_product(const Tensor& a, const Tensor& b, double sa, double sb) {
  Tensor p = kernels::matmul(a.to(DType::f64), b.to(DType::f64).transpose(0, 1).contiguous());
  double* pp = p.data<double>();
  for (int64_t i = 0; i < p.numel(); ++i)
    pp[i] *= sa * sb;
  return p;
}

TEST(Fp8Matmul, integer_inputs_are_exact_in_every_output_dtype) {
  for (auto [da, db] : {std::pair{DType::f8e4m3, DType::f8e4m3},
                        {DType::f8e4m3, DType::f8e5m2},
                        {DType::f8e5m2, DType::f8e4m3}}) {
    Tensor a = integer_codes({48, 64}, da), b = integer_codes({32, 64}, db);
    const Tensor want = reference_product(a, b, 0.5, 4.0);  // powers of two: exact
    for (DType out : {DType::f32, DType::bf16, DType::f16}) {
      Tensor got = fp8_matmul(a, b, scalar(0.5f), scalar(4.0f), out);
      ASSERT_EQ(got.shape(), (Shape{48, 32}));
      ASSERT_EQ(got.dtype(), out);
      EXPECT_TRUE(test::all_equal(got, want.to(out))) << dtype_name(out);
    }
  }
}

TEST(Fp8Matmul, scaled_random_inputs_match_a_double_reference) {
  Tensor x = test::random_normal({64, 96}, DType::f32, Device::cpu(), 2.0);
  Tensor w = test::random_normal({48, 96}, DType::f32, Device::cpu(), 0.05);
  const auto sx = fp8_scale_from_amax(cast_to_fp8(x, scalar(1), DType::f8e4m3).amax, DType::f8e4m3);
  const auto sw = fp8_scale_from_amax(cast_to_fp8(w, scalar(1), DType::f8e4m3).amax, DType::f8e4m3);
  const Tensor qx = cast_to_fp8(x, sx.scale, DType::f8e4m3).q;
  const Tensor qw = cast_to_fp8(w, sw.scale, DType::f8e4m3).q;
  const double ix = sx.scale_inv.data<float>()[0], iw = sw.scale_inv.data<float>()[0];
  const Tensor want = reference_product(qx, qw, ix, iw);
  Tensor got = fp8_matmul(qx, qw, sx.scale_inv, sw.scale_inv, DType::f32);
  // One f32 rounding of the same double sum (the order may differ: 1e-6 of
  // the magnitude covers it).
  EXPECT_TRUE(test::all_close(got, want.to(DType::f32), 1e-6, 1e-6));
  // And the whole pipeline approximates x @ w^T within FP8's rounding: an
  // element v, scaled by s, is off by at most 2^-4 |v| (half an e4m3 ulp,
  // normal range) + 2^-10 / s (half the smallest subnormal) + the f32
  // product's 2^-24 |v|; the GEMM's error is then bounded by
  // sum_k (e_x |w| + |x| e_w + e_x e_w), plus the output's f32 rounding.
  const double sxv = sx.scale.data<float>()[0], swv = sw.scale.data<float>()[0];
  auto err = [](double v, double s) { return (0.0625 + 0x1p-24) * std::fabs(v) + 0x1p-10 / s; };
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const Tensor g64 = got.to(DType::f64);
  const double* pg = g64.data<double>();
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t j = 0; j < 48; ++j) {
      double exact = 0, bound = 0;
      for (int64_t k = 0; k < 96; ++k) {
        const double xv = px[i * 96 + k], wv = pw[j * 96 + k];
        exact += xv * wv;
        const double ex = err(xv, sxv), ew = err(wv, swv);
        bound += ex * std::fabs(wv) + std::fabs(xv) * ew + ex * ew;
      }
      ASSERT_LE(std::fabs(pg[i * 48 + j] - exact), bound * (1 + 1e-6) + 0x1p-24 * std::fabs(exact))
          << i << ", " << j;
    }
}

TEST(Fp8Matmul, accumulates_into_an_f32_slot) {
  Tensor a = integer_codes({32, 16}, DType::f8e4m3), b = integer_codes({16, 16}, DType::f8e5m2);
  Tensor slot = test::random_normal({32, 16});
  const Tensor before = slot.clone();
  fp8_matmul_into(a, b, scalar(0.25f), scalar(1.0f), slot, /*accumulate=*/true);
  Tensor want = reference_product(a, b, 0.25, 1.0);
  double* pw = want.data<double>();
  for (int64_t i = 0; i < want.numel(); ++i)
    pw[i] += before.data<float>()[i];
  EXPECT_TRUE(test::all_equal(slot, want.to(DType::f32)));
  // Without accumulate the slot is overwritten.
  fp8_matmul_into(a, b, scalar(0.25f), scalar(1.0f), slot, false);
  EXPECT_TRUE(test::all_equal(slot, reference_product(a, b, 0.25, 1.0).to(DType::f32)));
}

// Note [FP8 GEMM]: a bias is added to the exact sum before the one rounding.
TEST(Fp8Matmul, a_bias_is_added_before_the_one_rounding) {
  Tensor a = integer_codes({48, 64}, DType::f8e4m3), b = integer_codes({32, 64}, DType::f8e4m3);
  for (DType out : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor bias = test::random_integers({32}, -50, 50, out);
    Tensor want = reference_product(a, b, 0.5, 4.0);
    double* pw = want.data<double>();
    const Tensor b64 = bias.to(DType::f64);
    for (int64_t i = 0; i < 48; ++i)
      for (int64_t j = 0; j < 32; ++j)
        pw[i * 32 + j] += b64.data<double>()[j];
    const Tensor got = fp8_matmul(a, b, scalar(0.5f), scalar(4.0f), out, false, bias);
    EXPECT_TRUE(test::all_equal(got, want.to(out))) << dtype_name(out);
  }
  const Tensor one = scalar(1.0f);
  EXPECT_ERROR(fp8_matmul(a, b, one, one, DType::bf16, false, zeros({16}, DType::bf16)),
               "fp8_matmul", "bias", "[16]", "[32]");
  EXPECT_ERROR(fp8_matmul(a, b, one, one, DType::bf16, false, zeros({32}, DType::f32)),
               "fp8_matmul", "bias", "f32", "bf16");
  EXPECT_ERROR(fp8_matmul_into(a, b, one, one, zeros({48, 32}), true, false, zeros({32})),
               "fp8_matmul", "bias", "accumulate");
}

// fp8_matmul_gelu_into: pre is fp8_matmul's biased product, out GELU's own
// kernel over it (the reference the GPU's epilogue is held to).
TEST(Fp8Matmul, gelu_epilogue_reference_is_the_biased_product_then_gelu) {
  const Tensor a = integer_codes({32, 64}, DType::f8e4m3),
               b = integer_codes({48, 64}, DType::f8e4m3);
  const Tensor bias = test::random_normal({48}, DType::bf16);
  const Tensor pre = empty({32, 48}, DType::bf16), out = empty({32, 48}, DType::bf16);
  kernels::fp8_matmul_gelu_into(a, b, scalar(0.25f), scalar(0.5f), bias, pre, out);
  const Tensor want_pre = fp8_matmul(a, b, scalar(0.25f), scalar(0.5f), DType::bf16, false, bias);
  EXPECT_TRUE(test::all_equal(pre, want_pre));
  EXPECT_TRUE(test::all_equal(out, kernels::unary(kernels::UnaryOp::Gelu, want_pre)));
  const Tensor one = scalar(1.0f);
  EXPECT_ERROR(kernels::fp8_matmul_gelu_into(a, b, one, one, bias.to(DType::f32),
                                             empty({32, 48}, DType::f32), empty({32, 48})),
               "fp8_matmul_gelu", "f32", "bf16 or f16");
  EXPECT_ERROR(
      kernels::fp8_matmul_gelu_into(a, b, one, one, bias, empty({32, 47}, DType::bf16), out),
      "fp8_matmul_gelu", "pre", "[32, 47]");
  EXPECT_ERROR(kernels::fp8_matmul_gelu_into(a, b, one, one, Tensor(), pre, out), "fp8_matmul_gelu",
               "bias");
}

TEST(Fp8Matmul, bad_inputs_name_the_op_and_values) {
  Tensor a = integer_codes({32, 64}, DType::f8e4m3), b = integer_codes({16, 64}, DType::f8e4m3);
  const Tensor one = scalar(1.0f);
  EXPECT_ERROR(fp8_matmul(a, integer_codes({16, 48}, DType::f8e4m3), one, one, DType::f32),
               "fp8_matmul", "[32, 64]", "[16, 48]", "K");
  EXPECT_ERROR(fp8_matmul(integer_codes({20, 64}, DType::f8e4m3), b, one, one, DType::f32),
               "fp8_matmul", "M = 20", "multiple of 16");
  EXPECT_ERROR(fp8_matmul(a, integer_codes({24, 64}, DType::f8e4m3), one, one, DType::f32),
               "fp8_matmul", "N = 24");
  EXPECT_ERROR(fp8_matmul(integer_codes({32, 40}, DType::f8e4m3),
                          integer_codes({16, 40}, DType::f8e4m3), one, one, DType::f32),
               "fp8_matmul", "K = 40");
  EXPECT_ERROR(fp8_matmul(a.to(DType::f32).to(DType::f8e5m2), b.to(DType::f32).to(DType::f8e5m2),
                          one, one, DType::f32),
               "fp8_matmul", "both f8e5m2");
  EXPECT_ERROR(fp8_matmul(a.to(DType::bf16), b, one, one, DType::f32), "fp8_matmul", "a", "bf16",
               "FP8");
  EXPECT_ERROR(fp8_matmul(a, b, one, one, DType::f64), "fp8_matmul", "f64");
  EXPECT_ERROR(fp8_matmul(a, b, one, one, DType::f8e4m3), "fp8_matmul", "f8e4m3");
  EXPECT_ERROR(fp8_matmul(a, b, zeros({2}), one, DType::f32), "fp8_matmul", "scale_inv_a", "[2]");
  EXPECT_ERROR(fp8_matmul(a, b, one, one.to(DType::f64), DType::f32), "fp8_matmul", "scale_inv_b",
               "f64");
  Tensor wide = integer_codes({64, 32}, DType::f8e4m3);
  EXPECT_ERROR(fp8_matmul(wide.transpose(0, 1), b.narrow(1, 0, 64), one, one, DType::f32),
               "fp8_matmul", "contiguous");
  Tensor flat = integer_codes({32 * 64 + 1}, DType::f8e4m3);
  EXPECT_ERROR(fp8_matmul(flat.narrow(0, 1, 32 * 64).view({32, 64}), b, one, one, DType::f32),
               "fp8_matmul", "a", "multiple of 16 bytes");
  EXPECT_ERROR(fp8_matmul_into(a, b, one, one, empty({32, 16}, DType::bf16), true), "fp8_matmul",
               "accumulate", "bf16");
  EXPECT_ERROR(fp8_matmul_into(a, b, one, one, empty({16, 32}), false), "fp8_matmul", "[16, 32]",
               "[32, 16]");
  EXPECT_ERROR(fp8_matmul(integer_codes({2, 32, 64}, DType::f8e4m3), b, one, one, DType::f32),
               "fp8_matmul", "2-D");
}

// ---- Note [FP8 block GEMM] ------------------------------------------------------------------

using kernels::fp8_block_matmul;
using kernels::fp8_block_matmul_into;
using kernels::Fp8Tiles;

int64_t tile_rows(Fp8Tiles t) {
  return t == Fp8Tiles::block ? 128 : 1;
}

Tensor tile_scales(const Tensor& q, Fp8Tiles t) {
  // Powers of two in [2^-2, 2^2], one per tile: products of integer codes stay exact.
  return test::random_powers_of_two(
      {(q.size(0) + tile_rows(t) - 1) / tile_rows(t), (q.size(1) + 127) / 128}, -2, 2);
}

// q's values times their tiles' scales, f64, by loops over the elements.
Tensor dequantized(const Tensor& q, const Tensor& s, Fp8Tiles t) {
  Tensor v = q.to(DType::f64).contiguous();
  double* pv = v.data<double>();
  const int64_t k = q.size(1);
  for (int64_t i = 0; i < q.size(0); ++i)
    for (int64_t p = 0; p < k; ++p)
      pv[i * k + p] *= s.data<float>()[(i / tile_rows(t)) * s.size(1) + p / 128];
  return v;
}

TEST(Fp8BlockMatmul, integer_codes_and_power_of_two_tiles_are_exact) {
  // K = 320: three 128-long slices, the last partial; 144 rows: two 128-row
  // blocks, the last partial.
  for (auto [ta, tb] : {std::pair{Fp8Tiles::row, Fp8Tiles::block},
                        {Fp8Tiles::block, Fp8Tiles::row},
                        {Fp8Tiles::row, Fp8Tiles::row}}) {
    const Tensor a = integer_codes({144, 320}, DType::f8e4m3);
    const Tensor b = integer_codes({160, 320}, DType::f8e5m2);
    const Tensor sa = tile_scales(a, ta), sb = tile_scales(b, tb);
    const Tensor want = kernels::matmul(dequantized(a, sa, ta),
                                        dequantized(b, sb, tb).transpose(0, 1).contiguous());
    for (DType out : {DType::f32, DType::bf16}) {
      const Tensor got = fp8_block_matmul(a, sa, ta, b, sb, tb, out);
      ASSERT_EQ(got.shape(), (Shape{144, 160}));
      EXPECT_TRUE(test::all_equal(got, want.to(out)))
          << static_cast<int>(ta) << " x " << static_cast<int>(tb) << " -> " << dtype_name(out);
    }
    // accumulate adds into an f32 out.
    Tensor slot = test::random_integers({144, 160}, -100, 100, DType::f32);
    const Tensor before = slot.to(DType::f64);
    fp8_block_matmul_into(a, sa, ta, b, sb, tb, slot, /*accumulate=*/true);
    EXPECT_TRUE(test::all_equal(
        slot, kernels::binary(kernels::BinaryOp::Add, want, before).to(DType::f32)));
  }
}

// The block casts' own scales (cast_to_fp8_blockwise): the GEMM multiplies
// what they dequantize to.
TEST(Fp8BlockMatmul, takes_the_block_casts_scales) {
  const Tensor x = test::random_normal({64, 256}, DType::f32, Device::cpu(), 3.0);
  const Tensor w = test::random_normal({48, 256}, DType::f32, Device::cpu(), 0.05);
  const auto cx = kernels::cast_to_fp8_blockwise(x, 1, 128, DType::f8e4m3);
  const auto cw = kernels::cast_to_fp8_blockwise(w, 128, 128, DType::f8e4m3);
  const Tensor want = kernels::matmul(
      dequantized(cx.q, cx.scale_inv, Fp8Tiles::row),
      dequantized(cw.q, cw.scale_inv, Fp8Tiles::block).transpose(0, 1).contiguous());
  const Tensor got = fp8_block_matmul(cx.q, cx.scale_inv, Fp8Tiles::row, cw.q, cw.scale_inv,
                                      Fp8Tiles::block, DType::f32);
  EXPECT_TRUE(test::all_close(got, want.to(DType::f32), 1e-6, 1e-6));
  // and approximates x @ w^T
  EXPECT_LT(test::relative_error(got, kernels::matmul(x, w.transpose(0, 1).contiguous())), 0.1);
}

TEST(Fp8BlockMatmul, bad_inputs_name_the_op_and_values) {
  const Tensor a = integer_codes({32, 256}, DType::f8e4m3),
               b = integer_codes({16, 256}, DType::f8e4m3);
  const Tensor sa = tile_scales(a, Fp8Tiles::row), sb = tile_scales(b, Fp8Tiles::block);
  EXPECT_ERROR(fp8_block_matmul(a, sb, Fp8Tiles::row, b, sb, Fp8Tiles::block, DType::f32),
               "fp8_block_matmul", "scale_inv_a", "[1, 2]", "1 x 128", "[32, 2]");
  EXPECT_ERROR(fp8_block_matmul(a, sa, Fp8Tiles::row, b, sa, Fp8Tiles::block, DType::f32),
               "fp8_block_matmul", "scale_inv_b", "[32, 2]", "128 x 128", "[1, 2]");
  EXPECT_ERROR(fp8_block_matmul(a, tile_scales(a, Fp8Tiles::block), Fp8Tiles::block, b, sb,
                                Fp8Tiles::block, DType::f32),
               "fp8_block_matmul", "both", "128 x 128");
  EXPECT_ERROR(
      fp8_block_matmul(a, sa.to(DType::f64), Fp8Tiles::row, b, sb, Fp8Tiles::block, DType::f32),
      "fp8_block_matmul", "scale_inv_a", "f64");
  EXPECT_ERROR(fp8_block_matmul(a, test::random_powers_of_two({2, 32}, -2, 2).transpose(0, 1),
                                Fp8Tiles::row, b, sb, Fp8Tiles::block, DType::f32),
               "fp8_block_matmul", "scale_inv_a", "contiguous");
  EXPECT_ERROR(fp8_block_matmul(a, sa, Fp8Tiles::row, b, Tensor(), Fp8Tiles::block, DType::f32),
               "fp8_block_matmul", "scale_inv_b");
  EXPECT_ERROR(fp8_block_matmul(integer_codes({20, 256}, DType::f8e4m3), sa, Fp8Tiles::row, b, sb,
                                Fp8Tiles::block, DType::f32),
               "fp8_block_matmul", "M = 20", "multiple of 16");
  EXPECT_ERROR(fp8_block_matmul_into(a, sa, Fp8Tiles::row, b, sb, Fp8Tiles::block,
                                     empty({32, 16}, DType::bf16), true),
               "fp8_block_matmul", "accumulate", "bf16");
}

}  // namespace
}  // namespace accrue
