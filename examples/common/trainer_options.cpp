#include "examples/common/trainer_options.h"

#include <limits>

#include "accrue/dist/bucket_plan.h"
#include "accrue/optim/param_store.h"

namespace accrue::examples {

void declare_gpt2_size_overrides(OptionTable& cli, std::optional<int64_t>& n_layer,
                                 std::optional<int64_t>& n_head, std::optional<int64_t>& n_embd,
                                 std::optional<int64_t>& vocab_size,
                                 std::optional<int64_t>& block_size, const char* help) {
  cli.integer("--n-layer", &n_layer, "N", help).min(1).default_text("the preset's");
  cli.integer("--n-head", &n_head, "N", help).min(1).default_text("the preset's");
  cli.integer("--n-embd", &n_embd, "N", help).min(1).default_text("the preset's");
  cli.integer("--vocab-size", &vocab_size, "N", help).min(1).default_text("the preset's");
  cli.integer("--block-size", &block_size, "N", help).min(1).default_text("the preset's");
}

void declare_close_under_forward(OptionTable& cli, CloseUnderForward& close,
                                 const std::string& limits) {
  cli.flag("--close-under-forward", &close.on,
           "step each layer's parameters beside the next window's forward instead of in the "
           "close (Note [Close under the forward]; the same bits; measured slower on an H200 "
           "except at K = 1, bench/RESULTS.md); with --cuda-graphs the micro-steps replay and "
           "the close runs eagerly" +
               limits);
  cli.integer("--close-layer-elements", &close.layer_elements, "N",
              "with --close-under-forward: the fewest parameters a stepped range holds")
      .min(1);
  cli.integer("--close-max-blocks", &close.max_blocks, "N",
              "with --close-under-forward: the most thread blocks each range's step launches, "
              "leaving the other SMs to the forward (0: one full wave)")
      .min(0);
}

void check_close_under_forward(const OptionTable& cli, const CloseUnderForward& close,
                               std::initializer_list<const char*> others) {
  for (const char* option : {"--close-layer-elements", "--close-max-blocks"})
    if (!close.on && cli.given(option)) usage_error(option, " needs --close-under-forward");
  if (!close.on) return;
  for (const char* other : others)
    if (other != nullptr)
      usage_error("--close-under-forward is not taken with ", other,
                  " (Note [Close under the forward])");
}

std::string GradientSyncChoice::transport_name() const {
  return transport ? dtype_name(*transport) : "exact";
}

double GradientSyncChoice::bucket_mib() const {
  return bucket_mb.value_or(static_cast<double>(dist::BucketPlanOptions{}.bucket_bytes) /
                            (1 << 20));
}

void declare_gradient_sync(OptionTable& cli, GradientSyncChoice& g) {
  cli.number("--bucket-mb", &g.bucket_mb, "MB",
             "under data parallelism: the gradient buckets' size in MiB, each all-reduced as "
             "soon as the backward has filled it (the first bucket at most 1 MiB; PyTorch DDP's "
             "bucket_cap_mb)")
      .min(0.001)
      .max(4096)
      .default_text(std::to_string(
          static_cast<int64_t>(GradientSyncChoice{}.bucket_mib())));  // a whole MiB: 25
  cli.choice("--grad-transport", &g.transport,
             {{"exact", std::nullopt}, {"bf16", DType::bf16}, {"f16", DType::f16}},
             "under data parallelism: the dtype the buckets travel in; bf16 or f16 halve the "
             "bytes but round each rank's gradients before the sum, so the step is no longer "
             "the large batch's exactly (Note [Gradient transport]; DDP's compress hooks)");
  cli.integer("--gemm-sm-margin", &g.gemm_sm_margin, "N",
              "under data parallelism: the last micro-step's GEMMs are planned for N fewer SMs, "
              "left to the buckets' collectives beside them (Note [GEMM SM margin]; other "
              "algorithms, so other bits than without it; measured no faster on 2 x H200)")
      .min(0)
      .max(1023);
  cli.integer("--nccl-max-ctas", &g.nccl_max_ctas, "N",
              "under data parallelism: at most N CTAs per NCCL kernel (ncclConfig_t::maxCTAs; "
              "0: NCCL's choice)")
      .min(0)
      .max(64);
}

OptionTable::Option& declare_concurrent_micro_batches(OptionTable& cli, int64_t& n) {
  return cli
      .integer("--concurrent-micro-batches", &n, "N",
               "with --cuda-graphs: run N micro-steps of a window at once, each on a stream of "
               "its own inside one graph, their gradient adds kept in order by events (Note "
               "[Concurrent micro-batches]; the same bits; N micro-batches of activations)")
      .min(1)
      .max(64);
}

void check_concurrent_micro_batches(int64_t n, bool cuda_graphs,
                                    std::initializer_list<const char*> others) {
  if (n == 1) return;
  if (!cuda_graphs)
    usage_error("--concurrent-micro-batches ", n,
                " needs --cuda-graphs: the micro-steps run side by side only inside graphs");
  for (const char* other : others)
    if (other != nullptr)
      usage_error("--concurrent-micro-batches is not taken with ", other,
                  " (Note [Concurrent micro-batches])");
}

void declare_weight_grad_branch(OptionTable& cli, int64_t& lag) {
  cli.integer("--weight-grad-branch", &lag, "LAG",
              "with --cuda-graphs: issue the Linear, convolution, LayerNorm and classifier "
              "parameter gradients of the captured micro-steps on a side stream beside the rest "
              "of the backward, at most LAG of them pending "
              "(Note [Weight gradients on a branch]; the same bits); 0 (the default) keeps them "
              "inline")
      .min(0)
      .max(64);
}

void check_weight_grad_branch(int64_t lag, bool cuda_graphs, int64_t concurrent_micro_batches) {
  if (lag == 0) return;
  if (!cuda_graphs)
    usage_error("--weight-grad-branch ", lag,
                " needs --cuda-graphs: the branch runs only inside graphs");
  if (concurrent_micro_batches > 1)
    usage_error("--weight-grad-branch is not taken with --concurrent-micro-batches ",
                concurrent_micro_batches, " (Note [Weight gradients on a branch])");
}

void declare_adamw_moments(OptionTable& cli, double& beta1, double& beta2, double& eps) {
  cli.number("--beta1", &beta1, "B1", "AdamW beta1").min(0).below(1);
  cli.number("--beta2", &beta2, "B2", "AdamW beta2").min(0).below(1);
  cli.number("--eps", &eps, "E", "AdamW epsilon").above(0);
}

void declare_loss_scale_start(OptionTable& cli, std::optional<double>& init_scale,
                              bool& calibrate_scale) {
  cli.number("--init-scale", &init_scale, "S", "f16: the dynamic loss scale's start")
      .min(1)
      .default_text("65536 / (B * T) rounded down to a power of two, Note [Normalization]");
  cli.flag("--calibrate-scale", &calibrate_scale,
           "f16: run the first window at scale 1 and start the dynamic scale from its largest "
           "gradient (Note [Scale calibration]; --init-scale is then not used)");
}

Fp8LinearOptions Fp8Choice::options() const {
  Fp8LinearOptions o;
  o.recipe = recipe;
  o.fast_forward_accumulation = fast_forward;
  o.grad_dtype = grad_dtype;
  return o;
}

void Fp8Choice::keep_in(optim::ParamStore& store, const std::vector<Tensor>& fp8_weights) const {
  if (keeps_copies()) store.keep_fp8_copies(fp8_weights, DType::f8e4m3, 0, recipe);
  if (delayed)  // Note [FP8 delayed scaling]
    store.keep_fp8_delayed_scaling(fp8_weights, optim::Fp8DelayedOptions()
                                                    .history(static_cast<int>(amax_history))
                                                    .dtypes(DType::f8e4m3, grad_dtype));
}

std::string Fp8Choice::record() const {
  if (!on) return "off";
  const std::string codes =
      std::string("projections e4m3/") + (grad_dtype == DType::f8e4m3 ? "e4m3" : "e5m2");
  if (recipe == Fp8Recipe::block) return codes + ", 1x128 / 128x128 block scaling";
  const std::string scaling =
      delayed ? "delayed scaling over " + std::to_string(amax_history) + " windows"
              : "current scaling";
  return codes + ", " + scaling + (fast_forward ? ", fast forward accumulation" : "");
}

void Fp8Choice::describe_json(JsonObject& config) const {
  config.boolean("fp8", on)
      .text("fp8_recipe", recipe == Fp8Recipe::block ? "block" : "tensor")
      .text("fp8_scaling", delayed ? "delayed" : "current")
      .text("fp8_grad_dtype", grad_dtype == DType::f8e4m3 ? "e4m3" : "e5m2")
      .boolean("fp8_cast_every_micro_batch", cast_every_micro_batch)
      .boolean("fp8_fast_forward", fast_forward);
}

void declare_fp8(OptionTable& cli, Fp8Choice& fp8) {
  cli.flag("--fp8", &fp8.on,
           "each decoder block's projections in FP8: e4m3 activations and weights, e5m2 "
           "gradients (--fp8-grad-dtype), per-tensor current scaling, each weight cast once per "
           "window at the close, the weight gradients into the fp32 slots; embeddings, norms "
           "and the classifier stay in the compute dtype (Note [FP8 linear], docs/FP8.md)");
  cli.choice<Fp8Recipe>("--fp8-recipe", &fp8.recipe,
                        {{"tensor", Fp8Recipe::tensor}, {"block", Fp8Recipe::block}},
                        "with --fp8: tensor, one scale per tensor on the FP8 GEMMs; block, a "
                        "scale per 1 x 128 tile of activations and gradients and per 128 x 128 "
                        "block of weights, on cuBLASLt's block-scaled FP8 GEMMs (Hopper only; "
                        "Note [FP8 block recipe])");
  cli.choice<DType>("--fp8-grad-dtype", &fp8.grad_dtype,
                    {{"e5m2", DType::f8e5m2}, {"e4m3", DType::f8e4m3}},
                    "with --fp8: the output gradients' codes: e5m2 (to 57,344 with 2 mantissa "
                    "bits, Transformer Engine's hybrid format) or e4m3 (to 448 with 3, as the "
                    "activations; DeepSeek-V3's choice)");
  cli.flag("--fp8-fast-forward", &fp8.fast_forward,
           "with --fp8 (tensor recipe), the forward GEMMs accumulate on the FP8 tensor cores "
           "without cuBLASLt's promotions to f32, as Transformer Engine's forward "
           "(Note [FP8 GEMM]); the gradients' GEMMs always promote");
  cli.choice<bool>("--fp8-scaling", &fp8.delayed, {{"current", false}, {"delayed", true}},
                   "with --fp8 (tensor recipe): current, each x and dy scaled by its own amax "
                   "(read before the cast); delayed, by the max amax of the last "
                   "--fp8-amax-history windows, each cast taking its amax in the same read (the "
                   "first window current; Note [FP8 delayed scaling])");
  cli.integer("--fp8-amax-history", &fp8.amax_history, "N",
              "with --fp8-scaling delayed, the windows of amaxes each scale is made from")
      .min(1)
      .max(1024);
  cli.flag("--fp8-cast-every-micro-batch", &fp8.cast_every_micro_batch,
           "with --fp8, cast each weight to FP8 at every micro-batch instead of once per window "
           "(the same bits, Note [Window FP8 weights]; to measure what the once-per-window copy "
           "saves)");
}

void check_fp8(const Fp8Choice& fp8) {
  if (fp8.cast_every_micro_batch && !fp8.on)
    usage_error("--fp8-cast-every-micro-batch needs --fp8");
  if (fp8.recipe != Fp8Recipe::tensor && !fp8.on) usage_error("--fp8-recipe needs --fp8");
  if (fp8.grad_dtype != DType::f8e5m2 && !fp8.on) usage_error("--fp8-grad-dtype needs --fp8");
  if (fp8.fast_forward && (!fp8.on || fp8.recipe != Fp8Recipe::tensor))
    usage_error("--fp8-fast-forward needs --fp8 with --fp8-recipe tensor");
  if (fp8.delayed && (!fp8.on || fp8.recipe != Fp8Recipe::tensor))
    usage_error("--fp8-scaling delayed needs --fp8 with --fp8-recipe tensor");
  if (fp8.amax_history != 16 && !fp8.delayed)
    usage_error("--fp8-amax-history needs --fp8-scaling delayed");
}

void declare_validation_schedule(OptionTable& cli, int64_t& val_every, int64_t& val_batches) {
  cli.integer("--val-every", &val_every, "N",
              "validation loss every N windows (0: at the end only)")
      .min(0);
  cli.integer("--val-batches", &val_batches, "N", "micro-batches per validation").min(1);
}

void declare_bench_timing(OptionTable& cli, int64_t& bench_warmup, int64_t& bench_windows,
                          std::optional<double>& peak_tflops) {
  cli.integer("--bench-warmup", &bench_warmup, "N", "untimed windows first").min(0);
  cli.integer("--bench-windows", &bench_windows, "N", "timed windows").min(1);
  cli.number("--peak-tflops", &peak_tflops, "F", "the device's peak for MFU")
      .above(0)
      .default_text("the bf16 dense peak of H100/H200 SXM, 989");
}

int64_t bench_window_count(int64_t bench_warmup, int64_t bench_windows) {
  // Both are non-negative (their declared ranges), so only the top can overflow;
  // checked before adding, since a signed overflow is undefined.
  if (bench_windows > std::numeric_limits<int64_t>::max() - bench_warmup)
    usage_error("--bench-warmup + --bench-windows overflows");
  return bench_warmup + bench_windows;
}

void check_stop_micro_steps(int64_t stop_micro_steps, int64_t K, int ranks) {
  // Note [Mid-window checkpoints]: a checkpoint inside a window holds this rank's own gradients.
  if (stop_micro_steps > 0 && ranks != 1)
    usage_error("--stop-micro-steps saves this rank's own gradients: run it on one process, not ",
                ranks);
  if (stop_micro_steps >= K)
    usage_error("--stop-micro-steps ", stop_micro_steps, " is not inside a window of K = ", K,
                " micro-steps");
}

}  // namespace accrue::examples
