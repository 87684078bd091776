// The micro-batch / K planner: the largest micro-batch that fits, measured.
//
// Note [Micro-batch planner]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Memory is measured, not modelled: for micro-batch sizes b that divide the
// per-rank batch (global batch / world size), smallest first and doubling,
// plan_micro_batch runs the caller's step(b) (one forward and backward, as a
// micro-step would) and reads the allocator's peak above what was held
// before (memory_stats). It stops at the first b whose peak exceeds the
// budget less the margin, or whose step runs out of memory (an accrue::Error
// from the allocator, caught), and plans the largest b that fitted: K =
// per-rank batch / b, so the window still sums the same items (Note
// [Normalization]: the update does not depend on the split). The budget
// defaults to what the device has free plus what accrue already holds there
// (CUDA), and must be given on the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accrue/core/device.h"

namespace accrue::optim {

struct PlanOptions {
  int64_t global_batch = 0;  // items per window over all ranks
  int world_size = 1;
  int64_t budget_bytes = 0;  // 0: the device's free memory plus accrue's own (CUDA only)
  double margin = 0.1;       // keep this fraction of the budget free
};

struct MicroBatchPlan {
  int64_t micro_batch = 0;
  int64_t micro_steps = 0;      // K
  int64_t predicted_bytes = 0;  // the measured peak of one micro-step at micro_batch
  int64_t budget_bytes = 0;
  std::vector<std::pair<int64_t, int64_t>> measured;  // (b, peak bytes); -1: out of memory
  // "micro-batch 16 x K 4 per rank: 1.2 GiB of a 4.0 GiB budget (measured: 1: 80 MiB, ...)"
  std::string describe() const;
};

// step(b) runs one forward and backward of b items on `device`.
MicroBatchPlan plan_micro_batch(Device device, const std::function<void(int64_t)>& step,
                                const PlanOptions& options);

}  // namespace accrue::optim
