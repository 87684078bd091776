#include "optim/gradient_sync.h"

#include "core/error.h"

namespace accrue::optim {

void GradientSync::reduce_flags(const Tensor& flags) {
  ACCRUE_CHECK(world_size() == 1, "GradientSync::reduce_flags: a sync over ", world_size(),
               " ranks must take the max of the ", flags.numel(),
               " written flags over them (override reduce_flags)");
}

void GradientSync::reduce_max(const Tensor& values) {
  ACCRUE_CHECK(world_size() == 1, "GradientSync::reduce_max: a sync over ", world_size(),
               " ranks must take the max of the ", values.numel(),
               " values over them (override reduce_max)");
}

// Only a sharded sync (non-empty owned_ranges()) is ever asked to gather.
void GradientSync::gather_partials(const Tensor&, const Tensor&) {
  ACCRUE_CHECK(false, "GradientSync::gather_partials: this sync does not shard (no owned ranges)");
}

void GradientSync::gather_parameters(const Tensor&) {
  ACCRUE_CHECK(false,
               "GradientSync::gather_parameters: this sync does not shard (no owned ranges)");
}

bool GradientSync::set_reduced_listener(std::function<void(const ArenaRange&)>) {
  return false;
}

}  // namespace accrue::optim
