// NormRowTracker: the norm pass of the window close, run while the last
// micro-step's backward still runs (Note [Norm under the backward]).
//
// Note [Norm under the backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Step 3 of Note [Window close] reads the whole gradient arena once. Without
// a GradientSync it need not wait for the close: in the last micro-step each
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
// one pass at close (tests/optim/norm_rows_test.cpp). Under data parallelism
// a row would have to wait for its bucket's reduction, so the Window keeps
// the pass at close there.
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

#include "autograd/grad_arena.h"
#include "core/cuda_runtime.h"

namespace accrue::optim {

class NormRowTracker {
 public:
  // partials: the [norm_partials_rows(arena.grads()), 2] table the close reads.
  NormRowTracker(const GradArena& arena, Tensor partials);

  // Around the last micro-step's backward: hooks count only in between.
  void begin_last_backward();
  void end_last_backward() { armed_ = false; }
  // A parameter's grad-ready hook: its slot is final (again, if it was).
  void on_final(size_t slot);
  // At close, after zero_unwritten: the rows not computed yet. On return the
  // current stream is ordered after every row.
  void finish();
  // Rows the last finish() computed (0 when every row ran under the backward).
  int64_t rows_at_last_close() const { return rows_at_last_close_; }

 private:
  // Launches the computable rows of [first, last], in runs of consecutive rows.
  int64_t launch(int64_t first, int64_t last, bool all_pending);

  const GradArena& arena_;
  Tensor partials_;
  // CUDA only: the side stream the rows run on, and the event each launch waits for.
  std::unique_ptr<Stream> side_;
  std::unique_ptr<Event> ordered_;
  std::vector<int64_t> first_row_, last_row_;  // per slot: the rows it overlaps
  std::vector<int> slots_in_row_;              // per row: the slots it overlaps
  std::vector<int> waiting_;                   // per row: slots not final yet
  std::vector<char> done_;                     // per row: computed this window
  std::vector<char> final_;                    // per slot: final this window
  bool armed_ = false;
  int64_t rows_at_last_close_ = 0;
};

}  // namespace accrue::optim
