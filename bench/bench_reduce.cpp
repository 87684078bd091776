// Large f32 reductions over 2^28 elements (1 GiB read): the sum of all
// elements, the sum of each row (reduce the contiguous last dim) and the sum
// of each column (reduce the strided first dim, the shape of a bias
// gradient). Bytes = input read + output written.
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

}  // namespace

void register_reduce_benchmarks() {
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
