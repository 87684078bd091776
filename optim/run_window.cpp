#include "accrue/optim/run_window.h"

#include <algorithm>

#include "accrue/core/allocator.h"
#include "accrue/core/error.h"

namespace accrue::optim {
namespace {

// The largest divisor of `items` that is at most `limit` (at least 1).
int64_t largest_divisor_at_most(int64_t items, int64_t limit) {
  for (int64_t b = std::max<int64_t>(limit, 1); b > 1; --b)
    if (items % b == 0) return b;
  return 1;
}

}  // namespace

WindowRun run_window(Window& window, int64_t items, int64_t micro_batch,
                     const std::function<Loss(int64_t first, int64_t count)>& forward,
                     const RetryOptions& options) {
  ACCRUE_CHECK(items >= 1 && micro_batch >= 1 && items % micro_batch == 0, "run_window: ", items,
               " items do not split into micro-batches of ", micro_batch);
  ACCRUE_CHECK(options.max_halvings >= 0, "run_window: max_halvings must be >= 0, got ",
               options.max_halvings);
  ACCRUE_CHECK(window.micro_step() == 0, "run_window: the window is at micro-step ",
               window.micro_step(), "; start between windows");
  const Device device = window.state().device();
  WindowRun run{micro_batch, items / micro_batch, 0};
  while (true) {
    window.set_micro_steps(run.micro_steps);
    const int64_t baseline = memory_stats(device).current_bytes;
    int64_t step = 0;
    // Only the micro-steps are retried: a close that ran out of memory may
    // have stepped part of the arena, and stepping again would be wrong.
    try {
      for (; step < run.micro_steps; ++step) {
        reset_peak_memory(device);
        window.backward(forward(step * run.micro_batch, run.micro_batch));
      }
    } catch (const OutOfMemoryError& e) {
      // What the failed micro-step held at its peak, and what it asked for on top.
      const int64_t reached = std::max<int64_t>(memory_stats(device).peak_bytes - baseline, 0);
      const int64_t needed = reached + e.requested_bytes();
      window.restart();
      const int64_t half = largest_divisor_at_most(items, run.micro_batch / 2);
      if (run.halvings < options.max_halvings && half < run.micro_batch) {
        run.micro_batch = half;
        run.micro_steps = items / half;
        ++run.halvings;
        continue;
      }
      // A linear estimate: the items that fit in what the failed step did get.
      const int64_t estimate = largest_divisor_at_most(
          items, needed > 0 ? static_cast<int64_t>(static_cast<double>(run.micro_batch) *
                                                   static_cast<double>(reached) /
                                                   static_cast<double>(needed))
                            : run.micro_batch / 2);
      ACCRUE_FAIL("run_window: out of memory in micro-step ", step, " of ", run.micro_steps,
                  " at micro-batch ", run.micro_batch, " (", items, " items per window",
                  run.halvings > 0 ? detail::str_cat(", after ", run.halvings, " halvings") : "",
                  "): the step reached ", mib(reached), " above the window's start and asked for ",
                  mib(e.requested_bytes()), " more; by a linear estimate micro-batch ", estimate,
                  " x K ", items / estimate,
                  " would fit (optim::plan_micro_batch measures it; RetryOptions::max_halvings "
                  "retries by itself). ",
                  e.message());
    }
    window.close();
    return run;
  }
}

}  // namespace accrue::optim
