// FP8 under data parallelism on one GPU: two ranks as two threads of one
// process sharing the GPU, their collectives on the host world
// (tests/dist/host_world.h), so the ranks' equality is checked with the
// GPU's FP8 casts, scaled GEMMs, amaxes and reducer without NCCL or a second
// GPU (tests/dist/multi_gpu_test.cpp checks it over NCCL on two). The run is
// tests/dist/fp8_dist_run.h's, as on the CPU (tests/dist/fp8_dist_test.cpp):
// two ranks of K = 2 micro-batches against one process of K = 4, plain and
// ZeRO-1, current and delayed scaling, f32 and bf16 compute copies (with
// bf16 the FP8 codes live in the compute slots until ZeRO-1 moves them out).
//  - The ranks end bitwise equal: weights, reported losses, and delayed
//    scaling's amax histories and scales (the close max-reduces the window
//    amaxes over the ranks).
//  - Against one process: the first window's casts see equal weights and
//    inputs, after that the weights differ by the order of the fp32 gradient
//    sums, so the weights agree to f32 rounding with an f32 compute copy, the
//    losses to 2% with a bf16 one (the same bound as the CPU's), and the
//    delayed scaling rows to 1e-3.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/dist/fp8_dist_run.h"
#include "tests/dist/host_world.h"

namespace accrue::dist {
namespace {

using fp8_run::kWindows;
using fp8_run::Result;
using fp8_run::RunOptions;
using fp8_run::train;
using host::HostCommunicator;
using host::HostWorld;

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

TEST(GpuHostWorldFp8, two_ranks_on_one_gpu_agree_bitwise_and_match_one_process) {
  ACCRUE_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  for (DType compute : {DType::f32, DType::bf16})
    for (bool delayed : {false, true})
      for (bool zero1 : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(compute)) + (zero1 ? ", zero1" : ", plain") +
                     (delayed ? ", delayed scaling" : ", current scaling"));
        const RunOptions o{.zero1 = zero1, .delayed = delayed, .compute = compute, .device = gpu};
        const Result single = train(1, 0, nullptr, o);
        HostWorld world(2);
        std::vector<Result> ranks(2);
        std::vector<int64_t> all_reduces(2);
        host::on_ranks(2, [&](int r) {
          HostCommunicator comm(world, r, gpu);
          ranks[static_cast<size_t>(r)] = train(2, r, &comm, o);
          all_reduces[static_cast<size_t>(r)] = comm.counts["all_reduce"];
        });
        EXPECT_GT(all_reduces[0], 0) << "the ranks never reduced";
        EXPECT_EQ(ranks[0].params, ranks[1].params) << "the ranks' weights differ";
        EXPECT_EQ(ranks[0].losses, ranks[1].losses) << "the ranks report different losses";
        EXPECT_EQ(ranks[0].fp8_state, ranks[1].fp8_state) << "the ranks' scales differ";
        ASSERT_EQ(ranks[0].fp8_state.empty(), !delayed);
        ASSERT_EQ(ranks[0].fp8_state.size(), single.fp8_state.size());
        for (size_t i = 0; i < single.fp8_state.size(); ++i)
          EXPECT_NEAR(ranks[0].fp8_state[i], single.fp8_state[i],
                      1e-3 * std::fabs(single.fp8_state[i]))
              << "delayed scaling row element " << i;
        if (compute == DType::f32) {
          EXPECT_LE(max_relative_difference(ranks[0].params, single.params), 1e-5);
        }
        const double loss_tol = compute == DType::f32 ? 1e-6 : 2e-2;
        for (int64_t w = 0; w < kWindows; ++w)
          EXPECT_NEAR(ranks[0].losses[w], single.losses[w], loss_tol * single.losses[w]) << w;
      }
}

}  // namespace
}  // namespace accrue::dist
