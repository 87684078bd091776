// Every GEMM of a GPT-2 124M training step, as the engine issues it (16-bit
// GEMM parity), at M = 1024, 8192 and 32768 tokens per micro-batch (B = 1, 8,
// 32 at T = 1024). For each Linear of the model, with its weight W [out, in]
// (bf16 compute copy):
//   fwd    y [M, out] = x [M, in] W^T               bf16 out
//   dgrad  dx [M, in] = g [M, out] W                bf16 out
//   wgrad  dW [out, in] += g^T x                    fp32 out, beta 1: the gradient
//                                                   lands in its arena slot (Note
//                                                   [Fused weight-gradient accumulation])
// The logits layer is the tied wte [50304, 768]; the model's classifier runs
// its forward in 4096-row chunks and its dgrad into fp32, timed too (M=4096
// fwd, dgrad_f32). FLOP = 2 M out in.
// bench/torch_bench.py times PyTorch under the same names: fwd and dgrad as
// torch.matmul, wgrad as torch.addmm(slot, g^T, x, out_dtype=float32), the
// same arithmetic (and, as gpt2_gemm_torch_pattern/..., what autograd does
// under autocast: a bf16 product added to the fp32 gradient).
// With ACCRUE_GEMM_TUNING=FILE set, the first call of each shape picks among
// cuBLASLt's candidates by timing (Note [GEMM autotuning]); the warm-up of
// time_gpu absorbs that first call.
#include <string>

#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"
#include "bench/gpt2_layout.h"

namespace accrue::bench {
namespace {

constexpr int64_t kTokens[] = {1024, 8192, 32768};

// DgradF32: the classifier's dgrad, whose product stays fp32 (kernels/classifier.cpp).
enum class Pass { Fwd, Dgrad, Wgrad, DgradF32 };
constexpr Pass kPasses[] = {Pass::Fwd, Pass::Dgrad, Pass::Wgrad};

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::Fwd:
      return "fwd";
    case Pass::Dgrad:
      return "dgrad";
    case Pass::Wgrad:
      return "wgrad";
    case Pass::DgradF32:
      return "dgrad_f32";
  }
  return "?";
}

void gpt2_gemm(benchmark::State& state, LinearShape s, int64_t m, Pass pass) {
  const Tensor w = random_input({s.out, s.in}, DType::bf16);
  GpuTime t;
  switch (pass) {
    case Pass::Fwd: {
      const Tensor x = random_input({m, s.in}, DType::bf16);
      const Tensor y = empty({m, s.out}, DType::bf16, gpu());
      t = time_gpu(state, [&] { kernels::gemm(x, false, w, /*transpose_b=*/true, y, 1.0, 0.0); });
      break;
    }
    case Pass::Dgrad:
    case Pass::DgradF32: {
      const Tensor g = random_input({m, s.out}, DType::bf16);
      const Tensor dx = empty({m, s.in}, pass == Pass::Dgrad ? DType::bf16 : DType::f32, gpu());
      t = time_gpu(state, [&] { kernels::gemm(g, false, w, false, dx, 1.0, 0.0); });
      break;
    }
    case Pass::Wgrad: {
      const Tensor g = random_input({m, s.out}, DType::bf16);
      const Tensor x = random_input({m, s.in}, DType::bf16);
      const Tensor slot = random_input({s.out, s.in}, DType::f32);  // holds a gradient already
      t = time_gpu(state,
                   [&] { kernels::gemm(g, /*transpose_a=*/true, x, false, slot, 1.0, 1.0); });
      break;
    }
  }
  report_flops(state, 2.0 * static_cast<double>(m) * s.out * s.in, t);
}

// Names read gpt2_gemm/<layer>_<out>x<in>/M=<tokens>/<pass>.
void register_gpt2_gemm(const LinearShape& s, int64_t m, Pass p) {
  const std::string name = std::string("gpt2_gemm/") + s.layer + "_" + std::to_string(s.out) + "x" +
                           std::to_string(s.in) + "/M=" + std::to_string(m) + "/" + pass_name(p);
  register_gpu_benchmark(name, [s, m, p](benchmark::State& state) { gpt2_gemm(state, s, m, p); });
}

[[maybe_unused]] const bool registered = [] {
  for (const LinearShape& s : kGpt2Linears)
    for (int64_t m : kTokens)
      for (Pass p : kPasses)
        register_gpt2_gemm(s, m, p);
  // What the fused classifier issues (Note [Classifier chunk rows]): the
  // forward in 4096-row chunks, the dgrad into fp32.
  const LinearShape& logits = kGpt2Linears[4];
  register_gpt2_gemm(logits, 4096, Pass::Fwd);
  for (int64_t m : {int64_t{8192}, int64_t{32768}})
    register_gpt2_gemm(logits, m, Pass::DgradF32);
  return true;
}();

}  // namespace
}  // namespace accrue::bench
