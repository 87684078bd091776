// The options accrue_train and accrue_train_gpt2 declare alike: the same flag,
// metavar, range and help text, declared here once so that the two trainers
// cannot drift apart. Each function declares one run of options that stands
// together in both --help listings (the table prints options in declaration
// order). The options whose wording or defaults differ between the trainers
// stay in train_options.cpp and gpt2_options.cpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "accrue/autograd/fp8_ops.h"
#include "examples/common/json.h"
#include "examples/common/options.h"

namespace accrue::optim {
class ParamStore;
}

namespace accrue::examples {

// --n-layer, --n-head, --n-embd, --vocab-size, --block-size: each overrides
// one size of the GPT-2 preset; `help` is the trainer's wording of that.
void declare_gpt2_size_overrides(OptionTable& cli, std::optional<int64_t>& n_layer,
                                 std::optional<int64_t>& n_head, std::optional<int64_t>& n_embd,
                                 std::optional<int64_t>& vocab_size,
                                 std::optional<int64_t>& block_size, const char* help);

// --beta1, --beta2, --eps: AdamW's moment decay rates and epsilon.
void declare_adamw_moments(OptionTable& cli, double& beta1, double& beta2, double& eps);

// --init-scale, --calibrate-scale: where f16's dynamic loss scale starts.
void declare_loss_scale_start(OptionTable& cli, std::optional<double>& init_scale,
                              bool& calibrate_scale);

// The FP8 options both trainers take (Note [FP8 linear]).
struct Fp8Choice {
  bool on = false;                       // --fp8: the decoder blocks' projections in FP8
  Fp8Recipe recipe = Fp8Recipe::tensor;  // --fp8-recipe (Note [FP8 block recipe])
  // --fp8-cast-every-micro-batch: the weights cast at every micro-batch
  // instead of once per window (Note [Window FP8 weights]), to measure that.
  bool cast_every_micro_batch = false;
  // --fp8-fast-forward: the forward GEMMs without f32 promotions (Fp8LinearOptions).
  bool fast_forward = false;
  // --fp8-scaling delayed: x and dy cast with scales from earlier windows' amaxes,
  // one read each (Note [FP8 delayed scaling]); --fp8-amax-history windows of them.
  bool delayed = false;
  int64_t amax_history = 16;
  // --fp8-grad-dtype: the output gradients' codes, e5m2 or e4m3.
  DType grad_dtype = DType::f8e5m2;
  // fp8_linear's options for this choice.
  Fp8LinearOptions options() const;
  // Whether the store keeps the weights' FP8 copies (once per window, Note [Window FP8 weights]).
  bool keeps_copies() const { return on && !cast_every_micro_batch; }
  // Gives the store what this choice keeps of the layers' weights (returned by
  // use_fp8): their once-per-window copies and, under delayed scaling, the
  // scaling rows in the layers' dtypes. Before the Window, whose close recasts them.
  void keep_in(optim::ParamStore& store, const std::vector<Tensor>& fp8_weights) const;
  // The run record's value (Note [Run record]).
  std::string record() const;
  // The choice in --bench's JSON config: fp8, fp8_recipe, fp8_scaling,
  // fp8_grad_dtype, fp8_cast_every_micro_batch, fp8_fast_forward.
  void describe_json(JsonObject& config) const;
};
void declare_fp8(OptionTable& cli, Fp8Choice& fp8);
// The UsageErrors: --fp8-recipe, --fp8-cast-every-micro-batch, --fp8-fast-forward,
// --fp8-grad-dtype or --fp8-scaling delayed without --fp8, and --fp8-fast-forward or delayed
// scaling under the block recipe.
void check_fp8(const Fp8Choice& fp8);

// --val-every, --val-batches: how often and over how many micro-batches the
// validation loss is taken.
void declare_validation_schedule(OptionTable& cli, int64_t& val_every, int64_t& val_batches);

// --bench-warmup, --bench-windows, --peak-tflops: --bench's window counts and
// the peak its MFU divides by.
void declare_bench_timing(OptionTable& cli, int64_t& bench_warmup, int64_t& bench_windows,
                          std::optional<double>& peak_tflops);

// The windows a --bench run trains: warm-up plus timed (a UsageError when the
// sum overflows).
int64_t bench_window_count(int64_t bench_warmup, int64_t bench_windows);

// --close-under-forward, --close-layer-elements (Note [Close under the
// forward] in optim/layer_steps.h): the optimizer step layer by layer beside
// the next window's forward.
struct CloseUnderForward {
  bool on = false;
  int64_t layer_elements = int64_t{1} << 20;
  int64_t max_blocks = 0;  // --close-max-blocks: each range's grid cap (0: none)
};
// `limits` ends the help text: "; not with ..." where the trainer refuses some.
void declare_close_under_forward(OptionTable& cli, CloseUnderForward& close,
                                 const std::string& limits);
// The UsageErrors: --close-layer-elements or --close-max-blocks without
// --close-under-forward, and
// --close-under-forward with what it does not run beside (`others`: each
// given option's name, or null for one not given).
void check_close_under_forward(const OptionTable& cli, const CloseUnderForward& close,
                               std::initializer_list<const char*> others);

// --bucket-mb, --grad-transport, --gemm-sm-margin and --nccl-max-ctas: the
// data-parallel reducer's bucket size (dist/bucket_plan.h; PyTorch DDP's
// bucket_cap_mb), the dtype its buckets travel in (Note [Gradient transport]
// in dist/reducer.h; DDP's bf16 and fp16 compress hooks), the SMs the last
// backward's GEMMs leave to the collectives (Note [GEMM SM margin]) and
// NCCL's CTA cap. Under one process there is nothing to sum: they do nothing.
struct GradientSyncChoice {
  std::optional<double> bucket_mb;  // unset: BucketPlanOptions' 25 MiB
  std::optional<DType> transport;   // unset: the arena's own dtype, exact
  int64_t gemm_sm_margin = 0;       // Note [GEMM SM margin]: SMs the last backward's GEMMs leave
  int64_t nccl_max_ctas = 0;        // NcclOptions::max_ctas; 0: NCCL's choice
  // "exact", "bf16" or "f16": what the trainers print, report and record.
  std::string transport_name() const;
  // --bucket-mb, or the plan's default when it was not given.
  double bucket_mib() const;
  bool given() const {
    return bucket_mb.has_value() || transport.has_value() || gemm_sm_margin != 0 ||
           nccl_max_ctas != 0;
  }
};
void declare_gradient_sync(OptionTable& cli, GradientSyncChoice& g);

// --concurrent-micro-batches N (Note [Concurrent micro-batches] in
// optim/graphed_window.h): N micro-steps in flight under --cuda-graphs.
// Returned for a binary whose default depends on the device (default_text).
OptionTable::Option& declare_concurrent_micro_batches(OptionTable& cli, int64_t& n);
// The UsageErrors: N > 1 without --cuda-graphs, or with what it does not run
// beside (`others`: each given option's name, or null for one not given).
void check_concurrent_micro_batches(int64_t n, bool cuda_graphs,
                                    std::initializer_list<const char*> others);

// --weight-grad-branch LAG (Note [Weight gradients on a branch] in
// autograd/weight_grad_branch.h): 0 off; the UsageErrors: on without
// --cuda-graphs or with concurrent micro-batches.
void declare_weight_grad_branch(OptionTable& cli, int64_t& lag);
void check_weight_grad_branch(int64_t lag, bool cuda_graphs, int64_t concurrent_micro_batches);

// --stop-micro-steps M against the window's K micro-steps on `ranks` ranks:
// one process only, and 0 < M < K (Note [Mid-window checkpoints]).
void check_stop_micro_steps(int64_t stop_micro_steps, int64_t K, int ranks);

}  // namespace accrue::examples
