#include "accrue/optim/layer_monitor.h"

#include <array>
#include <cmath>
#include <map>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "accrue/kernels/window_close.h"

namespace accrue::optim {

LayerMonitor::LayerMonitor(const ParamStore& arena) : arena_(arena) {
  ACCRUE_CHECK(!arena.master_sharded(), "LayerMonitor: the arena's master weights are a ZeRO-1 ",
               "shard; per-layer ratios need every layer's weights");
  for (size_t i = 0; i < arena.size(); ++i) {
    first_row_.push_back(table_rows_);
    rows_.push_back(kernels::norm_partials_rows(arena.grad_view(i)));
    table_rows_ += rows_.back();
  }
  table_ = zeros({3 * table_rows_, 2}, DType::f64, arena.options().device());
}

LayerMonitor::LayerMonitor(const ParamStore& arena, Optimizer& optimizer)
    : arena_(arena), optimizer_(&optimizer) {
  ACCRUE_CHECK(!arena.master_sharded(), "LayerMonitor: the arena's master weights are a ZeRO-1 ",
               "shard; per-layer ratios need every layer's weights");
  ACCRUE_CHECK(!arena.moments_sharded(), "LayerMonitor: the arena's optimizer state is a ZeRO-1 ",
               "shard, so no pass steps the whole arena; use LayerMonitor(arena)");
  const Device device = arena.options().device();
  const int64_t chunks = (arena.padded_numel() + kernels::kChunk - 1) / kernels::kChunk;
  step_sums_ = zeros({chunks, 3}, DType::f64, device);
  std::vector<int64_t> ranges;
  for (const ParamStore::Slot& s : arena.slots()) {
    ranges.push_back(s.offset / kernels::kChunk);
    ranges.push_back((s.offset + s.numel + kernels::kChunk - 1) / kernels::kChunk);
  }
  const auto slots = static_cast<int64_t>(arena.size());
  slot_chunks_ = from_vector(ranges, {slots, 2}, DType::i64, device);
  slot_sums_ = zeros({slots, 3}, DType::f64, device);
}

Tensor LayerMonitor::rows_of(int what, size_t i) const {
  return table_.narrow(0, what * table_rows_ + first_row_[i], rows_[i]);
}

void LayerMonitor::partials(const Tensor& source, int what, size_t i) const {
  const ParamStore::Slot& s = arena_.slots()[i];
  kernels::grad_norm_partials(source.narrow(0, s.offset, s.numel), rows_of(what, i));
}

void LayerMonitor::before_close() {
  NoGradGuard no_grad;
  measured_ = false;
  if (optimizer_ != nullptr) {  // Note [Step sums]: the close's pass writes them
    optimizer_->set_step_sums(step_sums_);
    steps_before_ = optimizer_->steps_with_sums();
    return;
  }
  for (size_t i = 0; i < arena_.size(); ++i) {
    if (arena_.written(i)) {
      partials(arena_.grads(), 0, i);
    } else {
      rows_of(0, i).fill_(0.0);  // the close zeroes it (Note [Overwrite first])
    }
    partials(arena_.master(), 2, i);
  }
  before_ = arena_.master().clone();
}

void LayerMonitor::after_close() {
  NoGradGuard no_grad;
  if (optimizer_ != nullptr) {
    optimizer_->set_step_sums(Tensor());
    const int64_t steps = optimizer_->steps_with_sums() - steps_before_;
    ACCRUE_CHECK(steps == 1, "LayerMonitor::after_close: the close ran ", steps,
                 " eager optimizer passes with step sums since before_close(); expected 1 (a "
                 "close replayed from a CUDA graph needs LayerMonitor(arena))");
    kernels::step_sums_per_slot(step_sums_, slot_chunks_, arena_.grads(), arena_.master(),
                                optimizer_->step_sums_state(), slot_sums_);
    steps_before_ = optimizer_->steps_with_sums();
    measured_ = true;
    return;
  }
  ACCRUE_CHECK(before_.defined(), "LayerMonitor::after_close: call before_close() first");
  kernels::axpy_(before_, -1.0, arena_.master());  // before - after: the update's negative
  for (size_t i = 0; i < arena_.size(); ++i)
    partials(before_, 1, i);
  before_ = Tensor();
  measured_ = true;
}

std::vector<LayerReport> LayerMonitor::read(const WindowReport& report) const {
  ACCRUE_CHECK(measured_,
               "LayerMonitor::read: no window measured (before_close, close, "
               "after_close)");
  const std::vector<double> v = slot_squares();
  const size_t n = arena_.size();
  // v holds, per slot, |g|^2, |p_after - p_before|^2 and |p_before|^2.
  double grad_total = 0.0, update_total = 0.0, weight_total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    grad_total += v[3 * i];
    update_total += v[3 * i + 1];
    weight_total += v[3 * i + 2];
  }
  // The arena holds the gradient scaled by the loss scale and not yet
  // divided by N: its norm, brought to the report's footing.
  const double scale = grad_total > 0.0 ? report.grad_norm / std::sqrt(grad_total) : 0.0;
  squares_ = v;
  grad_scale_ = scale;
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

std::vector<double> LayerMonitor::slot_squares() const {
  if (optimizer_ != nullptr) return slot_sums_.to(Device::cpu()).to_vector<double>();
  // Each slot's three sums of squares from its rows; a row's non-finite count
  // (column 1) turns its sum into infinity, as the close's norm does.
  const std::vector<double> t = table_.to(Device::cpu()).to_vector<double>();
  const size_t n = arena_.size();
  std::vector<double> v(3 * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (int what = 0; what < 3; ++what) {
      double sum = 0.0;
      for (int64_t r = 0; r < rows_[i]; ++r) {
        const size_t row = static_cast<size_t>(what * table_rows_ + first_row_[i] + r);
        sum += t[2 * row + 1] > 0.0 ? INFINITY : t[2 * row];
      }
      v[3 * i + static_cast<size_t>(what)] = sum;
    }
  }
  return v;
}

std::vector<GroupReport> LayerMonitor::groups(const std::vector<int>& slot_group) const {
  ACCRUE_CHECK(!squares_.empty() || arena_.size() == 0,
               "LayerMonitor::groups: call read() on a measured window first");
  ACCRUE_CHECK(slot_group.size() == arena_.size(), "LayerMonitor::groups: ", slot_group.size(),
               " group indices for ", arena_.size(), " slots");
  std::map<int, std::array<double, 3>> sums;  // group -> the three sums of squares
  for (size_t i = 0; i < slot_group.size(); ++i) {
    ACCRUE_CHECK(slot_group[i] >= 0, "LayerMonitor::groups: slot ", i, " has group ",
                 slot_group[i]);
    std::array<double, 3>& s = sums[slot_group[i]];
    for (size_t k = 0; k < 3; ++k)
      s[k] += squares_[3 * i + k];
  }
  std::vector<GroupReport> out;
  for (const auto& [group, s] : sums) {
    GroupReport g;
    g.group = group;
    g.grad_norm = std::sqrt(s[0]) * grad_scale_;
    g.update_ratio = s[2] > 0.0 ? std::sqrt(s[1] / s[2]) : 0.0;
    out.push_back(g);
  }
  return out;
}

}  // namespace accrue::optim
