// Weight-gradient accumulation at GPT-2 124M shapes (Note [Fused
// weight-gradient accumulation]): dW [out, in] = g^T x from the bf16 output
// gradient g [T, out] and input x [T, in], for qkv (2304x768), fc (3072x768)
// and fc2 (768x3072), T = 8192, 16384, 32768 tokens. Variants:
//   write             gemm into the fp32 arena slot, beta 0 (a window's first micro-batch)
//   accumulate        gemm into the fp32 slot, beta 1: the fused accumulation
//   unfused_f32_tmp   gemm into a fresh fp32 temporary, then axpy_ into the slot
//   unfused_bf16_tmp  gemm into a fresh bf16 temporary, cast to fp32, axpy_ into the
//                     slot (what GradArena::accumulate does with a bf16 gradient, and
//                     PyTorch's AccumulateGrad after autocast)
// FLOP = 2 T out in for every variant, so TFLOP/s compare directly. The
// target is accumulate / write <= 1.05: reading C costs little next to the
// product. bench/torch_accumulation.py times PyTorch's patterns under the
// same names.
#include <string>

#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

struct WgradShape {
  const char* layer;
  int64_t out, in;
};
constexpr WgradShape kShapes[] = {{"qkv", 2304, 768}, {"fc", 3072, 768}, {"fc2", 768, 3072}};
constexpr int64_t kTokens[] = {8192, 16384, 32768};

enum class Variant { Write, Accumulate, UnfusedF32Tmp, UnfusedBf16Tmp };
constexpr Variant kVariants[] = {Variant::Write, Variant::Accumulate, Variant::UnfusedF32Tmp,
                                 Variant::UnfusedBf16Tmp};

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::Write:
      return "write";
    case Variant::Accumulate:
      return "accumulate";
    case Variant::UnfusedF32Tmp:
      return "unfused_f32_tmp";
    case Variant::UnfusedBf16Tmp:
      return "unfused_bf16_tmp";
  }
  return "?";
}

void wgrad(benchmark::State& state, WgradShape s, int64_t tokens, Variant variant) {
  const Tensor g = random_input({tokens, s.out}, DType::bf16);
  const Tensor x = random_input({tokens, s.in}, DType::bf16);
  // The fp32 slot already holds a gradient: beta 1 reads real numbers.
  const Tensor slot = random_input({s.out, s.in}, DType::f32);
  GpuTime t = time_gpu(state, [&] {
    switch (variant) {
      case Variant::Write:
        kernels::gemm(g, /*transpose_a=*/true, x, /*transpose_b=*/false, slot, 1.0, 0.0);
        break;
      case Variant::Accumulate:
        kernels::gemm(g, true, x, false, slot, 1.0, 1.0);
        break;
      case Variant::UnfusedF32Tmp: {
        // Allocated per call, as an unfused backward does (a pool hit).
        Tensor tmp = empty({s.out, s.in}, DType::f32, gpu());
        kernels::gemm(g, true, x, false, tmp, 1.0, 0.0);
        kernels::axpy_(slot, 1.0, tmp);
        break;
      }
      case Variant::UnfusedBf16Tmp: {
        Tensor tmp = empty({s.out, s.in}, DType::bf16, gpu());
        kernels::gemm(g, true, x, false, tmp, 1.0, 0.0);
        kernels::axpy_(slot, 1.0, tmp.to(DType::f32));
        break;
      }
    }
  });
  report_flops(state, 2.0 * static_cast<double>(tokens) * s.out * s.in, t);
}

// Names read wgrad/bf16/<layer>_<out>x<in>/T=<tokens>/<variant>.
void register_wgrad_benchmarks() {
  for (const WgradShape& s : kShapes) {
    for (int64_t tokens : kTokens) {
      for (Variant v : kVariants) {
        const std::string name = std::string("wgrad/bf16/") + s.layer + "_" +
                                 std::to_string(s.out) + "x" + std::to_string(s.in) +
                                 "/T=" + std::to_string(tokens) + "/" + variant_name(v);
        register_gpu_benchmark(
            name, [s, tokens, v](benchmark::State& state) { wgrad(state, s, tokens, v); });
      }
    }
  }
}

// Registered at static initialization, as bench_window_close.cpp explains.
[[maybe_unused]] const bool registered = [] {
  register_wgrad_benchmarks();
  return true;
}();

}  // namespace
}  // namespace accrue::bench
