// The window close of Note [Window close] (optim/window.h), timed as the
// Window runs it: (a) grad_norm_partials, one read of the fp32 gradient arena; (b)
// window_scalar_step, one thread (dynamic loss scale, clipping on); (c)
// Optimizer::step, the fused AdamW pass over p, g, m, v. Everything on the
// device, nothing synchronizes the host.
//
// Bytes counted per parameter (padded arena elements):
//   close           32 = norm read g (4) + AdamW read p, g, m, v (16) + write p, m, v (12)
//   close_bf16copy  34 = the same + the bf16 compute copy written (2)
//   close_skip      32 under UnusedParameters::skip (Note [Unused parameters]):
//                   every slot written, so the same bytes, plus the flag copy,
//                   the per-slot step counts and the chunk-to-slot table reads
//   norm             4
//   adamw           28,  adamw_bf16copy 30
// The floor is those bytes at the device-to-device copy bandwidth measured in
// the same run (counter floor_ms; x_floor = time / floor).
//
// Shapes: GPT-2 124M as separate parameters (wte, wpe, 12 blocks, final
// layer norm: 124,475,904 in all) with two AdamW groups, weight decay on the
// 2-D weights and none on the 1-D biases and norm weights, as nanoGPT does;
// and a sweep of one flat parameter of 1M to 500M elements, one group.
// bench/torch_accumulation.py times PyTorch's recipe on the same shapes under
// the same names.
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/random.h"
#include "accrue/kernels/window_close.h"
#include "accrue/optim/optimizer.h"
#include "bench/bench_util.h"
#include "bench/gpt2_layout.h"

namespace accrue::bench {
namespace {

// The optimizer and close settings both sides use (torch_accumulation.py too).
constexpr double kLr = 6e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;
constexpr double kInitialScale = 65536.0;
constexpr double kMaxNorm = 1.0;
constexpr int64_t kMicroSteps = 8;
constexpr double kWindowItems = 8.0 * 8 * 1024;  // N: 8 micro-batches of 8 x 1024 tokens

// Random values in every parameter's slot of a flat arena; the padding
// between slots stays zero, as Note [Grad arena] requires.
void fill_slots(const optim::ParamStore& arena, const Tensor& flat, bool non_negative) {
  for (const optim::ParamStore::Slot& s : arena.slots()) {
    Tensor slot = make_view(flat, {s.numel}, {1}, s.offset);
    // Adam's v must be >= 0: uniform [0, 1) there, standard normal elsewhere.
    slot.copy_(non_negative ? rand({s.numel}, DType::f32, gpu())
                            : randn({s.numel}, DType::f32, gpu()));
  }
}

// One window's state as Window::close sees it: the arena with random
// gradients and moments, AdamW bound to it, the device state (scale and N set)
// and the norm partials.
class CloseFixture {
 public:
  CloseFixture(const std::vector<ParamSpec>& specs, bool split_groups, DType compute_dtype,
               bool skip_unused = false)
      : optimizer_(
            optim::AdamWOptions(kLr).betas(kBeta1, kBeta2).eps(kEps).weight_decay(kWeightDecay)) {
    std::vector<NamedParameter> params;
    for (const ParamSpec& s : specs)
      params.push_back({s.name, requires_grad_(randn(s.shape, DType::f32, gpu()))});
    arena_ = std::make_unique<optim::ParamStore>(params, optim::ParamStoreOptions()
                                                             .device(gpu())
                                                             .compute_dtype(compute_dtype)
                                                             .moments(optimizer_.moments_needed()));
    if (split_groups) {
      // nanoGPT's groups: no weight decay on biases and norm weights.
      std::vector<Tensor> no_decay;
      for (const Tensor& p : arena_->params())
        if (p.dim() < 2) no_decay.push_back(p);
      optimizer_.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
    }
    optimizer_.bind(*arena_);
    fill_slots(*arena_, arena_->grads(), false);
    fill_slots(*arena_, arena_->moment(0), false);
    fill_slots(*arena_, arena_->moment(1), true);

    config_.scaler.scaled = true;
    config_.scaler.dynamic = true;
    config_.normalization = kernels::Normalization::ItemCount;
    config_.micro_steps = kMicroSteps;
    config_.max_norm = kMaxNorm;
    state_ = kernels::make_window_state(kInitialScale, gpu());
    // window_scalar_step leaves kItems alone (the Window resets it), so every
    // timed close sees the same N.
    state_.narrow(0, kernels::kItems, 1).fill_(kWindowItems);
    partials_ = empty({kernels::norm_partials_rows(arena_->grads()), 2}, DType::f64, gpu());
    if (skip_unused) slots_ = optim::make_slot_tables(*arena_);
  }

  void norm() { kernels::grad_norm_partials(arena_->grads(), partials_); }
  void scalar_step() { kernels::window_scalar_step(partials_, state_, config_); }
  void optimizer_step() {
    if (slots_.used.defined()) {  // what Window::close adds under skip, every slot written
      kernels::store_slot_flags(std::vector<bool>(arena_->size(), true), slots_.used);
      kernels::advance_slot_steps(optimizer_.config_at(step_), slots_.used, slots_.steps, state_);
    }
    optimizer_.step(*arena_, state_, step_++, {}, slots_);
  }
  void close() {
    norm();
    scalar_step();
    optimizer_step();
  }

  double padded_numel() const { return static_cast<double>(arena_->padded_numel()); }

 private:
  optim::Optimizer optimizer_;
  std::unique_ptr<optim::ParamStore> arena_;
  kernels::CloseConfig config_;
  Tensor state_, partials_;
  optim::SlotTables slots_;  // defined under skip only
  int64_t step_ = 0;
};

enum class Pass { Close, Norm, AdamW };

double bytes_per_param(Pass pass, DType compute_dtype) {
  const double copy = compute_dtype == DType::f32 ? 0.0 : element_size(compute_dtype);
  switch (pass) {
    case Pass::Close:
      return 32.0 + copy;
    case Pass::Norm:
      return 4.0;
    case Pass::AdamW:
      return 28.0 + copy;
  }
  return 0.0;
}

void window_close(benchmark::State& state, const std::vector<ParamSpec>& specs, bool split_groups,
                  Pass pass, DType compute_dtype, bool skip_unused = false) {
  CloseFixture f(specs, split_groups, compute_dtype, skip_unused);
  // The optimizer pass alone needs a state a close has written (found_inf,
  // coef, step), as it has in a real close.
  f.norm();
  f.scalar_step();
  GpuTime t = time_gpu(state, [&] {
    switch (pass) {
      case Pass::Close:
        f.close();
        break;
      case Pass::Norm:
        f.norm();
        break;
      case Pass::AdamW:
        f.optimizer_step();
        break;
    }
  });
  const double bytes = bytes_per_param(pass, compute_dtype) * f.padded_numel();
  report_bandwidth(state, bytes, t);
  if (t.ops > 0 && t.seconds > 0) {
    const double floor_seconds = bytes / copy_bandwidth();
    state.counters["floor_ms"] = floor_seconds * 1e3;
    state.counters["x_floor"] = t.seconds / static_cast<double>(t.ops) / floor_seconds;
  }
  state.counters["params"] = f.padded_numel();
}

void register_window_close_benchmarks() {
  struct Case {
    const char* name;
    Pass pass;
    DType compute;
    bool skip_unused = false;
  };
  const Case cases[] = {
      {"close", Pass::Close, DType::f32},
      {"close_bf16copy", Pass::Close, DType::bf16},
      {"norm", Pass::Norm, DType::f32},
      {"adamw", Pass::AdamW, DType::f32},
      {"adamw_bf16copy", Pass::AdamW, DType::bf16},
      {"close_skip", Pass::Close, DType::f32, /*skip_unused=*/true},
  };
  for (const Case& c : cases) {
    register_gpu_benchmark(
        std::string("window_close/gpt2_124M/") + c.name, [c](benchmark::State& state) {
          window_close(state, gpt2_124m(), /*split_groups=*/true, c.pass, c.compute, c.skip_unused);
        });
  }
  // 124,475,904 is GPT-2 124M's size as one flat parameter, beside its
  // 148-tensor row above.
  for (int64_t n : {int64_t{1000000}, int64_t{10000000}, int64_t{50000000}, int64_t{124475904},
                    int64_t{500000000}}) {
    register_gpu_benchmark(
        "window_close/flat/n=" + std::to_string(n) + "/close", [n](benchmark::State& state) {
          window_close(state, {{"flat", {n}}}, /*split_groups=*/false, Pass::Close, DType::f32);
        });
  }
}

// main.cpp calls the register_* functions of bench_util.h; this file
// registers itself at static initialization instead (Google Benchmark's
// registry is safe to use then), so that adding it touched no shared file.
// Its rows come first in the output; the copy bandwidth they are divided by
// is measured before any benchmark runs (main.cpp's describe_gpu).
[[maybe_unused]] const bool registered = [] {
  register_window_close_benchmarks();
  return true;
}();

}  // namespace
}  // namespace accrue::bench
