#include "optim/layer_monitor.h"

#include <cmath>

#include "core/grad_mode.h"
#include "kernels/ops.h"

namespace accrue::optim {

namespace {

// sum(t * t) into the f64 element `into` (a 1-element view), on t's device.
void sum_of_squares(const Tensor& t, const Tensor& into) {
  const Tensor t64 = t.to(DType::f64);
  into.copy_(kernels::sum(kernels::binary(kernels::BinaryOp::Mul, t64, t64)).reshape({1}));
}

}  // namespace

LayerMonitor::LayerMonitor(const GradArena& arena) : arena_(arena) {
  ACCRUE_CHECK(!arena.master_sharded(), "LayerMonitor: the arena's master weights are a ZeRO-1 ",
               "shard; per-layer ratios need every layer's weights");
  squares_ = zeros({static_cast<int64_t>(arena.size()), 3}, DType::f64, arena.options().device);
}

void LayerMonitor::before_close() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < arena_.size(); ++i) {
    const Tensor cell = squares_.narrow(0, static_cast<int64_t>(i), 1).narrow(1, 0, 1).reshape({1});
    if (arena_.written(i)) {
      sum_of_squares(arena_.grad_view(i), cell);
    } else {
      cell.fill_(0.0);  // the close zeroes it (Note [Overwrite first])
    }
  }
  before_ = arena_.master().clone();
  measured_ = false;
}

void LayerMonitor::after_close() {
  ACCRUE_CHECK(before_.defined(), "LayerMonitor::after_close: call before_close() first");
  NoGradGuard no_grad;
  for (size_t i = 0; i < arena_.size(); ++i) {
    const GradArena::Slot& s = arena_.slots()[i];
    const Tensor now = arena_.master().narrow(0, s.offset, s.numel);
    const Tensor was = before_.narrow(0, s.offset, s.numel);
    const Tensor row = squares_.narrow(0, static_cast<int64_t>(i), 1);
    sum_of_squares(kernels::binary(kernels::BinaryOp::Sub, now, was),
                   row.narrow(1, 1, 1).reshape({1}));
    sum_of_squares(was, row.narrow(1, 2, 1).reshape({1}));
  }
  before_ = Tensor();
  measured_ = true;
}

std::vector<LayerReport> LayerMonitor::read(const WindowReport& report) const {
  ACCRUE_CHECK(measured_,
               "LayerMonitor::read: no window measured (before_close, close, "
               "after_close)");
  const std::vector<double> v = squares_.to_vector<double>();
  double grad_total = 0.0, update_total = 0.0, weight_total = 0.0;
  for (size_t i = 0; i < arena_.size(); ++i) {
    grad_total += v[3 * i];
    update_total += v[3 * i + 1];
    weight_total += v[3 * i + 2];
  }
  // The arena holds the gradient scaled by the loss scale and not yet
  // divided by N: its norm, brought to the report's footing.
  const double scale = grad_total > 0.0 ? report.grad_norm / std::sqrt(grad_total) : 0.0;
  std::vector<LayerReport> layers;
  for (size_t i = 0; i < arena_.size(); ++i) {
    LayerReport l;
    l.name = arena_.slots()[i].name;
    l.grad_norm = std::sqrt(v[3 * i]) * scale;
    l.update_ratio = v[3 * i + 2] > 0.0 ? std::sqrt(v[3 * i + 1] / v[3 * i + 2]) : 0.0;
    layers.push_back(l);
  }
  total_update_ratio_ = weight_total > 0.0 ? std::sqrt(update_total / weight_total) : 0.0;
  return layers;
}

}  // namespace accrue::optim
