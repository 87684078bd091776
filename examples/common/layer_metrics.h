// The layer monitor of the trainers' --layer-metrics-every (Note [Layer
// monitor]): built for the close the run has, run around it, and its figures
// as --metrics extras.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue.h"
#include "accrue/core/nvtx.h"

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

// One window of a trainer: the micro-steps still to run (a resumed window
// continues where it stopped), then the close, replayed when `graphed`, with
// the layer monitor around it when `measure`.
template <class MicroStep>
void run_one_window(optim::Window& window, optim::GraphedWindow* graphed,
                    optim::LayerMonitor* layers, bool measure, int64_t micro_steps,
                    MicroStep&& micro_step) {
  const NvtxRange range("accrue window");
  for (int64_t k = window.micro_step(); k < micro_steps; ++k)
    micro_step();
  if (measure) layers->before_close();
  if (graphed) {
    graphed->close();
  } else {
    window.close();
  }
  if (measure) layers->after_close();
}

}  // namespace accrue::examples
