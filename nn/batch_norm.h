// BatchNorm over the channel dim (dim 1) of [N, C] or [N, C, ...] inputs,
// with running statistics that can follow the accumulation window.
//
// Note [Window statistics]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// In training a BatchNorm normalizes each micro-batch with that micro-batch's
// own mean and (biased) variance, in every mode; the modes differ in how the
// running statistics used at inference are updated:
//  - PerMicroBatch (PyTorch's): after every forward, running = (1 - m) *
//    running + m * batch statistic (the variance unbiased), so a window of K
//    micro-batches moves them K times, each by a small sample's estimate;
//  - Window (the default): each forward merges its micro-batch's count, mean
//    and sum of squared deviations into pending statistics, exactly (Chan et
//    al.'s parallel formula: delta = mean_b - mean_a, n = n_a + n_b,
//    mean = mean_a + delta n_b / n, M2 = M2_a + M2_b + delta^2 n_a n_b / n),
//    and when the Window closes (WindowListener) the running statistics move
//    once, by the merged mean and M2 / (n - 1): what one forward of the whole
//    K x b batch would have done (tests/nn/batch_norm_test.cpp: within 1e-12
//    in f64).
// All of it is device arithmetic on tensors: no host synchronization. The
// pending statistics are buffers, so a mid-window checkpoint of the module's
// state dict carries them. A skipped window (Note [Skipped window]) still
// moves the running statistics: they describe the data under the weights the
// forward used, and a skipped window leaves those weights as they were (as
// PyTorch's forward updates them whatever the step does), unless they are
// not finite (Note [Non-finite window statistics]). A restarted window
// (Note [Out-of-memory retry]) drops the pending statistics with the
// micro-steps.
// Window mode lags: with one move by m per window, the running statistics
// average over about 1/m windows, K times as many weight updates' worth of
// micro-batches as PyTorch's 1/m forwards. Measured on a small ResNet
// (examples/resnet, bench/RESULTS.md), that lag costs more than the small
// samples' noise does; compound_momentum moves by 1 - (1 - m)^F instead, F
// the forwards merged, which keeps PyTorch's pace with exact statistics.
// (F is counted on the host, so a CUDA graph replay of the forwards would not
// count them.) Register the layer with Window::add_listener; without a Window
// (or one that never closes) Window mode never moves the running statistics.
// A forward that activation checkpointing recomputes in backward records its
// statistics a second time (as PyTorch's does): keep BatchNorm layers out of
// checkpointed blocks.
//
// Note [BatchNorm in f32]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A bf16/f16 input is widened to f32 for the statistics and the
// normalization (mean, centered values, variance, the division), and only the
// normalized values are rounded back to the input's dtype before the affine
// scale and shift, as group_norm does (autograd/conv_ops.h) and as cuDNN's
// batch norm keeps fp32 statistics. In the input's own 16-bit dtype the mean
// of a channel whose values sit far from 0 loses its low bits (bf16 keeps 8
// significant bits), and the running statistics inherit the error. Without
// sync the training forward is one node (accrue::batch_norm,
// Note [Fused batch norm] in autograd/ops_conv.cpp) that keeps only x and two
// [C] vectors for the backward; with sync the composed formula keeps the f32
// centered values, twice the bytes of the 16-bit activation.
#pragma once

#include <functional>
#include <vector>

#include "accrue/autograd/statistics_sync.h"
#include "accrue/autograd/window_listener.h"
#include "accrue/nn/module.h"

namespace accrue::nn {

enum class BatchNormStatistics { PerMicroBatch, Window };

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  BatchNormStatistics statistics = BatchNormStatistics::Window;
  // Window mode only: move by 1 - (1 - momentum)^F at a close that merged F
  // forwards, so that the running statistics forget at PyTorch's per-forward
  // pace while each move uses the exact merged statistics (Note [Window
  // statistics]). Off: one move by `momentum` per window.
  bool compound_momentum = false;
  // SyncBatchNorm: the normalization statistics of each training forward are
  // summed over the data-parallel ranks (autograd/statistics_sync.h), so
  // every rank normalizes with those of the whole global micro-batch, and
  // moves the same running statistics (with either mode above). Null: this
  // rank's micro-batch alone. Must outlive the layer's forwards and backwards.
  StatisticsSync* sync = nullptr;
};

class BatchNorm : public Module, public WindowListener {
 public:
  BatchNorm(int64_t channels, const ParamOptions& params, const BatchNormOptions& options = {});
  // Training: normalize with the batch's statistics (and record them, Note
  // [Window statistics]); eval: with the running statistics.
  Tensor forward(const Tensor& x);

  void on_window_close() override;
  // Window statistics are device arithmetic, but compound_momentum counts the
  // forwards on the host (Note [Window statistics]), which replays do not run,
  // and a statistics sync all-reduces from the host.
  const char* why_not_capturable() const override;
  void on_window_restart() override;
  // Note [Concurrent micro-batches]: inside a group of micro-steps in flight
  // each training forward keeps its statistics (two [C] vectors) and the
  // group's end records them in order (Note [Window statistics]).
  bool defers_group_writes() const override { return true; }
  void on_group_begin() override;
  void on_group_end() override;
  void on_group_abandon() override;

  // recompute_batch_norm_statistics' two halves: forwards in between merge
  // into the pending statistics whatever the mode; the end makes them the
  // running statistics (momentum 1) when `adopt`, drops them otherwise, and
  // restores the mode.
  void begin_recompute();
  void end_recompute(bool adopt);
  // Whether the statistics merged since the last adoption are finite (reads
  // them on the host): recompute_batch_norm_statistics refuses what Note
  // [Non-finite window statistics] would silently drop.
  bool pending_finite() const;

  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }

 private:
  // The statistics' dims of x: all but dim 1.
  std::vector<int64_t> reduce_dims(const Tensor& x) const;
  // running = (1 - m) running + m mean, and the same for var (already unbiased).
  void move_running(const Tensor& mean, const Tensor& unbiased_var);
  // The same move from the pending (merged) statistics, where any were
  // merged, then clears them: at a window's close (m = momentum) and at the
  // end of a recompute (m = 1).
  void adopt_pending(double momentum);

  int64_t channels_;
  BatchNormOptions options_;
  Tensor weight_, bias_;
  Tensor running_mean_, running_var_;                 // f64 buffers [C]
  Tensor pending_count_, pending_mean_, pending_m2_;  // Window mode: f64 [1], [C], [C]
  BatchNormStatistics saved_statistics_ = BatchNormStatistics::Window;  // during a recompute
  int64_t pending_forwards_ = 0;  // forwards merged since the last adoption (compound_momentum)
  // A training forward's statistics into the pending (Window) or running
  // (PerMicroBatch) ones: n values a channel, the biased variance.
  void record_statistics(const Tensor& mean, const Tensor& var, int64_t n);
  struct Kept {
    Tensor mean, var;
    int64_t n = 0;
  };
  bool in_group_ = false;
  std::vector<Kept> kept_;  // the group's forwards' statistics, in their order
};

// Precise BatchNorm statistics: re-estimates the running statistics of every
// BatchNorm in `model` from the forwards that run_batches() makes (the caller
// runs its batches through the model), with the parameters frozen and no
// graph: the statistics of all those batches merged exactly (Note [Window
// statistics]), replacing the running ones (momentum ignored). The model's
// train/eval mode and each layer's statistics mode are restored, also when a
// forward throws. A model without a BatchNorm is an error, and so are
// statistics that are not finite (a NaN or infinite input): the running
// statistics are then left as they were.
void recompute_batch_norm_statistics(Module& model, const std::function<void()>& run_batches);

}  // namespace accrue::nn
