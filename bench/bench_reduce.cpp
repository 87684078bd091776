// Large f32 reductions over 2^28 elements (1 GiB read): the sum of all
// elements, the sum of each row (reduce the contiguous last dim) and the sum
// of each column (reduce the strided first dim, the shape of a bias
// gradient). Bytes = input read + output written.
// bias_grad/bf16/<rows>x<cols>: GPT-2's bias gradients as the backward takes
// them, the column sums of a bf16 output gradient added into an fp32 slot
// (sum_rows_into, accumulate), at the rows of micro-batch 1, 4 and 32.
#include <string>

#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

void sum(benchmark::State& state, const Shape& shape, const std::vector<int64_t>& dims,
         double output_elements) {
  Tensor a = random_input(shape, DType::f32);
  GpuTime t = time_gpu(state, [&] { kernels::sum(a, dims); });
  report_bandwidth(state, (static_cast<double>(a.numel()) + output_elements) * sizeof(float), t);
}

void bias_grad(benchmark::State& state, int64_t rows, int64_t cols) {
  const Tensor g = random_input({rows, cols}, DType::bf16);
  const Tensor slot = random_input({cols}, DType::f32);
  GpuTime t = time_gpu(state, [&] { kernels::sum_rows_into(g, slot, /*accumulate=*/true); });
  report_bandwidth(state, static_cast<double>(rows * cols) * 2.0 + cols * 8.0, t);
}

}  // namespace

void register_reduce_benchmarks() {
  for (int64_t rows : {1024, 4096, 32768}) {
    for (int64_t cols : {768, 2304, 3072}) {
      register_gpu_benchmark(
          "bias_grad/bf16/" + std::to_string(rows) + "x" + std::to_string(cols),
          [rows, cols](benchmark::State& state) { bias_grad(state, rows, cols); });
    }
  }
  register_gpu_benchmark("sum_all/f32/n=268435456",
                         [](benchmark::State& state) { sum(state, {int64_t{1} << 28}, {}, 1); });
  register_gpu_benchmark("sum_rows/f32/16384x16384", [](benchmark::State& state) {
    sum(state, {16384, 16384}, {1}, 16384);
  });
  register_gpu_benchmark("sum_cols/f32/262144x1024", [](benchmark::State& state) {
    sum(state, {262144, 1024}, {0}, 1024);
  });
}

}  // namespace accrue::bench
