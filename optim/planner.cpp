#include "accrue/optim/planner.h"

#include <cstdio>
#include <sstream>
#include <string>

#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/error.h"

namespace accrue::optim {

MicroBatchPlan plan_micro_batch(Device device, const std::function<void(int64_t)>& step,
                                const PlanOptions& options) {
  const char* op = "plan_micro_batch";
  ACCRUE_CHECK(options.global_batch >= 1 && options.world_size >= 1 &&
                   options.global_batch % options.world_size == 0,
               op, ": a global batch of ", options.global_batch, " does not split over ",
               options.world_size, " ranks");
  ACCRUE_CHECK(options.margin >= 0.0 && options.margin < 1.0, op, ": margin ", options.margin,
               " must lie in [0, 1)");
  MicroBatchPlan plan;
  plan.budget_bytes = options.budget_bytes;
  if (plan.budget_bytes <= 0) {
    ACCRUE_CHECK(device.is_cuda(), op, ": give a budget_bytes on ", device.str());
    plan.budget_bytes = cuda_free_bytes(device.index) + memory_stats(device).current_bytes;
  }
  const auto limit =
      static_cast<int64_t>(static_cast<double>(plan.budget_bytes) * (1.0 - options.margin));
  const int64_t per_rank = options.global_batch / options.world_size;
  for (int64_t b = 1; b <= per_rank; b *= 2) {
    if (per_rank % b != 0) continue;
    const int64_t before = memory_stats(device).current_bytes;
    reset_peak_memory(device);
    int64_t peak = -1;
    try {
      step(b);
      peak = memory_stats(device).peak_bytes - before;
    } catch (const Error& e) {
      if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
    }
    plan.measured.push_back({b, peak});
    if (peak < 0 || peak > limit) break;
    plan.micro_batch = b;
    plan.predicted_bytes = peak;
  }
  if (plan.micro_batch == 0) {
    const int64_t smallest = plan.measured.empty() ? -1 : plan.measured.front().second;
    ACCRUE_FAIL(op, ": even a micro-batch of 1 needs ",
                smallest < 0 ? std::string("more than the device has") : mib(smallest), ", over ",
                mib(limit), " (", mib(plan.budget_bytes), " budget less a ",
                static_cast<int>(options.margin * 100), "% margin) on ", device.str());
  }
  plan.micro_steps = per_rank / plan.micro_batch;
  return plan;
}

std::string MicroBatchPlan::describe() const {
  std::ostringstream s;
  s << "micro-batch " << micro_batch << " x K " << micro_steps
    << " per rank: " << mib(predicted_bytes) << " of a " << mib(budget_bytes)
    << " budget (measured:";
  const char* sep = " ";
  for (const auto& [b, bytes] : measured) {
    s << sep << b << ": " << (bytes < 0 ? std::string("out of memory") : mib(bytes));
    sep = ", ";
  }
  s << ")";
  return s.str();
}

}  // namespace accrue::optim
