// NormRowTracker: the norm pass of the window close, run while the last
// micro-step's backward still runs (Note [Norm under the backward]).
//
// Note [Norm under the backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Step 3 of Note [Window close] reads the whole gradient arena once. It
// need not wait for the close: on one device, in the last micro-step each
// parameter's grad-ready hook (autograd/variable.h) fires once its gradient
// of the window is final, and every norm row (Note [Norm rows]) whose slots
// are all final is computed right then, consecutive rows in one launch. On
// CUDA the launches go to a side stream that waits (an event, no host block)
// for the backward's work so far: on the backward's own stream a launch of a
// few rows would hold up the backward kernels queued behind it. The close
// joins the side stream back before the scalar step, and computes only the
// rows left: those of parameters the last micro-step did not reach (after
// zero_unwritten, so they read as the close-time pass would) and any row a
// later gradient into an already final slot made stale. A row is the same
// code over the same bits whichever launch computes it, so the partials, and
// with them the norm, the clip, found_inf and the step, are bitwise those of
// one pass at close (tests/optim/norm_rows_test.cpp).
//
// Under data parallelism a row must also wait for its reduction, so the
// units that become final are not slots but reduced ranges: the GradientSync
// reports each bucket as it issues the bucket's reduction (set_reduced_listener
// in optim/gradient_sync.h), with the communicator's stream current, so the
// side stream's launch waits for the reduction itself. Plain data parallelism
// keeps the rows over the whole arena and a unit per slot (a bucket is whole
// slots: its report makes each of them final); ZeRO-1 keeps the rows of each
// owned range, packed in order as the close-time pass packs them, and a unit
// per owned range. Either way the rows are the close-time pass's rows over
// the same reduced bits, so the result is bitwise the same
// (tests/dist/norm_rows_dist_test.cpp). A 16-bit transport widens its sums
// into the arena only at the close, so there the pass stays at the close.
//
// It is off by default (WindowOptions::norm_under_backward) because it
// measured slower than the one pass at close. GPT-2 bf16 on an H100, window
// medians: d48 4x8 781 ms with the rows under the backward against 753 ms
// at close, d12 32x1 64.4 ms against 63.5 ms (accrue_train_gpt2
// --norm-under-backward). On the backward's own stream the row launches
// stall the kernels queued behind them (d48: 780 ms on an H200 against
// 727 ms, two calls); on the side stream they still cost 4%. Not profiled;
// the likely cause is that a launch of a few rows keeps a few blocks resident
// for the whole of a latency-bound read (a CUDA row is up to 12 MB at d48,
// Note [Norm partials]), taking SMs from the backward's GEMMs, while the
// whole pass at close reads the arena at full bandwidth in about 0.1 ms (d12)
// to 1.3 ms (d48).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/core/cuda_runtime.h"

namespace accrue::optim {

class NormRowTracker {
 public:
  // Rows over the whole arena (partials: the [norm_partials_rows(arena.grads()),
  // 2] table the close reads), a unit per slot: made final by the slot's
  // grad-ready hook (one device) or by the report of its bucket (plain data
  // parallelism).
  NormRowTracker(const GradArena& arena, Tensor partials);
  // Note [ZeRO-1]: the rows of each of `ranges` packed in order into
  // `partials`, as Window::norm_partials packs them; a unit per range.
  NormRowTracker(const GradArena& arena, const std::vector<ArenaRange>& ranges, Tensor partials);

  // Around the last micro-step's backward: only then do units become final.
  void begin_last_backward();
  void end_last_backward() { armed_ = false; }
  // A unit is final (again, if it was).
  void on_final(size_t unit);
  // Every unit inside `range` is final, its values ordered after the current
  // stream's work so far (GradientSync::set_reduced_listener).
  void on_reduced(const ArenaRange& range);
  // At close, after zero_unwritten and the sync's finish(): the rows not
  // computed yet. On return the current stream is ordered after every row.
  void finish();
  // Rows the last finish() computed (0 when every row ran under the backward).
  int64_t rows_at_last_close() const { return rows_at_last_close_; }

 private:
  // A range of the arena and its rows [row0, row0 + rows) of partials_.
  struct Block {
    ArenaRange range;
    int64_t row0 = 0, rows = 0;
  };
  // units: extents in the arena, disjoint, each inside one block.
  void init(const std::vector<ArenaRange>& blocks, const std::vector<ArenaRange>& units);
  // Marks a unit final; returns false when it already was (its rows go stale).
  void mark_final(size_t unit);
  // Launches the computable rows of [first, last], in runs of consecutive rows of one block.
  int64_t launch(int64_t first, int64_t last, bool all_pending);

  const GradArena& arena_;
  Tensor partials_;
  // CUDA only: the side stream the rows run on, and the event each launch waits for.
  std::unique_ptr<Stream> side_;
  std::unique_ptr<Event> ordered_;
  std::vector<Block> blocks_;
  std::vector<size_t> block_of_row_;
  std::vector<ArenaRange> units_;              // per unit: its extent
  std::vector<size_t> by_offset_;              // the units in arena order
  std::vector<int64_t> first_row_, last_row_;  // per unit: the rows it overlaps
  std::vector<int> units_in_row_;              // per row: the units it overlaps
  std::vector<int> waiting_;                   // per row: units not final yet
  std::vector<char> done_;                     // per row: computed this window
  std::vector<char> final_;                    // per unit: final this window
  bool armed_ = false;
  int64_t rows_at_last_close_ = 0;
};

}  // namespace accrue::optim
