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

#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/dist/reducer.h"
#include "accrue/nn/module.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/dist/host_world.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using host::HostCommunicator;
using host::HostWorld;

constexpr int64_t kRows = 16, kWindows = 3, kGlobalMicro = 4;

struct Result {
  std::vector<double> params;
  std::vector<double> losses;
  std::vector<float> fp8_state;  // delayed scaling's x rows, then dy's
};

// Window w's global micro-batch m: inputs [kRows, 32], targets [kRows].
std::pair<Tensor, Tensor> micro_batch(int64_t w, int64_t m) {
  Generator gen(static_cast<uint64_t>(100 + w * kGlobalMicro + m));
  Tensor x = randn({kRows, 32}, DType::f32, Device::cpu(), &gen);
  std::vector<int64_t> y(kRows);
  for (int64_t i = 0; i < kRows; ++i)
    y[static_cast<size_t>(i)] = (w * 7 + m * 3 + i * 5) % 16;
  return {x, from_vector<int64_t>(y, {kRows})};
}

// compute: the store's compute dtype; with bf16 the FP8 codes live in the
// compute slots (Note [FP8 codes in the compute slots]) until ZeRO-1 shards
// the master and moves them out.
Result train(int world, int rank, Communicator* comm, bool zero1, bool delayed = false,
             DType compute = DType::f32) {
  Generator init(3 + static_cast<uint64_t>(rank));  // ranks start apart: the broadcast fixes it
  nn::MLP model({32, 64, 16}, {Device::cpu(), DType::f32, &init});
  const std::vector<Tensor> fp8 = nn::use_fp8(model);
  optim::Optimizer opt(optim::AdamWOptions(1e-2).weight_decay(0.1));
  optim::ParamStore store(model.named_parameters(), optim::ParamStoreOptions()
                                                        .moments(opt.moments_needed())
                                                        .compute_dtype(compute)
                                                        .shard_ranks(zero1 ? world : 1));
  store.keep_fp8_copies(fp8);
  EXPECT_EQ(store.memory().fp8_in_compute, compute == DType::bf16);
  if (delayed) store.keep_fp8_delayed_scaling(fp8, optim::Fp8DelayedOptions().history(2));
  std::unique_ptr<Reducer> reducer;
  if (comm) {
    ReducerOptions o;
    o.buckets.first_bucket_bytes = 2048;
    o.buckets.bucket_bytes = 8192;
    o.zero1 = zero1;
    reducer = std::make_unique<Reducer>(store, *comm, o);
    reducer->broadcast_parameters(0);
  }
  const bool sharded = comm && zero1 && compute == DType::bf16;  // the master, and the codes out
  EXPECT_EQ(store.master_sharded(), sharded);
  EXPECT_EQ(store.memory().fp8_in_compute, compute == DType::bf16 && !sharded);
  const int64_t K = kGlobalMicro / world;
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(K).max_grad_norm(1.0),
                       reducer.get());
  Result r;
  for (int64_t w = 0; w < kWindows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      const auto [x, y] = micro_batch(w, rank * K + k);
      window.backward(cross_entropy(model.forward(x.to(compute)), y));
    }
    window.close();
    r.losses.push_back(window.report().loss);
  }
  for (const nn::NamedParameter& p : model.named_parameters())
    for (double v : detach(p.tensor).to(DType::f64).to_vector<double>())
      r.params.push_back(v);
  if (const optim::Fp8DelayedScaling* s = store.fp8_delayed_scaling()) {
    for (const Tensor& state : {s->x_state(), s->dy_state()})
      for (float v : state.to_vector<float>())
        r.fp8_state.push_back(v);
  }
  return r;
}

TEST(HostWorldFp8, two_ranks_agree_bitwise_and_match_one_process) {
  for (bool delayed : {false, true})
    for (bool zero1 : {false, true}) {
      SCOPED_TRACE(std::string(zero1 ? "zero1" : "plain") + (delayed ? ", delayed scaling" : ""));
      const Result single = train(1, 0, nullptr, false, delayed);
      HostWorld world(2);
      std::vector<Result> ranks(2);
      host::on_ranks(2, [&](int r) {
        HostCommunicator comm(world, r);
        ranks[static_cast<size_t>(r)] = train(2, r, &comm, zero1, delayed);
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
    const Result single = train(1, 0, nullptr, false, false, DType::bf16);
    HostWorld world(2);
    std::vector<Result> ranks(2);
    host::on_ranks(2, [&](int r) {
      HostCommunicator comm(world, r);
      ranks[static_cast<size_t>(r)] = train(2, r, &comm, zero1, false, DType::bf16);
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
