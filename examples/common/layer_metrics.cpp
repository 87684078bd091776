#include "examples/common/layer_metrics.h"

namespace accrue::examples {

std::unique_ptr<optim::LayerMonitor> make_layer_monitor(int64_t every,
                                                        const optim::ParamStore& store,
                                                        optim::Optimizer& optimizer, bool graphed) {
  if (every <= 0) return nullptr;
  if (graphed || store.moments_sharded()) return std::make_unique<optim::LayerMonitor>(store);
  return std::make_unique<optim::LayerMonitor>(store, optimizer);
}

void add_layer_extras(optim::LayerMonitor& layers, const optim::WindowReport& r,
                      const std::vector<int>& slot_groups,
                      std::vector<std::pair<std::string, double>>* extras) {
  for (const optim::LayerReport& l : layers.read(r)) {
    extras->emplace_back("grad_norm/" + l.name, l.grad_norm);
    extras->emplace_back("update_ratio/" + l.name, l.update_ratio);
  }
  extras->emplace_back("update_ratio", layers.total_update_ratio());
  // Per parameter group: 0 decays (the trainers' 2-D weights), 1 does not.
  for (const optim::GroupReport& g : layers.groups(slot_groups)) {
    extras->emplace_back("group_grad_norm/" + std::to_string(g.group), g.grad_norm);
    extras->emplace_back("group_update_ratio/" + std::to_string(g.group), g.update_ratio);
  }
}

}  // namespace accrue::examples
