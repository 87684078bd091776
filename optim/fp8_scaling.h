// The window state of FP8 delayed scaling: a scale, its inverse, the
// window's running amax and an amax history per tensor that an FP8 layer
// casts (its input x and its output gradient dy), on the device.
//
//   store.keep_fp8_copies(weights);
//   store.keep_fp8_delayed_scaling(weights, optim::Fp8DelayedOptions().history(16));
//   optim::Window window(store, optimizer, options);  // its close updates the scales
//
// Note [FP8 delayed scaling] (kernels/fp8.h) says what the kernels compute;
// here is who holds what:
//  - one row of f32 [3 + H] per tensor, the x rows in one state tensor and
//    the dy rows in another (their dtypes' ranges differ), made once, so the
//    layers' views and the CUDA graphs that read them stay valid;
//  - fp8_linear finds its weight's rows through the weight's owner
//    (ParameterOwner::fp8_scaling) and casts with them (autograd/ops_fp8.cpp);
//  - the first window has no scales yet: its layers cast with current
//    scaling and merge each amax into the rows, and the Window counts as
//    calibrating (its micro-steps run eagerly under GraphedWindow), as for
//    the loss scale's calibration (Note [Scale calibration]);
//  - every close runs the stage "fp8 scaling": update() pushes each window
//    amax onto its history and makes the next window's scales;
//  - the state tensors are part of the window checkpoint, and a resumed run
//    is calibrated when the checkpoint is past its first close.
//  - under data parallelism the close makes the window amaxes the ranks' max
//    before the update (GradientSync::all_reduce_max, one small collective),
//    so every rank keeps the same scales and the ranks stay bitwise equal; a
//    NaN amax goes as infinity (a max over ranks may drop a NaN), which the
//    update treats the same: a skipped window.
//  - a cast shared by several layers (fp8_input, Note [FP8 shared input]:
//    Llama's q/k/v and gate/up) takes the first layer's x row.
// Not built: the block recipe, whose scales are per tile and current.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accrue/autograd/fp8_ops.h"
#include "accrue/core/tensor.h"

namespace accrue::optim {

class Fp8DelayedOptions {
 public:
  // The length of each tensor's amax history, in windows (1: the last window's amax).
  Fp8DelayedOptions& history(int h) {
    history_ = h;
    return *this;
  }
  // scale = max / amax / 2^margin, margin in [0, 6] (Note [FP8 scaling]).
  Fp8DelayedOptions& margin(int m) {
    margin_ = m;
    return *this;
  }
  // The codes' dtypes of x and of dy, as the layers' Fp8LinearOptions.
  Fp8DelayedOptions& dtypes(DType x, DType dy) {
    x_dtype_ = x;
    dy_dtype_ = dy;
    return *this;
  }
  int history() const { return history_; }
  int margin() const { return margin_; }
  DType x_dtype() const { return x_dtype_; }
  DType dy_dtype() const { return dy_dtype_; }

 private:
  int history_ = 16;
  int margin_ = 0;
  DType x_dtype_ = DType::f8e4m3, dy_dtype_ = DType::f8e5m2;
};

class Fp8DelayedScaling {
 public:
  // One layer per (slot, name): the store's slot of its weight, named in errors.
  Fp8DelayedScaling(const std::vector<std::pair<size_t, std::string>>& layers,
                    const Fp8DelayedOptions& options, Device device);
  Fp8DelayedScaling(const Fp8DelayedScaling&) = delete;
  Fp8DelayedScaling& operator=(const Fp8DelayedScaling&) = delete;

  // The rows of the layer whose weight is slot `slot`, or nullptr.
  const Fp8DelayedRows* find(size_t slot) const;
  // The close: every window amax onto its history, the next scales from it.
  // With a world of ranks, `max_over_ranks` first makes the state every rank's
  // max (the scales and histories are equal on every rank already, so only
  // the window amaxes change): the ranks keep equal scales.
  void update(const std::function<void(const Tensor&)>& max_over_ranks = {});
  bool calibrated() const { return calibrated_; }
  // After a checkpoint is loaded: whether it was taken past the first close.
  void set_calibrated(bool c) { calibrated_ = c; }
  // The state tensors, f32 [layers, 3 + H]: x's rows and dy's.
  const Tensor& x_state() const { return x_state_; }
  const Tensor& dy_state() const { return dy_state_; }
  const Fp8DelayedOptions& options() const { return options_; }
  int64_t bytes() const;

 private:
  Fp8DelayedOptions options_;
  Tensor x_state_, dy_state_;
  std::vector<size_t> slots_;
  std::vector<Fp8DelayedRows> rows_;
  bool calibrated_ = false;
};

}  // namespace accrue::optim
