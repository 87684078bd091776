// Optimizers as configurations of the one fused window-close pass, with
// libtorch-like options, parameter groups and learning-rate schedules.
//
//   optim::Optimizer opt(optim::AdamWOptions(3e-4).betas(0.9, 0.95).weight_decay(0.1));
//   opt.add_param_group(no_decay_params, optim::GroupOptions().weight_decay(0.0));
//   opt.set_schedule(std::make_shared<optim::WarmupCosine>(100, 5000, 0.1));
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "accrue/kernels/window_close.h"
#include "accrue/optim/param_store.h"

namespace accrue::optim {

class SGDOptions {
 public:
  explicit SGDOptions(double lr) : lr_(lr) {}
  SGDOptions& momentum(double v) {
    momentum_ = v;
    return *this;
  }
  SGDOptions& dampening(double v) {
    dampening_ = v;
    return *this;
  }
  SGDOptions& nesterov(bool v) {
    nesterov_ = v;
    return *this;
  }
  SGDOptions& weight_decay(double v) {
    weight_decay_ = v;
    return *this;
  }
  double lr() const { return lr_; }
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  bool nesterov() const { return nesterov_; }
  double weight_decay() const { return weight_decay_; }

 private:
  double lr_, momentum_ = 0.0, dampening_ = 0.0, weight_decay_ = 0.0;
  bool nesterov_ = false;
};

// Adam's and AdamW's options (AdamW's default weight decay is 0.01, Adam's 0).
template <class Derived>
class AdamOptionsBase {
 public:
  explicit AdamOptionsBase(double lr, double weight_decay) : lr_(lr), weight_decay_(weight_decay) {}
  Derived& betas(double b1, double b2) {
    beta1_ = b1;
    beta2_ = b2;
    return self();
  }
  Derived& eps(double v) {
    eps_ = v;
    return self();
  }
  Derived& weight_decay(double v) {
    weight_decay_ = v;
    return self();
  }
  Derived& amsgrad(bool v) {
    amsgrad_ = v;
    return self();
  }
  double lr() const { return lr_; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  bool amsgrad() const { return amsgrad_; }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  double lr_, beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_;
  bool amsgrad_ = false;
};

class AdamOptions : public AdamOptionsBase<AdamOptions> {
 public:
  explicit AdamOptions(double lr) : AdamOptionsBase(lr, 0.0) {}
};
class AdamWOptions : public AdamOptionsBase<AdamWOptions> {
 public:
  explicit AdamWOptions(double lr) : AdamOptionsBase(lr, 0.01) {}
};

// Per-group overrides of the optimizer's lr and weight decay.
class GroupOptions {
 public:
  GroupOptions& lr(double v) {
    lr_ = v;
    return *this;
  }
  GroupOptions& weight_decay(double v) {
    weight_decay_ = v;
    return *this;
  }
  std::optional<double> lr() const { return lr_; }
  std::optional<double> weight_decay() const { return weight_decay_; }

 private:
  std::optional<double> lr_, weight_decay_;
};

// The learning-rate factor for the optimizer step about to be taken (0-based).
class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double factor(int64_t step) const = 0;
};
class ConstantLR : public LRSchedule {
 public:
  double factor(int64_t) const override { return 1.0; }
};
// Linear from 1/warmup up to 1 over `warmup` steps, then 1.
class LinearWarmup : public LRSchedule {
 public:
  explicit LinearWarmup(int64_t warmup);
  double factor(int64_t step) const override;

 private:
  int64_t warmup_;
};
// Linear warmup, then cosine decay to min_factor at `total` steps (and min_factor after).
class WarmupCosine : public LRSchedule {
 public:
  WarmupCosine(int64_t warmup, int64_t total, double min_factor = 0.0);
  double factor(int64_t step) const override;

 private:
  int64_t warmup_, total_;
  double min_factor_;
};

// The linear-scaling rule (Goyal et al.): lr grows with the global batch.
double linear_scaling_rule(double base_lr, int64_t base_batch, int64_t batch);

// The policy; the kernels see only OptimizerConfig's plain flags.
enum class OptimizerKind { SGD, Adam, AdamW };

// Note [Unused parameters] (optim/window.h): the tables of
// UnusedParameters::skip that the fused pass reads (see OptimizerBuffers);
// all undefined for step_with_zero.
struct SlotTables {
  Tensor chunk_slots;  // i32 [chunks]: each chunk's arena slot
  Tensor used;         // f64 [slots]: > 0 where written this window (on any rank)
  Tensor steps;        // f64 [slots, 3]: each slot's own step count and bias corrections
};
// The tables for `arena`: each chunk's slot, no slot used, every count 0.
SlotTables make_slot_tables(const ParamStore& arena);

class Optimizer {
 public:
  explicit Optimizer(const SGDOptions& o);
  explicit Optimizer(const AdamOptions& o);
  explicit Optimizer(const AdamWOptions& o);

  // Parameters of a group take its overrides; every other parameter is in the
  // default group. At most kernels::kMaxGroups groups in all.
  Optimizer& add_param_group(const std::vector<Tensor>& params, const GroupOptions& options);
  Optimizer& set_schedule(std::shared_ptr<const LRSchedule> schedule);

  OptimizerKind kind() const {
    if (!config_.adam) return OptimizerKind::SGD;
    return config_.decoupled_weight_decay ? OptimizerKind::AdamW : OptimizerKind::Adam;
  }
  // Moment arenas this optimizer needs (for ParamStoreOptions::moments).
  int moments_needed() const;
  // The config of one step: group lrs scaled by the schedule at `step`.
  kernels::OptimizerConfig config_at(int64_t step) const;

  // Builds the chunk-to-group table of `arena` (once, before the first step).
  void bind(const ParamStore& arena);
  // The fused pass of Note [Window close] (c) for optimizer step `step`, over
  // the whole arena, or under ZeRO-1 over `ranges` only (one launch each),
  // whose moments the arena keeps packed (ParamStore::shard_moments).
  // The pass reads each group's lr and weight decay from a device buffer
  // (Note [Hyperparameters on the device] in kernels/window_close.h), which
  // step() fills first, except inside a CUDA graph capture: the replay of a
  // captured close calls store_hyperparameters(step) itself, eagerly, before
  // the launch.
  // With `slots` defined, each slot steps by its own count and unused ones not
  // at all (Note [Unused parameters]).
  void step(const ParamStore& arena, const Tensor& window_state, int64_t step,
            const std::vector<ArenaRange>& ranges = {}, const SlotTables& slots = {}) const;
  void store_hyperparameters(int64_t step) const;
  // What bind() made and every pass reads on the device: each chunk's group
  // and the hyperparameter buffer (Note [Steps graph] in
  // optim/layer_steps.cpp keys its captured steps on their addresses).
  const Tensor& chunk_groups() const { return chunk_groups_; }
  const Tensor& hyperparameters() const { return hyper_; }
  // Note [Step ranges]: the fused pass of step() for optimizer step `step`
  // over one chunk-aligned range of the whole arena (not under ZeRO-1),
  // reading the hyperparameters store_hyperparameters(step) left on the
  // device (call it first, on the same stream). Ranges that cover the arena,
  // stepped in any order, write step()'s bits.
  // max_blocks caps the CUDA launch's grid (OptimizerBuffers::max_blocks; 0: none).
  void step_range(const ParamStore& arena, const Tensor& window_state, int64_t step,
                  const ArenaRange& range, const SlotTables& slots = {},
                  int64_t max_blocks = 0) const;
  // Note [Step sums] (kernels/window_close.h), for optim::LayerMonitor: while
  // `sums` (f64 [arena chunks, 3]) is set, every eager step() over the whole
  // arena also writes each chunk's (|g|^2, |p_after - p_before|^2, |p_before|^2)
  // row into it; an undefined tensor stops that. A step over ZeRO-1 ranges or
  // inside a CUDA graph capture refuses it.
  void set_step_sums(const Tensor& sums) { step_sums_ = sums; }
  bool measures_step_sums() const { return step_sums_.defined(); }
  // Steps that wrote step sums so far, and the window state of the last of
  // them (whose kFoundInf says whether it wrote any row).
  int64_t steps_with_sums() const { return steps_with_sums_; }
  const Tensor& step_sums_state() const { return step_sums_state_; }
  // The parameter group of each slot of `arena`: 0 for the default group,
  // k for the k-th add_param_group (config().groups' order).
  std::vector<int> slot_groups(const ParamStore& arena) const;

 private:
  struct Group {
    std::vector<Tensor> params;
    GroupOptions options;
  };
  // The fused pass's buffers over arena elements [offset, offset + numel),
  // whose moments (and sharded master) start at moment_offset.
  kernels::OptimizerBuffers buffers(const ParamStore& arena, int64_t offset, int64_t numel,
                                    int64_t moment_offset, const SlotTables& slots) const;
  kernels::OptimizerConfig config_;
  std::vector<Group> groups_;
  std::shared_ptr<const LRSchedule> schedule_ = std::make_shared<ConstantLR>();
  Tensor chunk_groups_;
  Tensor hyper_;  // f64 [kernels::kHyperSize] on the bound arena's device
  const ParamStore* bound_ = nullptr;
  Tensor step_sums_;  // set_step_sums
  mutable int64_t steps_with_sums_ = 0;
  mutable Tensor step_sums_state_;
};

}  // namespace accrue::optim
