// The reference: a device-to-device cudaMemcpyAsync of 1 GiB. Its rate
// (bytes read + written) is the practical memory floor that every
// bandwidth-bound op is reported against as copy_frac.
//
// Then contiguous() of the strided views a transformer makes, at GPT-2 124M's
// sizes (B=8, T=1024, H=12, D=64): the head split of q (rows of packs), the
// qkv split of c_attn's output into [3, B, H, T, D], a narrowed q, K^T (a
// batched tiled transpose), and a large 2-D f32 transpose; the head split and
// K^T again at B=64 (100 MB), where launch latency no longer counts. Each moves its
// bytes once each way, so the floor is 2 x bytes at the copy bandwidth.
#include <cuda_runtime_api.h>

#include <functional>
#include <string>

#include "accrue/core/status_check.h"
#include "bench/bench_util.h"

namespace accrue::bench {

void register_copy_benchmarks() {
  register_gpu_benchmark("copy/d2d/1GiB", [](benchmark::State& state) {
    constexpr int64_t kFloats = int64_t{1} << 28;
    constexpr size_t kBytes = static_cast<size_t>(kFloats) * sizeof(float);
    Tensor src = random_input({kFloats}, DType::f32);
    Tensor dst = empty({kFloats}, DType::f32, gpu());
    StreamHandle stream = current_stream(kDevice);
    GpuTime t = time_gpu(state, [&] {
      ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), kBytes,
                                        cudaMemcpyDeviceToDevice, stream));
    });
    report_bandwidth(state, 2.0 * kBytes, t);
  });
  struct Layout {
    const char* name;
    Shape shape;
    DType dtype;
    std::function<Tensor(const Tensor&)> view;
  };
  const Layout layouts[] = {
      {"copy_layout/head_split/bf16/8x1024x12x64",
       {8, 1024, 12, 64},
       DType::bf16,
       [](const Tensor& x) {
         return x.permute({0, 2, 1, 3});
       }},
      {"copy_layout/qkv_split/bf16/8x1024x3x12x64",
       {8, 1024, 3, 12, 64},
       DType::bf16,
       [](const Tensor& x) {
         return x.permute({2, 0, 3, 1, 4});
       }},
      {"copy_layout/narrow_q/bf16/8x1024x2304",
       {8, 1024, 2304},
       DType::bf16,
       [](const Tensor& x) { return x.narrow(2, 768, 768); }},
      {"copy_layout/k_transpose/bf16/8x12x1024x64",
       {8, 12, 1024, 64},
       DType::bf16,
       [](const Tensor& x) { return x.transpose(2, 3); }},
      {"copy_layout/head_split/bf16/64x1024x12x64",
       {64, 1024, 12, 64},
       DType::bf16,
       [](const Tensor& x) {
         return x.permute({0, 2, 1, 3});
       }},
      {"copy_layout/k_transpose/bf16/64x12x1024x64",
       {64, 12, 1024, 64},
       DType::bf16,
       [](const Tensor& x) { return x.transpose(2, 3); }},
      {"copy_layout/transpose/f32/8192x8192",
       {8192, 8192},
       DType::f32,
       [](const Tensor& x) { return x.transpose(0, 1); }},
  };
  for (const Layout& l : layouts) {
    register_gpu_benchmark(l.name, [l](benchmark::State& state) {
      const Tensor src = random_input(l.shape, l.dtype);
      const Tensor view = l.view(src);
      GpuTime t = time_gpu(state, [&] { view.contiguous(); });
      report_bandwidth(state, 2.0 * static_cast<double>(view.nbytes()), t);
    });
  }
}

}  // namespace accrue::bench
