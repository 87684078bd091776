// Core on the GPU: copies, casts, fills, views and random draws against the CPU.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accrue/core/allocator.h"
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

// Each copy kernel of core/copy.cu on the layouts that select it, in every
// dtype, bit for bit against the CPU: a permute that keeps the last dim and a
// narrow (Note [Rows of packs]), transposes with and without batch dims in 2-D
// to 5-D (Note [Tiled transpose], odd sizes so tiles are partial), and the
// per-element fallback (a misaligned start, a ragged row, a broadcast inner
// dim). Then the same views cast to bf16 and to f32, and written into a
// transposed destination.
TEST(GpuCore, every_copy_layout_matches_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  struct Layout {
    const char* name;
    Shape shape;
    std::function<Tensor(const Tensor&)> view;
  };
  const std::vector<Layout> layouts = {
      {"head split",
       {2, 64, 3, 16},
       [](const Tensor& t) {
         return t.permute({0, 2, 1, 3});
       }},
      {"narrowed q", {4, 8, 96}, [](const Tensor& t) { return t.narrow(2, 32, 32); }},
      {"broadcast rows",
       {1, 16},
       [](const Tensor& t) {
         return t.expand({8, 16});
       }},
      {"2-D transpose", {67, 133}, [](const Tensor& t) { return t.transpose(0, 1); }},
      {"k transposed", {2, 3, 40, 24}, [](const Tensor& t) { return t.transpose(2, 3); }},
      {"k transposed, odd rows",
       {2, 3, 40, 24},
       [](const Tensor& t) { return t.narrow(3, 0, 23).transpose(2, 3); }},
      {"3-D permute",
       {5, 37, 70},
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       }},
      {"5-D permute",
       {2, 3, 4, 5, 8},
       [](const Tensor& t) {
         return t.permute({4, 0, 3, 1, 2});
       }},
      {"misaligned narrow", {8, 97}, [](const Tensor& t) { return t.narrow(1, 1, 64); }},
      {"ragged rows", {8, 64}, [](const Tensor& t) { return t.narrow(1, 0, 30); }},
      {"broadcast inner",
       {8, 1},
       [](const Tensor& t) {
         return t.expand({8, 40});
       }},
  };
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    for (const Layout& l : layouts) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " " + l.name);
      const Tensor x = is_floating(d) ? test::random_normal(l.shape, DType::f32).to(d)
                                      : test::random_integers(l.shape, -1000, 1000, d);
      const Tensor g = x.to(kGpu);
      EXPECT_TRUE(
          test::all_equal(l.view(g).contiguous().to(Device::cpu()), l.view(x).contiguous()));
      for (DType to : {DType::bf16, DType::f32})
        EXPECT_TRUE(test::all_equal(l.view(g).to(to).to(Device::cpu()), l.view(x).to(to)))
            << "cast to " << dtype_name(to);
      // A transposed destination: the source's contiguous dim lands strided.
      const Tensor v = l.view(x).contiguous();
      if (v.dim() >= 2) {
        Shape t_shape = v.shape();
        std::swap(t_shape[0], t_shape[1]);
        const Tensor dst = empty(t_shape, d, kGpu);
        test::poison(dst);
        dst.transpose(0, 1).copy_(l.view(g));
        EXPECT_TRUE(test::all_equal(dst.to(Device::cpu()), v.transpose(0, 1).contiguous()))
            << "into a transposed destination";
      }
    }
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
