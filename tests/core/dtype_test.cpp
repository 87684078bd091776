// Host conversions of the 16-bit float types, checked bit-exactly.
#include <cmath>
#include <cstring>
#include <limits>

#include "accrue/core/dtype.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, element_sizes_and_names) {
  EXPECT_EQ(element_size(DType::f32), 4u);
  EXPECT_EQ(element_size(DType::bf16), 2u);
  EXPECT_EQ(element_size(DType::i64), 8u);
  EXPECT_EQ(element_size(DType::boolean), 1u);
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
}

TEST(BF16, rounds_to_nearest_even) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bf16(1.0f + 1.0f / 256).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(bf16(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_EQ(static_cast<float>(bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::infinity()))));
}

TEST(F16, converts_normals_subnormals_and_specials) {
  EXPECT_EQ(f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f16(65504.0f).bits, 0x7bff);               // largest finite
  EXPECT_EQ(f16(65520.0f).bits, 0x7c00);               // rounds to inf
  EXPECT_EQ(f16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // halfway to 0: ties to even
  EXPECT_EQ(f16(std::ldexp(1.0f, -14)).bits, 0x0400);  // smallest normal
  EXPECT_EQ(f16::to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16::to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isnan(f16::to_float(f16(bits_to_float(0x7fc00000u)).bits)));
  // Every finite half round-trips exactly through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    const float f = f16::to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(f16(f).bits, h) << "half bits " << h;
  }
}

}  // namespace
}  // namespace accrue
