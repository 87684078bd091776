// What keeps a trainer from passing off a failed run as a success: skipped
// windows bounded, a non-finite loss and a run that never stepped refused.
//
// Note [Honest exit codes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A window whose gradients are not finite is skipped by its close (Note
// [Skipped window] in optim/window.h): weights and moments stay as they were.
// That is how dynamic loss scaling gets past an overflow and how a run
// survives one bad batch, but it is not training, and once the weights or the
// data have gone bad every later window is skipped too. So a trainer ends
// with exit 1 (Note [Exit codes]) and one line naming the window:
//   - as soon as more than --max-skipped-windows windows in a row were
//     skipped, naming the first and the last of them. The default, 32, stops
//     a diverged run within 32 windows instead of at its end, and lets f16's
//     dynamic scale fall by 2^32 in a row (it halves at each skip), more than
//     any starting scale needs (the default start is at most 2^16);
//   - at its end, when the last window's loss is not finite, naming the
//     window from which it was not;
//   - at its end, when no window of the run (from window 1, across resumes)
//     took an optimizer step; not where it stops early to be resumed
//     (--stop-after), since f16's first windows may all be skipped.
// The count of skips in a row travels in the trainers' checkpoints, so the
// bound holds across a resume. The checks read the window's report, which the
// host reads once per window anyway, so they cost nothing on the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "accrue.h"

namespace accrue::examples {

class RunGuard {
 public:
  // `skipped_in_a_row`: the skips that ended the run this one resumes.
  explicit RunGuard(int64_t max_skipped_in_a_row, int64_t skipped_in_a_row = 0)
      : max_(max_skipped_in_a_row), in_a_row_(skipped_in_a_row) {}

  // After each window's report; `where` follows the window number in messages
  // (" of epoch 2", or "").
  void after_window(const optim::WindowReport& r, const std::string& where = {}) {
    in_a_row_ = r.skipped ? in_a_row_ + 1 : 0;
    if (std::isfinite(r.loss)) {
      nonfinite_since_ = 0;
    } else if (nonfinite_since_ == 0) {
      nonfinite_since_ = r.window;
    }
    if (in_a_row_ <= max_) return;
    if (in_a_row_ == 1)
      ACCRUE_FAIL("window ", r.window, where, " was skipped (its gradients were not finite; loss ",
                  r.loss, "), more than --max-skipped-windows ", max_);
    ACCRUE_FAIL(in_a_row_, " windows in a row were skipped (windows ", r.window - in_a_row_ + 1,
                " to ", r.window, where, ": their gradients were not finite; loss ", r.loss,
                "), more than --max-skipped-windows ", max_);
  }

  // At the end, with the last window's report. `whole_run`: false where the
  // run stops early to be resumed (--stop-after), whose first windows may all
  // be skipped while f16's scale settles.
  void finish(const optim::WindowReport& r, const std::string& where = {},
              bool whole_run = true) const {
    if (!std::isfinite(r.loss)) {
      const int64_t since = nonfinite_since_ > 0 ? nonfinite_since_ : r.window;
      if (since == r.window)
        ACCRUE_FAIL("the loss is not finite (", r.loss, ") at window ", r.window, where,
                    ", the last");
      ACCRUE_FAIL("the loss is not finite (", r.loss, ") in windows ", since, " to ", r.window,
                  where, ", the last");
    }
    ACCRUE_CHECK(r.optimizer_steps > 0 || !whole_run, "every window was skipped (windows 1 to ",
                 r.window, where,
                 "): no optimizer step was taken (every window's gradients were not finite)");
  }

  int64_t skipped_in_a_row() const { return in_a_row_; }

 private:
  int64_t max_, in_a_row_;
  int64_t nonfinite_since_ = 0;  // the first window of the last run of non-finite losses
};

}  // namespace accrue::examples
