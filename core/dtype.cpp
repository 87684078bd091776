#include "accrue/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace accrue {

const char* dtype_name(DType t) {
  switch (t) {
#define ACCRUE_DTYPE_NAME(name, type, str) \
  case DType::name:                        \
    return str;
    ACCRUE_FOR_EACH_ANY_DTYPE(ACCRUE_DTYPE_NAME)
#undef ACCRUE_DTYPE_NAME
  }
  return "?";
}

// IEEE binary16 conversion, round to nearest even, with subnormals, inf and NaN.
uint16_t f16::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value = mantissa * 2^-24.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half of the smallest
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 113 - exp + 13
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits.
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16::to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    x = sign;
  } else {
    // Subnormal: normalize.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    x = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

// Note [FP8 dtypes]: round to nearest even once, saturate at +-max, NaN to
// S.1111.111. With min_exp = 1 - bias the exponent of the smallest normal,
// ex = max(floor(log2 |v|), min_exp) and n = round(|v| / 2^(ex - mbits)), the
// code is ((ex - min_exp) << mbits) + n: for ex == min_exp that is the
// subnormal mantissa (or the smallest normal when n reaches 2^mbits), and for
// larger ex the biased exponent and mantissa, a rounding carry (n = 2^(mbits+1))
// landing on the next exponent by itself.
uint8_t encode_fp8(double v, int mbits, int bias, double max, uint8_t max_code) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return static_cast<uint8_t>(sign | 0x7f);
  const double a = std::fabs(v);
  if (a >= max) return static_cast<uint8_t>(sign | max_code);
  if (a == 0.0) return sign;  // frexp's exponent of zero is 0, not below min_exp
  const int min_exp = 1 - bias;
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e with f in [0.5, 1): floor(log2 a) = e - 1
  const int ex = std::max(e - 1, min_exp);
  const double n = std::nearbyint(std::ldexp(a, mbits - ex));  // exact scaling, then RNE
  const int code = ((ex - min_exp) << mbits) + static_cast<int>(n);
  return static_cast<uint8_t>(sign | code);
}

float decode_fp8(uint8_t b, int mbits, int bias) {
  const int ebits = 7 - mbits;
  const int e = (b >> mbits) & ((1 << ebits) - 1);
  const int m = b & ((1 << mbits) - 1);
  const double mag =
      e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp(m + (1 << mbits), e - bias - mbits);
  return static_cast<float>((b & 0x80) ? -mag : mag);
}

}  // namespace

uint8_t f8e4m3::encode(double v) {
  return encode_fp8(v, 3, 7, kMax, 0x7e);
}

float f8e4m3::decode(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();  // no infinity
  return decode_fp8(b, 3, 7);
}

uint8_t f8e5m2::encode(double v) {
  return encode_fp8(v, 2, 15, kMax, 0x7b);
}

float f8e5m2::decode(uint8_t b) {
  if ((b & 0x7c) == 0x7c) {  // exponent all ones: IEEE infinity or NaN
    if ((b & 0x03) != 0) return std::numeric_limits<float>::quiet_NaN();
    return (b & 0x80) ? -std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::infinity();
  }
  return decode_fp8(b, 2, 15);
}

double fp8_max(DType t) {
  switch (t) {
    case DType::f8e4m3:
      return f8e4m3::kMax;
    case DType::f8e5m2:
      return f8e5m2::kMax;
    default:
      ACCRUE_FAIL("fp8_max: dtype ", dtype_name(t), " is not an FP8 dtype");
  }
}

void fail_fp8_dtype(DType t) {
  if (is_fp8(t))
    ACCRUE_FAIL("dtype ", dtype_name(t),
                " is FP8, storage for the scaled GEMMs of kernels/fp8.h and not a compute dtype: "
                "this op does not take it; cast with Tensor::to(DType) (unscaled) or "
                "kernels::cast_to_fp8 (scaled) and use kernels::fp8_matmul");
  ACCRUE_FAIL("dtype ", static_cast<int>(t), " is not a known dtype");
}

}  // namespace accrue
