// The FP8 data-parallel run that tests/dist/fp8_dist_test.cpp (on the CPU) and
// gpu_fp8_dist_test.cpp (two ranks sharing one GPU) check: an MLP whose layers
// run fp8_linear (Note [FP8 linear]) with the weights' FP8 copies kept by each
// rank's store (Note [Window FP8 weights]), trained over kWindows windows of
// kGlobalMicro micro-batches split among the ranks, on a host world
// (tests/dist/host_world.h).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/dist/reducer.h"
#include "accrue/nn/module.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue::dist::fp8_run {

constexpr int64_t kRows = 16, kWindows = 3, kGlobalMicro = 4;

struct Result {
  std::vector<double> params;
  std::vector<double> losses;
  std::vector<float> fp8_state;  // delayed scaling's x rows, then dy's
};

// Window w's global micro-batch m: inputs [kRows, 32], targets [kRows].
inline std::pair<Tensor, Tensor> micro_batch(int64_t w, int64_t m) {
  Generator gen(static_cast<uint64_t>(100 + w * kGlobalMicro + m));
  Tensor x = randn({kRows, 32}, DType::f32, Device::cpu(), &gen);
  std::vector<int64_t> y(kRows);
  for (int64_t i = 0; i < kRows; ++i)
    y[static_cast<size_t>(i)] = (w * 7 + m * 3 + i * 5) % 16;
  return {x, from_vector<int64_t>(y, {kRows})};
}

struct RunOptions {
  bool zero1 = false;
  bool delayed = false;  // Note [FP8 delayed scaling], a history of 2
  // The store's compute dtype; with bf16 the FP8 codes live in the compute
  // slots (Note [FP8 codes in the compute slots]) until ZeRO-1 shards the
  // master and moves them out.
  DType compute = DType::f32;
  Device device = Device::cpu();
};

// Rank `rank` of `world` (comm null: one process of the whole batch).
inline Result train(int world, int rank, Communicator* comm, const RunOptions& o) {
  Generator init(3 + static_cast<uint64_t>(rank));  // ranks start apart: the broadcast fixes it
  nn::MLP model({32, 64, 16}, {Device::cpu(), DType::f32, &init});
  model.to(o.device);
  const std::vector<Tensor> fp8 = nn::use_fp8(model);
  optim::Optimizer opt(optim::AdamWOptions(1e-2).weight_decay(0.1));
  optim::ParamStore store(model.named_parameters(), optim::ParamStoreOptions()
                                                        .device(o.device)
                                                        .moments(opt.moments_needed())
                                                        .compute_dtype(o.compute)
                                                        .shard_ranks(o.zero1 ? world : 1));
  store.keep_fp8_copies(fp8);
  EXPECT_EQ(store.memory().fp8_in_compute, o.compute == DType::bf16);
  if (o.delayed) store.keep_fp8_delayed_scaling(fp8, optim::Fp8DelayedOptions().history(2));
  std::unique_ptr<Reducer> reducer;
  if (comm) {
    ReducerOptions ro;
    ro.buckets.first_bucket_bytes = 2048;
    ro.buckets.bucket_bytes = 8192;
    ro.zero1 = o.zero1;
    reducer = std::make_unique<Reducer>(store, *comm, ro);
    reducer->broadcast_parameters(0);
  }
  const bool sharded =
      comm && o.zero1 && o.compute == DType::bf16;  // the master, and the codes out
  EXPECT_EQ(store.master_sharded(), sharded);
  EXPECT_EQ(store.memory().fp8_in_compute, o.compute == DType::bf16 && !sharded);
  const int64_t K = kGlobalMicro / world;
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(K).max_grad_norm(1.0),
                       reducer.get());
  Result r;
  for (int64_t w = 0; w < kWindows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      const auto [x, y] = micro_batch(w, rank * K + k);
      window.backward(cross_entropy(model.forward(x.to(o.device).to(o.compute)), y.to(o.device)));
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

}  // namespace accrue::dist::fp8_run
