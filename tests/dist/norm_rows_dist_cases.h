// Note [Norm under the backward] under data parallelism, exercised through a
// Window and a Reducer on one rank of a world: shared by the host-world CPU
// test (norm_rows_dist_test.cpp) and the two-GPU one (multi_gpu_test.cpp).
// Every rank runs two replicas of one model side by side, the norm rows
// computed as the buckets are reduced and at the close, and they must agree
// bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/dist/reducer.h"
#include "accrue/kernels/window_close.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/optim/norm_rows_cases.h"
#include "tests/test_util.h"

namespace accrue::test {

// BranchRun's model and window (tests/optim/norm_rows_cases.h) with a
// Reducer. The branch registers first, so its slots are the end
// of the bucket plan (Note [Buckets]): when the last micro-step skips it, its
// buckets (the last ones) go at the close and the main's during the backward.
struct DistBranchRun {
  DistBranchRun(Device device, dist::Communicator& comm, bool zero1, bool under_backward,
                std::optional<DType> transport)
      : gen(5),
        branch({64, 96, 10}, {device, DType::f32, &gen}),
        main({64, 256, 256, 10}, {device, DType::f32, &gen}),
        opt(optim::AdamWOptions(1e-3).weight_decay(0.1)),
        arena(params(), optim::ParamStoreOptions().device(device)),
        reducer(arena, comm, reducer_options(zero1, transport)),
        window(arena, opt, branch_window_options(under_backward), &reducer),
        device_(device),
        rank_(comm.rank()) {}

  static dist::ReducerOptions reducer_options(bool zero1, std::optional<DType> transport) {
    dist::ReducerOptions o;
    o.buckets.first_bucket_bytes = 16 << 10;  // several buckets, each a few rows
    o.buckets.bucket_bytes = 128 << 10;
    o.zero1 = zero1;
    o.transport = transport;
    return o;
  }
  std::vector<Tensor> params() const { return parameters_of(branch, main); }
  // One window on this rank's data; with use_branch_last the branch reaches
  // the last micro-step too.
  void train_window(uint64_t seed, bool use_branch_last) {
    train_branch_window(window, main, branch, device_, seed * 16 + static_cast<uint64_t>(rank_),
                        use_branch_last);
  }

  Generator gen;
  nn::MLP branch, main;
  optim::Optimizer opt;
  optim::ParamStore arena;
  dist::Reducer reducer;
  optim::Window window;

 private:
  Device device_;
  int rank_;
};

// The rows computed as the buckets' reductions are issued give bitwise the
// close-time pass's state, weights and moments, on every rank. With every
// parameter in the last micro-step the close computes no row; without the
// branch it computes the branch's rows and some, not all. A 16-bit
// transport keeps every row at the close and still agrees.
inline void dist_norm_rows_under_the_backward_match_a_close_time_pass(
    Device device, dist::Communicator& comm, bool zero1, std::optional<DType> transport) {
  DistBranchRun early(device, comm, zero1, true, transport);
  DistBranchRun late(device, comm, zero1, false, transport);
  const int64_t rows = late.window.norm_rows_at_last_close();
  int64_t left = 0;
  for (uint64_t w = 0; w < 4; ++w) {
    const bool use_branch_last = w % 2 == 1;
    early.train_window(100 + w, use_branch_last);
    late.train_window(100 + w, use_branch_last);
    SCOPED_TRACE("window " + std::to_string(w));
    expect_same_steps(early.window, early.arena, late.window, late.arena);
    const int64_t at_close = early.window.norm_rows_at_last_close();
    if (transport) {
      EXPECT_EQ(at_close, rows) << "a 16-bit transport keeps the pass at the close";
    } else if (use_branch_last) {
      EXPECT_EQ(at_close, 0);
    } else {
      left = at_close;
      EXPECT_GT(left, 0);
      EXPECT_LT(left, rows);
    }
  }
  std::printf(
      "[norm rows, rank %d, %s%s%s] %lld rows; without the branch in the last "
      "micro-step %lld of them wait for the close\n",
      comm.rank(), device.str().c_str(), zero1 ? ", zero1" : "",
      transport ? ", 16-bit transport" : "", static_cast<long long>(rows),
      static_cast<long long>(transport ? rows : left));
}

}  // namespace accrue::test
