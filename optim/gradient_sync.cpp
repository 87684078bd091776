#include "optim/gradient_sync.h"

#include "core/error.h"

namespace accrue::optim {

// Only a sharded sync (non-empty owned_ranges()) is ever asked to gather.
void GradientSync::gather_partials(const Tensor&, const Tensor&) {
  ACCRUE_CHECK(false, "GradientSync::gather_partials: this sync does not shard (no owned ranges)");
}

void GradientSync::gather_parameters(const Tensor&) {
  ACCRUE_CHECK(false,
               "GradientSync::gather_parameters: this sync does not shard (no owned ranges)");
}

}  // namespace accrue::optim
