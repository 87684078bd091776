// The layer monitor of the trainers' --layer-metrics-every (Note [Layer
// monitor]): built for the close the run has, and its figures as --metrics
// extras.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue.h"

namespace accrue::examples {

// Null when every <= 0. Note [Step sums]: the figures come from the close's
// own pass, unless the close is replayed from a graph (`graphed`) or steps
// ZeRO-1 ranges; then from separate passes.
std::unique_ptr<optim::LayerMonitor> make_layer_monitor(int64_t every,
                                                        const optim::ParamStore& store,
                                                        optim::Optimizer& optimizer, bool graphed);

// The --metrics extras of a window the layer monitor measured: each layer's
// and each parameter group's gradient norm and update-to-weight ratio.
void add_layer_extras(optim::LayerMonitor& layers, const optim::WindowReport& r,
                      const std::vector<int>& slot_groups,
                      std::vector<std::pair<std::string, double>>* extras);

}  // namespace accrue::examples
