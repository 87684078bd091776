// WeightGradBranch: a backward's weight and bias gradients issued on a side
// stream, beside the data gradients that the rest of the backward waits for.
//
// Note [Weight gradients on a branch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Linear's backward makes three products of its output gradient g: dx = g W,
// which the layer below waits for, and dW += g^T x and db += the column sums
// of g, which nothing in the backward reads: they only add into the arena's
// slots. The fused classifier's dW, LayerNorm's parameter totals
// (kernels::norm_param_totals) and a convolution's dW (autograd/ops_conv.cpp)
// are the same kind of write. At small micro-batches each fills part of the
// GPU (at 1,024 rows GPT-2 124M's GEMMs have 36-144 output tiles for 132 SMs;
// a micro-batch of 32 images gives ResNet-50's last stage 1,568 rows). With a
// branch in force on the thread
// (WeightGradBranchScope; GraphedWindow opens one while it captures a
// micro-step, set_weight_grad_branch), those slot writes go to the branch's
// stream, so that they run beside the data gradients and the ops below them:
//  - run(): the current stream records an event, the branch waits for it, and
//    the writes are issued on the branch (the same kernels with the same
//    arguments as inline); the branch then records the entry's own event.
//  - Each slot keeps its order of writes: every branch write goes to the one
//    branch stream in host order, and a slot write from the current stream
//    (the embedding's, RMSNorm's, GradArena::accumulate) first waits for the
//    branch's last write into that slot (slot_write, called by
//    GradArena::claim and accumulate). So the sums are bitwise those of the
//    inline backward.
//  - The tensors the branch reads (g, x) are kept by the entry until the
//    current stream has waited for the entry's event; then the references
//    drop, and where they were the last, the memory is freed on the current
//    stream after the branch read it. At most `lag` entries stay pending: a
//    new one retires the oldest, so the held memory stays a few gradients and
//    the graph's allocator can reuse it (a free it reuses must come before
//    the allocation in the graph).
//  - join() at the end of every backward (autograd's engine) and when the
//    scope ends: the current stream waits for the branch's last event. A
//    capture needs every stream it forked joined, and Window's code after
//    the backward (the close, the norm) reads the slots on the current
//    stream. A leaf with grad-ready hooks joins before they run: a hook may
//    read the gradient. (A GradientSync's hooks sit on every parameter, so
//    GraphedWindow refuses the branch beside one.)
//  - Only inside CUDA graph captures: an eager kernel on a second stream slows
//    every later kernel of the process by about 0.17 us (bench/RESULTS.md,
//    stream_gap), a graph's branches do not.
//  - Writes that would return a fresh gradient (a leaf without a slot) stay
//    inline: the engine adds those on the current stream. An FP8 Linear's dW
//    goes on the branch from the codes of dy's cast, which stays on the
//    current stream: it feeds dx too, and its amax feeds the window's scaling
//    state (autograd/ops_fp8.cpp); the block recipe casts dy^T for dW alone,
//    on the branch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/tensor.h"

namespace accrue::autograd {

class WeightGradBranch {
 public:
  // What the branch asks of the streams; `entry` numbers run()'s calls from 0.
  //  fork:         the current stream records the fork event, the branch waits for it;
  //  branch_done:  the branch records entry's event after its writes;
  //  current_wait: the current stream waits for entry's event.
  enum class Op { fork, branch_done, current_wait };
  // Empty: CUDA events and the branch stream made current inside run(). (The
  // CPU tests of the ordering pass one that writes the ops down and run the
  // writes where they are.)
  using Ops = std::function<void(Op op, int64_t entry)>;

  // `branch` is a stream of `device` whose library workspaces exist
  // (kernels::prepare_stream); lag >= 1 entries may stay pending.
  WeightGradBranch(int device, StreamHandle branch, int lag, Ops ops = nullptr);
  ~WeightGradBranch();
  WeightGradBranch(const WeightGradBranch&) = delete;
  WeightGradBranch& operator=(const WeightGradBranch&) = delete;

  // The branch in force on this thread, or null.
  static WeightGradBranch* current();

  // Issues `writes` (slot writes only) on the branch after the current
  // stream's work so far; `keep` stays referenced until the entry retires.
  void run(std::vector<Tensor> keep, const std::function<void()>& writes);
  // Whether run() is issuing writes now (on this thread).
  bool on_branch() const { return on_branch_; }
  // A slot write: noted as the entry's when on_branch(), else the current
  // stream first waits for the branch's last write into `slot`.
  void slot_write(const void* slot);
  // The current stream waits for every entry; nothing stays pending.
  void join();
  // Drops every pending entry without a wait: after a failed capture, which ran nothing.
  void abandon() { pending_.clear(); }

  int device() const { return device_; }
  int64_t entries() const { return next_entry_; }
  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }
  // Waits of the current stream issued so far: by lag, by a slot write, by join.
  int64_t lag_waits() const { return lag_waits_; }
  int64_t slot_waits() const { return slot_waits_; }
  int64_t join_waits() const { return join_waits_; }

 private:
  struct Entry {
    int64_t number = 0;
    std::vector<Tensor> keep;
    std::vector<const void*> slots;
    std::unique_ptr<Event> done;  // with the CUDA ops
  };
  void run_op(Op op, Entry& e);
  // Waits for entry e (the current stream) and retires it with every earlier one.
  void retire_through(size_t index, int64_t& counter);

  int device_;
  StreamHandle branch_;
  int lag_;
  Ops ops_;
  std::deque<Entry> pending_;
  std::vector<std::unique_ptr<Event>> spare_events_;
  std::unique_ptr<Event> fork_;
  bool on_branch_ = false;
  int64_t next_entry_ = 0;
  int64_t lag_waits_ = 0, slot_waits_ = 0, join_waits_ = 0;
};

// Puts a branch in force on this thread for a scope; joins it at the end.
class WeightGradBranchScope {
 public:
  explicit WeightGradBranchScope(WeightGradBranch& branch);
  ~WeightGradBranchScope();
  WeightGradBranchScope(const WeightGradBranchScope&) = delete;
  WeightGradBranchScope& operator=(const WeightGradBranchScope&) = delete;

 private:
  WeightGradBranch& branch_;
  WeightGradBranch* previous_;
};

// Runs `writes` on the branch in force when there is one and `all_in_slots`
// (every write goes into a slot), else inline; `keep` as for run().
void write_slots_beside(bool all_in_slots, std::vector<Tensor> keep,
                        const std::function<void()>& writes);

}  // namespace accrue::autograd
