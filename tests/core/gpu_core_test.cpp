// Core on the GPU: copies, casts, fills, views and random draws against the CPU.
#include "core/allocator.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

TEST(GpuCore, host_device_round_trip_is_exact_for_every_dtype) {
  ACCRUE_REQUIRE_CUDA();
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    Tensor h = test::random_integers({3, 1000}, -50, 50, d);
    EXPECT_TRUE(test::all_equal(h.to(kGpu).to(Device::cpu()), h)) << dtype_name(d);
  }
}

TEST(GpuCore, casts_match_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  Tensor x = test::random_normal({4097}, DType::f32, Device::cpu(), 100.0);
  for (DType d : {DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    Tensor cpu = x.to(d);
    Tensor gpu = x.to(kGpu).to(d).to(Device::cpu());
    EXPECT_TRUE(test::all_equal(gpu, cpu)) << dtype_name(d);
  }
}

TEST(GpuCore, strided_and_broadcast_copies_match_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tensor x = test::random_normal({37, 53});
  Tensor g = x.to(kGpu);
  EXPECT_TRUE(test::all_equal(g.transpose(0, 1).contiguous().to(Device::cpu()),
                              x.transpose(0, 1).contiguous()));
  EXPECT_TRUE(test::all_equal(g.narrow(1, 5, 20).to(Device::cpu()), x.narrow(1, 5, 20)));
  Tensor dst = empty({4, 37, 53}, DType::bf16, kGpu);
  test::poison(dst);
  dst.copy_(g);
  EXPECT_TRUE(test::all_equal(dst.to(Device::cpu()), x.to(DType::bf16).expand({4, 37, 53})));
  // A strided destination on the GPU from a CPU source.
  Tensor big = zeros({37, 100}, DType::f32, kGpu);
  big.narrow(1, 10, 53).copy_(x);
  EXPECT_TRUE(test::all_equal(big.narrow(1, 10, 53).to(Device::cpu()), x));
  EXPECT_EQ(big.narrow(1, 0, 10).to(Device::cpu()).to_vector<float>(),
            std::vector<float>(370, 0.0f));
}

TEST(GpuCore, fill_and_arange_match_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    EXPECT_TRUE(
        test::all_equal(full({5, 7}, 3.25, d, kGpu).to(Device::cpu()), full({5, 7}, 3.25, d)));
    EXPECT_TRUE(test::all_equal(arange(-3, 1000, 1.5, d, kGpu).to(Device::cpu()),
                                arange(-3, 1000, 1.5, d)));
  }
}

TEST(GpuCore, same_seed_gives_the_same_numbers_on_cpu_and_gpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    Generator gc(99), gg(99);
    EXPECT_TRUE(test::all_equal(rand({100003}, d, kGpu, &gg).to(Device::cpu()),
                                rand({100003}, d, Device::cpu(), &gc)))
        << "rand " << dtype_name(d);
    // Normals: evaluated in double on both sides (Note [Philox element mapping]);
    // libm and CUDA may differ in the last double bit, so allow one float ulp.
    EXPECT_TRUE(test::all_close(randn({100003}, d, kGpu, &gg).to(Device::cpu()),
                                randn({100003}, d, Device::cpu(), &gc), 1.2e-7, 0.0))
        << "randn " << dtype_name(d);
    EXPECT_TRUE(test::all_equal(randint(-7, 9, {4099}, DType::i64, kGpu, &gg).to(Device::cpu()),
                                randint(-7, 9, {4099}, DType::i64, Device::cpu(), &gc)));
  }
}

TEST(GpuCore, allocator_counts_device_bytes_in_both_modes) {
  ACCRUE_REQUIRE_CUDA();
  const CudaAllocatorMode previous = cuda_allocator_mode();
  for (CudaAllocatorMode mode : {CudaAllocatorMode::StreamOrderedPool, CudaAllocatorMode::Plain}) {
    set_cuda_allocator_mode(mode);
    const int64_t before = memory_stats(kGpu).current_bytes;
    reset_peak_memory(kGpu);
    {
      Tensor t = empty({1 << 20}, DType::f32, kGpu);
      EXPECT_EQ(memory_stats(kGpu).current_bytes, before + (4 << 20));
    }
    EXPECT_EQ(memory_stats(kGpu).current_bytes, before);
    EXPECT_EQ(memory_stats(kGpu).peak_bytes, before + (4 << 20));
  }
  set_cuda_allocator_mode(previous);
}

TEST(GpuCore, out_of_memory_is_an_error_with_advice) {
  ACCRUE_REQUIRE_CUDA();
  try {
    Tensor t = empty({int64_t{1} << 46}, DType::f32, kGpu);  // 256 TiB
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("micro-batch"), std::string::npos) << e.what();
  }
}

TEST(GpuCore, streams_and_events_order_work) {
  ACCRUE_REQUIRE_CUDA();
  Stream side(0);
  Event done(true), start(true);
  Tensor x = test::random_normal({1 << 16}, DType::f32, kGpu);
  start.record(current_stream(0));
  Tensor y;
  {
    StreamGuard guard(0, side.handle());
    EXPECT_EQ(current_stream(0), side.handle());
    y = x.clone();
    done.record(side.handle());
  }
  done.block(current_stream(0));
  EXPECT_TRUE(test::all_equal(y.to(Device::cpu()), x.to(Device::cpu())));
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_GE(start.elapsed_ms(done), 0.0f);
}

}  // namespace
}  // namespace accrue
