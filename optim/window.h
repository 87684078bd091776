// Window: K micro-batches, one optimizer step — the accumulation story.
//
//   optim::Window window(store, optimizer, optim::WindowOptions().micro_steps(8)
//                                              .max_grad_norm(1.0)
//                                              .scaler(optim::LossScalerOptions::dynamic()));
//   for (each micro-batch) {
//     window.backward(cross_entropy(model.forward(x), y));
//     if (window.ready()) window.close();
//   }
//
// backward() seeds each micro-batch's backward with the loss scale only and
// counts its items on the device; gradients land in the store's gradient
// arena by Note [Overwrite first]. close() runs Note [Window close]. The Window itself never
// synchronizes the host: report() does, when asked. While it lives, the index
// checks of embedding, cross-entropy and the fused classifier on its device
// are deferred to it (Note [Deferred index checks]): a bad index skips the
// window on the device, and report() or check() throws the error.
//
// Note [Normalization]
// ~~~~~~~~~~~~~~~~~~~~
// Losses return sum and count (Note [Losses return sum and count]), and the
// window divides by its item count once, at close. backward() seeds each
// micro-batch's backward of loss.sum with the loss scale alone and adds
// loss.count to state[kItems] on the device (f64: exact). Under data
// parallelism the reducer sums that count over ranks at close, before the
// scalar step, so N is global. The scalar step takes inv_N = 1 / N into the one coefficient the
// optimizer applies (Note [Window scalar step]). The stepped gradient is then
// the sum over every item of the window divided by N: the large batch's mean,
// exactly, however the items were split over micro-batches and ranks (padding,
// ignore_index, variable lengths). A mean of per-micro-batch means is not:
// it weighs the items of a short micro-batch more. That legacy mode
// (Normalization::MeanOfMicroBatchMeans) seeds scale / count and divides by
// K x world size instead. N stays on the device: no host synchronization.
//
// Note [Window close]
// ~~~~~~~~~~~~~~~~~~~
// close() (after K backward() calls) is a fixed sequence on the current
// stream, with nothing read back by the host; each step is a stage, present
// or absent by the options (Note [Close stages] in optim/close_stages.h):
//   1. the slots no gradient reached are zeroed (Note [Overwrite first]);
//   2. the GradientSync, if any, sends the buckets still pending and sums N
//      and the loss sum over ranks (Note [Reducer] in dist/reducer.h), so the
//      report's loss is the world's mean (its local_loss is this rank's own);
//   3. one read of the gradient arena gives fixed-order partial sums of
//      squares and a non-finite count (kernels::grad_norm_partials; under
//      ZeRO-1 over the owned ranges, then gathered so every rank sums the
//      same rows in the same order). With norm_under_backward most rows
//      have already run under the last micro-step's backward, as its
//      gradients landed or, under a GradientSync, as its buckets' reductions
//      were issued (Note [Norm under the backward] in optim/norm_rows.h):
//      the close computes the rest;
//   4. one thread turns them into found_inf, the norm, the clip and the one
//      coefficient inv_scale * inv_N * clip, and updates the loss scale and
//      the step count (Note [Window scalar step]); under
//      UnusedParameters::skip the per-parameter counts of the slots written
//      this window (on any rank) advance too (Note [Unused parameters]);
//   5. one fused optimizer pass reads p, g, m, v, applies g * coef and writes
//      p, m, v and the compute copy; it returns at once when found_inf (Note
//      [Skipped window]). Its LR schedule is evaluated at the number of windows
//      closed before this one;
//   6. under ZeRO-1 the forward's parameters are gathered (Note [ZeRO-1]);
//   7. what report() shows is copied aside, N and the loss sum are reset.
// Every decision (skip, clip, scale) is made on the device from the state
// tensor, so a window never waits for the host and the arena is read once for
// the norm and once for the step.
//
// Note [Skipped window]
// ~~~~~~~~~~~~~~~~~~~~~
// A window whose gradient holds a non-finite value (or whose sum of squares
// overflows) is skipped, in every scaler mode, none included: applying it
// would ruin the weights. The scalar step writes found_inf = 1 and coef = 0,
// counts a skipped window, keeps the optimizer step count (Adam's bias
// corrections do not advance) and, with the dynamic scaler, backs the scale
// off. The fused optimizer pass reads found_inf on the device and returns
// before touching anything: master weights, moments and the compute copy stay
// bitwise unchanged. The window still counts as closed: windows_closed()
// advances, and with it the LR schedule (as scheduler.step() does in a PyTorch
// loop with GradScaler); N and the loss sum reset, and the next window's
// first contributions overwrite the bad gradients (Note [Overwrite first]).
// The host learns of it only through report().skipped. A window whose N is
// not finite is skipped the same way (Note [Deferred index checks]: a bad
// index sets N to NaN), and report() then throws that index's error. Under ZeRO-1 every
// rank sums every rank's partials, so all ranks skip together.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/autograd/window_listener.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/optim/close_stages.h"
#include "accrue/optim/gradient_sync.h"
#include "accrue/optim/loss_scaler.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"

namespace accrue::optim {

class LayerSteps;

// Note [Unused parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter no gradient reached in a window (an expert nobody routed to, a
// branch switched off) is, by optim::UnusedParameters:
//   step_with_zero (the default; Megatron's zeroed buffers): its slot reads 0
//     (Note [Overwrite first]) and it steps with that zero gradient: AdamW
//     decays it, the moments age, and one window-wide step count state[kStep]
//     gives every parameter the same bias correction;
//   skip (PyTorch's zero_grad(set_to_none=True)): weights, compute copy,
//     moments (amsgrad's max included) and its own step count stay bitwise
//     unchanged, and each slot's bias correction uses its own count.
// The skip is data, not host branching: the host writes the arena's written
// flags into slot_used (store_slot_flags: the values travel as kernel
// arguments, so nothing synchronizes and a captured close replays them), the
// data-parallel sync takes their max over ranks (a parameter is used if any
// rank wrote it), advance_slot_steps adds 1 to the count of every used slot
// and forms its bias corrections once per window, and the fused pass reads
// each chunk's slot and returns for unused ones before loading anything. The
// global norm needs nothing: an unwritten slot is zeroed either way, so it
// adds 0. Under a skipped window (Note [Skipped window]) both kernels return
// at once and no count moves. step_with_zero passes none of the tables and
// runs the window-wide path, bit for bit as before the switch existed.
//
// Either way an unused parameter is named, never left to stop training
// silently (a gradient cut upstream looks exactly like one), by
// optim::UnusedParameterCheck:
//   warn (the default): the first window with parameters no gradient reached
//     sends one line naming them (the first ten, then how many more) to the
//     options' unused_parameter_log (stderr unless set); later windows say
//     nothing, and the semantics above are unchanged;
//   error: that close throws accrue::Error naming them, before anything is
//     stepped (the Window stays ready, its gradients as they were);
//   ignore: nothing is said (a mixture of experts, where it is expected).
// On one process the check reads the host's written flags at close, so it
// costs no synchronization. Under a GradientSync a parameter is unused only
// if no rank wrote it, which only the device knows: the close adds a stage
// that keeps the flags' max over ranks (the one "unused flags" stage of skip
// when it is there: one all-reduce of a flag per parameter per window, even
// after warn has spoken, since the close's stages are fixed), and the check
// runs at the next check() or report(), which synchronize anyway, after the
// sync has said its reductions completed; an error there comes after that
// window stepped. ignore adds no stage.
enum class UnusedParameters {
  // Its slot reads 0 and it steps with that zero gradient (AdamW decays it,
  // its moments age); one step count per window. The default, and
  // PyTorch's zero_grad(set_to_none=False) once every parameter has had a gradient.
  step_with_zero,
  // Left bitwise unchanged, with a step count per parameter for the bias
  // corrections: PyTorch's zero_grad(set_to_none=True), its default.
  skip,
};
const char* unused_parameters_name(UnusedParameters policy);

// Note [Unused parameters]: what the Window says about a parameter no
// gradient reached.
enum class UnusedParameterCheck {
  warn,    // one line, the first time only (the default)
  error,   // accrue::Error naming them
  ignore,  // nothing
};
const char* unused_parameter_check_name(UnusedParameterCheck check);
// Receives the warning line of UnusedParameterCheck::warn (no trailing newline).
using UnusedParameterLog = std::function<void(const std::string&)>;

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
  // Note [Norm under the backward]: the norm rows run as the last
  // micro-step's gradients land, or under a GradientSync as its buckets are
  // reduced (off by default: it measured slower on one GPU's GPT-2).
  WindowOptions& norm_under_backward(bool on) {
    norm_under_backward_ = on;
    return *this;
  }
  // Note [Gradient noise scale]: measured on one window in `every` (0: off),
  // its estimates smoothed with an EMA of decay `ema`. Needs K >= 2.
  WindowOptions& noise_scale(int64_t every, double ema = 0.95) {
    noise_scale_every_ = every;
    noise_scale_ema_ = ema;
    return *this;
  }
  // Note [Unused parameters]: step_with_zero (the default) or skip.
  WindowOptions& unused_parameters(UnusedParameters policy) {
    unused_parameters_ = policy;
    return *this;
  }
  // Note [Unused parameters]: warn (the default), error or ignore.
  WindowOptions& unused_parameter_check(UnusedParameterCheck check) {
    unused_parameter_check_ = check;
    return *this;
  }
  // Where warn's line goes (a trainer's log); empty: stderr.
  WindowOptions& unused_parameter_log(UnusedParameterLog log) {
    unused_parameter_log_ = std::move(log);
    return *this;
  }
  // Note [Close under the forward] (optim/layer_steps.h): the optimizer
  // step goes layer by layer (ranges of at least min_elements arena
  // elements) beside the next window's forward, which awaits each layer's
  // parameters. Off by default.
  // max_blocks caps each range's launch (0: a full wave), leaving SMs to the forward.
  WindowOptions& close_under_forward(bool on, int64_t min_elements = int64_t{1} << 20,
                                     int64_t max_blocks = 0) {
    close_under_forward_ = on;
    close_layer_elements_ = min_elements;
    close_max_blocks_ = max_blocks;
    return *this;
  }
  // Its test mode: each range is stepped only when an await first needs it.
  WindowOptions& close_steps_on_first_read(bool on) {
    close_steps_on_first_read_ = on;
    return *this;
  }
  int64_t micro_steps() const { return micro_steps_; }
  bool close_under_forward() const { return close_under_forward_; }
  int64_t close_layer_elements() const { return close_layer_elements_; }
  int64_t close_max_blocks() const { return close_max_blocks_; }
  bool close_steps_on_first_read() const { return close_steps_on_first_read_; }
  UnusedParameters unused_parameters() const { return unused_parameters_; }
  UnusedParameterCheck unused_parameter_check() const { return unused_parameter_check_; }
  const UnusedParameterLog& unused_parameter_log() const { return unused_parameter_log_; }
  kernels::Normalization normalization() const { return normalization_; }
  double max_grad_norm() const { return max_grad_norm_; }
  const LossScalerOptions& scaler() const { return scaler_; }
  bool norm_under_backward() const { return norm_under_backward_; }
  int64_t noise_scale_every() const { return noise_scale_every_; }
  double noise_scale_ema() const { return noise_scale_ema_; }

 private:
  int64_t micro_steps_ = 1;
  kernels::Normalization normalization_ = kernels::Normalization::ItemCount;
  double max_grad_norm_ = 0.0;
  LossScalerOptions scaler_ = LossScalerOptions::none();
  bool norm_under_backward_ = false;
  int64_t noise_scale_every_ = 0;
  double noise_scale_ema_ = 0.95;
  UnusedParameters unused_parameters_ = UnusedParameters::step_with_zero;
  UnusedParameterCheck unused_parameter_check_ = UnusedParameterCheck::warn;
  UnusedParameterLog unused_parameter_log_;
  bool close_under_forward_ = false;
  int64_t close_layer_elements_ = int64_t{1} << 20;
  int64_t close_max_blocks_ = 0;
  bool close_steps_on_first_read_ = false;
};

// What the host learns about the last closed window (read with one synchronization).
struct WindowReport {
  int64_t window = 0;  // windows closed so far
  // The window's summed loss / N, over every rank (Note [Normalization]):
  // data parallelism reports the loss one process of the whole batch would.
  double loss = 0.0;
  double local_loss = 0.0;  // this rank's summed loss / this rank's items
  double items = 0.0;       // N
  double grad_norm = 0.0;   // unscaled, normalized, before clipping
  double clip_coef = 1.0;
  double loss_scale = 1.0;  // the scale for the next window
  bool skipped = false;
  int64_t skipped_windows = 0;
  int64_t optimizer_steps = 0;
  // Note [Gradient noise scale], when measured (noise_windows > 0): the
  // bias-corrected EMAs of |G|^2 and tr(Sigma) of the unscaled per-item
  // gradient, and B_simple = tr(Sigma) / |G|^2, the critical batch estimate.
  int64_t noise_windows = 0;
  double grad_sq = 0.0;
  double trace_sigma = 0.0;
  double noise_scale = 0.0;
};

class GraphedWindow;

class Window {
 public:
  Window(ParamStore& store, Optimizer& optimizer, const WindowOptions& options,
         GradientSync* sync = nullptr);

  // One micro-step: backward of loss.sum seeded with the loss scale (legacy
  // mode: scale / count), and N += count.
  void backward(const Loss& loss);
  bool ready() const { return micro_step_ == options_.micro_steps(); }
  // Note [Window close]; needs ready().
  void close();

  int64_t micro_step() const { return micro_step_; }
  int64_t micro_steps() const { return options_.micro_steps(); }
  // Note [Out-of-memory retry] (optim/run_window.h), one process only:
  // restart() drops the micro-steps of the current window (N, the loss sum
  // and the written flags go back to the window's start; the next backward
  // overwrites the slots), and between micro-steps 0 and 1 the number of
  // micro-steps may change (item-count normalization only: N counts items,
  // so the split does not enter the update).
  void restart();
  void set_micro_steps(int64_t k);
  // State outside the arena that follows the window (nn::BatchNorm's running
  // statistics, Note [Window statistics]): told at the end of every close()
  // and on restart(). The listener must outlive the Window or be removed.
  void add_listener(WindowListener* listener);
  void remove_listener(WindowListener* listener);
  int64_t windows_closed() const { return windows_; }

  // Note [Window captured whole]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A caller that records a whole window (its K backward() calls and the
  // close(), on the current stream) in a CUDA graph of its own, as the torch
  // bridge does under torch.cuda.graph, brackets the capture with
  // begin_whole_capture / end_whole_capture and each replay with
  // before_whole_replay / after_whole_replay:
  //  - begin refuses what a replay would get wrong (as GraphedWindow keeps
  //    it eager, Note [Graphed window]): a window already begun, a
  //    GradientSync (its all-reduces launch from host hooks), listeners (they
  //    act on the host at close), a stage that is not capturable, the CPU,
  //    the plain CUDA allocator, a calibrating scaler. The caller holds a
  //    ForeignCaptureScope while the capture records (Note [Capturable code]).
  //  - The capture ran nothing, but the host counted a window: end puts the
  //    host state back (micro-step, window count, written flags) and checks
  //    that exactly one whole window was recorded; it returns the written
  //    flags the capture left, which each replay repeats.
  //  - before_whole_replay checks the unused parameters (Note [Unused
  //    parameters]) and stores this window's learning rates on the device
  //    (Note [Hyperparameters on the device]: the schedule moves every window
  //    and the captured pass reads them there); after_whole_replay repeats the
  //    host bookkeeping of the K micro-steps and of the close.
  // The step counts, the loss scale and N live on the device already, so a
  // replay updates the weights bitwise as the eager window does.
  struct WholeCapture {
    int64_t micro_step = 0;
    int64_t windows = 0;
    std::vector<bool> written;
  };
  WholeCapture begin_whole_capture() const;
  std::vector<bool> end_whole_capture(const WholeCapture& before);
  void before_whole_replay(const std::vector<bool>& written);
  void after_whole_replay(const std::vector<bool>& written);

  // One host synchronization. Throws the first bad index seen on the device
  // since the host last looked (Note [Deferred index checks]), naming the op,
  // the value, the valid range, the window and the micro-step; that window's
  // update was skipped. The record is then clear: a second call returns.
  // Under a GradientSync it also runs the unused-parameter check of the last
  // closed window (Note [Unused parameters]).
  void check() const;
  // check(), then what the last closed window did.
  WindowReport report() const;
  // The device state (kernels::WindowField layout).
  const Tensor& state() const { return ctx_->state; }
  // Note [Norm under the backward]: the norm rows the last close still had to
  // compute (all of them when the pass runs at close; under ZeRO-1 this
  // rank's rows of its owned ranges).
  int64_t norm_rows_at_last_close() const;

  // Everything a checkpoint needs to resume bit-exactly: master weights,
  // moments, the window state (scale, tracker, step, N) and the window count
  // (under UnusedParameters::skip also "param_steps", each parameter's own
  // step count: Note [Unused parameters]; with channels-last parameters also
  // "channels_last_slots", and a load refuses a checkpoint of other layouts:
  // Note [Parameter layouts]);
  // inside a window also the gradients so far (Note [Mid-window
  // checkpoints]). Under ZeRO-1 each rank's dict holds its own shard
  // ("master" and the moments packed over the owned ranges) and loading is
  // collective: every rank loads its own, then the parameters are gathered.
  //
  // Note [Mid-window checkpoints]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A checkpoint may be taken after any micro-step. With m of K micro-steps
  // done (0 < m < K) the dict adds "micro_step" (m), "grads" (this rank's
  // whole arena: no reduction has started before the last micro-step),
  // "grads_written" (Note [Overwrite first]'s flags, one per slot) and
  // "loss_sum"; N, a pending noise-scale measurement and the scale are in
  // "window_state" already. A Window that loads it, fresh or between two
  // windows, resumes at micro-step m: the next backward adds to those
  // gradients exactly as the uninterrupted run would have, so the rest of the
  // run is bitwise the same (tests/optim/optim_test.cpp). A bad index seen
  // before the save (Note [Deferred index checks]) is carried as N = NaN,
  // so the resumed window is skipped too, but its message is not: call
  // check() before saving to see it. The data position and any dropout
  // generator are the caller's to save beside.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);
  // Under ZeRO-1 (Note [ZeRO-1]): this rank steps only the sync's owned ranges.
  bool sharded() const { return ctx_->sharded(); }
  // Note [Unused parameters]: under skip, each parameter's own optimizer step
  // count (one per arena slot, in slot order; one host synchronization).
  // Under step_with_zero every parameter has the window's count,
  // report().optimizer_steps, and this throws.
  std::vector<int64_t> parameter_steps() const;
  bool skips_unused() const { return options_.unused_parameters() == UnusedParameters::skip; }
  // Note [Scale calibration]: true until the close of the first window of a
  // scaler with calibrate(); its backwards then run under the observer.
  bool calibrating() const;
  // The close's stages in order (Note [Close stages]), e.g. "zero unwritten,
  // items, norm, scalar step, optimizer step, report".
  std::string describe_close() const { return describe_stages(stages_); }
  // Note [Close under the forward]: the layer steps (their ranges and how
  // they were launched), or null without close_under_forward.
  const LayerSteps* layer_steps() const;

 private:
  // Note [Graphed window] (optim/graphed_window.h): a GraphedWindow captures
  // the device work of backward() and of close_device(), and repeats their
  // host bookkeeping on replay.
  friend class GraphedWindow;
  // close() is close_device(), the stages of Note [Close stages] that a
  // captured close records, then close_host(): the counters and listeners.
  void close_device();
  void close_host();
  // Note [Capturable code]: why this Window's micro-steps and close cannot be
  // captured at all (a stage's host decisions, the plain CUDA allocator), or
  // null. GraphedWindow and begin_whole_capture ask it.
  const char* why_not_capturable() const;
  // Why the close alone cannot be captured (a stage's side stream), or null.
  const char* why_close_not_capturable() const;
  // Note [Close under the forward]: the current stream waits for the last
  // close's layer steps (a no-op without them); `where` names the caller.
  void join_layer_steps(const char* where, bool after_forward = false) const;
  // What backward() does on the host, for a micro-step replayed from a graph
  // that left the arena's written flags at `written_after`.
  void replay_micro_step(const std::vector<bool>& written_after);
  // Note [Unused parameters]: the check of UnusedParameterCheck over
  // `written` (one flag per slot) for window `window` (1-based); `where`
  // names the caller in an error.
  void check_unused(const std::vector<bool>& written, int64_t window, const char* where) const;
  Tensor field(int f) const { return ctx_->field(f); }
  MicroStep position() const { return {micro_step_, options_.micro_steps(), windows_}; }
  // The stage of type S, or null when the options left it out.
  template <class S>
  S* find_stage() const {
    for (const auto& s : stages_)
      if (auto* found = dynamic_cast<S*>(s.get())) return found;
    return nullptr;
  }
  // The owned ranges of a flat arena, packed in order.
  Tensor pack_owned(const Tensor& flat) const;
  // Note [ZeRO-1]: the owned ranges as an i64 [ranges, 2] table of (offset,
  // numel), saved with a shard so that it loads only where it belongs.
  Tensor owned_ranges_table() const;
  static std::string ranges_str(const std::vector<int64_t>& table);

  ParamStore& store_;
  Optimizer& optimizer_;
  WindowOptions options_;
  GradientSync* sync_;
  // The device state and what the close acts on (Note [Close stages]): on
  // the heap, so that the stages' reference stays put when the Window moves.
  std::unique_ptr<CloseContext> ctx_;
  std::vector<std::unique_ptr<CloseStage>> stages_;
  bool keeps_fp8_copies_ = false;   // the close recasts the store's FP8 copies
  bool keeps_fp8_scaling_ = false;  // the close updates the store's FP8 delayed scaling
  // Note [Deferred index checks]: on the heap, so that it stays put (it is
  // registered with the thread) when the Window moves.
  std::unique_ptr<kernels::DeferredIndexChecks> index_checks_;
  std::vector<WindowListener*> listeners_;
  int64_t micro_step_ = 0;
  int64_t windows_ = 0;
  // Note [Ordered writes]: the window's loss sum and item count (one key),
  // which every micro-step adds to; active with the arena's order while
  // micro-batches run on streams of their own (GraphedWindow).
  std::unique_ptr<WriteOrder> scalar_order_ = std::make_unique<WriteOrder>(1);
  // Note [Unused parameters]: warn has spoken; under a sync, the last window checked.
  mutable bool unused_warned_ = false;
  mutable int64_t unused_checked_window_ = 0;
};

}  // namespace accrue::optim
