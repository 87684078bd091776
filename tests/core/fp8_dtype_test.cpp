// The FP8 dtypes (Note [FP8 dtypes]): every code of both formats decoded
// against an independent reading of the format, and the encoder checked at
// every code, at every midpoint between adjacent codes (ties to even) and
// beyond the range (saturation).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "accrue/core/dtype.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor_io.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// An independent reading of a code: sign, biased exponent, fraction, from the
// format's definition, in long double powers (no ldexp, no shared helper).
struct Format {
  int exp_bits, man_bits, bias;
  bool e4m3;  // e4m3fn: no infinity, NaN only at S.1111.111
};
constexpr Format kE4M3{4, 3, 7, true};
constexpr Format kE5M2{5, 2, 15, false};

long double pow2(int e) {
  long double r = 1.0L;
  for (; e > 0; --e)
    r *= 2.0L;
  for (; e < 0; ++e)
    r /= 2.0L;
  return r;
}

// NaN as a quiet NaN, infinity as infinity, otherwise the exact value.
long double reference_value(const Format& f, int code) {
  const bool neg = code & 0x80;
  const int exp = (code >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int man = code & ((1 << f.man_bits) - 1);
  const int all_ones = (1 << f.exp_bits) - 1;
  long double v;
  if (f.e4m3 && exp == all_ones && man == (1 << f.man_bits) - 1) {
    return std::numeric_limits<long double>::quiet_NaN();
  } else if (!f.e4m3 && exp == all_ones) {
    if (man != 0) return std::numeric_limits<long double>::quiet_NaN();
    v = std::numeric_limits<long double>::infinity();
  } else if (exp == 0) {
    v = man * pow2(1 - f.bias - f.man_bits);
  } else {
    v = (1.0L + man * pow2(-f.man_bits)) * pow2(exp - f.bias);
  }
  return neg ? -v : v;
}

template <class T>
float decode(int code) {
  return T::decode(static_cast<uint8_t>(code));
}

template <class T>
void expect_every_code_decodes(const Format& f) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const long double want = reference_value(f, c);
    const float got = decode<T>(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<long double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
  }
  EXPECT_EQ(nans, f.e4m3 ? 2 : 6);
}

TEST(FP8, every_e4m3_code_decodes_to_the_format_value) {
  expect_every_code_decodes<f8e4m3>(kE4M3);
  EXPECT_EQ(f8e4m3::decode(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3::decode(0xfe), -448.0f);
  EXPECT_EQ(f8e4m3::decode(0x08), 0.015625f);     // 2^-6, the smallest normal
  EXPECT_EQ(f8e4m3::decode(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(f8e4m3::decode(0x07), 0.013671875f);  // 7 * 2^-9, the largest subnormal
  EXPECT_EQ(f8e4m3::decode(0x38), 1.0f);
  EXPECT_EQ(f8e4m3::decode(0x78), 256.0f);  // exponent 15 is finite in e4m3fn
  EXPECT_TRUE(std::isnan(f8e4m3::decode(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3::decode(0xff)));
  EXPECT_EQ(f8e4m3::kMax, 448.0f);
}

TEST(FP8, every_e5m2_code_decodes_to_the_format_value) {
  expect_every_code_decodes<f8e5m2>(kE5M2);
  EXPECT_EQ(f8e5m2::decode(0x7b), 57344.0f);
  EXPECT_EQ(f8e5m2::decode(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f8e5m2::decode(0xfc), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f8e5m2::decode(0x04), 6.103515625e-05f);    // 2^-14, the smallest normal
  EXPECT_EQ(f8e5m2::decode(0x01), 1.52587890625e-05f);  // 2^-16, the smallest subnormal
  EXPECT_EQ(f8e5m2::decode(0x3c), 1.0f);
  for (int c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    EXPECT_TRUE(std::isnan(f8e5m2::decode(static_cast<uint8_t>(c)))) << c;
  EXPECT_EQ(f8e5m2::kMax, 57344.0f);
}

// Every finite code round-trips; every midpoint between adjacent finite codes
// goes to the even one, a hair either side to the nearer one, through both the
// double and the float entry; beyond the largest code saturates.
template <class T>
void expect_encoding_rounds_and_saturates(const Format& f, uint8_t max_code) {
  for (int c = 0; c < 256; ++c) {
    const float v = T::decode(static_cast<uint8_t>(c));
    if (std::isnan(v) || std::isinf(v)) continue;
    EXPECT_EQ(T::encode(v), c) << "code " << c;
    EXPECT_EQ(T(v).bits, c) << "code " << c;
  }
  int midpoints = 0;
  for (int sign : {0x00, 0x80}) {
    for (int c = 0; c < max_code; ++c) {
      const int lo = sign | c, hi = sign | (c + 1);
      const long double a = reference_value(f, lo), b = reference_value(f, hi);
      const double mid = static_cast<double>((a + b) / 2);
      ASSERT_EQ(static_cast<long double>(mid), (a + b) / 2) << "midpoint not exact";
      const int even = (lo & 1) == 0 ? lo : hi;
      EXPECT_EQ(T::encode(mid), even) << "midpoint of codes " << lo << ", " << hi;
      EXPECT_EQ(T(static_cast<float>(mid)).bits, even) << "midpoint of codes " << lo;
      const double toward_hi = std::nextafter(mid, static_cast<double>(b));
      const double toward_lo = std::nextafter(mid, static_cast<double>(a));
      EXPECT_EQ(T::encode(toward_hi), hi) << "above the midpoint of " << lo << ", " << hi;
      EXPECT_EQ(T::encode(toward_lo), lo) << "below the midpoint of " << lo << ", " << hi;
      const float toward_hi_f = std::nextafter(static_cast<float>(mid), static_cast<float>(b));
      const float toward_lo_f = std::nextafter(static_cast<float>(mid), static_cast<float>(a));
      EXPECT_EQ(T(toward_hi_f).bits, hi) << "float above the midpoint of " << lo;
      EXPECT_EQ(T(toward_lo_f).bits, lo) << "float below the midpoint of " << lo;
      ++midpoints;
    }
  }
  EXPECT_EQ(midpoints, 2 * max_code);
  const double max = T::kMax;
  const double ulp_top =
      static_cast<double>(reference_value(f, max_code) - reference_value(f, max_code - 1));
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {max + ulp_top / 4, max + ulp_top / 2, max + ulp_top, 2 * max, 1e30, inf}) {
    EXPECT_EQ(T::encode(v), max_code) << v;
    EXPECT_EQ(T::encode(-v), 0x80 | max_code) << -v;
  }
  EXPECT_EQ(T(std::numeric_limits<float>::infinity()).bits, max_code);
  // Below half the smallest subnormal: zero with the sign; just above: the smallest.
  const double tiny = static_cast<double>(reference_value(f, 1));
  EXPECT_EQ(T::encode(tiny / 2), 0x00);
  EXPECT_EQ(T::encode(-tiny / 2), 0x80);
  EXPECT_EQ(T::encode(std::nextafter(tiny / 2, 1.0)), 0x01);
  EXPECT_EQ(T::encode(1e-30), 0x00);
  for (double nan :
       {std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN()})
    EXPECT_TRUE(std::isnan(T::decode(T::encode(nan))));
  EXPECT_TRUE(std::isnan(static_cast<float>(T(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(FP8, e4m3_encoding_rounds_to_nearest_even_and_saturates) {
  expect_encoding_rounds_and_saturates<f8e4m3>(kE4M3, 0x7e);
  EXPECT_EQ(f8e4m3::encode(464.0), 0x7e);   // the would-be code 0x7f is NaN, not 480
  EXPECT_EQ(f8e4m3::encode(1.0625), 0x38);  // 1 + 2^-4: tie between 1 and 1.125, to even
  EXPECT_EQ(f8e4m3::encode(1.1875), 0x3a);  // tie between 1.125 and 1.25, to even (1.25)
}

TEST(FP8, e5m2_encoding_rounds_to_nearest_even_and_saturates) {
  expect_encoding_rounds_and_saturates<f8e5m2>(kE5M2, 0x7b);
  EXPECT_EQ(f8e5m2::encode(61440.0), 0x7b);  // the midpoint to the would-be 65536: saturates
}

TEST(FP8, dtype_facts_and_refusals) {
  EXPECT_EQ(element_size(DType::f8e4m3), 1u);
  EXPECT_EQ(element_size(DType::f8e5m2), 1u);
  EXPECT_STREQ(dtype_name(DType::f8e4m3), "f8e4m3");
  EXPECT_STREQ(dtype_name(DType::f8e5m2), "f8e5m2");
  EXPECT_TRUE(is_fp8(DType::f8e4m3));
  EXPECT_TRUE(is_fp8(DType::f8e5m2));
  EXPECT_FALSE(is_fp8(DType::bf16));
  EXPECT_FALSE(is_floating(DType::f8e4m3));  // not a compute dtype
  EXPECT_EQ(fp8_max(DType::f8e4m3), 448.0);
  EXPECT_EQ(fp8_max(DType::f8e5m2), 57344.0);
  EXPECT_ERROR((void)fp8_max(DType::bf16), "fp8_max", "bf16");
  EXPECT_ERROR(visit_dtype(DType::f8e4m3, [](auto) {}), "f8e4m3", "FP8");
}

// Tensor::to(DType) to and from FP8 on the CPU: a plain unscaled cast, each
// element as the encoder rounds it, saturating, NaN kept.
TEST(FP8, tensor_casts_are_unscaled_saturating_casts) {
  Tensor x = test::random_normal({3, 257}, DType::f32, Device::cpu(), 200.0);
  x.data<float>()[0] = 1e6f;
  x.data<float>()[1] = -1e6f;
  x.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  x.data<float>()[3] = 1.0625f;
  for (DType d : {DType::f8e4m3, DType::f8e5m2}) {
    Tensor q = x.to(d);
    ASSERT_EQ(q.dtype(), d);
    ASSERT_EQ(q.shape(), x.shape());
    const auto* codes = static_cast<const uint8_t*>(q.data_ptr());
    Tensor back = q.to(DType::f32);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.data<float>()[i];
      const uint8_t want = d == DType::f8e4m3 ? f8e4m3::encode(v) : f8e5m2::encode(v);
      const float want_back = d == DType::f8e4m3 ? f8e4m3::decode(want) : f8e5m2::decode(want);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(back.data<float>()[i]));
        continue;
      }
      ASSERT_EQ(codes[i], want) << dtype_name(d) << " element " << i << " = " << v;
      ASSERT_EQ(back.data<float>()[i], want_back) << i;
    }
    EXPECT_EQ(back.data<float>()[0], static_cast<float>(fp8_max(d)));
    EXPECT_EQ(back.data<float>()[1], -static_cast<float>(fp8_max(d)));
    // bf16 and f64 sources: each value rounded once from its own value.
    Tensor xd = x.to(DType::f64);
    EXPECT_TRUE(test::all_equal(xd.to(d).to(DType::f32), back));
    Tensor xb = x.to(DType::bf16);
    Tensor qb = xb.to(d);
    const auto* cb = static_cast<const uint8_t*>(qb.data_ptr());
    for (int64_t i = 3; i < x.numel(); ++i) {
      const double v = static_cast<float>(xb.data<bf16>()[i]);
      ASSERT_EQ(cb[i], d == DType::f8e4m3 ? f8e4m3::encode(v) : f8e5m2::encode(v)) << i;
    }
    // fill_ and zeros on an FP8 tensor; compute ops refuse it by name.
    Tensor z = zeros({4}, d);
    EXPECT_EQ(static_cast<const uint8_t*>(z.data_ptr())[3], 0);
    z.fill_(1.0);
    EXPECT_EQ(z.to(DType::f32).data<float>()[2], 1.0f);
    EXPECT_ERROR((void)arange(0, 4, 1, d), dtype_name(d), "FP8");
    EXPECT_ERROR((void)randn({4}, d), dtype_name(d));
  }
}

TEST(FP8, safetensors_round_trip_keeps_the_codes) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("accrue_fp8_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
        std::to_string(reinterpret_cast<uintptr_t>(&path)) + ".safetensors"))
          .string();
  Tensor x = test::random_normal({5, 7}, DType::f32, Device::cpu(), 3.0);
  Tensor a = x.to(DType::f8e4m3), b = x.to(DType::f8e5m2);
  save_safetensors(path, {{"a", a}, {"b", b}});
  auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.at("a").dtype(), DType::f8e4m3);
  ASSERT_EQ(loaded.at("b").dtype(), DType::f8e5m2);
  EXPECT_EQ(std::memcmp(loaded.at("a").data_ptr(), a.data_ptr(), 35), 0);
  EXPECT_EQ(std::memcmp(loaded.at("b").data_ptr(), b.data_ptr(), 35), 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace accrue
