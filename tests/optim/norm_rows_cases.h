// Note [Norm under the backward] exercised through a Window on one device:
// shared by the CPU test (norm_rows_test.cpp) and the CUDA one
// (gpu_norm_rows_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/kernels/window_close.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue::test {

// One window of K = 3 micro-steps on `seed`'s data: the main MLP in every
// micro-step, the branch added in the first one and, with use_branch_last,
// in the last one too.
inline void train_branch_window(optim::Window& window, const nn::MLP& main, const nn::MLP& branch,
                                Device device, uint64_t seed, bool use_branch_last) {
  Generator data(seed);
  for (int64_t k = 0; k < 3; ++k) {
    Tensor x = randn({8, 64}, DType::f32, device, &data);
    Tensor y = randint(0, 10, {8}, DType::i64, device, &data);
    Tensor logits = main.forward(x);
    if (k == 0 || (k == 2 && use_branch_last)) logits = logits + branch.forward(x);
    window.backward(cross_entropy(logits, y));
  }
  window.close();
}

// K = 3, clipping at 0.5 and a dynamic scaler.
inline optim::WindowOptions branch_window_options(bool under_backward) {
  return optim::WindowOptions()
      .micro_steps(3)
      .max_grad_norm(0.5)
      .scaler(optim::LossScalerOptions::dynamic().init_scale(1024.0))
      .norm_under_backward(under_backward);
}

// first's parameters, then second's: the registration order.
inline std::vector<Tensor> parameters_of(const nn::MLP& first, const nn::MLP& second) {
  std::vector<Tensor> p = first.parameters();
  for (const Tensor& t : second.parameters())
    p.push_back(t);
  return p;
}

// Two runs' window state, weights and moments are the same bits.
inline void expect_same_steps(const optim::Window& a, const optim::ParamStore& a_arena,
                              const optim::Window& b, const optim::ParamStore& b_arena) {
  EXPECT_TRUE(all_equal(a.state(), b.state()));
  EXPECT_TRUE(all_equal(a_arena.master(), b_arena.master()));
  EXPECT_TRUE(all_equal(a_arena.moment(0), b_arena.moment(0)));
  EXPECT_TRUE(all_equal(a_arena.moment(1), b_arena.moment(1)));
}

// A main MLP used by every micro-step and a branch used by the first
// micro-step of each window only, so that the last micro-step leaves the
// branch's rows for the close. AdamW, clipping, a dynamic scaler, K = 3.
struct BranchRun {
  BranchRun(Device device, bool under_backward)
      : gen(5),
        main({64, 256, 256, 10}, {device, DType::f32, &gen}),
        branch({64, 96, 10}, {device, DType::f32, &gen}),
        opt(optim::AdamWOptions(1e-3).weight_decay(0.1)),
        arena(params(), optim::ParamStoreOptions().device(device)),
        window(arena, opt, branch_window_options(under_backward)),
        device_(device) {}

  std::vector<Tensor> params() const { return parameters_of(main, branch); }
  // One window; with use_branch_last the branch reaches the last micro-step too.
  void train_window(uint64_t seed, bool use_branch_last) {
    train_branch_window(window, main, branch, device_, seed, use_branch_last);
  }

  Generator gen;
  nn::MLP main, branch;
  optim::Optimizer opt;
  optim::ParamStore arena;
  optim::Window window;

 private:
  Device device_;
};

// The norm rows computed under the backward give bitwise the close-time
// pass's state, weights and moments; the close computes only the branch's
// rows when the branch sits out the last micro-step, and none when it does not.
inline void norm_rows_under_the_backward_match_a_close_time_pass(Device device) {
  BranchRun early(device, true), late(device, false);
  const int64_t rows = kernels::norm_partials_rows(early.arena.grads());
  int64_t left = 0;
  for (uint64_t w = 0; w < 4; ++w) {
    const bool use_branch_last = w % 2 == 1;
    early.train_window(100 + w, use_branch_last);
    late.train_window(100 + w, use_branch_last);
    SCOPED_TRACE("window " + std::to_string(w));
    expect_same_steps(early.window, early.arena, late.window, late.arena);
    EXPECT_EQ(late.window.norm_rows_at_last_close(), rows);
    if (use_branch_last) {
      EXPECT_EQ(early.window.norm_rows_at_last_close(), 0);
    } else {
      left = early.window.norm_rows_at_last_close();
      EXPECT_GT(left, 0);
      EXPECT_LT(left, rows);
    }
  }
  std::printf(
      "[norm rows] %s: %lld rows; a window whose last micro-step skips the branch "
      "leaves %lld of them for the close\n",
      device.str().c_str(), static_cast<long long>(rows), static_cast<long long>(left));
}

}  // namespace accrue::test
