// FP8 under data parallelism on the host world (tests/dist/host_world.h): an
// MLP whose layers run fp8_linear (Note [FP8 linear]) with the weights' FP8
// copies kept by each rank's store (Note [Window FP8 weights]). Two ranks of
// K = 2 micro-batches against one process of K = 4 on the same global batch,
// plain and ZeRO-1:
//  - every rank ends with the same weights, bit for bit (the copies are cast
//    from equal weights, so equal on every rank);
//  - the weights equal the one-process run's to f32 rounding: each
//    micro-batch is cast with its own scales in both runs, so only the order
//    of the fp32 sums differs;
//  - the report's loss is the world's mean, as one process reports it.
// With delayed scaling (Note [FP8 delayed scaling]) the close max-reduces the
// window amaxes over the ranks, so each rank's scales and histories are the
// one process's bit for bit, and so are the casts: the same three results.
#include <cmath>
#include <string>
#include <vector>

#include "tests/dist/fp8_dist_run.h"
#include "tests/dist/host_world.h"

namespace accrue::dist {
namespace {

using fp8_run::kWindows;
using fp8_run::Result;
using fp8_run::train;
using host::HostCommunicator;
using host::HostWorld;

TEST(HostWorldFp8, two_ranks_agree_bitwise_and_match_one_process) {
  for (bool delayed : {false, true})
    for (bool zero1 : {false, true}) {
      SCOPED_TRACE(std::string(zero1 ? "zero1" : "plain") + (delayed ? ", delayed scaling" : ""));
      const Result single = train(1, 0, nullptr, {.delayed = delayed});
      HostWorld world(2);
      std::vector<Result> ranks(2);
      host::on_ranks(2, [&](int r) {
        HostCommunicator comm(world, r);
        ranks[static_cast<size_t>(r)] = train(2, r, &comm, {.zero1 = zero1, .delayed = delayed});
      });
      EXPECT_EQ(ranks[0].params, ranks[1].params) << "the ranks' weights differ";
      EXPECT_EQ(ranks[0].fp8_state, ranks[1].fp8_state) << "the ranks' scales differ";
      EXPECT_EQ(ranks[0].fp8_state, single.fp8_state) << "the scales differ from one process's";
      EXPECT_EQ(ranks[0].fp8_state.empty(), !delayed);
      double diff = 0, scale = 0;
      for (size_t i = 0; i < single.params.size(); ++i) {
        diff = std::max(diff, std::fabs(ranks[0].params[i] - single.params[i]));
        scale = std::max(scale, std::fabs(single.params[i]));
      }
      EXPECT_LE(diff / scale, 1e-5);
      for (int64_t w = 0; w < kWindows; ++w)
        EXPECT_NEAR(ranks[0].losses[w], single.losses[w], 1e-6 * single.losses[w]) << w;
    }
}

// With a bf16 compute copy: plain data parallelism keeps the FP8 codes in the
// compute slots (the broadcast's refresh recasts them there), ZeRO-1 moves
// them out with the master's shard; either way the ranks stay bitwise equal.
TEST(HostWorldFp8, codes_in_the_compute_slots_keep_the_ranks_equal) {
  for (bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "zero1" : "plain");
    const Result single = train(1, 0, nullptr, {.compute = DType::bf16});
    HostWorld world(2);
    std::vector<Result> ranks(2);
    host::on_ranks(2, [&](int r) {
      HostCommunicator comm(world, r);
      ranks[static_cast<size_t>(r)] = train(2, r, &comm, {.zero1 = zero1, .compute = DType::bf16});
    });
    EXPECT_EQ(ranks[0].params, ranks[1].params) << "the ranks' weights differ";
    EXPECT_EQ(ranks[0].losses, ranks[1].losses);
    // One process of the whole batch: the same training up to the sums' order.
    for (int64_t w = 0; w < kWindows; ++w)
      EXPECT_NEAR(ranks[0].losses[w], single.losses[w], 2e-2 * single.losses[w]) << w;
  }
}

}  // namespace
}  // namespace accrue::dist
