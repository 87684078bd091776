// The accumulation verifier (accrue_verify): K micro-batches against one
// large batch, window by window, PASS or FAIL.
//
// Note [Accumulation verifier]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A training loop accumulates correctly when K micro-batches of b items give
// the update of one batch of K b items. verify_accumulation builds the user's
// setup twice from the same factory (so the same seed and weights): once for
// K micro-steps per window, once for one, feeds both the same global batches
// (the K run takes items [k b, (k + 1) b) in micro-step k), and after every
// window compares the flat parameters: max |a - b| / max |b|. Within the
// tolerance (by dtype: 1e-10 for f64, 1e-5 for f32 with TF32 off) at every
// window is PASS. The loop under test is the factory's: the Window, or a
// hand-written loop, so that the classic mistakes show up as FAIL (mean of
// per-micro-batch means over padded batches, clipping per micro-batch, a loss
// normalized twice, gradients zeroed every micro-step;
// tests/optim/verify_test.cpp plants each).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accrue/core/dtype.h"

namespace accrue::optim {

// One training setup, built for a number of micro-steps per window.
class VerifyRun {
 public:
  virtual ~VerifyRun() = default;
  // Forward and backward of items [begin, end) of window `window`'s global batch.
  virtual void micro_step(int64_t window, int64_t begin, int64_t end) = 0;
  // The window's update.
  virtual void close() = 0;
  // Every parameter, flattened in a fixed order, as f64 on the host.
  virtual std::vector<double> parameters() const = 0;
};

// Builds a VerifyRun for `micro_steps` micro-steps per window, from the same
// seed every time.
using VerifyFactory = std::function<std::unique_ptr<VerifyRun>(int64_t micro_steps)>;

struct VerifyOptions {
  int64_t windows = 5;
  int64_t micro_steps = 4;  // K
  int64_t batch = 16;       // items per window, K b
  double tolerance = 1e-10;
  // The tolerance for runs in `dtype`: 1e-10 (f64), 1e-5 (f32, TF32 off), 2e-2 (bf16/f16).
  static double tolerance_for(DType dtype);
};

struct VerifyReport {
  std::vector<double> parameter_error;  // per window, max |a - b| / max |b|
  double tolerance = 0.0;
  int64_t micro_steps = 0;
  bool passed = false;
  // One line per window, then PASS or FAIL.
  std::string table() const;
};

VerifyReport verify_accumulation(const VerifyFactory& make, const VerifyOptions& options);

}  // namespace accrue::optim
