#include "accrue/optim/optimizer.h"

#include <cmath>

#include "accrue/core/cuda_graph.h"
#include "accrue/core/error.h"

namespace accrue::optim {

namespace {

template <class O>
kernels::OptimizerConfig adam_config(const O& o, bool decoupled, const char* who) {
  kernels::OptimizerConfig c;
  c.adam = true;
  c.decoupled_weight_decay = decoupled;
  c.groups = {{o.lr(), o.weight_decay()}};
  c.beta1 = o.beta1();
  c.beta2 = o.beta2();
  c.eps = o.eps();
  c.amsgrad = o.amsgrad();
  kernels::check_optimizer_config(c, who);  // Note [Option checks]
  return c;
}

// Note [Unused parameters]: the arena slot of every kernels::kChunk-element
// chunk. Slots start on 256-byte boundaries, so a chunk holds one slot's
// elements or padding; padding goes with the slot before it (zeros stay zero
// whether stepped or not).
Tensor chunk_slot_table(const ParamStore& arena) {
  const int64_t chunks = (arena.padded_numel() + kernels::kChunk - 1) / kernels::kChunk;
  std::vector<int32_t> table(static_cast<size_t>(chunks), -1);
  for (size_t i = 0; i < arena.size(); ++i) {
    const ParamStore::Slot& s = arena.slots()[i];
    for (int64_t c = s.offset / kernels::kChunk;
         c < (s.offset + s.numel + kernels::kChunk - 1) / kernels::kChunk; ++c)
      table[static_cast<size_t>(c)] = static_cast<int32_t>(i);
  }
  int32_t previous = 0;
  for (int32_t& slot : table) {
    if (slot < 0) slot = previous;
    previous = slot;
  }
  return from_vector(table, {chunks}, DType::i32, arena.options().device());
}
}  // namespace

SlotTables make_slot_tables(const ParamStore& arena) {
  const auto slots = static_cast<int64_t>(arena.size());
  const Device device = arena.options().device();
  return {chunk_slot_table(arena), zeros({slots}, DType::f64, device),
          zeros({slots, 3}, DType::f64, device)};
}

LinearWarmup::LinearWarmup(int64_t warmup) : warmup_(warmup) {
  ACCRUE_CHECK(warmup >= 0, "LinearWarmup: invalid warmup ", warmup);
}
double LinearWarmup::factor(int64_t step) const {
  return step < warmup_ ? static_cast<double>(step + 1) / static_cast<double>(warmup_) : 1.0;
}

WarmupCosine::WarmupCosine(int64_t warmup, int64_t total, double min_factor)
    : warmup_(warmup), total_(total), min_factor_(min_factor) {
  ACCRUE_CHECK(warmup >= 0 && total > warmup,
               "WarmupCosine: need 0 <= warmup < total, got warmup=", warmup, " total=", total);
  ACCRUE_CHECK(min_factor >= 0.0 && min_factor <= 1.0, "WarmupCosine: invalid min_factor ",
               min_factor);
}
double WarmupCosine::factor(int64_t step) const {
  if (step < warmup_) return static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_) return min_factor_;
  const double progress =
      static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_factor_ + (1.0 - min_factor_) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double linear_scaling_rule(double base_lr, int64_t base_batch, int64_t batch) {
  ACCRUE_CHECK(base_batch > 0 && batch > 0,
               "linear_scaling_rule: invalid batch sizes base=", base_batch, " batch=", batch);
  return base_lr * static_cast<double>(batch) / static_cast<double>(base_batch);
}

Optimizer::Optimizer(const SGDOptions& o) {
  config_.adam = false;
  config_.decoupled_weight_decay = false;
  config_.groups = {{o.lr(), o.weight_decay()}};
  config_.momentum = o.momentum();
  config_.dampening = o.dampening();
  config_.nesterov = o.nesterov();
  kernels::check_optimizer_config(config_, "SGD");  // Note [Option checks]
}

Optimizer::Optimizer(const AdamOptions& o) : config_(adam_config(o, false, "Adam")) {}
Optimizer::Optimizer(const AdamWOptions& o) : config_(adam_config(o, true, "AdamW")) {}

Optimizer& Optimizer::add_param_group(const std::vector<Tensor>& params,
                                      const GroupOptions& options) {
  ACCRUE_CHECK(static_cast<int>(groups_.size()) + 2 <= kernels::kMaxGroups, "Optimizer: at most ",
               kernels::kMaxGroups, " parameter groups");
  // Note [Option checks]: the overrides, with the group's index among all groups.
  kernels::check_group_hyper({options.lr().value_or(0.0), options.weight_decay().value_or(0.0)},
                             static_cast<int64_t>(groups_.size()) + 1,
                             "Optimizer::add_param_group");
  ACCRUE_CHECK(bound_ == nullptr, "Optimizer: add parameter groups before the first step");
  groups_.push_back({params, options});
  return *this;
}

Optimizer& Optimizer::set_schedule(std::shared_ptr<const LRSchedule> schedule) {
  ACCRUE_CHECK(schedule != nullptr, "Optimizer::set_schedule: null schedule");
  schedule_ = std::move(schedule);
  return *this;
}

int Optimizer::moments_needed() const {
  if (!config_.adam) return config_.momentum > 0.0 ? 1 : 0;
  return config_.amsgrad ? 3 : 2;
}

kernels::OptimizerConfig Optimizer::config_at(int64_t step) const {
  kernels::OptimizerConfig c = config_;
  const kernels::GroupHyper base = config_.groups[0];
  const double factor = schedule_->factor(step);
  c.groups.clear();
  c.groups.push_back({base.lr * factor, base.weight_decay});
  for (const Group& g : groups_) {
    c.groups.push_back({g.options.lr().value_or(base.lr) * factor,
                        g.options.weight_decay().value_or(base.weight_decay)});
  }
  return c;
}

std::vector<int> Optimizer::slot_groups(const ParamStore& arena) const {
  std::vector<int> out(arena.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const Tensor& p : groups_[g].params) {
      const int i = arena.index_of(p);
      ACCRUE_CHECK(i >= 0, "Optimizer::slot_groups: a parameter of group ", g + 1,
                   " is not registered in the arena");
      out[static_cast<size_t>(i)] = static_cast<int>(g + 1);
    }
  }
  return out;
}

void Optimizer::bind(const ParamStore& arena) {
  ACCRUE_CHECK(arena.options().moments() >= moments_needed(), "Optimizer: needs ", moments_needed(),
               " moment arenas, the arena has ", arena.options().moments());
  const int64_t chunks = (arena.padded_numel() + kernels::kChunk - 1) / kernels::kChunk;
  std::vector<int32_t> table(static_cast<size_t>(chunks), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const Tensor& p : groups_[g].params) {
      const int i = arena.index_of(p);
      ACCRUE_CHECK(i >= 0, "Optimizer: a parameter of group ", g + 1,
                   " is not registered in the arena");
      const ParamStore::Slot& s = arena.slots()[i];
      // Slots start on 256-byte boundaries, so each chunk belongs to one parameter.
      for (int64_t c = s.offset / kernels::kChunk;
           c < (s.offset + s.numel + kernels::kChunk - 1) / kernels::kChunk; ++c)
        table[c] = static_cast<int32_t>(g + 1);
    }
  }
  chunk_groups_ = from_vector(table, {chunks}, DType::i32, arena.options().device());
  hyper_ = zeros({kernels::kHyperSize}, DType::f64, arena.options().device());
  bound_ = &arena;
}

void Optimizer::store_hyperparameters(int64_t step) const {
  ACCRUE_CHECK(bound_ != nullptr, "Optimizer::store_hyperparameters: bind(arena) first");
  kernels::store_hyperparameters(config_at(step), hyper_);
}

kernels::OptimizerBuffers Optimizer::buffers(const ParamStore& arena, int64_t offset, int64_t numel,
                                             int64_t moment_offset, const SlotTables& slots) const {
  const int m = moments_needed();
  kernels::OptimizerBuffers b;
  // Note [ZeRO-1]: a sharded master is packed as the moments are.
  b.params = arena.master().narrow(0, arena.master_sharded() ? moment_offset : offset, numel);
  b.grads = arena.grads().narrow(0, offset, numel);
  if (m >= 1) b.exp_avg = arena.moment(0).narrow(0, moment_offset, numel);
  if (m >= 2) b.exp_avg_sq = arena.moment(1).narrow(0, moment_offset, numel);
  if (m >= 3) b.max_exp_avg_sq = arena.moment(2).narrow(0, moment_offset, numel);
  if (arena.compute().defined()) b.compute = arena.compute().narrow(0, offset, numel);
  b.chunk_groups = chunk_groups_;
  b.hyper = hyper_;
  b.first_element = offset;
  b.chunk_slots = slots.chunk_slots;
  b.slot_used = slots.used;
  b.slot_steps = slots.steps;
  return b;
}

// Note [Step ranges]
// ~~~~~~~~~~~~~~~~~~
// The fused pass is elementwise: element i's update reads its own p, g and
// moments, the group and slot of its kChunk-element chunk (first_element
// places a range in the whole arena's tables), the hyperparameters and the
// window state, and writes only its own p, moments and compute copy. So the
// arena stepped as ranges, one launch each, in any order and on any stream,
// writes the bits of one step() over it. A range starts at a slot's offset
// (256-byte aligned, a multiple of kChunk) and ends at another's or at the
// padded end, so a chunk never straddles two launches and the vectorized
// path is taken as in step(). Note [Close under the forward] steps the arena
// so, layer by layer, beside the next window's forward.
void Optimizer::step_range(const ParamStore& arena, const Tensor& window_state, int64_t step,
                           const ArenaRange& range, const SlotTables& slots,
                           int64_t max_blocks) const {
  ACCRUE_CHECK(bound_ == &arena, "Optimizer::step_range: bind(arena) first");
  ACCRUE_CHECK(!arena.moments_sharded() && !arena.master_sharded(),
               "Optimizer::step_range: a ZeRO-1 arena steps its owned ranges with step()");
  ACCRUE_CHECK(
      range.offset >= 0 && range.numel >= 0 && range.offset + range.numel <= arena.padded_numel(),
      "Optimizer::step_range: range [", range.offset, ", ", range.offset + range.numel,
      ") is outside the arena's ", arena.padded_numel(), " elements");
  ACCRUE_CHECK(
      range.offset % kernels::kChunk == 0 && (range.numel % kernels::kChunk == 0 ||
                                              range.offset + range.numel == arena.padded_numel()),
      "Optimizer::step_range: range [", range.offset, ", ", range.offset + range.numel,
      ") does not start and end on ", kernels::kChunk, "-element chunks");
  ACCRUE_CHECK(!step_sums_.defined(),
               "Optimizer::step_range: step sums need the whole arena in one step()");
  ACCRUE_CHECK(max_blocks >= 0, "Optimizer::step_range: max_blocks must be >= 0, got ", max_blocks);
  if (range.numel == 0) return;
  kernels::OptimizerBuffers b = buffers(arena, range.offset, range.numel, range.offset, slots);
  b.max_blocks = max_blocks;
  kernels::fused_optimizer_step(config_at(step), b, window_state);
}

void Optimizer::step(const ParamStore& arena, const Tensor& window_state, int64_t step,
                     const std::vector<ArenaRange>& ranges, const SlotTables& slots) const {
  ACCRUE_CHECK(bound_ == &arena, "Optimizer::step: bind(arena) first");
  const int m = moments_needed();
  const kernels::OptimizerConfig config = config_at(step);
  // Note [Capturable code]: a captured close stores them before each replay.
  if (!graph_capturing()) kernels::store_hyperparameters(config, hyper_);
  if (step_sums_.defined()) {  // Note [Step sums]
    ACCRUE_CHECK(ranges.empty(), "Optimizer::step: step sums need the whole arena in one pass; ",
                 "this step covers ", ranges.size(), " ZeRO-1 ranges");
    ACCRUE_CHECK(!graph_capturing(),
                 "Optimizer::step: step sums are not captured in a CUDA "
                 "graph; measure an eager close");
  }
  if (ranges.empty()) {
    ACCRUE_CHECK(!arena.moments_sharded(), "Optimizer::step: the arena's moments hold a shard of ",
                 arena.moment_numel(), " elements; step the owned ranges");
    kernels::OptimizerBuffers b = buffers(arena, 0, arena.padded_numel(), 0, slots);
    b.step_sums = step_sums_;
    kernels::fused_optimizer_step(config, b, window_state);
    if (step_sums_.defined()) {
      ++steps_with_sums_;
      step_sums_state_ = window_state;
    }
    return;
  }
  int64_t packed = 0;
  for (const ArenaRange& r : ranges) {
    ACCRUE_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset + r.numel <= arena.padded_numel(),
                 "Optimizer::step: range [", r.offset, ", ", r.offset + r.numel,
                 ") is outside the arena's ", arena.padded_numel(), " elements");
    packed += r.numel;
  }
  ACCRUE_CHECK(m == 0 || packed == arena.moment_numel(), "Optimizer::step: the ranges hold ",
               packed, " elements but the arena's moments ", arena.moment_numel());
  ACCRUE_CHECK(!arena.master_sharded() || packed == arena.master().numel(),
               "Optimizer::step: the ranges hold ", packed,
               " elements but the arena's sharded master ", arena.master().numel());
  int64_t moment_offset = 0;
  for (const ArenaRange& r : ranges) {
    if (r.numel > 0)
      kernels::fused_optimizer_step(config, buffers(arena, r.offset, r.numel, moment_offset, slots),
                                    window_state);
    moment_offset += r.numel;
  }
}

}  // namespace accrue::optim
