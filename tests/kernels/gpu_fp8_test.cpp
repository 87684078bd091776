// The FP8 family on CUDA against the CPU reference (Note [FP8 scaling]):
// casts and scales bit for bit (NaN codes compared as NaN, the one place the
// formats have several encodings).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/fp8.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::cast_to_fp8;
using kernels::fp8_scale_from_amax;

const Device kGpu = Device::cuda(0);

float decode(DType d, uint8_t c) {
  return d == DType::f8e4m3 ? f8e4m3::decode(c) : f8e5m2::decode(c);
}

// Same codes at every element, or NaN at both; either side on either device.
::testing::AssertionResult same_codes(const Tensor& gpu, const Tensor& cpu) {
  if (gpu.dtype() != cpu.dtype() || gpu.shape() != cpu.shape())
    return ::testing::AssertionFailure() << "dtype or shape differ";
  const Tensor g = gpu.to(Device::cpu()).contiguous(), c = cpu.to(Device::cpu()).contiguous();
  const auto* pg = static_cast<const uint8_t*>(g.data_ptr());
  const auto* pc = static_cast<const uint8_t*>(c.data_ptr());
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (pg[i] == pc[i]) continue;
    if (std::isnan(decode(g.dtype(), pg[i])) && std::isnan(decode(c.dtype(), pc[i]))) continue;
    return ::testing::AssertionFailure()
           << "element " << i << ": gpu code " << int(pg[i]) << ", cpu code " << int(pc[i]);
  }
  return ::testing::AssertionSuccess();
}

// The same f32 bits at every element, or NaN at both; either side on either
// device.
::testing::AssertionResult same_float_bits(const Tensor& gpu, const Tensor& cpu) {
  if (gpu.dtype() != DType::f32 || cpu.dtype() != DType::f32 || gpu.shape() != cpu.shape())
    return ::testing::AssertionFailure() << "dtype or shape differ";
  const Tensor gh = gpu.to(Device::cpu()).contiguous(), ch = cpu.to(Device::cpu()).contiguous();
  for (int64_t i = 0; i < gh.numel(); ++i) {
    const float g = gh.data<float>()[i], c = ch.data<float>()[i];
    if (std::memcmp(&g, &c, 4) == 0 || (std::isnan(g) && std::isnan(c))) continue;
    return ::testing::AssertionFailure() << "element " << i << ": gpu " << g << ", cpu " << c;
  }
  return ::testing::AssertionSuccess();
}

TEST(GpuFp8, plain_casts_match_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tensor x = test::random_normal({4097}, DType::f32, Device::cpu(), 300.0);
  x.data<float>()[5] = std::numeric_limits<float>::infinity();
  x.data<float>()[6] = -1e9f;
  for (DType d : {DType::f8e4m3, DType::f8e5m2}) {
    for (DType src : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      Tensor xs = x.to(src);
      EXPECT_TRUE(same_codes(xs.to(kGpu).to(d), xs.to(d))) << dtype_name(src) << dtype_name(d);
      // And back, from every code.
      Tensor codes = xs.to(d);
      EXPECT_TRUE(test::all_equal(codes.to(kGpu).to(src).to(Device::cpu()), codes.to(src)));
    }
    // A transposed copy through the tiled kernel, and a fill.
    Tensor m = test::random_normal({67, 130}, DType::f32, Device::cpu(), 50.0);
    EXPECT_TRUE(same_codes(m.to(kGpu).transpose(0, 1).contiguous().to(d),
                           m.transpose(0, 1).contiguous().to(d)));
    EXPECT_TRUE(same_codes(m.to(d).to(kGpu).transpose(0, 1).contiguous(),
                           m.to(d).transpose(0, 1).contiguous()));
    EXPECT_TRUE(same_codes(full({33}, 3.3, d, kGpu), full({33}, 3.3, d)));
  }
}

TEST(GpuFp8, scaled_casts_and_amax_match_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  for (DType xd : {DType::f32, DType::bf16, DType::f16}) {
    for (DType d : {DType::f8e4m3, DType::f8e5m2}) {
      for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{1} << 20, int64_t{3000001}}) {
        Tensor x = test::random_normal({n}, xd, Device::cpu(), 7.0);
        for (float scale : {1.0f, 37.3f, 1000.0f}) {
          const Tensor s = from_vector<float>({scale}, {1});
          const auto cpu = cast_to_fp8(x, s, d);
          const auto gpu = cast_to_fp8(x.to(kGpu), s.to(kGpu), d);
          EXPECT_TRUE(same_codes(gpu.q, cpu.q)) << dtype_name(xd) << dtype_name(d) << n;
          EXPECT_TRUE(same_float_bits(gpu.amax, cpu.amax)) << n;
          EXPECT_TRUE(same_float_bits(kernels::fp8_amax(x.to(kGpu)), cpu.amax)) << n;
        }
        // One element in: a view no 16-byte pack fits, element by element.
        if (n < 3) continue;
        const Tensor xo = x.narrow(0, 1, n - 1), s = from_vector<float>({37.3f}, {1});
        const auto cpu = cast_to_fp8(xo, s, d);
        const auto gpu = cast_to_fp8(x.to(kGpu).narrow(0, 1, n - 1), s.to(kGpu), d);
        EXPECT_TRUE(same_codes(gpu.q, cpu.q)) << "offset view " << dtype_name(xd) << n;
        EXPECT_TRUE(same_float_bits(gpu.amax, cpu.amax));
        EXPECT_TRUE(same_float_bits(kernels::fp8_amax(x.to(kGpu).narrow(0, 1, n - 1)), cpu.amax));
      }
    }
  }
  // Planted infinity and NaN: amax says so on both.
  Tensor y = test::random_normal({100000}, DType::f32);
  y.data<float>()[99999] = std::numeric_limits<float>::infinity();
  const Tensor one = from_vector<float>({1.0f}, {1});
  EXPECT_TRUE(same_float_bits(cast_to_fp8(y.to(kGpu), one.to(kGpu), DType::f8e4m3).amax,
                              cast_to_fp8(y, one, DType::f8e4m3).amax));
  EXPECT_TRUE(
      same_float_bits(kernels::fp8_amax(y.to(kGpu)), cast_to_fp8(y, one, DType::f8e4m3).amax));
  y.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  const auto g = cast_to_fp8(y.to(kGpu), one.to(kGpu), DType::f8e5m2);
  EXPECT_TRUE(std::isnan(g.amax.to(Device::cpu()).data<float>()[0]));
  EXPECT_TRUE(std::isnan(kernels::fp8_amax(y.to(kGpu)).to(Device::cpu()).data<float>()[0]));
  EXPECT_TRUE(same_codes(g.q, cast_to_fp8(y, one, DType::f8e5m2).q));
}

// Note [FP8 block cast kernel]: 1 x 128 and 128 x 128 tiles on the segment
// kernel (300 x 520: partial tiles at the right and bottom edges), the same
// with columns not a multiple of 4 (130 x 262) and other tiles on the first
// kernel; a NaN makes its tile's codes and scale, and the amax, NaN.
TEST(GpuFp8, blockwise_casts_match_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  for (DType xd : {DType::f32, DType::bf16, DType::f16})
    for (DType d : {DType::f8e4m3, DType::f8e5m2})
      for (auto [tr, tc] : {std::pair<int64_t, int64_t>{1, 128}, {128, 128}, {3, 1000}})
        for (Shape shape : {Shape{300, 520}, Shape{130, 262}})
          for (bool pow2 : {true, false}) {
            Tensor x = test::random_normal(shape, xd, Device::cpu(), 4.0);
            if (pow2 && xd != DType::bf16) {
              Tensor f = x.to(DType::f32);
              f.data<float>()[shape[1] + 7] = std::numeric_limits<float>::quiet_NaN();
              x = f.to(xd);
            }
            const auto cpu = kernels::cast_to_fp8_blockwise(x, tr, tc, d, pow2);
            const auto gpu = kernels::cast_to_fp8_blockwise(x.to(kGpu), tr, tc, d, pow2);
            const std::string what = std::string(dtype_name(xd)) + " " + dtype_name(d) + " " +
                                     std::to_string(tr) + "x" + std::to_string(tc) + " " +
                                     shape_str(shape);
            EXPECT_TRUE(same_codes(gpu.q, cpu.q)) << what;
            EXPECT_TRUE(same_float_bits(gpu.scale_inv, cpu.scale_inv)) << what;
            EXPECT_TRUE(same_float_bits(gpu.amax, cpu.amax)) << what;
          }
}

// Note [FP8 block cast of a transpose]: 1 x 128 tiles of a transposed view,
// cast from its base without the transpose copy where the base's rows M are a
// multiple of 8 and its columns K of the pack (1000 x 200: partial tiles both
// ways; 256 x 64; 256 x 12 for f32), through the copy elsewhere (30 x 64, and
// 256 x 12 in 16 bits): the bits of casting the contiguous transpose, a
// planted NaN included.
TEST(GpuFp8, blockwise_cast_of_a_transposed_view_matches_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  for (DType xd : {DType::f32, DType::bf16, DType::f16})
    for (DType d : {DType::f8e4m3, DType::f8e5m2})
      for (auto [m, k] : {std::pair<int64_t, int64_t>{1000, 200}, {256, 64}, {30, 64}, {256, 12}})
        for (bool nan : {false, true}) {
          Tensor base = test::random_normal({m, k}, xd, Device::cpu(), 4.0);
          if (nan && xd != DType::bf16) {
            Tensor f = base.to(DType::f32);
            f.data<float>()[(m - 1) * k + 5] = std::numeric_limits<float>::quiet_NaN();
            base = f.to(xd);
          }
          const auto cpu =
              kernels::cast_to_fp8_blockwise(base.transpose(0, 1).contiguous(), 1, 128, d, true);
          const auto gpu =
              kernels::cast_to_fp8_blockwise(base.to(kGpu).transpose(0, 1), 1, 128, d, true);
          const std::string what = std::string(dtype_name(xd)) + " " + dtype_name(d) + " " +
                                   std::to_string(m) + "x" + std::to_string(k) +
                                   (nan ? " NaN" : "");
          EXPECT_TRUE(same_codes(gpu.q, cpu.q)) << what;
          EXPECT_TRUE(same_float_bits(gpu.scale_inv, cpu.scale_inv)) << what;
          EXPECT_TRUE(same_float_bits(gpu.amax, cpu.amax)) << what;
        }
}

TEST(GpuFp8, cast_transpose_matches_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  // Note [FP8 cast-transpose]: packed 64 x 64 tiles where K is a multiple of
  // the pack and M of 8 (768 x 3072, 1000 x 72 with partial edge tiles,
  // 136 x 200 for f32 only), element by element elsewhere (1 x 1, 31 x 33,
  // 1000 x 70, and 136 x 200 in 16 bits), and for an x no pack fits.
  for (DType xd : {DType::f32, DType::bf16, DType::f16})
    for (DType d : {DType::f8e4m3, DType::f8e5m2})
      for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 1},
                          {31, 33},
                          {768, 3072},
                          {1000, 70},
                          {1000, 72},
                          {136, 200}}) {
        const Tensor flat = test::random_normal({m * k + 1}, xd, Device::cpu(), 5.0);
        const Tensor s = from_vector<float>({3.0f}, {1});
        for (int64_t offset : {0, 1}) {
          const Tensor x = flat.narrow(0, offset, m * k).view({m, k});
          const auto cpu = kernels::cast_to_fp8_transpose(x, s, d);
          const auto gpu = kernels::cast_to_fp8_transpose(
              flat.to(kGpu).narrow(0, offset, m * k).view({m, k}), s.to(kGpu), d);
          EXPECT_TRUE(same_codes(gpu.q, cpu.q)) << m << "x" << k << " offset " << offset;
          EXPECT_TRUE(same_codes(gpu.q_t, cpu.q_t)) << m << "x" << k << " offset " << offset;
          EXPECT_TRUE(same_float_bits(gpu.amax, cpu.amax));
        }
      }
}

// The scaled cast-transpose (its scale made in the cast kernel, Note [FP8
// scaling]) against the CPU's, on both kernels' shapes and every guard.
TEST(GpuFp8, scaled_cast_transpose_matches_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  for (auto [m, k] : {std::pair<int64_t, int64_t>{768, 3072}, {31, 33}}) {
    const Tensor x = test::random_normal({m, k}, DType::bf16, Device::cpu(), 5.0);
    const float real = kernels::fp8_amax(x).data<float>()[0];
    for (float a : {real, 0.0f, inf, std::numeric_limits<float>::quiet_NaN()})
      for (DType d : {DType::f8e4m3, DType::f8e5m2})
        for (bool guard : {false, true}) {
          const Tensor amax = from_vector<float>({a}, {1});
          const auto cpu = kernels::cast_to_fp8_transpose_scaled(x, amax, d, 1, false, guard);
          const auto gpu =
              kernels::cast_to_fp8_transpose_scaled(x.to(kGpu), amax.to(kGpu), d, 1, false, guard);
          EXPECT_TRUE(same_codes(gpu.q, cpu.q)) << m << "x" << k << " amax " << a;
          EXPECT_TRUE(same_codes(gpu.q_t, cpu.q_t)) << m << "x" << k << " amax " << a;
          EXPECT_TRUE(same_float_bits(gpu.scale_inv, cpu.scale_inv)) << a;
        }
  }
}

// Note [FP8 delayed scaling]: the merging cast (both kernels' shapes), the
// merge and the close's update, each against the CPU bit for bit.
TEST(GpuFp8, delayed_scaling_matches_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor s = from_vector<float>({6.0f}, {1});
  for (auto [m, k] : {std::pair<int64_t, int64_t>{768, 3072}, {31, 33}}) {
    const Tensor a = test::random_normal({m, k}, DType::bf16, Device::cpu(), 3.0);
    const Tensor b = test::random_normal({m, k}, DType::bf16, Device::cpu(), 7.0);
    auto run = [&](Device d) {
      Tensor running = from_vector<float>({1.5f}, {1}).to(d);
      const Tensor q = empty({m, k}, DType::f8e4m3, d), qt = empty({k, m}, DType::f8e4m3, d);
      kernels::cast_to_fp8_transpose_into(a.to(d), s.to(d), q, qt, running, true);
      kernels::cast_to_fp8_transpose_into(b.to(d), s.to(d), q, qt, running, true);
      return std::vector<Tensor>{q, qt, running};
    };
    const std::vector<Tensor> cpu = run(Device::cpu()), gpu = run(kGpu);
    EXPECT_TRUE(same_codes(gpu[0], cpu[0])) << m << "x" << k;
    EXPECT_TRUE(same_codes(gpu[1], cpu[1])) << m << "x" << k;
    EXPECT_TRUE(same_float_bits(gpu[2], cpu[2])) << m << "x" << k;
  }
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  // -0.0 and -2: an amax is a magnitude (the device's unsigned max would rank a sign bit first).
  for (float a : {0.0f, -0.0f, 2.0f, -2.0f, 9.0f, inf, nan})
    for (float r : {0.0f, 4.0f, nan}) {
      Tensor cpu = from_vector<float>({r}, {1}), gpu = cpu.to(kGpu);
      kernels::fp8_amax_merge_(cpu, from_vector<float>({a}, {1}));
      kernels::fp8_amax_merge_(gpu, from_vector<float>({a}, {1}).to(kGpu));
      EXPECT_TRUE(same_float_bits(gpu, cpu)) << r << " merged with " << a;
    }
  // 300 rows of H = 5: random histories, windows random, zero, infinite or NaN.
  Tensor state = test::random_normal({300, 8}, DType::f32, Device::cpu(), 50.0);
  float* p = state.data<float>();
  for (int64_t i = 0; i < 300; ++i) {
    for (int64_t j = 2; j < 8; ++j)
      p[i * 8 + j] = std::fabs(p[i * 8 + j]);
    if (i % 7 == 0) p[i * 8 + 2] = 0.0f;
    if (i % 11 == 0) p[i * 8 + 2] = inf;
    if (i % 13 == 0) p[i * 8 + 2] = nan;
  }
  for (DType d : {DType::f8e4m3, DType::f8e5m2}) {
    Tensor cpu = state.clone(), gpu = state.to(kGpu);
    kernels::fp8_delayed_scale_update(cpu, d, 1);
    kernels::fp8_delayed_scale_update(gpu, d, 1);
    EXPECT_TRUE(same_float_bits(gpu, cpu)) << dtype_name(d);
  }
}

// Note [FP8 bias gradient in the cast]: the codes as the plain cast's, bit for
// bit; the column sums within f32 rounding of a double sum, onto dbias with
// accumulate, and the same bits on a second run. Packed tiles (768 x 3072,
// 1000 x 72 with partial edge tiles, 2304 x 200 with more row tiles than the
// reduction's groups) and the fallback (31 x 33), which runs sum_rows after
// the cast.
TEST(GpuFp8, scaled_cast_transpose_with_column_sums) {
  ACCRUE_REQUIRE_CUDA();
  for (DType xd : {DType::bf16, DType::f32})
    for (auto [m, k] : {std::pair<int64_t, int64_t>{768, 3072}, {1000, 72}, {31, 33}, {2304, 200}})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(xd)) + " " + std::to_string(m) + "x" +
                     std::to_string(k) + (accumulate ? " accumulate" : ""));
        const Tensor x = test::random_normal({m, k}, xd, Device::cpu(), 5.0);
        const Tensor start = test::random_normal({k}, DType::f32, Device::cpu(), 3.0);
        const Tensor xg = x.to(kGpu), amax = kernels::fp8_amax(xg);
        const auto plain =
            kernels::cast_to_fp8_transpose_scaled(xg, amax, DType::f8e5m2, 0, false, true);
        Tensor db = start.to(kGpu), again = start.to(kGpu);
        const auto fused = kernels::cast_to_fp8_transpose_scaled_with_column_sums(
            xg, amax, DType::f8e5m2, 0, false, true, db, accumulate);
        kernels::cast_to_fp8_transpose_scaled_with_column_sums(xg, amax, DType::f8e5m2, 0, false,
                                                               true, again, accumulate);
        EXPECT_TRUE(same_codes(fused.q, plain.q));
        EXPECT_TRUE(same_codes(fused.q_t, plain.q_t));
        EXPECT_TRUE(same_float_bits(fused.scale_inv, plain.scale_inv));
        EXPECT_TRUE(same_float_bits(db, again.to(Device::cpu())));
        // Delayed scaling's cast (a given scale, the amax merged): the same sums' bits.
        Tensor running = from_vector<float>({1.0f}, {1}).to(kGpu), db_delayed = start.to(kGpu);
        const Tensor q = empty({m, k}, DType::f8e5m2, kGpu),
                     qt = empty({k, m}, DType::f8e5m2, kGpu);
        kernels::cast_to_fp8_transpose_with_column_sums_into(
            xg, from_vector<float>({2.0f}, {1}).to(kGpu), q, qt, running, true, db_delayed,
            accumulate);
        EXPECT_TRUE(same_float_bits(db_delayed, db.to(Device::cpu())));
        EXPECT_TRUE(same_float_bits(running, kernels::fp8_amax(x).to(DType::f32)));
        const Tensor xc = x.to(DType::f32).contiguous(), got = db.to(Device::cpu());
        for (int64_t c = 0; c < k; ++c) {
          double sum = accumulate ? start.data<float>()[c] : 0.0, size = 0.0;
          for (int64_t r = 0; r < m; ++r) {
            sum += xc.data<float>()[r * k + c];
            size += std::fabs(xc.data<float>()[r * k + c]);
          }
          // f32 sums of m terms: each addition rounds by at most 2^-24 of a partial sum.
          ASSERT_NEAR(got.data<float>()[c], sum, 1e-6 * (size + 3.0) * std::log2(m + 2.0) + 1e-6)
              << "column " << c;
        }
      }
}

TEST(GpuFp8, scale_rule_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  for (float a : {0.0f, inf, std::numeric_limits<float>::quiet_NaN(), 1e-38f, 0.37f, 3.0f, 1e30f})
    for (DType d : {DType::f8e4m3, DType::f8e5m2})
      for (int margin : {0, 2})
        for (bool pow2 : {false, true})
          for (bool nan_on_overflow : {false, true}) {
            const Tensor amax = from_vector<float>({a}, {1});
            const auto cpu = fp8_scale_from_amax(amax, d, margin, pow2, nan_on_overflow);
            const auto gpu = fp8_scale_from_amax(amax.to(kGpu), d, margin, pow2, nan_on_overflow);
            EXPECT_TRUE(same_float_bits(gpu.scale, cpu.scale)) << a;
            EXPECT_TRUE(same_float_bits(gpu.scale_inv, cpu.scale_inv)) << a;
          }
  // Devices must agree.
  EXPECT_ERROR(cast_to_fp8(test::random_normal({4}).to(kGpu), from_vector<float>({1.0f}, {1}),
                           DType::f8e4m3),
               "cast_to_fp8", "scale", "cpu", "cuda");
}

using kernels::fp8_matmul;
using kernels::fp8_matmul_into;

Tensor integer_codes(const Shape& shape, DType d) {
  return test::random_integers(shape, -8, 8, DType::f32).to(d);
}

Tensor scalar_on(float v, Device device) {
  return from_vector<float>({v}, {1}).to(device);
}

// Integer-valued operands with |partial sums| <= 64 * K <= 2^14: every
// accumulator cuBLASLt may use holds them exactly, so the f32 result is the
// CPU's bit for bit, and a 16-bit output is the same exact value rounded once.
TEST(GpuFp8, gemm_of_integer_operands_is_exact) {
  ACCRUE_REQUIRE_CUDA();
  for (auto [da, db] : {std::pair{DType::f8e4m3, DType::f8e4m3},
                        {DType::f8e4m3, DType::f8e5m2},
                        {DType::f8e5m2, DType::f8e4m3}}) {
    for (auto [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{16, 16, 16}, {128, 64, 256}, {272, 528, 192}}) {
      Tensor a = integer_codes({m, k}, da), b = integer_codes({n, k}, db);
      for (DType out : {DType::f32, DType::bf16}) {
        const Tensor cpu =
            fp8_matmul(a, b, scalar_on(0.5f, Device::cpu()), scalar_on(2.0f, Device::cpu()), out);
        const Tensor gpu =
            fp8_matmul(a.to(kGpu), b.to(kGpu), scalar_on(0.5f, kGpu), scalar_on(2.0f, kGpu), out);
        EXPECT_TRUE(test::all_equal(gpu.to(Device::cpu()), cpu))
            << dtype_name(da) << " x " << dtype_name(db) << " -> " << dtype_name(out) << " " << m
            << "x" << n << "x" << k;
      }
    }
  }
}

// The bias in cuBLASLt's epilogue (Note [FP8 GEMM]) on integer operands and
// an integer bias: added before the one rounding, the CPU's bits; a bias
// that is not 16-byte aligned is added after the GEMM (f32: exact too).
TEST(GpuFp8, gemm_adds_the_bias_in_its_epilogue) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor a = integer_codes({128, 256}, DType::f8e4m3);
  const Tensor b = integer_codes({96, 256}, DType::f8e4m3);
  for (DType out : {DType::bf16, DType::f32}) {
    const Tensor bias = test::random_integers({96}, -50, 50, out);
    const Tensor cpu = fp8_matmul(a, b, scalar_on(0.5f, Device::cpu()),
                                  scalar_on(2.0f, Device::cpu()), out, false, bias);
    const Tensor gpu = fp8_matmul(a.to(kGpu), b.to(kGpu), scalar_on(0.5f, kGpu),
                                  scalar_on(2.0f, kGpu), out, false, bias.to(kGpu));
    EXPECT_TRUE(test::all_equal(gpu.to(Device::cpu()), cpu)) << dtype_name(out);
  }
  const Tensor bias = test::random_integers({97}, -50, 50, DType::f32);
  const Tensor misaligned = bias.to(kGpu).narrow(0, 1, 96);
  const Tensor cpu =
      fp8_matmul(a, b, scalar_on(0.5f, Device::cpu()), scalar_on(2.0f, Device::cpu()), DType::f32,
                 false, bias.narrow(0, 1, 96).contiguous());
  const Tensor gpu = fp8_matmul(a.to(kGpu), b.to(kGpu), scalar_on(0.5f, kGpu),
                                scalar_on(2.0f, kGpu), DType::f32, false, misaligned);
  EXPECT_TRUE(test::all_equal(gpu.to(Device::cpu()), cpu)) << "misaligned bias";
}

// Note [FP8 GEMM]'s rounding model on random operands: the products of two
// FP8 values are exact in f32; the bound takes Hopper's FP8 accumulator to
// keep at least 14 significant bits (an addition errs by <= 2^-13 of the
// running sum, itself <= sum |a b|), with the partial sums promoted to f32 at
// least every 128 products when fast accumulation is off (<= 128 * 2^-13 =
// 2^-6 of sum |a b| in all) and never when it is on (<= K * 2^-13), plus the
// output's rounding (and the reference's). Real errors should be far smaller; the bound
// catches a wrong layout, scale or operand order, which errs by O(|out|).
void expect_within_fp8_model(const Tensor& gpu, const Tensor& a, const Tensor& b, double scale,
                             bool fast, DType out) {
  const Tensor cpu =
      fp8_matmul(a, b, scalar_on(1.0f, Device::cpu()), scalar_on(1.0f, Device::cpu()), DType::f32);
  const Tensor g = gpu.to(Device::cpu()).to(DType::f64);
  const Tensor c = cpu.to(DType::f64);
  const Tensor fa = a.to(DType::f64), fb = b.to(DType::f64);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  const double acc = fast ? static_cast<double>(k) * 0x1p-13 : 0x1p-6;
  const double unit = out == DType::f32 ? 0x1p-24 : out == DType::bf16 ? 0x1p-8 : 0x1p-11;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double abs_sum = 0;
      for (int64_t p = 0; p < k; ++p)
        abs_sum += std::fabs(fa.data<double>()[i * k + p] * fb.data<double>()[j * k + p]);
      const double want = c.data<double>()[i * n + j] * scale;
      const double bound = acc * abs_sum * scale + 2 * unit * std::fabs(want);
      ASSERT_LE(std::fabs(g.data<double>()[i * n + j] - want), bound)
          << i << ", " << j << " (" << dtype_name(out) << (fast ? ", fast" : "") << ")";
    }
}

TEST(GpuFp8, scaled_gemm_matches_the_cpu_within_the_rounding_model) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t m = 256, n = 192, k = 1024;
  Tensor x = test::random_normal({m, k}, DType::bf16, kGpu, 3.0);
  Tensor w = test::random_normal({n, k}, DType::bf16, kGpu, 0.02);
  const auto sx =
      fp8_scale_from_amax(cast_to_fp8(x, scalar_on(1, kGpu), DType::f8e4m3).amax, DType::f8e4m3);
  const auto sw =
      fp8_scale_from_amax(cast_to_fp8(w, scalar_on(1, kGpu), DType::f8e4m3).amax, DType::f8e4m3);
  const Tensor qx = cast_to_fp8(x, sx.scale, DType::f8e4m3).q;
  const Tensor qw = cast_to_fp8(w, sw.scale, DType::f8e4m3).q;
  const double scale = static_cast<double>(sx.scale_inv.to(Device::cpu()).data<float>()[0]) *
                       sw.scale_inv.to(Device::cpu()).data<float>()[0];
  for (bool fast : {false, true})
    for (DType out : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor y = fp8_matmul(qx, qw, sx.scale_inv, sw.scale_inv, out, fast);
      expect_within_fp8_model(y, qx.to(Device::cpu()), qw.to(Device::cpu()), scale, fast, out);
    }
}

// The weight gradient's use: four micro-batches added into one f32 slot by
// the GEMM itself (beta = 1), against the CPU doing the same.
TEST(GpuFp8, gemm_accumulates_micro_batches_into_an_f32_slot) {
  ACCRUE_REQUIRE_CUDA();
  Tensor slot_cpu = test::random_normal({64, 128});
  Tensor slot_gpu = slot_cpu.to(kGpu);
  for (int micro = 0; micro < 4; ++micro) {
    Tensor dyt = integer_codes({64, 512}, DType::f8e5m2);  // dy^T [N, M]
    Tensor xt = integer_codes({128, 512}, DType::f8e4m3);  // x^T [K, M]
    fp8_matmul_into(dyt, xt, scalar_on(0.25f, Device::cpu()), scalar_on(0.5f, Device::cpu()),
                    slot_cpu, true);
    fp8_matmul_into(dyt.to(kGpu), xt.to(kGpu), scalar_on(0.25f, kGpu), scalar_on(0.5f, kGpu),
                    slot_gpu, true);
  }
  // Each micro-batch's product is exact (integer operands, power-of-two
  // scales); only the f32 additions into the slot round, identically.
  EXPECT_TRUE(test::all_equal(slot_gpu.to(Device::cpu()), slot_cpu));
}

// Note [FP8 scaling]: scales live on the device, so the per-tensor recipe
// (cast for amax, scale, cast, GEMM into an f32 slot) captures into a CUDA
// graph, and a replay on new inputs uses the new scales: bitwise the eager
// run on the same inputs.
TEST(GpuFp8, current_scaling_chain_replays_in_a_cuda_graph) {
  ACCRUE_REQUIRE_CUDA();
  const test::GraphPoolScope pool;
  const Tensor x = test::random_normal({128, 256}, DType::bf16, kGpu, 2.0);
  const Tensor w = test::random_normal({64, 256}, DType::bf16, kGpu, 0.05);
  const Tensor one = scalar_on(1.0f, kGpu);
  const auto chain = [&](const Tensor& slot) {
    const auto sx = fp8_scale_from_amax(cast_to_fp8(x, one, DType::f8e4m3).amax, DType::f8e4m3);
    const auto sw = fp8_scale_from_amax(cast_to_fp8(w, one, DType::f8e4m3).amax, DType::f8e4m3);
    const Tensor qx = cast_to_fp8(x, sx.scale, DType::f8e4m3).q;
    const Tensor qw = cast_to_fp8(w, sw.scale, DType::f8e4m3).q;
    fp8_matmul_into(qx, qw, sx.scale_inv, sw.scale_inv, slot, true);
  };
  const Tensor slot = zeros({128, 64}, DType::f32, kGpu);
  chain(slot);  // the cuBLASLt plan and workspace exist before the capture
  std::string why;
  const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(
      0, [&] { chain(slot); }, &why);
  ASSERT_TRUE(graph) << why;
  x.copy_(test::random_normal(x.shape(), DType::bf16, kGpu, 30.0));  // a new amax
  slot.fill_(0.0);
  graph->launch();
  const Tensor eager = zeros({128, 64}, DType::f32, kGpu);
  chain(eager);
  EXPECT_TRUE(test::all_equal(slot.to(Device::cpu()), eager.to(Device::cpu())));
}

TEST(GpuFp8, gemm_refuses_mixed_devices) {
  ACCRUE_REQUIRE_CUDA();
  Tensor a = integer_codes({16, 16}, DType::f8e4m3);
  EXPECT_ERROR(fp8_matmul(a.to(kGpu), a, scalar_on(1, kGpu), scalar_on(1, kGpu), DType::f32),
               "fp8_matmul", "cpu", "cuda");
  EXPECT_ERROR(fp8_matmul(a.to(kGpu), a.to(kGpu), scalar_on(1, Device::cpu()), scalar_on(1, kGpu),
                          DType::f32),
               "fp8_matmul", "scale_inv_a", "cpu");
}

// ---- Note [FP8 block GEMM] on cuBLASLt -------------------------------------------------------

using kernels::Fp8Tiles;

// Powers of two in [2^-2, 2^2], one per tile of rows_per_tile x 128 over q.
Tensor power_of_two_tiles(const Tensor& q, int64_t rows_per_tile) {
  return test::random_powers_of_two(
      {(q.size(0) + rows_per_tile - 1) / rows_per_tile, (q.size(1) + 127) / 128}, -2, 2);
}

// Integer codes and power-of-two tile scales: each 128-long slice's integer
// sum (<= 128 * 64) is exact in any accumulator cuBLASLt uses, and so is the
// scaled f32 total, so the GPU gives the CPU's bits. K = 768 takes 6 slices,
// which cuBLASLt's 128 x 128 layout pads to 8 (Note [FP8 block GEMM]); 272
// rows end in a partial block.
TEST(GpuFp8, block_scaled_gemm_of_integer_operands_is_exact) {
  ACCRUE_REQUIRE_CUDA();
  for (auto [ta, tb] : {std::pair{Fp8Tiles::row, Fp8Tiles::block},
                        {Fp8Tiles::block, Fp8Tiles::row},
                        {Fp8Tiles::row, Fp8Tiles::row}}) {
    const Tensor a = integer_codes({272, 768}, DType::f8e4m3);
    const Tensor b = integer_codes({144, 768}, DType::f8e5m2);
    const Tensor sa = power_of_two_tiles(a, ta == Fp8Tiles::block ? 128 : 1);
    const Tensor sb = power_of_two_tiles(b, tb == Fp8Tiles::block ? 128 : 1);
    const std::string what =
        std::to_string(static_cast<int>(ta)) + " x " + std::to_string(static_cast<int>(tb));
    for (DType out : {DType::f32, DType::bf16}) {
      const Tensor cpu = kernels::fp8_block_matmul(a, sa, ta, b, sb, tb, out);
      const Tensor gpu =
          kernels::fp8_block_matmul(a.to(kGpu), sa.to(kGpu), ta, b.to(kGpu), sb.to(kGpu), tb, out);
      EXPECT_TRUE(test::all_equal(gpu.to(Device::cpu()), cpu)) << what << " " << dtype_name(out);
    }
    // Into an f32 slot (the weight gradient's use), twice.
    Tensor slot_cpu = test::random_integers({272, 144}, -100, 100, DType::f32);
    Tensor slot_gpu = slot_cpu.to(kGpu);
    for (int micro = 0; micro < 2; ++micro) {
      kernels::fp8_block_matmul_into(a, sa, ta, b, sb, tb, slot_cpu, true);
      kernels::fp8_block_matmul_into(a.to(kGpu), sa.to(kGpu), ta, b.to(kGpu), sb.to(kGpu), tb,
                                     slot_gpu, true);
    }
    EXPECT_TRUE(test::all_equal(slot_gpu.to(Device::cpu()), slot_cpu)) << what << " accumulated";
  }
}

// Real data through the block casts: the GPU within Note [FP8 GEMM]'s
// rounding model of the CPU (each slice promoted to f32).
TEST(GpuFp8, block_scaled_gemm_of_cast_tiles_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({256, 1024}, DType::bf16, kGpu, 3.0);
  const Tensor w = test::random_normal({192, 1024}, DType::bf16, kGpu, 0.02);
  const auto cx = kernels::cast_to_fp8_blockwise(x, 1, 128, DType::f8e4m3);
  const auto cw = kernels::cast_to_fp8_blockwise(w, 128, 128, DType::f8e4m3);
  const Tensor gpu = kernels::fp8_block_matmul(cx.q, cx.scale_inv, Fp8Tiles::row, cw.q,
                                               cw.scale_inv, Fp8Tiles::block, DType::f32);
  const Tensor cpu = kernels::fp8_block_matmul(
      cx.q.to(Device::cpu()), cx.scale_inv.to(Device::cpu()), Fp8Tiles::row, cw.q.to(Device::cpu()),
      cw.scale_inv.to(Device::cpu()), Fp8Tiles::block, DType::f32);
  // Hopper's FP8 tensor cores keep about 14 bits of a partial sum between
  // the promotions to f32 (Note [FP8 GEMM]): a few times 2^-13 of the
  // output's norm over K = 1024 (1.26e-4 measured on an H100).
  EXPECT_LT(test::relative_error(gpu.to(Device::cpu()), cpu), 5e-4);
}

}  // namespace
}  // namespace accrue
