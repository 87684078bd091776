// The window close as an ordered list of stages (Note [Close stages]).
//
// Note [Close stages]
// ~~~~~~~~~~~~~~~~~~~
// Window::close is the stages of Note [Window close], built once by
// make_close_stages from the window's options and run in order on the current
// stream, none of them reading anything back to the host:
//
//   stage            present                 reads               writes
//   unused flags     UnusedParameters::skip  written flags       used flags (max over ranks)
//   zero unwritten   always                  written flags       unwritten gradient slots
//   items            always                  N, loss sum         the report's local N, loss
//   reduce           a GradientSync          gradients, N        reduced gradients, N
//   norm             always                  gradients           norm partials (ZeRO-1: gathered)
//   scalar step      always                  partials, state     found_inf, norm, coef, scale, step
//   noise scale      noise_scale(every > 0)  state               noise EMAs
//   slot steps       UnusedParameters::skip  used flags, state   per-parameter step counts
//   optimizer step   always, or:             store, state        master, moments, compute copy
//   layer steps      close_under_forward     store, state        the same, beside the forward
//   calibration      first window, calibrate f16 maxima          the next window's scale
//   gather parameters  ZeRO-1                owned ranges        the forward's weights
//   fp8 weights      FP8 weight copies       forward weights     their FP8 copies
//   fp8 scaling      FP8 delayed scaling     the window's amaxes the next window's scales
//   report           always                  state, loss sum, N  the report; N, loss sum reset
//
// Layer steps: Note [Close under the forward] in optim/layer_steps.h.
//
// An optional feature is a stage that is present or absent, never a nullable
// member tested along the way; a stage that also acts during the micro-steps
// (the norm rows under the last backward, the noise scale's micro-step 0, the
// calibration's observer) does it through the backward hooks. The order is
// the one the eager loop always had, so every device operation is issued as
// before: results, graph replay and resume stay bitwise (the equivalence and
// golden suites, the graphed-window tests).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue/autograd/gradient_observer.h"
#include "accrue/kernels/window_close.h"
#include "accrue/optim/gradient_sync.h"
#include "accrue/optim/noise_scale.h"
#include "accrue/optim/norm_rows.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/scale_calibration.h"

namespace accrue::optim {

// Where the current micro-step is: its index in the window, the window's
// micro-step count and the windows closed before this one.
struct MicroStep {
  int64_t index = 0;
  int64_t micro_steps = 1;
  int64_t window = 0;
  bool last() const { return index + 1 == micro_steps; }
};

class CloseStage {
 public:
  virtual ~CloseStage() = default;
  virtual const char* name() const = 0;
  // What the stage reads and writes (the table of Note [Close stages]).
  virtual const char* reads() const = 0;
  virtual const char* writes() const = 0;
  // The stage's part of the close of window `window` (windows closed before it).
  virtual void run(int64_t window) = 0;
  // Around each micro-step's backward; abort_backward when that backward threw.
  virtual void before_backward(const MicroStep&) {}
  virtual void after_backward(const MicroStep&) {}
  virtual void abort_backward() {}
  // Why the micro-steps and the close cannot be replayed from CUDA graphs
  // while this stage is present (Note [Graphed window]), or null.
  virtual const char* why_not_capturable() const { return nullptr; }
  // Why the close alone cannot be (its micro-steps can), or null.
  virtual const char* why_close_not_capturable() const { return nullptr; }
};

// What the stages act on: the window's device state and its configuration.
// The Window owns one on the heap (it stays put when the Window moves) and
// builds it whole before make_close_stages; the stages keep a reference.
struct CloseContext {
  ParamStore* store = nullptr;
  Optimizer* optimizer = nullptr;
  GradientSync* sync = nullptr;    // null on one process
  std::vector<ArenaRange> ranges;  // ZeRO-1: the sync's owned ranges; empty otherwise
  kernels::CloseConfig config;
  Tensor state;           // f64 [kWindowStateSize]
  Tensor partials;        // the norm pass's rows (ZeRO-1: every rank's, gathered)
  Tensor local_partials;  // ZeRO-1: this rank's rows, one block per owned range
  Tensor loss_sum;        // f64 0-d, summed over the window's micro-steps
  // f64: the last window's state, then the world's loss sum, this rank's item
  // count, N, and this rank's loss sum (one process: the world is this rank).
  Tensor last;
  SlotTables slots;  // Note [Unused parameters]: defined under skip only
  // Note [Unused parameters]: f64 [slots], > 0 where any rank wrote the slot
  // this window; the check's flags under a sync (slots.used under skip).
  Tensor used_flags;

  static constexpr int kLastLoss = kernels::kWindowStateSize, kLastLocalItems = kLastLoss + 1,
                       kLastItems = kLastLoss + 2, kLastLocalLoss = kLastLoss + 3,
                       kLastSize = kLastLoss + 4;
  bool sharded() const { return !ranges.empty(); }
  // Field f of the state, a 0-d view.
  Tensor field(int f) const { return state.narrow(0, f, 1).reshape({}); }
};

// The features the options ask for, which decide the stages present.
struct CloseFeatures {
  bool skips_unused = false;
  // Note [Unused parameters]: keep the used flags' max over ranks for the check.
  bool checks_unused_world = false;
  bool norm_under_backward = false;
  int64_t noise_every = 0;
  double noise_ema = 0.95;
  bool calibrate = false;
  double calibration_scale = 1.0, calibration_margin = 1.0;
  bool fp8_copies = false;   // Note [Window FP8 weights]
  bool fp8_scaling = false;  // Note [FP8 delayed scaling]
  // Note [Close under the forward]: layer steps in place of the optimizer step.
  bool close_under_forward = false;
  int64_t close_layer_elements = 0;
  int64_t close_max_blocks = 0;
  bool close_steps_on_first_read = false;
};

// Note [Norm under the backward] or the plain pass: the norm partials of the
// gradients this rank holds.
class NormStage final : public CloseStage {
 public:
  NormStage(CloseContext& c, bool under_backward);
  const char* name() const override { return "norm"; }
  const char* reads() const override { return "gradients"; }
  const char* writes() const override { return "norm partials"; }
  void run(int64_t window) override;
  void before_backward(const MicroStep& m) override;
  void after_backward(const MicroStep& m) override;
  void abort_backward() override;
  const char* why_not_capturable() const override {
    return rows_ ? "norm_under_backward launches its norm rows from host hooks" : nullptr;
  }
  // The rows the last close still had to compute.
  int64_t rows_at_last_close() const;

 private:
  CloseContext& c_;
  // Shared with the grad-ready hooks, which hold it weakly (hooks cannot be
  // unregistered); null when the pass runs at close.
  std::shared_ptr<NormRowTracker> rows_;
};

// Note [Gradient noise scale].
class NoiseScaleStage final : public CloseStage {
 public:
  NoiseScaleStage(CloseContext& c, int64_t every, double ema);
  const char* name() const override { return "noise scale"; }
  const char* reads() const override { return "state"; }
  const char* writes() const override { return "noise EMAs"; }
  void run(int64_t window) override;
  void after_backward(const MicroStep& m) override;
  const char* why_not_capturable() const override {
    return "the noise scale decides on the host which windows it measures";
  }
  double ema() const { return noise_.ema(); }

 private:
  CloseContext& c_;
  NoiseScale noise_;
};

// Note [Scale calibration]: present until the first close, then spent.
class CalibrationStage final : public CloseStage {
 public:
  CalibrationStage(CloseContext& c, double scale, double margin);
  const char* name() const override { return "calibration"; }
  const char* reads() const override { return "observed f16 maxima"; }
  const char* writes() const override { return "the next window's scale"; }
  void run(int64_t window) override;
  void before_backward(const MicroStep& m) override;
  void after_backward(const MicroStep& m) override;
  void abort_backward() override { observe_.reset(); }
  // True until the first close (or a checkpoint that carries the scale).
  bool active() const { return calibration_ != nullptr; }
  void spend() { calibration_.reset(); }

 private:
  CloseContext& c_;
  double scale_, margin_;
  std::unique_ptr<ScaleCalibration> calibration_;
  std::optional<autograd::GradientObserverScope> observe_;
};

// The stages for these features, in the order of Note [Close stages].
std::vector<std::unique_ptr<CloseStage>> make_close_stages(CloseContext& c,
                                                           const CloseFeatures& features);

// "zero unwritten, items, norm, ...": the stages' names in order.
std::string describe_stages(const std::vector<std::unique_ptr<CloseStage>>& stages);

}  // namespace accrue::optim
