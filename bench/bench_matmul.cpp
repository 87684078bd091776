// Matrix products at GPT-2 124M shapes, T = 8192 tokens (B=8 x 1024):
// a [T, K] @ b [K, N] for the attention qkv and projection, the MLP's fc and
// fc2, and the tied-embedding logits. FLOP = 2 M N K. f32 runs in true fp32
// (TF32 off), bf16 accumulates in fp32.
#include "accrue/core/dtype.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

struct MatmulShape {
  const char* layer;
  int64_t m, k, n;
};
constexpr int64_t kTokens = 8192;
constexpr MatmulShape kShapes[] = {
    {"qkv", kTokens, 768, 2304}, {"proj", kTokens, 768, 768},     {"fc", kTokens, 768, 3072},
    {"fc2", kTokens, 3072, 768}, {"logits", kTokens, 768, 50304},
};

void matmul(benchmark::State& state, MatmulShape s, DType dtype) {
  kernels::set_allow_tf32(false);
  Tensor a = random_input({s.m, s.k}, dtype);
  Tensor b = random_input({s.k, s.n}, dtype);
  GpuTime t = time_gpu(state, [&] { kernels::matmul(a, b); });
  report_flops(state, 2.0 * s.m * s.n * s.k, t);
}

}  // namespace

// Names read matmul/<dtype>/<layer>_MxKxN; torch_bench.py uses the same.
void register_matmul_benchmarks() {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const MatmulShape& s : kShapes) {
      std::string name = std::string("matmul/") + dtype_name(dtype) + "/" + s.layer + "_" +
                         std::to_string(s.m) + "x" + std::to_string(s.k) + "x" +
                         std::to_string(s.n);
      register_gpu_benchmark(name,
                             [s, dtype](benchmark::State& state) { matmul(state, s, dtype); });
    }
  }
}

}  // namespace accrue::bench
