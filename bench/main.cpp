// accrue_bench: every accrue microbenchmark in one Google Benchmark binary.
//
//   accrue_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//                --benchmark_out=bench.json --benchmark_out_format=json
//
// The JSON context carries the GPU name and the measured copy bandwidth that
// bench/compare.py puts beside the PyTorch figures (bench/torch_bench.py).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "accrue/core/status_check.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace {

bool only_listing(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_list_tests", 22) == 0 &&
        std::strcmp(argv[i], "--benchmark_list_tests=false") != 0)
      return true;
  return false;
}

// The GPU's name and the copy bandwidth, recorded in the output's context.
void describe_gpu() {
  using namespace accrue;
  set_cuda_device(bench::kDevice);
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, bench::kDevice));
  benchmark::AddCustomContext("gpu", prop.name);
  const double bandwidth = bench::copy_bandwidth();
  benchmark::AddCustomContext("copy_bandwidth_GBps", std::to_string(bandwidth * 1e-9));
  std::printf("accrue_bench: %s, device-to-device copy %.0f GB/s (read + write)\n", prop.name,
              bandwidth * 1e-9);
}

}  // namespace

int main(int argc, char** argv) {
  const bool listing = only_listing(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  accrue::bench::register_copy_benchmarks();
  accrue::bench::register_elementwise_benchmarks();
  accrue::bench::register_reduce_benchmarks();
  accrue::bench::register_matmul_benchmarks();
  accrue::bench::register_model_op_benchmarks();
  accrue::bench::register_attention_benchmarks();
  accrue::bench::register_fused_benchmarks();
  accrue::bench::register_graph_memset_benchmarks();
  accrue::bench::register_graph_carveout_benchmarks();
  // Last: its side-stream cases make every later kernel of the process about
  // 0.18 us slower (graph_memsets/no_memsets ran 1.394 us a kernel after them
  // and 1.204-1.218 alone on an H200; bench/RESULTS.md, twenty-fourth session).
  accrue::bench::register_stream_gap_benchmarks();

  if (!listing) {
    if (!accrue::cuda_available()) {
      std::fprintf(stderr, "accrue_bench: needs a CUDA GPU (%s)\n",
                   accrue::cuda_unavailable_reason());
      return 1;
    }
    try {
      accrue::kernels::set_allow_tf32(false);
      describe_gpu();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "accrue_bench: %s\n", e.what());
      return 1;
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
