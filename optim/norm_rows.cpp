#include "optim/norm_rows.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "kernels/window_close.h"

namespace accrue::optim {

NormRowTracker::NormRowTracker(const GradArena& arena, Tensor partials)
    : arena_(arena), partials_(std::move(partials)) {
  const Tensor& grads = arena.grads();
  const int64_t rows = kernels::norm_partials_rows(grads);
  const int64_t per_row = kernels::norm_row_elements(grads);
  // Note [Norm rows]: only CUDA's row 0 reads a tail past the last 16-byte
  // pack, and an arena has none (its size is a multiple of 256 bytes).
  const int64_t pack = 16 / static_cast<int64_t>(element_size(grads.dtype()));
  ACCRUE_CHECK(arena.padded_numel() % pack == 0 && per_row > 0, "NormRowTracker: an arena of ",
               arena.padded_numel(), " elements, rows of ", per_row);
  slots_in_row_.assign(static_cast<size_t>(rows), 0);
  const std::vector<GradArena::Slot>& slots = arena.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    // A slot's extent runs to the next slot's start: its padding rides along.
    const int64_t end = i + 1 < slots.size() ? slots[i + 1].offset : arena.padded_numel();
    const int64_t first = std::min(slots[i].offset / per_row, rows - 1);
    const int64_t last = std::min((std::max(end, slots[i].offset + 1) - 1) / per_row, rows - 1);
    first_row_.push_back(first);
    last_row_.push_back(last);
    for (int64_t r = first; r <= last; ++r)
      ++slots_in_row_[static_cast<size_t>(r)];
  }
  waiting_ = slots_in_row_;
  done_.assign(static_cast<size_t>(rows), 0);
  final_.assign(slots.size(), 0);
  if (grads.device().is_cuda()) {
    side_ = std::make_unique<Stream>(grads.device().index);
    ordered_ = std::make_unique<Event>();
  }
}

void NormRowTracker::begin_last_backward() {
  waiting_ = slots_in_row_;
  std::fill(done_.begin(), done_.end(), 0);
  std::fill(final_.begin(), final_.end(), 0);
  armed_ = true;
}

void NormRowTracker::on_final(size_t slot) {
  if (!armed_) return;
  const int64_t first = first_row_[slot], last = last_row_[slot];
  if (final_[slot]) {
    // Another gradient landed in a final slot: its rows are stale; they run
    // again once nothing else is waiting in them (here, or at close).
    for (int64_t r = first; r <= last; ++r)
      done_[static_cast<size_t>(r)] = 0;
  } else {
    final_[slot] = 1;
    for (int64_t r = first; r <= last; ++r)
      --waiting_[static_cast<size_t>(r)];
  }
  launch(first, last, /*all_pending=*/false);
}

void NormRowTracker::finish() {
  armed_ = false;
  rows_at_last_close_ = launch(0, static_cast<int64_t>(done_.size()) - 1, /*all_pending=*/true);
  if (side_) {  // the scalar step, on the current stream, reads every row
    ordered_->record(side_->handle());
    ordered_->block(current_stream(side_->device()));
  }
}

int64_t NormRowTracker::launch(int64_t first, int64_t last, bool all_pending) {
  int64_t launched = 0;
  auto computable = [&](int64_t r) {
    const size_t i = static_cast<size_t>(r);
    return !done_[i] && (all_pending || waiting_[i] == 0);
  };
  for (int64_t r = first; r <= last;) {
    if (!computable(r)) {
      ++r;
      continue;
    }
    int64_t end = r;
    while (end + 1 <= last && computable(end + 1))
      ++end;
    std::optional<StreamGuard> on_side;
    if (side_) {
      // The side stream waits for every gradient written so far, then reads.
      const int device = side_->device();
      ordered_->record(current_stream(device));
      ordered_->block(side_->handle());
      on_side.emplace(device, side_->handle());
    }
    kernels::grad_norm_partials(arena_.grads(), partials_, r, end - r + 1);
    for (int64_t i = r; i <= end; ++i)
      done_[static_cast<size_t>(i)] = 1;
    launched += end - r + 1;
    r = end + 1;
  }
  return launched;
}

}  // namespace accrue::optim
