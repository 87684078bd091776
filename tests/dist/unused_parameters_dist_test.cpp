// Note [Unused parameters] under data parallelism, on the host world
// (tests/dist/host_world.h): a parameter counts as used when ANY rank wrote
// it. Three parameters: "shared" (every rank uses it), "rank1_only" (only
// rank 1's loss reaches it) and "never". Under UnusedParameters::skip, with
// plain data parallelism and with ZeRO-1 on two ranks, rank1_only steps on
// both ranks identically, as one rank with both micro-batches steps it,
// "never" stays bitwise unchanged, and every rank keeps the same
// per-parameter step counts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/dist/reducer.h"
#include "accrue/optim/window.h"
#include "tests/dist/host_world.h"
#include "tests/dist/unused_parameters_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using host::HostCommunicator;
using host::HostWorld;

using unused::input;
using unused::kWindows;
using unused::Result;

Result train(int world, bool zero1, int rank, Communicator* comm) {
  return unused::train(world, zero1, rank, comm, Device::cpu(), DType::f64);
}

std::vector<Result> on_two_ranks(bool zero1) {
  HostWorld world(2);
  std::vector<Result> out(2);
  host::on_ranks(2, [&](int r) {
    HostCommunicator comm(world, r);
    out[static_cast<size_t>(r)] = train(2, zero1, r, &comm);
  });
  return out;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

TEST(HostWorld, a_parameter_used_on_one_rank_only_is_stepped_under_skip_on_every_rank) {
  const Result single = train(1, false, 0, nullptr);
  EXPECT_EQ(single.steps, (std::vector<int64_t>{kWindows, kWindows, 0}));
  for (bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "zero1" : "plain");
    const std::vector<Result> ranks = on_two_ranks(zero1);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r].steps, (std::vector<int64_t>{kWindows, kWindows, 0})) << "rank " << r;
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(ranks[r].params[i], ranks[0].params[i]) << "rank " << r << " param " << i;
        EXPECT_LE(max_rel(ranks[r].params[i], single.params[i]), 1e-12)
            << "rank " << r << " param " << i;
      }
    }
    // rank1_only moved on rank 0 too, though rank 0 never wrote its slot.
    EXPECT_NE(ranks[0].params[1], input(100, 0, 1).to_vector<double>());
  }
}

}  // namespace
}  // namespace accrue::dist
