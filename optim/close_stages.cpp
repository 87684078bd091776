#include "accrue/optim/close_stages.h"

#include <functional>
#include <utility>

#include "accrue/autograd/variable.h"
#include "accrue/kernels/ops.h"
#include "accrue/optim/layer_steps.h"

namespace accrue::optim {

namespace {

// A stage that acts only at the close: its name, what it reads and writes,
// and the step itself, written where make_close_stages lists the close.
class StepStage final : public CloseStage {
 public:
  using Step = std::function<void(CloseContext& c, int64_t window)>;
  StepStage(CloseContext& c, const char* name, const char* reads, const char* writes, Step step)
      : c_(c), name_(name), reads_(reads), writes_(writes), step_(std::move(step)) {}
  const char* name() const override { return name_; }
  const char* reads() const override { return reads_; }
  const char* writes() const override { return writes_; }
  void run(int64_t window) override { step_(c_, window); }

 private:
  CloseContext& c_;
  const char *name_, *reads_, *writes_;
  Step step_;
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
  auto step = [&](const char* name, const char* reads, const char* writes, StepStage::Step fn) {
    s.push_back(std::make_unique<StepStage>(c, name, reads, writes, std::move(fn)));
  };
  if (f.skips_unused) {
    // Note [Unused parameters]: the written flags, before anything marks the
    // zeroed slots written, and the world's (a parameter any rank wrote is used).
    step("unused flags", "written flags", "used flags (max over ranks)",
         [](CloseContext& c, int64_t) {
           kernels::store_slot_flags(c.store->written_flags(), c.slots.used);
           if (c.sync) c.sync->all_reduce_max(c.slots.used);
         });
  } else if (f.checks_unused_world) {
    // The same flags for the check alone; the fused pass never reads them.
    step("unused flags", "written flags", "used flags (max over ranks)",
         [](CloseContext& c, int64_t) {
           kernels::store_slot_flags(c.store->written_flags(), c.used_flags);
           if (c.sync) c.sync->all_reduce_max(c.used_flags);
         });
  }
  // Note [Overwrite first]: unused parameters read 0, before any reduction sums them.
  step("zero unwritten", "written flags", "unwritten gradient slots",
       [](CloseContext& c, int64_t) { c.store->zero_unwritten(); });
  // The report's local loss is this rank's own mean: its loss sum over its
  // own items, kept before a sync makes both the world's.
  step("items", "N, loss sum", "the report's local N and loss sum", [](CloseContext& c, int64_t) {
    c.last.narrow(0, CloseContext::kLastLocalItems, 1).copy_(c.field(kernels::kItems).reshape({1}));
    c.last.narrow(0, CloseContext::kLastLocalLoss, 1).copy_(c.loss_sum.reshape({1}));
  });
  if (c.sync) {
    // Note [Reducer] (dist/reducer.h): the buckets still pending, and N summed
    // over ranks; then the loss sum, so the report's loss is the world's mean.
    step("reduce", "gradients, N, loss sum", "reduced gradients, N and loss sum over ranks",
         [](CloseContext& c, int64_t) {
           c.sync->finish(c.field(kernels::kItems));
           c.sync->all_reduce_sum(c.loss_sum);
         });
  }
  s.push_back(std::make_unique<NormStage>(c, f.norm_under_backward));
  // Note [Window scalar step].
  step(
      "scalar step", "norm partials, state", "found_inf, norm, coef, scale, step",
      [](CloseContext& c, int64_t) { kernels::window_scalar_step(c.partials, c.state, c.config); });
  if (f.noise_every > 0)
    s.push_back(std::make_unique<NoiseScaleStage>(c, f.noise_every, f.noise_ema));
  if (f.skips_unused) {
    // Note [Unused parameters]: the counts of the slots written this window
    // (on any rank) advance.
    step("slot steps", "used flags, state", "per-parameter step counts",
         [](CloseContext& c, int64_t window) {
           kernels::advance_slot_steps(c.optimizer->config_at(window), c.slots.used, c.slots.steps,
                                       c.state);
         });
  }
  // The one fused optimizer pass; it returns at once on found_inf (Note [Skipped window]).
  // Note [Close under the forward]: or its ranges, beside the next forward.
  if (f.close_under_forward) {
    s.push_back(std::make_unique<LayerStepsStage>(c, f.close_layer_elements, f.close_max_blocks,
                                                  f.close_steps_on_first_read));
  } else {
    step("optimizer step", "store, state, slot steps", "master, moments, compute copy",
         [](CloseContext& c, int64_t window) {
           c.optimizer->step(*c.store, c.state, window, c.ranges, c.slots);
         });
  }
  if (f.calibrate)
    s.push_back(std::make_unique<CalibrationStage>(c, f.calibration_scale, f.calibration_margin));
  if (c.sharded()) {
    // Note [ZeRO-1]: each rank stepped its shard; the forward needs them all.
    step("gather parameters", "owned ranges", "the forward's weights",
         [](CloseContext& c, int64_t) { c.sync->all_gather_owned(c.store->forward_weights()); });
  }
  if (f.fp8_copies && !f.close_under_forward) {  // else the layer steps recast them
    // Note [Window FP8 weights]: the next window's micro-batches read these.
    step("fp8 weights", "the forward's weights", "their FP8 copies",
         [](CloseContext& c, int64_t) { c.store->refresh_fp8_copies(); });
  }
  if (f.fp8_scaling) {
    // Note [FP8 delayed scaling]: the window's amaxes onto the histories.
    step("fp8 scaling", "the window's amaxes", "the next window's FP8 scales",
         [](CloseContext& c, int64_t) {
           if (!c.sync) return c.store->fp8_delayed_scaling()->update();
           c.store->fp8_delayed_scaling()->update(
               [&c](const Tensor& values) { c.sync->all_reduce_max(values); });
         });
  }
  // Keeps what report() shows, then starts the next window's counters.
  step("report", "state, loss sum, N", "the report; N and the loss sum reset",
       [](CloseContext& c, int64_t) {
         c.last.narrow(0, 0, kernels::kWindowStateSize).copy_(c.state);
         c.last.narrow(0, CloseContext::kLastLoss, 1).copy_(c.loss_sum.reshape({1}));
         c.last.narrow(0, CloseContext::kLastItems, 1).copy_(c.field(kernels::kItems).reshape({1}));
         c.field(kernels::kItems).fill_(0.0);
         c.loss_sum.fill_(0.0);
       });
  return s;
}

std::string describe_stages(const std::vector<std::unique_ptr<CloseStage>>& stages) {
  std::string out;
  for (const auto& s : stages)
    out += (out.empty() ? "" : ", ") + std::string(s->name());
  return out;
}

}  // namespace accrue::optim
