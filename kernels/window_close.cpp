// The dispatch point of the window-close kernels (kernels/window_close.h):
// validate, then call the backend of the device. Every
// bad input throws accrue::Error naming the op and the offending values; the
// backends only compute.
#include <cmath>
#include <string>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/window_close.h"
#include "accrue/kernels/window_close_backend.h"

namespace accrue::kernels {

using dispatch_util::check_contiguous;
using dispatch_util::check_defined;
using dispatch_util::check_dtype;

namespace {

// ---- validation -------------------------------------------------------------

// Every tensor of the close lives where the gradient arena does.
void check_device(const Tensor& t, Device expected, const char* op, const char* what) {
  dispatch_util::check_device(t, expected, op, what, "the gradient arena");
}

// The master-weight / gradient dtypes: f32 (the arena) or f64 (the CPU reference).
void check_master_dtype(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op, ": ", what, " of shape ",
               shape_str(t.shape()), " has dtype ", dtype_name(t.dtype()), "; expected f32 or f64");
}

// state: f64 [kWindowStateSize], contiguous, on `device`.
void check_state(const Tensor& state, Device device, const char* op) {
  check_defined(state, op, "state");
  check_dtype(state, DType::f64, op, "state");
  ACCRUE_CHECK(state.shape() == Shape{kWindowStateSize}, op, ": state has shape ",
               shape_str(state.shape()), "; expected [", int64_t{kWindowStateSize},
               "] (make it with make_window_state)");
  check_contiguous(state, op, "state");
  check_device(state, device, op, "state");
}

void check_close_config(const CloseConfig& c, const char* op) {
  check_scaler_config(c.scaler, op);
  ACCRUE_CHECK(c.normalization == Normalization::ItemCount ||
                   c.normalization == Normalization::MeanOfMicroBatchMeans,
               op, ": unknown normalization ", static_cast<int>(c.normalization));
  ACCRUE_CHECK(c.micro_steps >= 1, op, ": micro_steps = ", c.micro_steps, " must be >= 1");
  ACCRUE_CHECK(!std::isnan(c.max_norm), op, ": max_norm is NaN (<= 0 turns clipping off)");
  ACCRUE_CHECK(c.clip_eps >= 0.0 && std::isfinite(c.clip_eps), op, ": clip_eps = ", c.clip_eps,
               " must be a finite number >= 0");
}

}  // namespace

// ---- Note [Option checks] -------------------------------------------------------------

void check_scaler_config(const ScalerConfig& s, const char* who) {
  ACCRUE_CHECK(s.scaled || !s.dynamic, who, ": a dynamic scale must also be scaled");
  if (!s.dynamic) return;
  // The same limits as torch.amp.GradScaler's constructor.
  ACCRUE_CHECK(s.growth_factor > 1.0 && std::isfinite(s.growth_factor), who,
               ": growth_factor = ", s.growth_factor, " must be a finite number > 1");
  ACCRUE_CHECK(s.backoff_factor > 0.0 && s.backoff_factor < 1.0, who,
               ": backoff_factor = ", s.backoff_factor, " must lie in (0, 1)");
  ACCRUE_CHECK(s.growth_interval >= 1, who, ": growth_interval = ", s.growth_interval,
               " must be >= 1");
  ACCRUE_CHECK(s.min_scale > 0.0 && std::isfinite(s.min_scale), who, ": min_scale = ", s.min_scale,
               " must be a finite number > 0");
  ACCRUE_CHECK(s.max_scale >= s.min_scale, who, ": max_scale = ", s.max_scale,
               " is below min_scale = ", s.min_scale);
}

void check_group_hyper(const GroupHyper& g, int64_t group, const char* who) {
  ACCRUE_CHECK(g.lr >= 0.0 && std::isfinite(g.lr), who, ": group ", group,
               " has learning rate lr = ", g.lr, "; expected a finite number >= 0");
  ACCRUE_CHECK(g.weight_decay >= 0.0 && std::isfinite(g.weight_decay), who, ": group ", group,
               " has weight_decay = ", g.weight_decay, "; expected a finite number >= 0");
}

// The limits of torch.optim's constructors.
void check_optimizer_config(const OptimizerConfig& c, const char* who) {
  ACCRUE_CHECK(c.adam || !c.decoupled_weight_decay, who,
               ": decoupled weight decay (AdamW) needs the Adam update");
  const int64_t groups = static_cast<int64_t>(c.groups.size());
  ACCRUE_CHECK(groups >= 1 && groups <= kMaxGroups, who, ": ", groups,
               " parameter groups; expected 1 to ", kMaxGroups);
  for (int64_t k = 0; k < groups; ++k)
    check_group_hyper(c.groups[k], k, who);
  if (!c.adam) {
    ACCRUE_CHECK(c.momentum >= 0.0 && std::isfinite(c.momentum), who,
                 ": SGD momentum = ", c.momentum, " must be a finite number >= 0");
    ACCRUE_CHECK(std::isfinite(c.dampening), who, ": SGD dampening = ", c.dampening,
                 " is not finite");
    ACCRUE_CHECK(!c.nesterov || (c.momentum > 0.0 && c.dampening == 0.0), who,
                 ": SGD nesterov needs momentum > 0 and dampening == 0 (momentum = ", c.momentum,
                 ", dampening = ", c.dampening, ")");
    return;
  }
  ACCRUE_CHECK(c.beta1 >= 0.0 && c.beta1 < 1.0, who, ": beta1 = ", c.beta1, " must lie in [0, 1)");
  ACCRUE_CHECK(c.beta2 >= 0.0 && c.beta2 < 1.0, who, ": beta2 = ", c.beta2, " must lie in [0, 1)");
  ACCRUE_CHECK(c.eps >= 0.0 && std::isfinite(c.eps), who, ": eps = ", c.eps,
               " must be a finite number >= 0");
}

namespace {

// An arena buffer of the optimizer: defined, contiguous, `numel` elements,
// the params' device and (where `dtype` is given) dtype.
void check_buffer(const Tensor& t, const Tensor& params, const char* op, const char* what,
                  const char* needed_by) {
  ACCRUE_CHECK(t.defined(), op, ": ", what, " is undefined but ", needed_by, " needs it");
  check_device(t, params.device(), op, what);
  ACCRUE_CHECK(t.numel() == params.numel(), op, ": ", what, " of shape ", shape_str(t.shape()),
               " has ", t.numel(), " elements; params of shape ", shape_str(params.shape()),
               " has ", params.numel());
  check_contiguous(t, op, what);
}

const char* kind_name(const OptimizerConfig& c) {
  if (!c.adam) return c.momentum != 0.0 ? "SGD with momentum" : "SGD";
  if (c.decoupled_weight_decay) return c.amsgrad ? "AdamW with amsgrad" : "AdamW";
  return c.amsgrad ? "Adam with amsgrad" : "Adam";
}

// Note [Hyperparameters on the device]: f64 [kHyperSize], contiguous, beside the params.
void check_hyper(const Tensor& hyper, Device device, const char* op) {
  check_dtype(hyper, DType::f64, op, "hyper");
  check_contiguous(hyper, op, "hyper");
  check_device(hyper, device, op, "hyper");
  ACCRUE_CHECK(hyper.numel() == kHyperSize, op, ": hyper has shape ", shape_str(hyper.shape()),
               "; expected [", kHyperSize, "]");
}

// Note [Unused parameters]: slot_used f64 [slots] on `device`.
void check_slot_used(const Tensor& used, Device device, const char* op) {
  check_dtype(used, DType::f64, op, "slot_used");
  check_contiguous(used, op, "slot_used");
  check_device(used, device, op, "slot_used");
  ACCRUE_CHECK(used.dim() == 1, op, ": slot_used has shape ", shape_str(used.shape()),
               "; expected [slots]");
}

// slot_steps f64 [slots, 3] beside slot_used.
void check_slot_steps(const Tensor& steps, const Tensor& used, const char* op) {
  check_dtype(steps, DType::f64, op, "slot_steps");
  check_contiguous(steps, op, "slot_steps");
  check_device(steps, used.device(), op, "slot_steps");
  ACCRUE_CHECK(steps.shape() == (Shape{used.numel(), 3}), op, ": slot_steps has shape ",
               shape_str(steps.shape()), "; expected [", used.numel(),
               ", 3] (one row per slot of slot_used)");
}

// The three tables of Note [Unused parameters]: all defined or none.
void check_slot_tables(const OptimizerBuffers& b, int64_t chunks, const char* op) {
  const int defined =
      int{b.chunk_slots.defined()} + int{b.slot_used.defined()} + int{b.slot_steps.defined()};
  ACCRUE_CHECK(defined == 0 || defined == 3, op,
               ": chunk_slots, slot_used and slot_steps go together (Note [Unused parameters]); ",
               defined, " of the 3 are defined");
  if (defined == 0) return;
  check_dtype(b.chunk_slots, DType::i32, op, "chunk_slots");
  check_contiguous(b.chunk_slots, op, "chunk_slots");
  check_device(b.chunk_slots, b.params.device(), op, "chunk_slots");
  ACCRUE_CHECK(b.chunk_slots.numel() >= chunks, op, ": chunk_slots of shape ",
               shape_str(b.chunk_slots.shape()), " has ", b.chunk_slots.numel(), " elements; ",
               chunks, " chunks needed");
  check_slot_used(b.slot_used, b.params.device(), op);
  check_slot_steps(b.slot_steps, b.slot_used, op);
}

// Note [Step sums]: f64 [>= chunks, 3], one row per chunk.
void check_step_sums(const Tensor& sums, int64_t chunks, Device device, const char* op) {
  check_dtype(sums, DType::f64, op, "step_sums");
  check_contiguous(sums, op, "step_sums");
  check_device(sums, device, op, "step_sums");
  ACCRUE_CHECK(sums.dim() == 2 && sums.size(0) >= chunks && sums.size(1) == 3, op,
               ": step_sums of shape ", shape_str(sums.shape()), " must be [>= ", chunks,
               ", 3]: one row per chunk of ", kChunk, " elements");
}

void check_optimizer_buffers(const OptimizerConfig& c, const OptimizerBuffers& b, const char* op) {
  check_defined(b.params, op, "params");
  check_master_dtype(b.params, op, "params");
  check_contiguous(b.params, op, "params");
  const char* kind = kind_name(c);
  check_buffer(b.grads, b.params, op, "grads", kind);
  check_dtype(b.grads, b.params.dtype(), op, "grads");
  if (uses_exp_avg(c)) {
    check_buffer(b.exp_avg, b.params, op, "exp_avg", kind);
    check_dtype(b.exp_avg, b.params.dtype(), op, "exp_avg");
  }
  if (uses_exp_avg_sq(c)) {
    check_buffer(b.exp_avg_sq, b.params, op, "exp_avg_sq", kind);
    check_dtype(b.exp_avg_sq, b.params.dtype(), op, "exp_avg_sq");
  }
  if (uses_max_exp_avg_sq(c)) {
    check_buffer(b.max_exp_avg_sq, b.params, op, "max_exp_avg_sq", kind);
    check_dtype(b.max_exp_avg_sq, b.params.dtype(), op, "max_exp_avg_sq");
  }
  if (b.compute.defined()) {
    check_buffer(b.compute, b.params, op, "compute", "the compute copy");
    ACCRUE_CHECK(b.compute.dtype() == DType::bf16 || b.compute.dtype() == DType::f16, op,
                 ": compute of shape ", shape_str(b.compute.shape()), " has dtype ",
                 dtype_name(b.compute.dtype()), "; expected bf16 or f16 (or leave it undefined)");
  }
  if (b.hyper.defined()) check_hyper(b.hyper, b.params.device(), op);
  check_defined(b.chunk_groups, op, "chunk_groups");
  check_dtype(b.chunk_groups, DType::i32, op, "chunk_groups");
  check_contiguous(b.chunk_groups, op, "chunk_groups");
  check_device(b.chunk_groups, b.params.device(), op, "chunk_groups");
  ACCRUE_CHECK(b.first_element >= 0, op, ": first_element = ", b.first_element, " must be >= 0");
  const int64_t chunks = (b.first_element + b.params.numel() + kChunk - 1) / kChunk;
  ACCRUE_CHECK(b.chunk_groups.numel() >= chunks, op, ": chunk_groups of shape ",
               shape_str(b.chunk_groups.shape()), " has ", b.chunk_groups.numel(), " elements; ",
               b.params.numel(), " params from element ", b.first_element, " need ceil((",
               b.first_element, " + ", b.params.numel(), ") / ", kChunk, ") = ", chunks);
  check_slot_tables(b, chunks, op);
  if (b.step_sums.defined()) {  // Note [Step sums]
    check_step_sums(b.step_sums, chunks, b.params.device(), op);
    ACCRUE_CHECK(b.first_element % kChunk == 0 && b.params.numel() % kChunk == 0, op,
                 ": step_sums needs whole chunks of ", kChunk, " elements; got ", b.params.numel(),
                 " params from element ", b.first_element);
  }
}

}  // namespace

Tensor make_window_state(double initial_scale, Device device) {
  ACCRUE_CHECK(initial_scale > 0.0 && std::isfinite(initial_scale),
               "make_window_state: initial_scale = ", initial_scale,
               " must be a finite number > 0");
  Tensor state = zeros({kWindowStateSize}, DType::f64, Device::cpu());
  state.data<double>()[kScale] = initial_scale;
  return device.is_cpu() ? state : state.to(device);
}

int64_t norm_partials_rows(const Tensor& grads) {
  const char* op = "norm_partials_rows";
  check_defined(grads, op, "grads");
  check_master_dtype(grads, op, "grads");
  const Device device = grads.device();
  return ACCRUE_BACKEND_CALL(device, norm_partials_rows, grads.numel(), grads.dtype(),
                             device.index);
}

int64_t norm_row_elements(const Tensor& grads) {
  const char* op = "norm_row_elements";
  check_defined(grads, op, "grads");
  check_master_dtype(grads, op, "grads");
  const Device device = grads.device();
  return ACCRUE_BACKEND_CALL(device, norm_row_elements, grads.numel(), grads.dtype(), device.index);
}

void grad_norm_partials(const Tensor& grads, const Tensor& partials) {
  grad_norm_partials(grads, partials, 0, norm_partials_rows(grads));
}

void grad_norm_partials(const Tensor& grads, const Tensor& partials, int64_t first_row,
                        int64_t rows) {
  const char* op = "grad_norm_partials";
  NoGradGuard no_grad;
  check_defined(grads, op, "grads");
  check_master_dtype(grads, op, "grads");
  check_contiguous(grads, op, "grads");
  check_defined(partials, op, "partials");
  check_dtype(partials, DType::f64, op, "partials");
  check_device(partials, grads.device(), op, "partials");
  check_contiguous(partials, op, "partials");
  const int64_t all = norm_partials_rows(grads);
  ACCRUE_CHECK(partials.shape() == (Shape{all, 2}), op, ": partials has shape ",
               shape_str(partials.shape()), "; expected [", all, ", 2] (norm_partials_rows of ",
               grads.numel(), " gradient elements on ", grads.device().str(), ")");
  ACCRUE_CHECK(first_row >= 0 && rows >= 0 && first_row + rows <= all, op, ": rows [", first_row,
               ", ", first_row + rows, ") are outside the ", all, " rows");
  if (rows == 0) return;
  ACCRUE_BACKEND_CALL(grads.device(), grad_norm_partials, grads, partials, first_row, rows);
}

void window_scalar_step(const Tensor& partials, const Tensor& state, const CloseConfig& config) {
  const char* op = "window_scalar_step";
  NoGradGuard no_grad;
  check_close_config(config, op);
  check_defined(partials, op, "partials");
  check_dtype(partials, DType::f64, op, "partials");
  ACCRUE_CHECK(partials.dim() == 2 && partials.size(0) >= 1 && partials.size(1) == 2, op,
               ": partials has shape ", shape_str(partials.shape()),
               "; expected [rows, 2] with rows >= 1");
  check_contiguous(partials, op, "partials");
  check_state(state, partials.device(), op);
  ACCRUE_BACKEND_CALL(state.device(), window_scalar_step, partials, state, config);
}

void fused_optimizer_step(const OptimizerConfig& config, const OptimizerBuffers& buffers,
                          const Tensor& state) {
  const char* op = "fused_optimizer_step";
  NoGradGuard no_grad;
  check_optimizer_config(config, op);
  check_optimizer_buffers(config, buffers, op);
  check_state(state, buffers.params.device(), op);
  if (buffers.params.numel() == 0) return;
  ACCRUE_BACKEND_CALL(state.device(), fused_optimizer_step, config, buffers, state);
}

void store_hyperparameters(const OptimizerConfig& config, const Tensor& hyper) {
  const char* op = "store_hyperparameters";
  check_optimizer_config(config, op);
  check_defined(hyper, op, "hyper");
  check_hyper(hyper, hyper.device(), op);
  ACCRUE_BACKEND_CALL(hyper.device(), store_hyperparameters, hyper_values(config), hyper);
}

void store_slot_flags(const std::vector<bool>& written, const Tensor& slot_used) {
  const char* op = "store_slot_flags";
  check_defined(slot_used, op, "slot_used");
  check_slot_used(slot_used, slot_used.device(), op);
  ACCRUE_CHECK(static_cast<int64_t>(written.size()) == slot_used.numel(), op, ": ", written.size(),
               " written flags for a slot_used of ", slot_used.numel(), " slots");
  if (written.empty()) return;
  ACCRUE_BACKEND_CALL(slot_used.device(), store_slot_flags, written, slot_used);
}

void advance_slot_steps(const OptimizerConfig& config, const Tensor& slot_used,
                        const Tensor& slot_steps, const Tensor& state) {
  const char* op = "advance_slot_steps";
  NoGradGuard no_grad;
  check_optimizer_config(config, op);
  check_defined(slot_used, op, "slot_used");
  check_slot_used(slot_used, slot_used.device(), op);
  check_defined(slot_steps, op, "slot_steps");
  check_slot_steps(slot_steps, slot_used, op);
  check_state(state, slot_used.device(), op);
  if (slot_used.numel() == 0) return;
  ACCRUE_BACKEND_CALL(state.device(), advance_slot_steps, config.beta1, config.beta2, slot_used,
                      slot_steps, state);
}

void step_sums_per_slot(const Tensor& step_sums, const Tensor& slot_chunks, const Tensor& grads,
                        const Tensor& params, const Tensor& state, const Tensor& out) {
  const char* op = "step_sums_per_slot";
  NoGradGuard no_grad;
  check_defined(state, op, "state");
  const Device device = state.device();
  check_state(state, device, op);
  check_defined(params, op, "params");
  check_master_dtype(params, op, "params");
  check_contiguous(params, op, "params");
  check_device(params, device, op, "params");
  check_defined(grads, op, "grads");
  check_dtype(grads, params.dtype(), op, "grads");
  check_contiguous(grads, op, "grads");
  check_device(grads, device, op, "grads");
  ACCRUE_CHECK(grads.numel() == params.numel(), op, ": grads has ", grads.numel(),
               " elements and params ", params.numel(), "; they must match");
  const int64_t chunks = (params.numel() + kChunk - 1) / kChunk;
  check_defined(step_sums, op, "step_sums");
  check_step_sums(step_sums, chunks, device, op);
  check_defined(slot_chunks, op, "slot_chunks");
  check_dtype(slot_chunks, DType::i64, op, "slot_chunks");
  check_contiguous(slot_chunks, op, "slot_chunks");
  check_device(slot_chunks, device, op, "slot_chunks");
  ACCRUE_CHECK(slot_chunks.dim() == 2 && slot_chunks.size(1) == 2, op, ": slot_chunks of shape ",
               shape_str(slot_chunks.shape()), " must be [slots, 2]");
  if (device.is_cpu()) {  // the CUDA kernel clamps instead: a check would synchronize
    const int64_t* r = slot_chunks.data<int64_t>();
    for (int64_t i = 0; i < slot_chunks.size(0); ++i) {
      ACCRUE_CHECK(r[2 * i] >= 0 && r[2 * i] <= r[2 * i + 1] && r[2 * i + 1] <= chunks, op,
                   ": slot ", i, " has chunks [", r[2 * i], ", ", r[2 * i + 1], "), outside [0, ",
                   chunks, "]");
      ACCRUE_CHECK(i == 0 || r[2 * i] >= r[2 * i - 1], op, ": slot ", i, " has chunks [", r[2 * i],
                   ", ", r[2 * i + 1], "), which start before slot ", i - 1, "'s end ",
                   r[2 * i - 1], "; the ranges must be ascending and disjoint");
    }
  }
  check_defined(out, op, "out");
  check_dtype(out, DType::f64, op, "out");
  check_contiguous(out, op, "out");
  check_device(out, device, op, "out");
  ACCRUE_CHECK(out.shape() == Shape({slot_chunks.size(0), 3}), op, ": out of shape ",
               shape_str(out.shape()), " must be [", slot_chunks.size(0), ", 3]");
  if (slot_chunks.size(0) == 0) return;
  ACCRUE_BACKEND_CALL(device, step_sums_per_slot, step_sums, slot_chunks, grads, params, state,
                      out);
}

void calibrate_loss_scale(const Tensor& amax, const Tensor& state, const ScalerConfig& scaler,
                          double scale_used, double margin) {
  const char* op = "calibrate_loss_scale";
  NoGradGuard no_grad;
  check_defined(state, op, "state");
  check_state(state, state.device(), op);
  check_defined(amax, op, "amax");
  check_dtype(amax, DType::f64, op, "amax");
  check_device(amax, state.device(), op, "amax");
  ACCRUE_CHECK(amax.numel() == 1, op, ": amax has ", amax.numel(), " elements; expected 1");
  ACCRUE_CHECK(scaler.scaled && scaler.dynamic, op,
               ": needs a dynamic loss scaler (scaled and dynamic), got scaled ", scaler.scaled,
               ", dynamic ", scaler.dynamic);
  ACCRUE_CHECK(std::isfinite(scale_used) && scale_used > 0.0, op, ": scale_used ", scale_used,
               " must be a positive finite number");
  ACCRUE_CHECK(std::isfinite(margin) && margin >= 1.0, op, ": margin ", margin,
               " must be a finite number >= 1");
  ACCRUE_BACKEND_CALL(state.device(), calibrate_loss_scale, amax.contiguous(), state, scaler,
                      scale_used, margin);
}

}  // namespace accrue::kernels
