// SyncBatchNorm (nn::BatchNormOptions::sync) on a world of ranks as threads
// with the host communicator, in f64: W ranks with micro-batches b each equal
// one rank with their concatenation (W b): outputs, input gradients, the
// parameter gradients summed over ranks (what the reducer sums), and the
// running statistics in both modes.
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/dist/statistics_sync.h"
#include "accrue/nn/batch_norm.h"
#include "tests/dist/host_world.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

constexpr int64_t kChannels = 3;

Tensor concat(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts)
    rows += p.size(0);
  Shape shape = parts[0].shape();
  shape[0] = rows;
  Tensor out = empty(shape, parts[0].dtype());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    out.narrow(0, at, p.size(0)).copy_(p);
    at += p.size(0);
  }
  return out;
}

struct RankResult {
  Tensor y, dx, dweight, dbias, running_mean, running_var;
};

// One BatchNorm's training forward and backward of sum(y * g), with the
// weight and bias set to fixed values; `sync` null for the single rank.
RankResult run(const Tensor& x_in, const Tensor& g, nn::BatchNormStatistics mode,
               StatisticsSync* sync) {
  nn::BatchNormOptions o;
  o.statistics = mode;
  o.sync = sync;
  nn::BatchNorm bn(kChannels, {Device::cpu(), DType::f64, nullptr}, o);
  {
    NoGradGuard no_grad;
    bn.named_parameters()[0].tensor.copy_(from_vector<double>({0.5, 1.5, -2.0}, {kChannels}));
    bn.named_parameters()[1].tensor.copy_(from_vector<double>({0.1, -0.3, 0.7}, {kChannels}));
  }
  const Tensor x = requires_grad_(x_in.clone());
  const Tensor y = bn.forward(x);
  backward(sum(y * g));
  bn.on_window_close();  // Window mode moves its statistics here; PerMicroBatch already has
  return {detach(y),
          grad(x),
          grad(bn.named_parameters()[0].tensor),
          grad(bn.named_parameters()[1].tensor),
          bn.running_mean().clone(),
          bn.running_var().clone()};
}

void two_ranks_equal_one_with_the_concatenated_batch(nn::BatchNormStatistics mode, int world) {
  std::vector<Tensor> xs, gs;
  for (int r = 0; r < world; ++r) {  // different sizes, scales and offsets per rank
    xs.push_back(test::random_normal({2 + r, kChannels, 3, 2}, DType::f64, Device::cpu(), 1.0 + r) +
                 0.5 * r);
    gs.push_back(test::random_normal({2 + r, kChannels, 3, 2}, DType::f64));
  }
  const RankResult whole = run(concat(xs), concat(gs), mode, nullptr);

  host::HostWorld host(world);
  std::vector<RankResult> ranks(static_cast<size_t>(world));
  host::on_ranks(world, [&](int r) {
    host::HostCommunicator comm(host, r);
    CommunicatorStatisticsSync sync(comm);
    ranks[static_cast<size_t>(r)] =
        run(xs[static_cast<size_t>(r)], gs[static_cast<size_t>(r)], mode, &sync);
  });

  int64_t at = 0;
  Tensor dweight = zeros({kChannels}, DType::f64), dbias = zeros({kChannels}, DType::f64);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankResult& mine = ranks[static_cast<size_t>(r)];
    const int64_t rows = xs[static_cast<size_t>(r)].size(0);
    EXPECT_LE(test::relative_error(mine.y, whole.y.narrow(0, at, rows).contiguous()), 1e-12);
    EXPECT_LE(test::relative_error(mine.dx, whole.dx.narrow(0, at, rows).contiguous()), 1e-12);
    EXPECT_LE(test::relative_error(mine.running_mean, whole.running_mean), 1e-12);
    EXPECT_LE(test::relative_error(mine.running_var, whole.running_var), 1e-12);
    dweight = dweight + mine.dweight;
    dbias = dbias + mine.dbias;
    at += rows;
  }
  EXPECT_LE(test::relative_error(dweight, whole.dweight), 1e-12);
  EXPECT_LE(test::relative_error(dbias, whole.dbias), 1e-12);
  // Without sync, each rank normalizes alone: a measurable difference.
  const RankResult alone = run(xs[0], gs[0], mode, nullptr);
  EXPECT_GT(test::relative_error(alone.y, whole.y.narrow(0, 0, xs[0].size(0)).contiguous()), 1e-3);
}

TEST(SyncBatchNorm, ranks_equal_one_rank_with_the_concatenated_batch_per_micro_batch) {
  two_ranks_equal_one_with_the_concatenated_batch(nn::BatchNormStatistics::PerMicroBatch, 2);
}

TEST(SyncBatchNorm, ranks_equal_one_rank_with_the_concatenated_batch_window_mode) {
  two_ranks_equal_one_with_the_concatenated_batch(nn::BatchNormStatistics::Window, 2);
  two_ranks_equal_one_with_the_concatenated_batch(nn::BatchNormStatistics::Window, 3);
}

}  // namespace
}  // namespace accrue::dist
