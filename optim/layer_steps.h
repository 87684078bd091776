// The close's optimizer step issued layer by layer beside the next window's
// forward (Note [Close under the forward]).
//
// Note [Close under the forward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With WindowOptions::close_under_forward the close runs its stages up to
// the scalar step (and the slot steps) as always; then, in place of the one
// fused optimizer pass, LayerSteps steps the arena as layer ranges (Note
// [Step ranges] in optim/optimizer.cpp): consecutive slots in registration
// order, each range at least min_elements long (the last may be shorter),
// together covering the padded arena.
//  - On CUDA the close stores the hyperparameters on the current stream,
//    then the ranges go to a side stream, which first waits for the close's
//    stages (an event on the current stream), then steps the ranges in
//    order, recording an event after each. The current stream goes on at
//    once: the close's report, then the next window's forward.
//  - The side stream runs them as one CUDA graph, captured at the first
//    close and replayed at each (Note [Steps graph] in
//    optim/layer_steps.cpp), never as eager kernels: on an H200 one eager
//    kernel launched on a second stream made every later kernel of the
//    process slower, by about 0.17 us of gap each for the rest of its life
//    (+14% at 1.2 us kernels; GPT-2 at micro-batch 1 x 32 under CUDA graphs
//    went from 110.0 to 115.6 ms a window), while a graph launched there, a
//    memset, an event record or an allocation cost nothing (the stream_gap
//    cases side_wait, side_graph, side_memset, side_event and side_alloc of
//    bench/bench_stream_gap.cu; bench/RESULTS.md). Where the graph cannot
//    be captured (the plain allocator, Note [Capturable code]; a close
//    issued inside another capture) the ranges go to the side stream as
//    eager kernels, as before, with a warning on stderr once.
//  - The forward awaits its parameters (accrue::await_parameters, Note
//    [Parameter gates] in autograd/parameter_gate.h; nn's models call it
//    before each layer): the current stream waits for the event of the
//    parameter's range. The side stream steps ranges in order, so that event
//    covers every range before it too (a prefix wait), and later awaits of
//    earlier ranges cost nothing.
//  - The ranges read the gradient arena, which micro-step 0's backward
//    overwrites (Note [Overwrite first]), and the state and hyperparameters,
//    which the next close rewrites: before micro-step 0's backward the window
//    joins (the current stream waits for the last range). So do state_dict,
//    load_state_dict, the Window's destructor and the store's reads and
//    accessors and loads (master, compute, moment, value, master_view, load,
//    load_master, refresh_compute), except while LayerSteps itself issues the
//    steps through them.
//  - Bitwise: the same kernel over the same elements, with the state (found_inf,
//    the coefficient, the step count) the scalar step wrote before the side
//    stream began; a skipped window's ranges return at once as the one pass
//    does. So the weights are those of the sequential close, bit for bit.
//  - A window whose forward awaited no parameter while ranges were pending
//    is refused at the join: its model does not call await_parameters, and
//    it read weights that were being stepped.
//  - On the CPU there is nothing to overlap: the close steps every range at
//    once, unless close_steps_on_first_read (a test mode, on any device)
//    steps each range only when an await first needs it, on the awaiting
//    stream, and the rest at the join: the latest a side stream could. A
//    forward that reads a layer before awaiting it then reads the old
//    weights and the bits change, which the tests compare.
//  - Under a GraphedWindow the micro-steps are captured and replayed; the
//    close runs eagerly (its ranges as the steps graph on the side stream,
//    which the GraphedWindow does not capture). A capture records each await's
//    and the join's wait as an event-wait node on an event recorded outside
//    the graph (Event::block_external), so every replay waits for the ranges
//    the eager close before it issued; the replay of micro-step 0 then marks
//    the steps joined on the host. The test mode keeps everything eager (its
//    steps run from the forward's awaits, which a replay does not run).
//  - A window whose step sums are measured (optim::LayerMonitor, Note [Step
//    sums]) is stepped whole in the close, as without this option.
//  - FP8 weight copies (Note [Window FP8 weights]) are recast range by range
//    after each range's step, before its event, in place of the close's
//    "fp8 weights" stage.
//  - Not with ZeRO-1 (the gathers of the stepped shards): refused. A
//    whole-window capture is refused too: the side stream would have to
//    rejoin inside the graph.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "accrue/autograd/parameter_gate.h"
#include "accrue/optim/close_stages.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"

namespace accrue {
class CudaGraph;
class Event;
class Stream;
}  // namespace accrue

namespace accrue::optim {

class LayerSteps final : public ParameterGate {
 public:
  // Ranges of at least min_elements (>= 1) arena elements; steps_on_first_read:
  // the test mode of Note [Close under the forward].
  LayerSteps(ParamStore& store, const Optimizer& optimizer, int64_t min_elements,
             bool steps_on_first_read, int64_t max_blocks = 0);
  ~LayerSteps() override;
  LayerSteps(const LayerSteps&) = delete;
  LayerSteps& operator=(const LayerSteps&) = delete;

  // The ranges, in arena order, and the range of each slot.
  const std::vector<ArenaRange>& ranges() const { return ranges_; }
  const std::vector<int64_t>& range_of_slot() const { return range_of_slot_; }

  // Issues optimizer step `step` over every range after what the current
  // stream holds (the close's stages up to the scalar step).
  void launch(const Tensor& state, int64_t step, const SlotTables& slots);
  // ParameterGate: the current stream waits until param's range is stepped.
  void await(const Tensor& param) override;
  // The current stream waits until every range is stepped. With
  // after_forward (micro-step 0's backward), first refuses a forward that
  // awaited nothing while ranges were pending; `where` names the caller.
  void join(const char* where, bool after_forward = false);
  bool steps_on_first_read() const { return lazy_; }
  // A replayed micro-step 0 joined on the device (its capture recorded the
  // join's wait, Note [Graphed window]): the host state follows.
  void joined_by_replay() { set_launched(false); }
  // Note [Steps graph]: closes whose ranges went to the side stream as the
  // captured graph, and the graph's captures (Window::layer_steps reaches them).
  int64_t graphed_launches() const { return graphed_launches_; }
  int64_t graph_captures() const { return graph_captures_; }

 private:
  void step_ranges_until(int64_t end);  // the test mode's steps, [awaited_, end)
  void step_range(size_t r);            // range r's step, then its slots' FP8 copies
  void wait_for(int64_t range);
  void set_launched(bool on);  // and the gate's pending mark (Note [Parameter gates])
  // Every range's step and its event on the current stream (the side stream):
  // as external event-record nodes when captured.
  void issue_ranges(bool captured);
  // Note [Steps graph]: the graph of issue_ranges for what the steps read
  // now, captured when there is none or what they read has moved; null
  // where it cannot be (then the caller issues the ranges eagerly).
  const CudaGraph* steps_graph(int device);
  std::vector<int64_t> graph_key() const;

  ParamStore& store_;
  const Optimizer& optimizer_;
  bool lazy_;
  bool on_cuda_;
  int64_t max_blocks_;  // each range's grid cap (0: none)
  std::vector<ArenaRange> ranges_;
  std::vector<int64_t> range_of_slot_;
  // The launch's arguments, which every range's step reads.
  Tensor state_;
  int64_t step_ = 0;
  SlotTables slots_;
  bool launched_ = false;
  bool stepping_ = false;  // issuing steps: the store's accessors must not join
  int64_t awaited_ = 0;    // ranges [0, awaited_) are stepped for the current stream
  int64_t awaits_ = 0;     // awaits of pending ranges since the launch
  std::unique_ptr<Stream> side_;
  std::unique_ptr<Event> ready_;
  std::vector<std::unique_ptr<Event>> done_;
  // Note [Steps graph]; last, so that it goes before the events its nodes record.
  std::vector<int64_t> graph_key_;  // the addresses the graph was captured on
  bool graph_failed_ = false;       // its capture failed once: eager from then on
  int64_t graphed_launches_ = 0;
  int64_t graph_captures_ = 0;
  std::unique_ptr<CudaGraph> graph_;
};

// The close's stage in place of "optimizer step" (Note [Close stages]).
class LayerStepsStage final : public CloseStage {
 public:
  LayerStepsStage(CloseContext& c, int64_t min_elements, int64_t max_blocks,
                  bool steps_on_first_read);
  const char* name() const override { return "layer steps"; }
  const char* reads() const override { return "store, state, slot steps"; }
  const char* writes() const override {
    return "master, moments, compute copy (beside the forward)";
  }
  void run(int64_t window) override;
  const char* why_not_capturable() const override {
    return steps_.steps_on_first_read()
               ? "close_steps_on_first_read steps the parameters from the forward's awaits"
               : nullptr;
  }
  const char* why_close_not_capturable() const override {
    return "close_under_forward steps the parameters on a side stream that the next forward "
           "awaits (Note [Close under the forward])";
  }
  LayerSteps& steps() { return steps_; }

 private:
  CloseContext& c_;
  LayerSteps steps_;
};

}  // namespace accrue::optim
