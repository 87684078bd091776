// GPT-2's LayerNorms at the shapes the training points give them: 1,024 rows
// of 768 (124M at micro-batch 1), 32,768 of 768 (124M at micro-batch 32) and
// 8,192 of 1,600 (1.5B at micro-batch 8). The forward is the block's
// residual add and LayerNorm in one kernel (kernels::residual_layer_norm,
// Note [Residual LayerNorm kernel]); the backward writes dx and adds dweight
// and dbias into fp32 slots (kernels::layer_norm_backward), as a micro-step
// does. Both are bandwidth-bound: the bytes counted are the least that must
// move, so x floor and copy_frac say how far each is from the copy rate, at
// sizes where launch latency and a partly filled GPU matter as much as
// bandwidth. bench/torch_bench.py times F.layer_norm on the same names.
//
// Names read gpt2_norm/<residual_layer_norm|layer_norm_backward>/bf16/<rows>x<width>.
#include <string>

#include "accrue/core/dtype.h"
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

struct NormShape {
  int64_t rows, width;
};
constexpr NormShape kShapes[] = {{1024, 768}, {32768, 768}, {8192, 1600}};
constexpr double kEps = 1e-5;

std::string shape_name(const NormShape& s) {
  return std::to_string(s.rows) + "x" + std::to_string(s.width);
}

// x and the residual read, their sum and the normalized row written (2 bytes
// each), weight and bias read, mean and rstd written (4 bytes a row each).
void forward(benchmark::State& state, NormShape s) {
  const Tensor x = random_input({s.rows, s.width}, DType::bf16);
  const Tensor res = random_input({s.rows, s.width}, DType::bf16);
  const Tensor w = random_input({s.width}, DType::bf16);
  const Tensor b = random_input({s.width}, DType::bf16);
  const GpuTime t = time_gpu(state, [&] { kernels::residual_layer_norm(x, res, w, b, kEps); });
  const double elements = static_cast<double>(s.rows * s.width);
  report_bandwidth(state, 8 * elements + 4.0 * s.width + 8.0 * s.rows, t);
}

// dy and x read and dx written (2 bytes each), mean and rstd read, weight
// read, dweight's and dbias's fp32 slots read and written (accumulate).
void backward(benchmark::State& state, NormShape s) {
  const Tensor x = random_input({s.rows, s.width}, DType::bf16);
  const Tensor dy = random_input({s.rows, s.width}, DType::bf16);
  const Tensor w = random_input({s.width}, DType::bf16);
  const Tensor b = random_input({s.width}, DType::bf16);
  const kernels::LayerNormOutput f = kernels::layer_norm(x, w, b, kEps);
  const Tensor dw = random_input({s.width}, DType::f32);
  const Tensor db = random_input({s.width}, DType::f32);
  const GpuTime t = time_gpu(state, [&] {
    kernels::layer_norm_backward(dy, x, w, f.mean, f.rstd, dw, db, /*accumulate=*/true);
  });
  const double elements = static_cast<double>(s.rows * s.width);
  report_bandwidth(state, 6 * elements + 8.0 * s.rows + 2.0 * s.width + 16.0 * s.width, t);
}

void register_gpt2_norm_benchmarks() {
  for (const NormShape& s : kShapes) {
    register_gpu_benchmark("gpt2_norm/residual_layer_norm/bf16/" + shape_name(s),
                           [s](benchmark::State& state) { forward(state, s); });
    register_gpu_benchmark("gpt2_norm/layer_norm_backward/bf16/" + shape_name(s),
                           [s](benchmark::State& state) { backward(state, s); });
  }
}

// Registered at static initialization, as bench_window_close.cpp explains.
[[maybe_unused]] const bool registered = [] {
  register_gpt2_norm_benchmarks();
  return true;
}();

}  // namespace
}  // namespace accrue::bench
