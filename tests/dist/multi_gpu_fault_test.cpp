// Note [No silent hang], end to end: the last rank dies in the middle of a
// window (after its second micro-step, without a word to anyone); rank 0 goes
// on into its last micro-step, where the buckets' all-reduces wait for a peer
// that is gone. The watchdog must abort the communicator and rank 0 must get
// accrue::Error naming itself and the collective within 20 s, not hang.
// Its own process: the world is unusable afterwards, so ctest runs each case
// of this binary alone (--gtest_filter). The second case sums the buckets on
// the copy engines (Note [Copy-engine all-reduce]): the survivor's streams wait
// on flags the dead peer never writes, and the abort must release them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "accrue/dist/reducer.h"
#include "tests/dist/multi_gpu_world.h"
#include "tests/equivalence/equivalence_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using equivalence::Batch;
using equivalence::ModelKind;
using multi_gpu::device;
using multi_gpu::info;
using multi_gpu::world;

void a_rank_exits_mid_window(bool copy_engines) {
  constexpr int64_t K = 4;
  if (copy_engines) {
    if (info().world_size != 2) GTEST_SKIP() << "the copy engines sum between two GPUs";
    std::string why;
    // Every f32 sum on the copy engines: the tiny classifier's buckets too.
    ASSERT_TRUE(world().use_copy_engine_all_reduce(int64_t{16} << 20, 1, &why)) << why;
  }
  equivalence::Precision p = equivalence::cuda_f32();
  p.device = device();
  auto model = equivalence::make_model(ModelKind::Classifier, p, 5);
  optim::ParamStoreOptions ao;
  ao.device(device());
  optim::ParamStore arena(model->named_parameters(), ao);
  Reducer reducer(arena, world());
  optim::Optimizer optimizer(equivalence::adamw());
  optim::Window window(arena, optimizer, optim::WindowOptions().micro_steps(K), &reducer);
  const auto data = equivalence::make_batches(ModelKind::Classifier, 4, 16, p, 9);
  auto run_window = [&](const Batch& global) {
    for (int64_t k = 0; k < K; ++k)
      window.backward(model->loss(global.micro(k, K)));
    window.close();
    window.report();  // a host read, as a training loop's logging does
    world().synchronize();
  };
  // Two healthy windows: every connection is up when the peer dies.
  run_window(data[0]);
  run_window(data[1]);

  const auto start = std::chrono::steady_clock::now();
  if (info().rank == info().world_size - 1) {
    window.backward(model->loss(data[2].micro(0, K)));
    window.backward(model->loss(data[2].micro(1, K)));
    std::printf("[rank %d] exiting in the middle of window 2 without a word\n", info().rank);
    std::fflush(stdout);
    std::_Exit(0);  // a crash: no destructors, no goodbye to NCCL
  }
  try {
    run_window(data[2]);
    run_window(data[3]);  // in case the error surfaces only at the next micro-step
    ADD_FAILURE() << "rank " << info().rank << " trained on with a dead peer";
  } catch (const Error& e) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[rank %d] after %.2f s: %s\n", info().rank, seconds, e.what());
    EXPECT_LT(seconds, 20.0);
    const std::string who = "rank " + std::to_string(info().rank) + " of ";
    EXPECT_THAT(e.what(), ::testing::HasSubstr(who));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("all_reduce"));
  }
  EXPECT_TRUE(world().aborted());
  // Every later call says so too, at once.
  EXPECT_ERROR(world().check(), "rank");
  if (copy_engines) {
    EXPECT_GT(world().copy_engine_all_reduces(), 0);
  }
}

TEST(MultiGpuFault, a_rank_that_exits_mid_window_makes_the_others_raise_within_20_s) {
  a_rank_exits_mid_window(false);
}

TEST(MultiGpuFault, copy_engines_a_rank_that_exits_mid_window_makes_the_others_raise_within_20_s) {
  a_rank_exits_mid_window(true);
}

}  // namespace
}  // namespace accrue::dist
