// run_window: one window over a batch of items, split into micro-batches by
// the library, retried at half the micro-batch when memory runs out.
//
// Note [Out-of-memory retry]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A window's update depends on the items it sums, not on how they are split
// (Note [Normalization]: N counts items, 1/N comes at close). So when a
// micro-step runs out of memory (an OutOfMemoryError from the allocator, in
// the forward or the backward; not in the close, which may have stepped part
// of the arena already and is never run twice), the window can start again at half the
// micro-batch and twice the micro-steps and still make the same update: the
// micro-steps done so far are dropped (Window::restart: N, the loss sum and
// the written flags go back, and the next backward overwrites the slots, so
// a backward cut short leaves nothing behind), and every item is run again.
// The result equals the large batch up to the order of the additions (the
// CPU test compares against an uninterrupted run at the final micro-batch
// within 1e-12 in f64). Without a retry, or once the halvings allowed are
// spent, the error says what the allocator said (requested, free, held), the
// micro-batch and K that failed, the peak the failed micro-step reached, and
// the micro-batch x K that a linear estimate from those numbers says would
// fit. One process only: under data parallelism every rank would have to
// restart together.
#pragma once

#include <cstdint>
#include <functional>

#include "accrue/autograd/ops.h"
#include "accrue/optim/window.h"

namespace accrue::optim {

struct RetryOptions {
  int max_halvings = 0;  // 0: no retry, the error only
};

struct WindowRun {
  int64_t micro_batch = 0;  // the micro-batch that ran the window
  int64_t micro_steps = 0;  // its K
  int halvings = 0;         // retries it took
};

// Runs one window of `items` items in micro-batches of `micro_batch` (which
// must divide it), forward(first, count) giving the Loss of items [first,
// first + count); the backward and the close are done here. The window must
// be between windows; its micro-step count becomes items / micro_batch.
WindowRun run_window(Window& window, int64_t items, int64_t micro_batch,
                     const std::function<Loss(int64_t first, int64_t count)>& forward,
                     const RetryOptions& options = {});

}  // namespace accrue::optim
