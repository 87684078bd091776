// GraphedWindow: an optim::Window whose micro-steps and close replay as CUDA
// graphs, for the small micro-batches where launching ~500 kernels a
// micro-step costs as much as running them.
//
//   optim::GraphedWindow graphed(window, [&](const std::vector<Tensor>& in) {
//     return model.loss(in[0], in[1]);  // forward only: the Window runs backward
//   });
//   for (each micro-batch) {
//     graphed.backward({x, y});
//     if (graphed.ready()) graphed.close();
//   }
//
// Note [Graphed window]
// ~~~~~~~~~~~~~~~~~~~~~
// A micro-step is the step function's forward plus Window::backward; it is
// captured once per phase and replayed after that:
//  - phase "first" (micro-step 0) writes every gradient slot with beta 0, and
//    phase "rest" (micro-steps 1..K-1) adds with beta 1 (Note [Overwrite
//    first]): two graphs, because the GEMMs' beta is a kernel argument;
//  - the inputs are copied into buffers the graphs read (a device copy each),
//    laid out as the inputs were (a channels-last batch, a channels-last
//    buffer: the layout the eager warm-up's convolution plans were made for);
//  - each (phase) is run eagerly the first time it is seen, which creates
//    the cuBLASLt workspace, the cuDNN plans and anything else made on first
//    use, and is captured the second time (Note [Capturable code] in
//    core/cuda_graph.h); the capture records and then launches, so that
//    micro-step runs exactly once either way;
//  - a replay repeats the host bookkeeping backward() would have done: the
//    micro-step count, the arena's written flags as the capture left them,
//    the reducer's per-micro-step checks (Window::replay_micro_step).
// The close is captured the same way (Window::close_device), keyed on the
// written flags and K, and replayed after the optimizer stores this window's
// learning rates on the device (Note [Hyperparameters on the device]); the
// window count and listeners then advance on the host (Window::close_host):
// a listener's on_window_close (BatchNorm's adoption of the window's
// statistics, Note [Window statistics]) runs eagerly after the graph, as
// after an eager close.
//
// Each successful capture ends with release_unused_cuda_memory (one host
// synchronization, once per graph): graph memory nodes draw on a pool of
// their own, so the eager warm-up's activations, left in the stream-ordered
// pool, would otherwise stay held beside the graph's copy of them.
//
// Replays run the same kernels with the same arguments in the same order as
// the eager code, so they give bitwise the same weights
// (tests/optim/gpu_graphed_window_test.cpp).
//
// What stays eager, each with a one-line warning on stderr, once:
//  - inputs whose shapes, dtypes or devices differ from the first micro-step's;
//  - a micro-step whose capture was refused (dropout, Note [Capturable code])
//    or failed (a synchronizing call, the plain allocator): it runs eagerly
//    from then on, after the host state is put back as it was;
//  - with a GradientSync, the last micro-step and the close: the reducer's
//    all-reduces are launched from the backward's hooks on its own stream,
//    and run eagerly around the graphs of the earlier micro-steps;
//  - with close_under_forward, the close: its layer steps go to a side stream
//    that the captured micro-steps wait for (Note [Close under the forward]);
//  - with norm_under_backward or the noise scale, everything (their host
//    decisions change from window to window); with a listener whose host
//    state follows the forwards (WindowListener::why_not_capturable:
//    BatchNorm's compound_momentum or statistics sync), everything.
// On the CPU every call is eager, silently: graphs are CUDA's.
//
// Note [Concurrent micro-batches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With set_concurrent_micro_batches(n > 1), a group of n micro-steps is one
// graph, each micro-step on a stream of its own (the current stream, then
// n - 1 side streams forked and joined inside the capture), so that small
// micro-batches fill the GPU together:
//  - backward() copies its inputs into the buffers of their place in the
//    group and returns; the group runs when its last input arrives (the
//    window's last group may be shorter: K need not divide by n). So
//    window().micro_step() counts the micro-steps run, not the inputs taken;
//    flush() runs a group that is not whole (its own graph after a warm-up),
//    as a checkpoint inside a window needs. Where the micro-steps run
//    eagerly (the CPU, a calibrating window, the reasons of Note [Graphed
//    window]) the groups are taken the same way, as copies of the inputs, and
//    run one after another: the same bookkeeping on every device.
//  - Within the window the weights do not change: micro-step k + 1's forward
//    depends on nothing of micro-step k. Their shared writes, each gradient
//    slot and the window's loss sum and item count, keep the host's order by
//    events (Note [Ordered writes] in core/write_order.h): micro-step k + 1
//    adds into a slot after micro-step k's last write into it. So the
//    weights are bitwise those of the sequential loop. (A tied weight, as
//    GPT-2's embedding and classifier, is written first and last by a
//    backward, so there the backwards follow one another; the forwards still
//    run beside them, and the order's implied waits are left out.) Measured
//    on an H200 with n = 2 against 1 (bench/RESULTS.md, nineteenth session),
//    the same bits: GPT-2 124M bf16 +4.3% at 1 x 32, +2.9% at 2 x 16, +1.6%
//    at 4 x 8, +0.9% at 8 x 4 and -0.3% at 16 x 2; FP8 +5.4% at 1 x 32 and
//    +3.0% at 4 x 8; llama-125m +4.4% at 1 x 2,048 x 16.
//  - Only inside graphs: an eager kernel on a second stream slows every later
//    kernel of the process by about 0.17 us (bench/RESULTS.md, stream_gap),
//    a graph's branches do not. The warm-up runs the group one micro-step
//    after another on the current stream, and the side streams get their
//    library workspaces without a kernel (kernels::prepare_stream). A refused
//    capture runs the group one after another, as without the option.
//  - Each micro-step in flight holds its own activations: the peak grows by
//    about (n - 1) micro-batches' activations (the graphs' pool, GPT-2 124M
//    at 4 x 8: 1.68 GB with one in flight, 3.36 GB with two). That is why the
//    trainers keep n = 1 unless asked: a micro-batch sized to the memory
//    would not fit twice.
//  - Only the arena's slots and the window's sums are ordered: a leaf that
//    requires grad outside the store (its .grad summed by the autograd
//    engine) would be added to from two streams at once. Keep every
//    trainable tensor in the ParamStore.
//  - BatchNorm's statistics, which every training forward adds to (Note
//    [Window statistics]), are kept by each forward in flight and recorded
//    at the group's end, after the streams joined, in the forwards' order
//    (WindowListener::defers_group_writes): the sequential loop's bits with
//    no edge between the streams, where ordering each layer's record by
//    events would tie the forwards together at every BatchNorm.
//  - Refused with a GradientSync (its hooks launch all-reduces from the
//    host), a window listener that cannot keep a group's writes, and
//    close_under_forward (a side stream's forward would not wait for the
//    steps, Note [Close under the forward]).
//  - FP8 layers (Note [Window FP8 weights]) take part: the weights' FP8
//    copies are only read within a window; a current-scaling or block cast
//    makes its own scale; the bias gradient from the cast of dy goes into
//    the bias's slot, ordered as any slot. Delayed scaling's casts merge
//    their amax into the window's running amax from several streams at
//    once: every merge is an atomic max (Note [FP8 delayed scaling]), which
//    gives the same value in any order. A cast's guarded scale_inv reads the
//    running amax as it stands. Whether it sees another stream's overflow
//    therefore depends on timing, but an overflow anywhere in the window
//    skips the window at the close, so the weights do not depend on it.
//
// The step function must not keep tensors it made past its return (the
// captured graph owns that memory), and a grad-ready hook registered by the
// user runs during the capture only, not on replays. A bad index in a
// replayed micro-step skips its window as it does eagerly (Note [Deferred
// index checks]), but the error names the window and micro-step of the
// capture: those numbers are kernel arguments the replay repeats. The
// allocator's counters see one micro-step's allocations, at the capture;
// graph_memory() reports what the graphs hold.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/core/cuda_graph.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/optim/window.h"

namespace accrue::autograd {
class WeightGradBranch;
}  // namespace accrue::autograd

namespace accrue::optim {

class GraphedWindow {
 public:
  // The forward of one micro-step on these inputs; returns its (sum, count) loss.
  using StepFn = std::function<Loss(const std::vector<Tensor>& inputs)>;

  GraphedWindow(Window& window, StepFn step);
  ~GraphedWindow();
  GraphedWindow(const GraphedWindow&) = delete;
  GraphedWindow& operator=(const GraphedWindow&) = delete;

  // One micro-step: step(inputs), then the Window's backward; replayed from a
  // graph when one is captured for these inputs and this phase.
  void backward(const std::vector<Tensor>& inputs);
  bool ready() const { return window_.ready(); }
  // Window::close, replayed from a graph once one is captured.
  void close();
  // Note [Concurrent micro-batches]: n >= 1 micro-steps in flight (1, the
  // default: one after another). Before the first backward.
  void set_concurrent_micro_batches(int n);
  int concurrent_micro_batches() const { return concurrent_; }
  // Note [Weight gradients on a branch] (autograd/weight_grad_branch.h): with
  // lag >= 1 the captured micro-steps issue their Linear, convolution,
  // LayerNorm and classifier parameter gradients on a side stream beside the
  // rest of the backward, at most `lag` of them pending; the same bits. 0 (the
  // default): inline. Not with concurrent micro-batches or a GradientSync.
  // Before the first backward.
  void set_weight_grad_branch(int lag);
  int weight_grad_branch() const { return branch_lag_; }
  // The branch's entries issued so far: a capture's Linears, convolutions,
  // LayerNorms and classifier.
  int64_t weight_grad_branch_entries() const;
  // Runs the micro-steps whose inputs wait for the rest of their group, so
  // that window().micro_step() counts every input taken: before a checkpoint
  // inside a window. Nothing when none wait.
  void flush();
  // Inputs taken whose group has not run yet.
  int64_t pending_micro_steps() const { return pending_; }
  Window& window() { return window_; }

  struct Counts {
    int64_t replayed_micro_steps = 0;  // launched from a graph (the capturing one included)
    int64_t eager_micro_steps = 0;
    int64_t replayed_closes = 0;
    int64_t eager_closes = 0;
    int64_t graphs = 0;  // captured so far
  };
  const Counts& counts() const { return counts_; }
  // Why nothing is captured at all, or empty.
  const std::string& why_eager() const { return why_eager_; }

 private:
  struct Captured {
    int seen = 0;        // eager runs so far (the first is the warm-up)
    bool eager = false;  // its capture failed: eager from now on
    std::unique_ptr<CudaGraph> graph;
    std::vector<bool> written_after;  // the arena's flags after the captured micro-step
  };
  void eager_micro_step(const std::vector<Tensor>& inputs);
  // Note [Concurrent micro-batches]: takes one input of a group; runs the
  // group (run_group) when it is whole.
  void group_backward(const std::vector<Tensor>& inputs, bool eager);
  void run_group();
  // The first n places of `inputs`, one eager micro-step after another.
  void eager_group(const std::vector<std::vector<Tensor>>& inputs, int64_t n);
  void capture_group(Captured& c, int64_t n, const std::string& what);
  // Captures body into `c`, restoring the Window's host state when it fails.
  bool capture(Captured& c, const std::string& what, const std::function<void()>& body);
  void warn(const std::string& what, const std::string& why) const;
  // The options' check: nothing has run through this GraphedWindow yet.
  void check_unstarted(const char* op) const;
  // Note [Concurrent micro-batches]: every window listener keeps a group's
  // writes until its end (BatchNorm does), else op refuses n in flight.
  void check_listeners_keep_group_writes(const char* op, int64_t n) const;
  std::string signature(const std::vector<Tensor>& inputs) const;

  Window& window_;
  StepFn step_;
  std::string why_eager_;        // set when nothing is captured at all
  std::string why_close_eager_;  // set when closes are never captured
  std::string signature_;        // the first micro-step's inputs
  std::vector<Tensor> buffers_;  // what the graphs read, shaped as signature_
  bool warned_signature_ = false;
  Captured first_, rest_;
  std::map<std::string, Captured> closes_;  // by written flags and K
  Counts counts_;
  // Note [Concurrent micro-batches].
  int concurrent_ = 1;
  std::vector<std::unique_ptr<Stream>> sides_;      // concurrent_ - 1 streams
  std::vector<std::vector<Tensor>> group_buffers_;  // the inputs of each place in a group
  std::vector<std::vector<Tensor>> eager_inputs_;   // copies, for a group that runs eagerly
  bool group_eager_ = false;                        // the group being taken runs eagerly
  int64_t pending_ = 0;                             // inputs taken, their group not yet run
  std::map<std::string, Captured> groups_;          // by phase and group size
  std::unique_ptr<Event> fork_;
  std::vector<std::unique_ptr<Event>> joins_;
  // Note [Weight gradients on a branch]: 0 (off) or the branch's lag.
  int branch_lag_ = 0;
  std::unique_ptr<Stream> branch_stream_;
  std::unique_ptr<autograd::WeightGradBranch> branch_;
};

}  // namespace accrue::optim
