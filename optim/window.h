// Window: K micro-batches, one optimizer step — the accumulation story.
//
//   optim::Window window(arena, optimizer, optim::WindowOptions().micro_steps(8)
//                                              .max_grad_norm(1.0)
//                                              .scaler(optim::LossScalerOptions::dynamic()));
//   for (each micro-batch) {
//     window.backward(cross_entropy(model.forward(x), y));
//     if (window.ready()) window.close();
//   }
//
// backward() seeds each micro-batch's backward with the loss scale only and
// counts its items on the device; gradients land in the arena by Note
// [Overwrite first]. close() runs Note [Window close]. Nothing inside a window
// synchronizes the host: report() does, when asked.
#pragma once

#include <map>
#include <string>

#include "autograd/grad_arena.h"
#include "autograd/ops.h"
#include "optim/gradient_sync.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace accrue::optim {

class WindowOptions {
 public:
  WindowOptions& micro_steps(int64_t k) {
    micro_steps_ = k;
    return *this;
  }
  WindowOptions& normalization(kernels::Normalization n) {
    normalization_ = n;
    return *this;
  }
  // Global L2-norm clipping of the window's gradient; <= 0 turns it off.
  WindowOptions& max_grad_norm(double v) {
    max_grad_norm_ = v;
    return *this;
  }
  WindowOptions& scaler(const LossScalerOptions& s) {
    scaler_ = s;
    return *this;
  }
  int64_t micro_steps() const { return micro_steps_; }
  kernels::Normalization normalization() const { return normalization_; }
  double max_grad_norm() const { return max_grad_norm_; }
  const LossScalerOptions& scaler() const { return scaler_; }

 private:
  int64_t micro_steps_ = 1;
  kernels::Normalization normalization_ = kernels::Normalization::ItemCount;
  double max_grad_norm_ = 0.0;
  LossScalerOptions scaler_ = LossScalerOptions::none();
};

// What the host learns about the last closed window (read with one synchronization).
struct WindowReport {
  int64_t window = 0;      // windows closed so far
  double loss = 0.0;       // summed loss / items of that window
  double items = 0.0;      // N
  double grad_norm = 0.0;  // unscaled, normalized, before clipping
  double clip_coef = 1.0;
  double loss_scale = 1.0;  // the scale for the next window
  bool skipped = false;
  int64_t skipped_windows = 0;
  int64_t optimizer_steps = 0;
};

class Window {
 public:
  Window(GradArena& arena, Optimizer& optimizer, const WindowOptions& options,
         GradientSync* sync = nullptr);

  // One micro-step: backward of loss.sum seeded with the loss scale (legacy
  // mode: scale / count), and N += count.
  void backward(const Loss& loss);
  bool ready() const { return micro_step_ == options_.micro_steps(); }
  // Note [Window close]; needs ready().
  void close();

  int64_t micro_step() const { return micro_step_; }
  int64_t windows_closed() const { return windows_; }
  WindowReport report() const;
  // The device state (kernels::WindowField layout).
  const Tensor& state() const { return state_; }

  // Everything a checkpoint needs to resume bit-exactly: master weights,
  // moments, the window state (scale, tracker, step) and the window count.
  // Under ZeRO-1 each rank's dict holds its own shard ("master" and the
  // moments packed over the owned ranges) and loading is collective: every
  // rank loads its own, then the parameters are gathered.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);
  // Under ZeRO-1 (Note [ZeRO-1]): this rank steps only the sync's owned ranges.
  bool sharded() const { return !ranges_.empty(); }

 private:
  Tensor field(int f) const;
  // The norm partials of the gradients this rank holds, into partials_.
  void norm_partials();
  // The owned ranges of a flat arena, packed in order, and back.
  Tensor pack_owned(const Tensor& flat) const;
  void unpack_owned(const Tensor& packed, const Tensor& flat) const;
  // The flat arena the forward reads: the compute copy, else the master.
  const Tensor& forward_params() const;

  GradArena& arena_;
  Optimizer& optimizer_;
  WindowOptions options_;
  GradientSync* sync_;
  kernels::CloseConfig close_config_;
  Tensor state_;                    // f64 [kWindowStateSize]
  std::vector<ArenaRange> ranges_;  // ZeRO-1: the sync's owned ranges; empty otherwise
  Tensor partials_;                 // the norm pass's output (ZeRO-1: every rank's, gathered)
  Tensor local_partials_;           // ZeRO-1: this rank's rows, one block per owned range
  Tensor loss_sum_;                 // f64 0-d, summed over the window's micro-steps
  Tensor last_;  // f64: the last window's state, this rank's loss sum and items, and N
  int64_t micro_step_ = 0;
  int64_t windows_ = 0;
};

}  // namespace accrue::optim
