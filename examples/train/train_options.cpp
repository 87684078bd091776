#include "examples/train/train_options.h"

#include "examples/common/checkpoint_file.h"
#include "examples/common/options.h"
#include "examples/common/train_model.h"
#include "examples/common/trainer_options.h"

namespace accrue::examples {

namespace {

std::string preset_list() {
  std::string s;
  for (const std::string& n : train_model_presets())
    s += n + ", ";
  return s + "or hf:DIR";
}

void declare_model_and_data(OptionTable& cli, TrainOptions& o) {
  cli.section("model and data");
  const std::string presets = preset_list();
  cli.text("--model", &o.model, "NAME",
           "a preset (" + presets +
               ": a Hugging Face directory, GPT-2 or Llama-family, its config.json and weights). "
               "gpt2-tiny: 2 layers, 4 heads, width 64, vocab 256, block 64");
  cli.path("--init-from", &o.init_from, "PATH",
           "start from Hugging Face weights: GPT-2, a GPT2LMHeadModel model.safetensors file; "
           "a Llama-family preset, a directory whose config.json describes it (or use "
           "--model hf:DIR)");
  cli.path("--train-data", &o.train_data, "GLOB",
           "token shards (tools/make_shards.py); GPT-2 reads contiguous rows across documents "
           "(Note [GPT-2 rows])");
  cli.integer("--eos-id", &o.eos_id, "ID", "the token that ends a document in the shards")
      .min(0)
      .default_text("required with --train-data, not taken by GPT-2 or --contiguous-rows");
  cli.flag("--contiguous-rows", &o.contiguous_rows,
           "a Llama model reads --train-data and --val-data as GPT-2 does: contiguous rows "
           "across document boundaries, plain causal attention (no --eos-id; Note [GPT-2 rows]: "
           "packed documents take the composed attention path on a GPU)");
  cli.path("--val-data", &o.val_data, "GLOB",
           "validation shards, read as --train-data is (the same micro-batches from their start "
           "each time)");
  declare_validation_schedule(cli, o.val_every, o.val_batches);
  cli.flag("--synthetic", &o.synthetic,
           "random documents of random lengths, packed (GPT-2: random full rows)");
  cli.choice<SyntheticDocuments>(
         "--synthetic-documents", &o.synthetic_documents,
         {{"random", SyntheticDocuments::random}, {"full", SyntheticDocuments::full}},
         "with --synthetic: random lengths packed into the rows (attention within each), or full: "
         "each row one document of --seq-len tokens (plain causal attention, as a PyTorch "
         "baseline trains)")
      .default_text("random; full for GPT-2, which takes no packed documents");
  cli.number("--dropout", &o.dropout, "P", "dropout probability (GPT-2 only)").min(0).below(1);
  cli.flag("--composed", &o.composed,
           "GPT-2 only: the model written from the public primitives only (examples/"
           "composed_gpt2: attention as matmul, mask and softmax, materialized logits; no fused "
           "op), same weights");
  declare_gpt2_size_overrides(cli, o.n_layer, o.n_head, o.n_embd, o.vocab_size, o.block_size,
                              "overrides a GPT-2 preset's size");
  cli.flag("--activation-checkpointing", &o.activation_checkpointing,
           "recompute each block's forward in backward (Note [Activation checkpointing])");
}

void declare_batch_and_optimizer(OptionTable& cli, TrainOptions& o) {
  cli.section("batch and optimizer");
  cli.integer("--micro-batch", &o.micro_batch, "B", "rows per micro-batch").min(1);
  cli.integer("--seq-len", &o.seq_len, "T", "tokens per row").min(2);
  cli.integer("--accum", &o.accum, "K", "micro-batches per window").min(1);
  cli.integer("--total-batch-tokens", &o.total_batch_tokens, "N",
              "tokens per window over all ranks instead of --accum: K = N / (B * T * ranks)")
      .min(1)
      .default_text("none: --accum");
  cli.integer("--windows", &o.windows, "W", "windows (optimizer steps) to train").min(1);
  cli.integer("--stop-after", &o.stop_after, "N", "stop after window N (to resume later)").min(1);
  cli.integer("--stop-micro-steps", &o.stop_micro_steps, "M",
              "with --stop-after N and --checkpoint: run M more micro-steps (0 < M < K) into "
              "window N+1, save there and end; the resumed run finishes that window bit-exactly "
              "(Note [Mid-window checkpoints]; one process only)")
      .min(1)
      .default_text("none");
  cli.number("--lr", &o.lr, "LR", "AdamW peak learning rate").above(0);
  cli.integer("--warmup-windows", &o.warmup_windows, "N", "linear warmup, then cosine").min(0);
  cli.number("--min-lr-factor", &o.min_lr_factor, "F", "cosine decay ends at F * lr").min(0).max(1);
  cli.number("--weight-decay", &o.weight_decay, "WD",
             "decay of 2-D weights (not norms; GPT-2: not wte, wpe)")
      .min(0);
  declare_adamw_moments(cli, o.beta1, o.beta2, o.eps);
  cli.number("--max-grad-norm", &o.max_grad_norm, "C", "clip the global norm (0: off)").min(0);
  cli.choice<DType>(
      "--dtype", &o.dtype,
      {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}, {"f64", DType::f64}},
      "compute dtype (bf16 and f16 over f32 master weights; f16 adds dynamic loss "
      "scaling)");
  declare_fp8(cli, o.fp8);
  declare_loss_scale_start(cli, o.init_scale, o.calibrate_scale);
  cli.integer("--seed", &o.seed, "S", "seed of the weights and the synthetic data").min(0);
}

void declare_run(OptionTable& cli, TrainOptions& o) {
  cli.section("run");
  cli.flag("--norm-under-backward", &o.norm_under_backward,
           "compute the norm rows under the last backward instead of in one pass at the close "
           "(measured slower for GPT-2; same bits)");
  declare_close_under_forward(cli, o.close_under_forward, "; not with --zero1 or --composed");
  cli.flag("--cuda-graphs", &o.cuda_graphs, "replay micro-steps and close as CUDA graphs (GPU)");
  declare_concurrent_micro_batches(cli, o.concurrent_micro_batches);
  declare_weight_grad_branch(cli, o.weight_grad_branch);
  cli.path("--gemm-tuning", &o.gemm_tuning, "FILE",
           "time the GEMM candidates per shape on first use and keep the fastest, recorded in "
           "FILE (Note [GEMM autotuning]); a run with the same FILE computes the same bits");
  cli.flag("--nvtx", &o.nvtx, "NVTX ranges for Nsight Systems (each window, micro-step, close)");
  cli.flag("--zero1", &o.zero1,
           "under a data-parallel launcher, shard the optimizer state over the ranks (Note "
           "[ZeRO-1]); on one process it changes nothing");
  declare_gradient_sync(cli, o.grad_sync);
  cli.flag("--cpu", &o.force_cpu, "run on the CPU even when a GPU is present");
  cli.path("--checkpoint", &o.checkpoint, "FILE", "write a checkpoint at the end (and every N)");
  cli.integer("--checkpoint-every", &o.checkpoint_every, "N", "also every N windows (0: end only)")
      .min(0);
  cli.path("--resume", &o.resume, "FILE", "continue the run a checkpoint holds");
  cli.text("--allow-changed", &o.allow_changed, "WORDS",
           "with --resume, let these settings differ from the checkpoint's run (comma-separated; "
           "each acts from the next window on): lr (--lr, --warmup-windows, --min-lr-factor), "
           "windows (--windows); the run prints what changed")
      .default_text("none");
  cli.path("--metrics", &o.metrics, "FILE", "one JSON line per window");
  cli.integer("--layer-metrics-every", &o.layer_metrics_every, "N",
              "every N windows, add each parameter's and parameter group's gradient norm and "
              "update-to-weight ratio to the --metrics line (Note [Layer monitor]; a copy of the "
              "weights in those windows)")
      .min(1)
      .default_text("none");
  cli.integer("--noise-scale-every", &o.noise_scale_every, "N",
              "every N windows, estimate the gradient noise scale B_simple from the first "
              "micro-batch's gradient and the window's (Note [Gradient noise scale]; needs "
              "--accum >= 2), shown in the progress line and the --metrics file")
      .min(1)
      .default_text("none");
  cli.integer("--max-skipped-windows", &o.max_skipped_windows, "N",
              "fail after more than N skipped windows in a row")
      .min(0);
}

void declare_benchmark(OptionTable& cli, TrainOptions& o) {
  cli.section("benchmark");
  cli.flag("--bench", &o.bench,
           "timing mode: warm-up windows, then timed windows; prints one JSON line (tokens/s, "
           "window ms, peak memory, MFU, memory per rank)");
  declare_bench_timing(cli, o.bench_warmup, o.bench_windows, o.peak_tflops);
}

// The checks between options, once the table has parsed them; GPT-2's
// defaults and --bench's window count are set here too.
void check_options(const OptionTable& cli, TrainOptions& o) {
  if (o.synthetic == !o.train_data.empty())
    usage_error("give exactly one of --train-data and --synthetic");
  if (!is_train_model_name(o.model))
    usage_error("--model '", o.model, "' is not one of ", preset_list());
  const bool gpt2 = is_gpt2_model_name(o.model) || is_hf_gpt2_model(o.model);
  if (!o.synthetic && cli.given("--synthetic-documents"))
    usage_error("--synthetic-documents needs --synthetic");
  // Note [GPT-2 rows]
  if (gpt2 && cli.given("--eos-id"))
    usage_error("--model ", o.model,
                " takes no --eos-id: GPT-2 reads contiguous rows of the shards across document "
                "boundaries");
  if (gpt2 && o.synthetic_documents == SyntheticDocuments::random &&
      cli.given("--synthetic-documents"))
    usage_error("--model ", o.model,
                " takes full rows only (--synthetic-documents full), not packed documents");
  if (gpt2) o.synthetic_documents = SyntheticDocuments::full;
  if (o.contiguous_rows && o.synthetic)
    usage_error(
        "--contiguous-rows reads --train-data; with --synthetic, rows are "
        "--synthetic-documents full");
  if (o.contiguous_rows && cli.given("--eos-id"))
    usage_error("--contiguous-rows takes no --eos-id: rows run across document boundaries");
  const bool rows = gpt2 || o.contiguous_rows;
  if (!rows && !o.train_data.empty() && o.eos_id < 0) usage_error("--train-data needs --eos-id");
  if (!rows && !o.val_data.empty() && o.eos_id < 0) usage_error("--val-data needs --eos-id");
  if (o.val_data.empty() && (cli.given("--val-every") || cli.given("--val-batches")))
    usage_error("--val-every and --val-batches need --val-data GLOB");
  if (o.bench && (!o.checkpoint.empty() || !o.resume.empty()))
    usage_error("--bench takes no --checkpoint or --resume");
  if (o.bench && o.stop_after) usage_error("--bench takes no --stop-after");
  check_fp8(o.fp8);
  if (o.fp8.on && o.dtype == DType::f64)
    usage_error("--fp8 computes in FP8 over f32, bf16 or f16 activations; not with --dtype f64");
  if (o.init_scale && o.dtype != DType::f16)
    usage_error("--init-scale applies to --dtype f16 only, the compute dtype is ",
                dtype_name(o.dtype));
  if (o.calibrate_scale && o.dtype != DType::f16)
    usage_error("--calibrate-scale applies to --dtype f16 only, the compute dtype is ",
                dtype_name(o.dtype));
  if (o.composed && (o.dropout > 0.0 || o.activation_checkpointing || o.fp8.on))
    usage_error("--composed has no dropout, no activation checkpointing and no FP8");
  check_close_under_forward(cli, o.close_under_forward,
                            {o.zero1 ? "--zero1" : nullptr, o.composed ? "--composed" : nullptr});
  check_concurrent_micro_batches(o.concurrent_micro_batches, o.cuda_graphs,
                                 {o.close_under_forward.on ? "--close-under-forward" : nullptr,
                                  o.zero1 ? "--zero1" : nullptr});
  check_weight_grad_branch(o.weight_grad_branch, o.cuda_graphs, o.concurrent_micro_batches);
  if (o.stop_micro_steps > 0 && (!o.stop_after || o.checkpoint.empty()))
    usage_error("--stop-micro-steps needs --stop-after N and --checkpoint FILE");
  if (o.stop_micro_steps > 0 && *o.stop_after >= o.windows)
    usage_error("--stop-micro-steps stops inside window ", *o.stop_after + 1, ", beyond --windows ",
                o.windows);
  if (!o.allow_changed.empty()) {
    if (o.resume.empty()) usage_error("--allow-changed needs --resume FILE");
    o.allowed_changes = parse_change_words("--allow-changed", o.allow_changed, {"lr", "windows"});
  }
  if (o.total_batch_tokens && cli.given("--accum"))
    usage_error("give --accum or --total-batch-tokens, not both");
  if (o.layer_metrics_every > 0 && o.metrics.empty())
    usage_error("--layer-metrics-every needs --metrics FILE");
  // The schedule spans the windows run.
  if (o.bench) o.windows = bench_window_count(o.bench_warmup, o.bench_windows);
  // Note [ZeRO-1]: each rank's optimizer state is its own shard, which the
  // one-file checkpoint of rank 0 (Note [Llama trainer checkpoint]) cannot hold.
  if (o.zero1 && (!o.checkpoint.empty() || !o.resume.empty()))
    usage_error(
        "--zero1 takes no --checkpoint or --resume (each rank holds its own shard of the "
        "optimizer state)");
  if (o.stop_after && *o.stop_after > o.windows)
    usage_error("--stop-after ", *o.stop_after, " is past --windows ", o.windows);
  checked_product({{"--micro-batch", o.micro_batch}, {"--seq-len", o.seq_len}});
}

}  // namespace

bool parse_train_options(const char* program, int argc, char** argv, TrainOptions& o) {
  OptionTable cli(program,
                  "Trains GPT-2 on full rows or a Llama-family model (Llama 2/3, Qwen3, or a "
                  "Hugging Face directory) on packed documents, K micro-batches per optimizer "
                  "step.");
  declare_model_and_data(cli, o);
  declare_batch_and_optimizer(cli, o);
  declare_run(cli, o);
  declare_benchmark(cli, o);
  if (!cli.parse(argc, argv)) return false;
  check_options(cli, o);
  return true;
}

void probe_train_outputs(const TrainOptions& o) {
  if (!o.checkpoint.empty()) probe_output_file("--checkpoint", o.checkpoint);
  if (!o.metrics.empty()) probe_output_file("--metrics", o.metrics);
  if (!o.gemm_tuning.empty()) probe_output_file("--gemm-tuning", o.gemm_tuning);
}

void resolve_window(TrainOptions& opt, int ranks) {
  if (opt.total_batch_tokens) {
    const int64_t step = checked_product(
        {{"--micro-batch", opt.micro_batch}, {"--seq-len", opt.seq_len}, {"ranks", ranks}});
    if (*opt.total_batch_tokens % step != 0)
      usage_error("--total-batch-tokens ", *opt.total_batch_tokens,
                  " is not a multiple of micro-batch ", opt.micro_batch, " x seq-len ", opt.seq_len,
                  " x ", ranks, " ranks = ", step);
    opt.accum = *opt.total_batch_tokens / step;
  }
  check_stop_micro_steps(opt.stop_micro_steps, opt.accum, ranks);
  if (opt.noise_scale_every > 0 && opt.accum < 2)
    usage_error("--noise-scale-every needs K >= 2 micro-batches per window, got K = ", opt.accum);
}

const char* documents_name(const TrainOptions& o) {
  if (!o.synthetic) {  // Note [GPT-2 rows], Note [Documents within rows]
    const bool rows = o.contiguous_rows || is_gpt2_model_name(o.model) || is_hf_gpt2_model(o.model);
    return rows ? "shards, contiguous rows" : "shards, documents within rows";
  }
  return o.synthetic_documents == SyntheticDocuments::full ? "full" : "random";
}

}  // namespace accrue::examples
