// The training run of Note [Unused parameters] under data parallelism, shared
// by the host-world test (unused_parameters_dist_test.cpp, f64 on the CPU) and
// the NCCL test (multi_gpu_test.cpp, f32 on GPUs). Three parameters:
// "shared" (every rank's loss reaches it), "rank1_only" (only rank 1's) and
// "never" (nobody's), trained under UnusedParameters::skip.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/dist/reducer.h"
#include "accrue/optim/window.h"

namespace accrue::dist::unused {

constexpr int64_t kWindows = 4, kNumel = 8;

// Rank r's inputs of window w: deterministic, different per rank and window.
inline Tensor input(int64_t w, int rank, double shift, Device device = Device::cpu(),
                    DType dtype = DType::f64) {
  std::vector<double> v(kNumel);
  for (int64_t i = 0; i < kNumel; ++i)
    v[i] = std::sin(0.7 * static_cast<double>(i + 1) + 1.3 * static_cast<double>(w) + 0.5 * rank +
                    shift);
  return from_vector(v, {kNumel}, dtype, device);
}

struct Result {
  std::vector<std::vector<double>> params;  // per parameter, after the last window
  std::vector<int64_t> steps;
};

inline std::vector<double> host_values(const Tensor& t) {
  return t.contiguous().to(Device::cpu()).to(DType::f64).to_vector<double>();
}

// `world` ranks through `comm` (world 1, comm null: one rank with both
// micro-batches, K = 2). Checks that "never" stays bitwise unchanged.
inline Result train(int world, bool zero1, int rank, Communicator* comm, Device device,
                    DType dtype) {
  std::vector<Tensor> params;
  for (int i = 0; i < 3; ++i) {
    Tensor p = input(100, 0, i, device, dtype);
    requires_grad_(p);
    params.push_back(p);
  }
  const auto ao = optim::ParamStoreOptions().device(device).master_dtype(dtype);
  optim::ParamStore arena({{"shared", params[0]}, {"rank1_only", params[1]}, {"never", params[2]}},
                          ao);
  std::unique_ptr<Reducer> reducer;
  if (comm) {
    ReducerOptions ro;
    ro.zero1 = zero1;
    reducer = std::make_unique<Reducer>(arena, *comm, ro);
  }
  optim::Optimizer opt(optim::AdamWOptions(0.05).weight_decay(0.1));
  const int64_t K = world == 1 ? 2 : 1;
  optim::Window window(
      arena, opt,
      optim::WindowOptions().micro_steps(K).unused_parameters(optim::UnusedParameters::skip),
      reducer.get());
  const Tensor never_before = arena.master_view(2).contiguous().to(Device::cpu());
  for (int64_t w = 0; w < kWindows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      const int who = world == 1 ? static_cast<int>(k) : rank;  // the rank whose data this is
      Loss loss{sum(mul(params[0], input(w, who, 0.0, device, dtype))),
                full({}, 1.0, DType::i64, device)};
      if (who == 1)
        loss.sum =
            add(loss.sum, sum(mul(mul(params[1], params[1]), input(w, who, 1, device, dtype))));
      window.backward(loss);
    }
    window.close();
  }
  const Tensor never_after = arena.master_view(2).contiguous().to(Device::cpu());
  EXPECT_EQ(std::memcmp(never_after.data_ptr(), never_before.data_ptr(), never_before.nbytes()), 0)
      << "'never' must stay bitwise unchanged";
  Result r;
  for (size_t i = 0; i < 3; ++i)
    r.params.push_back(host_values(arena.master_view(i)));
  r.steps = window.parameter_steps();
  return r;
}

}  // namespace accrue::dist::unused
