#include "accrue/optim/gradient_sync.h"

#include "accrue/core/error.h"

namespace accrue::optim {

void GradientSync::all_reduce_max(const Tensor& values) {
  ACCRUE_CHECK(world_size() == 1, "GradientSync::all_reduce_max: a sync over ", world_size(),
               " ranks must take the max of the ", values.numel(),
               " values over them (override all_reduce_max)");
}

void GradientSync::all_reduce_sum(const Tensor& values) {
  ACCRUE_CHECK(world_size() == 1, "GradientSync::all_reduce_sum: a sync over ", world_size(),
               " ranks must sum the ", values.numel(),
               " values over them (override all_reduce_sum)");
}

// Only a sharded sync (non-empty owned_ranges()) is ever asked to gather.
void GradientSync::all_gather(const Tensor&, const Tensor&) {
  ACCRUE_CHECK(false, "GradientSync::all_gather: this sync does not shard (no owned ranges)");
}

void GradientSync::all_gather_owned(const Tensor&) {
  ACCRUE_CHECK(false, "GradientSync::all_gather_owned: this sync does not shard (no owned ranges)");
}

bool GradientSync::set_reduced_listener(std::function<void(const ArenaRange&)>) {
  return false;
}

}  // namespace accrue::optim
