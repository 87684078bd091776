// A large elementwise op: c = a + b over 2^28 elements (1 GiB per f32
// tensor). Bytes moved = 2 reads + 1 write; the floor is that traffic at the
// copy bandwidth.
#include "accrue/core/dtype.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

constexpr int64_t kElements = int64_t{1} << 28;

void add(benchmark::State& state, DType dtype) {
  Tensor a = random_input({kElements}, dtype);
  Tensor b = random_input({kElements}, dtype);
  GpuTime t = time_gpu(state, [&] { kernels::binary(kernels::BinaryOp::Add, a, b); });
  report_bandwidth(state, 3.0 * kElements * element_size(dtype), t);
}

// The attention mask add of a composed GPT-2: scores [B, H, T, T] + mask
// [T, T] broadcast (Note [Rows of packs]). Bytes: the scores read and the sum
// written; the mask is read once per (b, h) but stays in L2.
void mask_add(benchmark::State& state, DType dtype) {
  Tensor scores = random_input({8, 12, 1024, 1024}, dtype);
  Tensor mask = random_input({1024, 1024}, dtype);
  GpuTime t = time_gpu(state, [&] { kernels::binary(kernels::BinaryOp::Add, scores, mask); });
  report_bandwidth(
      state, 2.0 * static_cast<double>(scores.nbytes()) + static_cast<double>(mask.nbytes()), t);
}

}  // namespace

void register_elementwise_benchmarks() {
  for (DType dtype : {DType::f32, DType::bf16}) {
    register_gpu_benchmark(std::string("mask_add/") + dtype_name(dtype) + "/8x12x1024x1024",
                           [dtype](benchmark::State& state) { mask_add(state, dtype); });
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    register_gpu_benchmark(std::string("add/") + dtype_name(dtype) + "/n=268435456",
                           [dtype](benchmark::State& state) { add(state, dtype); });
  }
}

}  // namespace accrue::bench
