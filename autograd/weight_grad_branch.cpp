// Note [Weight gradients on a branch] (autograd/weight_grad_branch.h).
#include "accrue/autograd/weight_grad_branch.h"

#include <algorithm>
#include <optional>

#include "accrue/core/error.h"

namespace accrue::autograd {

namespace {

thread_local WeightGradBranch* t_branch = nullptr;

}  // namespace

WeightGradBranch::WeightGradBranch(int device, StreamHandle branch, int lag, Ops ops)
    : device_(device), branch_(branch), lag_(lag), ops_(std::move(ops)) {
  ACCRUE_CHECK(lag >= 1, "WeightGradBranch: lag must be >= 1, got ", lag);
  ACCRUE_CHECK(ops_ || branch != nullptr, "WeightGradBranch: no branch stream on cuda:", device);
}

WeightGradBranch::~WeightGradBranch() = default;

WeightGradBranch* WeightGradBranch::current() {
  return t_branch;
}

void WeightGradBranch::run_op(Op op, Entry& e) {
  if (ops_) {
    ops_(op, e.number);
    return;
  }
  const StreamHandle here = current_stream(device_);
  switch (op) {
    case Op::fork:
      if (!fork_) fork_ = std::make_unique<Event>();
      fork_->record(here);
      fork_->block(branch_);
      break;
    case Op::branch_done:
      if (!e.done) {
        if (spare_events_.empty()) {
          e.done = std::make_unique<Event>();
        } else {
          e.done = std::move(spare_events_.back());
          spare_events_.pop_back();
        }
      }
      e.done->record(branch_);
      break;
    case Op::current_wait:
      e.done->block(here);
      break;
  }
}

void WeightGradBranch::run(std::vector<Tensor> keep, const std::function<void()>& writes) {
  ACCRUE_CHECK(!on_branch_, "WeightGradBranch::run: called from inside a branch's writes");
  Entry e;
  e.number = next_entry_++;
  e.keep = std::move(keep);
  run_op(Op::fork, e);
  pending_.push_back(std::move(e));
  Entry& entry = pending_.back();
  {
    // The writes note their slots into `entry` (slot_write) while on_branch_.
    std::optional<StreamGuard> on;
    if (!ops_) on.emplace(device_, branch_);
    on_branch_ = true;
    try {
      writes();
    } catch (...) {
      // The entry never recorded its event: drop it, so that no later wait
      // (a lag, a slot write, join) asks for one. Its writes are as undone as
      // the error left them; a capture that failed runs nothing.
      on_branch_ = false;
      pending_.pop_back();
      throw;
    }
    on_branch_ = false;
  }
  run_op(Op::branch_done, entry);
  // Keep at most lag_ entries pending: the oldest retires (its memory comes back).
  if (static_cast<int64_t>(pending_.size()) > lag_)
    retire_through(pending_.size() - static_cast<size_t>(lag_) - 1, lag_waits_);
}

void WeightGradBranch::slot_write(const void* slot) {
  if (on_branch_) {
    pending_.back().slots.push_back(slot);
    return;
  }
  // The branch's last write into this slot, newest entry first.
  for (size_t i = pending_.size(); i-- > 0;) {
    const std::vector<const void*>& s = pending_[i].slots;
    if (std::find(s.begin(), s.end(), slot) != s.end()) {
      retire_through(i, slot_waits_);
      return;
    }
  }
}

void WeightGradBranch::join() {
  ACCRUE_CHECK(!on_branch_, "WeightGradBranch::join: called from inside a branch's writes");
  if (!pending_.empty()) retire_through(pending_.size() - 1, join_waits_);
}

void WeightGradBranch::retire_through(size_t index, int64_t& counter) {
  // One wait covers every earlier entry: the branch runs them in order.
  run_op(Op::current_wait, pending_[index]);
  ++counter;
  for (size_t i = 0; i <= index; ++i) {
    if (pending_.front().done) spare_events_.push_back(std::move(pending_.front().done));
    pending_.pop_front();  // the kept tensors drop here, after the wait
  }
}

WeightGradBranchScope::WeightGradBranchScope(WeightGradBranch& branch)
    : branch_(branch), previous_(t_branch) {
  t_branch = &branch;
}

WeightGradBranchScope::~WeightGradBranchScope() {
  try {
    branch_.join();
  } catch (...) {  // a destructor must not throw; the capture that failed reports it
    branch_.abandon();
  }
  t_branch = previous_;
}

void write_slots_beside(bool all_in_slots, std::vector<Tensor> keep,
                        const std::function<void()>& writes) {
  WeightGradBranch* branch = WeightGradBranch::current();
  if (branch == nullptr || !all_in_slots || branch->on_branch()) {
    writes();
    return;
  }
  branch->run(std::move(keep), writes);
}

}  // namespace accrue::autograd
