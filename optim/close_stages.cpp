#include "accrue/optim/close_stages.h"

#include "accrue/autograd/variable.h"
#include "accrue/kernels/ops.h"

namespace accrue::optim {

namespace {

// Note [Unused parameters]: the written flags, before anything marks the
// zeroed slots written, and the world's (a parameter any rank wrote is used).
class UnusedFlagsStage final : public CloseStage {
 public:
  explicit UnusedFlagsStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "unused flags"; }
  const char* reads() const override { return "written flags"; }
  const char* writes() const override { return "used flags (max over ranks)"; }
  void run(int64_t) override {
    kernels::store_slot_flags(c_.store->written_flags(), c_.slots.used);
    if (c_.sync) c_.sync->all_reduce_max(c_.slots.used);
  }

 private:
  CloseContext& c_;
};

// Note [Overwrite first]: unused parameters read 0, before any reduction sums them.
class ZeroUnwrittenStage final : public CloseStage {
 public:
  explicit ZeroUnwrittenStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "zero unwritten"; }
  const char* reads() const override { return "written flags"; }
  const char* writes() const override { return "unwritten gradient slots"; }
  void run(int64_t) override { c_.store->zero_unwritten(); }

 private:
  CloseContext& c_;
};

// The loss report is this rank's own mean: its loss sum over its own items,
// kept before a sync makes N the world's.
class ItemsStage final : public CloseStage {
 public:
  explicit ItemsStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "items"; }
  const char* reads() const override { return "N"; }
  const char* writes() const override { return "the report's local N"; }
  void run(int64_t) override {
    c_.last.narrow(0, CloseContext::kLastLocalItems, 1)
        .copy_(c_.field(kernels::kItems).reshape({1}));
  }

 private:
  CloseContext& c_;
};

// Note [Reducer] (dist/reducer.h): the buckets still pending, and N summed over ranks.
class ReduceStage final : public CloseStage {
 public:
  explicit ReduceStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "reduce"; }
  const char* reads() const override { return "gradients, N"; }
  const char* writes() const override { return "reduced gradients, N over ranks"; }
  void run(int64_t) override { c_.sync->finish(c_.field(kernels::kItems)); }

 private:
  CloseContext& c_;
};

// Note [Window scalar step].
class ScalarStepStage final : public CloseStage {
 public:
  explicit ScalarStepStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "scalar step"; }
  const char* reads() const override { return "norm partials, state"; }
  const char* writes() const override { return "found_inf, norm, coef, scale, step"; }
  void run(int64_t) override { kernels::window_scalar_step(c_.partials, c_.state, c_.config); }

 private:
  CloseContext& c_;
};

// Note [Unused parameters]: the counts of the slots written this window (on any rank) advance.
class SlotStepsStage final : public CloseStage {
 public:
  explicit SlotStepsStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "slot steps"; }
  const char* reads() const override { return "used flags, state"; }
  const char* writes() const override { return "per-parameter step counts"; }
  void run(int64_t window) override {
    kernels::advance_slot_steps(c_.optimizer->config_at(window), c_.slots.used, c_.slots.steps,
                                c_.state);
  }

 private:
  CloseContext& c_;
};

// The one fused optimizer pass; returns at once on found_inf (Note [Skipped window]).
class OptimizerStepStage final : public CloseStage {
 public:
  explicit OptimizerStepStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "optimizer step"; }
  const char* reads() const override { return "store, state, slot steps"; }
  const char* writes() const override { return "master, moments, compute copy"; }
  void run(int64_t window) override {
    c_.optimizer->step(*c_.store, c_.state, window, c_.ranges, c_.slots);
  }

 private:
  CloseContext& c_;
};

// Note [ZeRO-1]: each rank stepped its shard; the forward needs them all.
class GatherParametersStage final : public CloseStage {
 public:
  explicit GatherParametersStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "gather parameters"; }
  const char* reads() const override { return "owned ranges"; }
  const char* writes() const override { return "the forward's weights"; }
  void run(int64_t) override { c_.sync->all_gather_owned(c_.store->forward_weights()); }

 private:
  CloseContext& c_;
};

// Keeps what report() shows, then starts the next window's counters.
class ReportStage final : public CloseStage {
 public:
  explicit ReportStage(CloseContext& c) : c_(c) {}
  const char* name() const override { return "report"; }
  const char* reads() const override { return "state, loss sum, N"; }
  const char* writes() const override { return "the report; N and the loss sum reset"; }
  void run(int64_t) override {
    c_.last.narrow(0, 0, kernels::kWindowStateSize).copy_(c_.state);
    c_.last.narrow(0, CloseContext::kLastLoss, 1).copy_(c_.loss_sum.reshape({1}));
    c_.last.narrow(0, CloseContext::kLastItems, 1).copy_(c_.field(kernels::kItems).reshape({1}));
    c_.field(kernels::kItems).fill_(0.0);
    c_.loss_sum.fill_(0.0);
  }

 private:
  CloseContext& c_;
};

}  // namespace

NormStage::NormStage(CloseContext& c, bool under_backward) : c_(c) {
  if (!under_backward) return;
  const GradArena& arena = c.store->grad_arena();
  rows_ = c.sharded() ? std::make_shared<NormRowTracker>(arena, c.ranges, c.local_partials)
                      : std::make_shared<NormRowTracker>(arena, c.partials);
  // Note [Norm under the backward]: one device counts slots as their hooks
  // fire; under a sync, ranges as their reductions are issued.
  const std::weak_ptr<NormRowTracker> tracker = rows_;
  if (c.sync == nullptr) {
    for (size_t i = 0; i < arena.size(); ++i)
      register_grad_ready_hook(arena.params()[i], [tracker, i](const Tensor&) {
        if (auto t = tracker.lock()) t->on_final(i);
      });
  } else if (!c.sync->set_reduced_listener([tracker](const ArenaRange& range) {
               if (auto t = tracker.lock()) t->on_reduced(range);
             })) {
    rows_.reset();  // the sync cannot say when a range is reduced: all rows at close
  }
}

void NormStage::before_backward(const MicroStep& m) {
  if (rows_ && m.last()) rows_->begin_last_backward();
}

void NormStage::after_backward(const MicroStep& m) {
  if (rows_ && m.last()) rows_->end_last_backward();
}

void NormStage::abort_backward() {
  if (rows_) rows_->end_last_backward();
}

void NormStage::run(int64_t) {
  if (rows_) {
    rows_->finish();  // the rows the backward left (Note [Norm under the backward])
  } else if (!c_.sharded()) {
    kernels::grad_norm_partials(c_.store->grads(), c_.partials);
  } else {
    int64_t row = 0;
    for (const ArenaRange& r : c_.ranges) {
      const Tensor grads = c_.store->grads().narrow(0, r.offset, r.numel);
      const int64_t rows = kernels::norm_partials_rows(grads);
      kernels::grad_norm_partials(grads, c_.local_partials.narrow(0, row, rows));
      row += rows;
    }
  }
  if (!c_.sharded()) return;
  // The global norm is the sum over every rank's partials, summed in the same
  // fixed order on every rank: all agree on it, on the clip and on found_inf.
  c_.sync->all_gather(c_.local_partials, c_.partials);
}

int64_t NormStage::rows_at_last_close() const {
  if (rows_) return rows_->rows_at_last_close();
  return c_.sharded() ? c_.local_partials.size(0) : c_.partials.size(0);
}

NoiseScaleStage::NoiseScaleStage(CloseContext& c, int64_t every, double ema)
    : c_(c), noise_(c.store->grad_arena(), every, ema) {}

void NoiseScaleStage::after_backward(const MicroStep& m) {
  if (m.index == 0 && noise_.measures(m.window))
    noise_.after_first_micro_step(c_.store->grad_arena(), c_.state);
}

void NoiseScaleStage::run(int64_t window) {
  if (noise_.measures(window)) noise_.after_close(c_.state);
}

CalibrationStage::CalibrationStage(CloseContext& c, double scale, double margin)
    : c_(c),
      scale_(scale),
      margin_(margin),
      calibration_(std::make_unique<ScaleCalibration>(c.state.device())) {}

void CalibrationStage::before_backward(const MicroStep&) {
  if (calibration_) observe_.emplace(calibration_.get());
}

void CalibrationStage::after_backward(const MicroStep&) {
  observe_.reset();
}

void CalibrationStage::run(int64_t) {
  if (!calibration_) return;
  // Note [Scale calibration]: the next window's scale, the world's.
  const Tensor amax = calibration_->amax();
  if (c_.sync) c_.sync->all_reduce_max(amax);
  kernels::calibrate_loss_scale(amax, c_.state, c_.config.scaler, scale_, margin_);
  calibration_.reset();
}

std::vector<std::unique_ptr<CloseStage>> make_close_stages(CloseContext& c,
                                                           const CloseFeatures& f) {
  std::vector<std::unique_ptr<CloseStage>> s;
  if (f.skips_unused) s.push_back(std::make_unique<UnusedFlagsStage>(c));
  s.push_back(std::make_unique<ZeroUnwrittenStage>(c));
  s.push_back(std::make_unique<ItemsStage>(c));
  if (c.sync) s.push_back(std::make_unique<ReduceStage>(c));
  s.push_back(std::make_unique<NormStage>(c, f.norm_under_backward));
  s.push_back(std::make_unique<ScalarStepStage>(c));
  if (f.noise_every > 0)
    s.push_back(std::make_unique<NoiseScaleStage>(c, f.noise_every, f.noise_ema));
  if (f.skips_unused) s.push_back(std::make_unique<SlotStepsStage>(c));
  s.push_back(std::make_unique<OptimizerStepStage>(c));
  if (f.calibrate)
    s.push_back(std::make_unique<CalibrationStage>(c, f.calibration_scale, f.calibration_margin));
  if (c.sharded()) s.push_back(std::make_unique<GatherParametersStage>(c));
  s.push_back(std::make_unique<ReportStage>(c));
  return s;
}

std::string describe_stages(const std::vector<std::unique_ptr<CloseStage>>& stages) {
  std::string out;
  for (const auto& s : stages)
    out += (out.empty() ? "" : ", ") + std::string(s->name());
  return out;
}

}  // namespace accrue::optim
