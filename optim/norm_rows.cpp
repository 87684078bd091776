#include "accrue/optim/norm_rows.h"

#include <algorithm>
#include <optional>

#include "accrue/core/error.h"
#include "accrue/kernels/window_close.h"

namespace accrue::optim {

namespace {

// A slot's extent runs to the next slot's start: its padding rides along.
std::vector<ArenaRange> slot_extents(const GradArena& arena) {
  const std::vector<GradArena::Slot>& slots = arena.slots();
  std::vector<ArenaRange> out;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t end = i + 1 < slots.size() ? slots[i + 1].offset : arena.padded_numel();
    out.push_back({slots[i].offset, end - slots[i].offset});
  }
  return out;
}

}  // namespace

NormRowTracker::NormRowTracker(const GradArena& arena, Tensor partials)
    : arena_(arena), partials_(std::move(partials)) {
  init({{0, arena.padded_numel()}}, slot_extents(arena));
}

NormRowTracker::NormRowTracker(const GradArena& arena, const std::vector<ArenaRange>& ranges,
                               Tensor partials)
    : arena_(arena), partials_(std::move(partials)) {
  init(ranges, ranges);
}

void NormRowTracker::init(const std::vector<ArenaRange>& blocks,
                          const std::vector<ArenaRange>& units) {
  const Tensor& grads = arena_.grads();
  // Note [Norm rows]: only CUDA's row 0 reads a tail past the last 16-byte
  // pack; a block without one computes every row the same in any launch.
  const int64_t pack = 16 / static_cast<int64_t>(element_size(grads.dtype()));
  int64_t row0 = 0;
  for (const ArenaRange& r : blocks) {
    const Tensor g = grads.narrow(0, r.offset, r.numel);
    const int64_t rows = kernels::norm_partials_rows(g);
    ACCRUE_CHECK(r.numel % pack == 0 && kernels::norm_row_elements(g) > 0,
                 "NormRowTracker: a range of ", r.numel, " elements at ", r.offset,
                 " is not a whole number of ", pack, "-element packs");
    blocks_.push_back({r, row0, rows});
    block_of_row_.insert(block_of_row_.end(), static_cast<size_t>(rows), blocks_.size() - 1);
    row0 += rows;
  }
  ACCRUE_CHECK(partials_.size(0) == row0, "NormRowTracker: a partials table of ", partials_.size(0),
               " rows for ", row0, " rows");
  units_in_row_.assign(static_cast<size_t>(row0), 0);
  for (const ArenaRange& u : units) {
    // ZeRO-1's ranges come in plan order, which runs down the arena: search them all.
    auto inside = [&](const Block& k) {
      return u.offset >= k.range.offset && u.offset + u.numel <= k.range.offset + k.range.numel;
    };
    const auto block = std::find_if(blocks_.begin(), blocks_.end(), inside);
    ACCRUE_CHECK(block != blocks_.end(), "NormRowTracker: the unit [", u.offset, ", ",
                 u.offset + u.numel, ") lies in no single range");
    const Block& k = *block;
    const int64_t per_row =
        kernels::norm_row_elements(grads.narrow(0, k.range.offset, k.range.numel));
    const int64_t begin = u.offset - k.range.offset;
    const int64_t end = std::max(u.offset + u.numel, u.offset + 1) - k.range.offset;
    const int64_t first = k.row0 + std::min(begin / per_row, k.rows - 1);
    const int64_t last = k.row0 + std::min((end - 1) / per_row, k.rows - 1);
    units_.push_back(u);
    first_row_.push_back(first);
    last_row_.push_back(last);
    for (int64_t r = first; r <= last; ++r)
      ++units_in_row_[static_cast<size_t>(r)];
  }
  by_offset_.resize(units_.size());
  for (size_t i = 0; i < units_.size(); ++i)
    by_offset_[i] = i;
  std::sort(by_offset_.begin(), by_offset_.end(),
            [&](size_t a, size_t b) { return units_[a].offset < units_[b].offset; });
  waiting_ = units_in_row_;
  done_.assign(static_cast<size_t>(row0), 0);
  final_.assign(units_.size(), 0);
  if (grads.device().is_cuda()) {
    side_ = std::make_unique<Stream>(grads.device().index);
    ordered_ = std::make_unique<Event>();
  }
}

void NormRowTracker::begin_last_backward() {
  waiting_ = units_in_row_;
  std::fill(done_.begin(), done_.end(), 0);
  std::fill(final_.begin(), final_.end(), 0);
  armed_ = true;
}

void NormRowTracker::mark_final(size_t unit) {
  const int64_t first = first_row_[unit], last = last_row_[unit];
  if (final_[unit]) {
    // Another gradient landed in a final unit: its rows are stale; they run
    // again once nothing else is waiting in them (here, or at close).
    for (int64_t r = first; r <= last; ++r)
      done_[static_cast<size_t>(r)] = 0;
    return;
  }
  final_[unit] = 1;
  for (int64_t r = first; r <= last; ++r)
    --waiting_[static_cast<size_t>(r)];
}

void NormRowTracker::on_final(size_t unit) {
  if (!armed_) return;
  mark_final(unit);
  launch(first_row_[unit], last_row_[unit], /*all_pending=*/false);
}

void NormRowTracker::on_reduced(const ArenaRange& range) {
  if (!armed_) return;
  // Units do not overlap: those inside the range are one run in offset order.
  auto it = std::lower_bound(by_offset_.begin(), by_offset_.end(), range.offset,
                             [&](size_t u, int64_t off) { return units_[u].offset < off; });
  int64_t first = -1, last = -1;
  for (; it != by_offset_.end() &&
         units_[*it].offset + units_[*it].numel <= range.offset + range.numel;
       ++it) {
    mark_final(*it);
    // One block holds them all (each is inside `range`, a block or a bucket of slots).
    first = first < 0 ? first_row_[*it] : std::min(first, first_row_[*it]);
    last = std::max(last, last_row_[*it]);
  }
  if (first >= 0) launch(first, last, /*all_pending=*/false);
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
    const Block& k = blocks_[block_of_row_[static_cast<size_t>(r)]];
    int64_t end = r;
    while (end + 1 <= last && end + 1 < k.row0 + k.rows && computable(end + 1))
      ++end;
    std::optional<StreamGuard> on_side;
    if (side_) {
      // The side stream waits for every gradient written so far, then reads.
      const int device = side_->device();
      ordered_->record(current_stream(device));
      ordered_->block(side_->handle());
      on_side.emplace(device, side_->handle());
    }
    kernels::grad_norm_partials(arena_.grads().narrow(0, k.range.offset, k.range.numel),
                                partials_.narrow(0, k.row0, k.rows), r - k.row0, end - r + 1);
    for (int64_t i = r; i <= end; ++i)
      done_[static_cast<size_t>(i)] = 1;
    launched += end - r + 1;
    r = end + 1;
  }
  return launched;
}

}  // namespace accrue::optim
