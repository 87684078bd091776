// The MPI bootstrap (dist/mpi_bootstrap.h) across two real processes, no GPU:
// ctest starts this binary with `mpirun -np 2`. MPI is initialized by the
// first exchange and finalized at exit (Note [MPI lifetime]), so the shared
// test main() serves. Every case is collective: both ranks run the same
// cases in the same order, and a mismatch is an error on both (the check is
// an all-gather, not an abort), so later cases still find MPI usable.
#include <gtest/gtest.h>

#include <random>

#include "accrue/dist/launch_env.h"
#include "accrue/dist/mpi_bootstrap.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

Blob random_blob(uint32_t seed) {
  std::mt19937 gen(seed);
  Blob b;
  for (auto& x : b)
    x = static_cast<uint8_t>(gen());
  return b;
}

class MpiBootstrap : public ::testing::Test {
 protected:
  void SetUp() override {
    info_ = discover_rank();
    ASSERT_TRUE(launched_by_mpi(info_) && info_.world_size == 2)
        << "start this test with mpirun -np 2; it runs as " << describe(info_);
  }
  RankInfo info_;
};

TEST_F(MpiBootstrap, is_the_bootstrap_under_mpirun) {
  EXPECT_TRUE(mpi_available());
  EXPECT_EQ(bootstrap_method(info_), Bootstrap::mpi);
  EXPECT_STREQ(bootstrap_name(bootstrap_method(info_)), "mpi");
  // The same variables under torchrun (or no launcher) keep the TCP exchange.
  RankInfo torchrun = info_;
  torchrun.launcher = "torchrun";
  EXPECT_EQ(bootstrap_method(torchrun), Bootstrap::tcp);
}

TEST_F(MpiBootstrap, rank0_blob_arrives_bitwise_on_every_rank) {
  const Blob sent = random_blob(2024);
  // Only rank 0's blob counts; rank 1's differs and must be overwritten.
  const Blob mine = info_.rank == 0 ? sent : random_blob(99);
  EXPECT_EQ(mpi_exchange_blob(info_, 0x1234, mine), sent);
}

TEST_F(MpiBootstrap, fingerprint_mismatch_fails_every_rank_naming_both_values) {
  const uint64_t fingerprint = info_.rank == 1 ? 0xbb : 0xaa;
  EXPECT_ERROR(mpi_exchange_blob(info_, fingerprint, random_blob(1)),
               "rank 1 registered a different parameter layout", "0x00000000000000bb",
               "rank 0 has 0x00000000000000aa", "mpi bootstrap on rank");
}

TEST_F(MpiBootstrap, world_size_that_disagrees_with_mpi_fails_every_rank_naming_both) {
  RankInfo wrong = info_;
  if (info_.rank == 1) wrong.world_size = 3;
  EXPECT_ERROR(mpi_exchange_blob(wrong, 7, random_blob(2)),
               "rank 1 has world size 3 but MPI_COMM_WORLD has 2 processes");
}

TEST_F(MpiBootstrap, ranks_that_disagree_with_mpi_fail_every_rank) {
  RankInfo swapped = info_;
  swapped.rank = 1 - info_.rank;
  EXPECT_ERROR(mpi_exchange_blob(swapped, 7, random_blob(3)), "MPI_COMM_WORLD rank 0 is rank 1",
               "MPI_COMM_WORLD rank 1 is rank 0");
}

TEST_F(MpiBootstrap, still_usable_after_a_mismatch) {
  EXPECT_THROW(mpi_exchange_blob(info_, 100 + static_cast<uint64_t>(info_.rank), random_blob(4)),
               Error);
  const Blob sent = random_blob(5);
  EXPECT_EQ(mpi_exchange_blob(info_, 9, info_.rank == 0 ? sent : Blob{}), sent);
}

}  // namespace
}  // namespace accrue::dist
