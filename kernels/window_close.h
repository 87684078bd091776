// The kernels of a window close (Note [Window close] in optim/window.h), each
// one pass:
//   (a) grad_norm_partials: one read of the flat gradient arena giving
//       fixed-order partial sums of squares and a non-finite flag;
//   (b) window_scalar_step: one thread turns the partials into found_inf, the
//       unscaled normalized norm, the combined coefficient
//       inv_scale * inv_N * clip, the loss-scale update and the step count;
//   (c) fused_optimizer_step: returns at once when found_inf, else reads
//       p, g, m, v and writes p, m, v (and the low-precision compute copy).
// State lives in a small f64 device tensor, so nothing here syncs the host.
// Each has a CPU reference (kernels/cpu/window_close.cpp) and a CUDA path
// (kernels/cuda/window_close_*.cu); this header is the dispatch point.
#pragma once

#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

// Fields of the window state: an f64 tensor of kWindowStateSize elements on
// the arena's device (f64 holds every count exactly up to 2^53).
enum WindowField : int {
  kFoundInf = 0,        // 1 when the last closed window had a non-finite gradient
  kGradNorm = 1,        // L2 norm of the last window's unscaled, normalized gradient
  kCoef = 2,            // inv_scale * inv_N * clip applied to the last window
  kScale = 3,           // the loss scale for the next window's backward seeds
  kGrowthTracker = 4,   // clean windows since the last scale change
  kStep = 5,            // optimizer steps taken (skipped windows do not count)
  kSkippedWindows = 6,  // windows skipped for non-finite gradients
  kItems = 7,           // N of the current window: items summed over micro-steps (and ranks)
  kClipCoef = 8,        // min(1, max_norm / (norm + eps)) of the last window
  // Note [Gradient noise scale] (optim/noise_scale.h), when measured:
  kNoiseSmall = 9,        // |sum of micro-step 0's gradient|^2 / scale^2, this window
  kNoiseSmallItems = 10,  // micro-step 0's items (B_small)
  kNoiseGradSq = 11,      // EMA of the estimate of |G|^2
  kNoiseTrace = 12,       // EMA of the estimate of tr(Sigma)
  kNoiseWindows = 13,     // windows measured (for the EMAs' bias correction)
  kWindowStateSize = 16
};

// A fresh state: scale = initial_scale, everything else 0.
Tensor make_window_state(double initial_scale, Device device);

// (a) partials: f64 [rows, 2] with rows = norm_partials_rows(grads): column 0
// the sum of squares of a fixed slice, column 1 its count of non-finite values.
int64_t norm_partials_rows(const Tensor& grads);
void grad_norm_partials(const Tensor& grads, const Tensor& partials);
// Note [Norm rows]
// ~~~~~~~~~~~~~~~~
// Row r of the partials covers the elements [r E, min((r + 1) E, n)) of
// grads, E = norm_row_elements(grads); on CUDA row 0 also sums the n % 4
// (f32) or n % 2 (f64) elements after the last whole 16-byte pack (none in a
// gradient arena, whose size is a multiple of 256 bytes). A row depends on
// those elements alone and is computed by the same code whichever launch
// computes it, so rows computed early, one range at a time (the Window does
// as the last micro-step's gradients land: Note [Norm under the backward] in
// optim/norm_rows.h), are bitwise the rows of one grad_norm_partials call.
int64_t norm_row_elements(const Tensor& grads);
// Rows [first_row, first_row + rows) of grad_norm_partials(grads, partials);
// partials is the whole [norm_partials_rows(grads), 2] table.
void grad_norm_partials(const Tensor& grads, const Tensor& partials, int64_t first_row,
                        int64_t rows);

// Plain parameters: the policy (optim::ScalerMode) lives in optim.
struct ScalerConfig {
  // The backward seeds carry state[kScale] and the close divides by it (a
  // static or dynamic scaler); otherwise the scale is 1 and never read.
  bool scaled = false;
  // The scale moves as torch.amp.GradScaler's update (needs scaled).
  bool dynamic = false;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
};

enum class Normalization {
  // Note [Normalization]: divide the window's summed gradient by N, the items of the window.
  ItemCount,
  // Legacy: each micro-batch seeds backward with 1/count (its mean) and the
  // close divides by K. Inexact for padded or variable-length micro-batches.
  MeanOfMicroBatchMeans,
};

struct CloseConfig {
  ScalerConfig scaler;
  Normalization normalization = Normalization::ItemCount;
  int64_t micro_steps = 1;  // K
  double max_norm = 0.0;    // <= 0: no clipping
  double clip_eps = 1e-6;   // as torch.nn.utils.clip_grad_norm_
};

// (b) Reads partials and state[kScale], state[kItems]; writes kFoundInf,
// kGradNorm, kCoef, kClipCoef, kScale, kGrowthTracker, kStep, kSkippedWindows.
// kItems is left for the caller to reset. Single thread, fixed order.
void window_scalar_step(const Tensor& partials, const Tensor& state, const CloseConfig& config);

struct GroupHyper {
  double lr = 1e-3;
  double weight_decay = 0.0;
};
inline constexpr int kMaxGroups = 8;
// Plain parameters: the policy (optim::OptimizerKind) lives in optim.
struct OptimizerConfig {
  // Adam's moments (exp_avg, exp_avg_sq); otherwise SGD, with a momentum
  // buffer when momentum > 0.
  bool adam = true;
  // AdamW: p *= 1 - lr * weight_decay before the update; otherwise weight
  // decay is added to the gradient (Adam, SGD). Only with adam.
  bool decoupled_weight_decay = true;
  std::vector<GroupHyper> groups;  // 1..kMaxGroups, indexed by chunk_groups
  // Adam / AdamW
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool amsgrad = false;
  // SGD
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
};

// The flat arenas the fused pass reads and writes; all contiguous, same numel
// (the arena's padded size), same device.
struct OptimizerBuffers {
  Tensor params;          // master weights (f32, f64 for the CPU reference)
  Tensor grads;           // same dtype as params
  Tensor exp_avg;         // Adam m / SGD momentum buffer (undefined when unused)
  Tensor exp_avg_sq;      // Adam v
  Tensor max_exp_avg_sq;  // amsgrad's running max of v
  Tensor compute;         // bf16/f16 compute copy written from the new params, or undefined
  // i32 [>= ceil((first_element + numel) / kChunk)]: the group of each 32-element chunk.
  Tensor chunk_groups;
  // Where params[0] sits in the frame chunk_groups describes: element i's group is
  // chunk_groups[(first_element + i) / kChunk]. Non-zero when stepping a range of
  // the arena (Note [ZeRO-1]: a rank's shard) against the whole arena's table.
  int64_t first_element = 0;
  // f64 [kHyperSize] on the params' device, or undefined: each group's
  // learning rate and weight decay as store_hyperparameters wrote them, read
  // in place of config's (Note [Hyperparameters on the device]).
  Tensor hyper;
  // Note [Unused parameters]: all three defined (optim's UnusedParameters::skip)
  // or all undefined (step_with_zero: every element steps with the window's count).
  //   chunk_slots  i32 [>= ceil((first_element + numel) / kChunk)]: the arena
  //                slot of each chunk, in the frame of chunk_groups;
  //   slot_used    f64 [slots]: > 0 where the slot was written this window;
  //   slot_steps   f64 [slots, 3]: each slot's own step count t, 1 - beta1^t and
  //                sqrt(1 - beta2^t), as advance_slot_steps left them.
  Tensor chunk_slots, slot_used, slot_steps;
  // Note [Step sums]: f64 [>= ceil((first_element + numel) / kChunk), 3] in the
  // frame of chunk_groups, or undefined (nothing is written).
  Tensor step_sums;
  // The most thread blocks the CUDA launch uses (0: one wave of resident
  // blocks, the default). Its grid-stride loop gives every element the same
  // bits whatever the grid; a cap leaves SMs to a forward running beside it
  // (Note [Close under the forward] in optim/layer_steps.h). The CPU ignores it.
  int64_t max_blocks = 0;
};
inline constexpr int64_t kChunk = 32;
// The hyper buffer: group k's lr at 2k, its weight decay at 2k + 1.
inline constexpr int64_t kHyperSize = 2 * kMaxGroups;

// Note [Option checks]
// ~~~~~~~~~~~~~~~~~~~~
// The one validation of optimizer and loss-scaler options, with the limits of
// torch.optim's and torch.amp.GradScaler's constructors. optim's constructors
// call it as soon as options are given (who = "AdamW", "LossScaler", ...) and
// the kernels call it again at every step (who = the kernel's name), so a bad
// value gets the same message wherever it is caught. Each throws
// accrue::Error naming who, the option and its value.
void check_optimizer_config(const OptimizerConfig& config, const char* who);
// Only a Dynamic scaler has options to check.
void check_scaler_config(const ScalerConfig& config, const char* who);
// One group's learning rate and weight decay (group: its index, for the message).
void check_group_hyper(const GroupHyper& hyper, int64_t group, const char* who);

// (c) With g = grads * state[kCoef] and t = state[kStep] (already incremented
// by the scalar step), per element, exactly as PyTorch's optimizers:
//   SGD:   d = g + wd p; if momentum: buf = (t == 1) ? d : momentum buf + (1 - dampening) d,
//          d = nesterov ? d + momentum buf : buf;  p -= lr d
//   Adam:  g += wd p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//          vhat = amsgrad ? (vmax = max(vmax, v)) : v;
//          p -= lr / (1 - b1^t) * m / (sqrt(vhat) / sqrt(1 - b2^t) + eps)
//   AdamW: p *= 1 - lr wd, then Adam without the g += wd p.
// Nothing is read or written when state[kFoundInf] != 0. With the slot
// tables, t is each slot's own and unused slots are not touched (Note [Unused parameters]).
void fused_optimizer_step(const OptimizerConfig& config, const OptimizerBuffers& buffers,
                          const Tensor& state);

// Note [Step sums]
// ~~~~~~~~~~~~~~~~
// The health monitor's per-layer figures (optim::LayerMonitor) come out of the
// fused pass itself, which already holds every element's gradient and weight
// before and after the step: with OptimizerBuffers::step_sums defined, the
// pass writes, for each 32-element chunk c it covers, the row
//   step_sums[c] = (sum g^2, sum (p_after - p_before)^2, sum p_before^2)
// (g the gradient as the arena holds it; sums in f64), and nothing else
// changes: the update is bit for bit the one without the sums. A chunk of an
// unused slot under UnusedParameters::skip gets (sum g^2, 0, sum p^2). That is
// 24 bytes per 32 parameters written and no extra pass over the arena, where
// separate norm passes and a weight copy cost 36 bytes per parameter. On CUDA
// the P packs of a chunk (8 of f32, 16 of f64) are P neighbouring lanes of one
// warp, combined by a fixed butterfly, so a row is bitwise the same on every
// run; the CPU adds a chunk's elements in index order. The CUDA pass needs the
// vectorized layout (16-byte aligned buffers, numel and first_element
// multiples of kChunk: always true of a GradArena) and refuses anything else.
// A skipped window (Note [Skipped window]) writes no row.
//
// step_sums_per_slot then folds each slot's rows in a fixed order into
// out[i] = (|g|^2, |p_after - p_before|^2, |p_before|^2) of slot i, whose
// chunks are [slot_chunks[i][0], slot_chunks[i][1]): ascending and disjoint
// ranges, as a GradArena's slots are. On CUDA a slot's rows are cut into
// fixed tiles of chunks spread over the GPU, then the tiles' partials added
// in order (two launches for all slots), so a slot of a million chunks costs
// no more than its bytes.
// After a skipped window (state[kFoundInf] != 0) no row was written, so it
// reads the slot's gradient and weights from grads and params instead:
// (|g|^2, 0, |p|^2), a non-finite gradient making |g|^2 infinite.
// step_sums: f64 [chunks, 3]; slot_chunks: i64 [slots, 2] (checked on the
// CPU; on CUDA, where a check would synchronize, clamped to [0, chunks] and
// never read or written out of bounds, but misordered ranges give wrong sums);
// grads and params: the arena's flat gradient and master weights (same
// numel, chunk frame from element 0); out: f64 [slots, 3]; all on one device.
void step_sums_per_slot(const Tensor& step_sums, const Tensor& slot_chunks, const Tensor& grads,
                        const Tensor& params, const Tensor& state, const Tensor& out);

// Note [Unused parameters] (optim/window.h): the kernels that make the skip data.
// slot_used: f64 [slots] on its device; written[i] -> 1 or 0.
void store_slot_flags(const std::vector<bool>& written, const Tensor& slot_used);
// Once per window, after the scalar step and before the fused pass(es):
// unless state[kFoundInf], each slot with slot_used > 0 gets t += 1 and its
// bias corrections from config's betas. slot_steps: f64 [slots, 3].
void advance_slot_steps(const OptimizerConfig& config, const Tensor& slot_used,
                        const Tensor& slot_steps, const Tensor& state);

// The dynamic loss scale's calibrated start, after the first window's
// optimizer step: state[kScale] from amax, scale_used and margin, the growth
// tracker reset, on the device (the formula and when the state is left alone:
// Note [Scale calibration] in optim/scale_calibration.h).
// amax: f64 [1] on the state's device.
void calibrate_loss_scale(const Tensor& amax, const Tensor& state, const ScalerConfig& scaler,
                          double scale_used, double margin);

// Note [Hyperparameters on the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A captured close (optim/graphed_window.h) replays the kernel arguments of
// its capture, but the LR schedule moves every window. So the fused pass can
// take each group's learning rate and weight decay from a small buffer on its
// device (OptimizerBuffers::hyper) instead of from its arguments, and this
// writes that buffer: one launch of one block on CUDA (its values travel as
// kernel arguments, so no host memory must outlive the call and nothing
// synchronizes), a plain store on the CPU. optim::Optimizer stores before
// every eager pass, and before every replay of a captured one.
// hyper: f64 [kHyperSize], contiguous; config's groups are validated first.
void store_hyperparameters(const OptimizerConfig& config, const Tensor& hyper);

}  // namespace accrue::kernels
