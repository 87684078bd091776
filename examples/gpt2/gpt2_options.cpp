#include "examples/gpt2/gpt2_options.h"

#include <limits>

#include "examples/common/checkpoint_file.h"
#include "examples/common/options.h"
#include "examples/common/train_model.h"
#include "examples/common/trainer_options.h"

namespace accrue::examples {

namespace {

void declare(OptionTable& cli, Gpt2Options& o) {
  cli.section("model");
  cli.choice("--model", &o.model, {"d12", "d24", "d36", "d48", "tiny"},
             "a GPT-2 size (tiny: 2 layers, 4 heads, width 64, vocab 256 bytes, block 64)");
  declare_gpt2_size_overrides(cli, o.n_layer, o.n_head, o.n_embd, o.vocab_size, o.block_size,
                              "overrides the preset's size");
  cli.number("--dropout", &o.dropout, "P", "dropout probability").min(0).below(1);
  cli.flag("--activation-checkpointing", &o.activation_checkpointing,
           "recompute each block's forward in backward");
  cli.flag("--composed", &o.composed,
           "run the model written from the public primitives only (examples/composed_gpt2: "
           "attention as matmul, mask and softmax, materialized logits; no fused op), same "
           "weights");
  cli.path("--init-from", &o.init_from, "FILE",
           "start from Hugging Face GPT-2 safetensors weights");

  cli.section("data");
  cli.path("--train-data", &o.train_data, "GLOB", "training shards (quote the pattern)");
  cli.path("--val-data", &o.val_data, "GLOB", "validation shards");
  cli.flag("--synthetic", &o.synthetic, "random tokens from the seed instead of --train-data");
  cli.integer("--micro-batch", &o.micro_batch, "B", "sequences per micro-batch").min(1);
  cli.integer("--seq-len", &o.seq_len, "T", "tokens per sequence")
      .min(1)
      .default_text("the block size");
  cli.integer("--total-batch-tokens", &o.total_batch_tokens, "N",
              "tokens per optimizer step over all ranks; K = N / (B * T * ranks)")
      .min(1)
      .default_text("B * T * ranks");

  cli.section("optimization");
  cli.integer("--windows", &o.windows, "N", "optimizer steps (windows) in all").min(1);
  cli.integer("--stop-after", &o.stop_after, "N",
              "end after window N, as if preempted (the schedule still spans --windows; resume "
              "with --resume)")
      .min(1)
      .default_text("--windows");
  cli.integer("--stop-micro-steps", &o.stop_micro_steps, "M",
              "with --stop-after N and --checkpoint: run M more micro-steps (0 < M < K) into "
              "window N+1, save there and end; the resumed run finishes that window bit-exactly "
              "(one process only)")
      .min(1)
      .default_text("none");
  cli.number("--lr", &o.lr, "LR", "peak learning rate").above(0);
  cli.integer("--warmup-windows", &o.warmup_windows, "N", "linear warmup windows").min(0);
  cli.number("--min-lr-factor", &o.min_lr_factor, "F", "cosine decay ends at F * lr").min(0).max(1);
  cli.number("--weight-decay", &o.weight_decay, "W",
             "AdamW decay of the Linear weights (never biases, LayerNorms, wte, wpe)")
      .min(0);
  declare_adamw_moments(cli, o.beta1, o.beta2, o.eps);
  cli.number("--max-grad-norm", &o.max_grad_norm, "N",
             "global gradient-norm clipping; 0 turns it off")
      .min(0);
  cli.flag("--norm-under-backward", &o.norm_under_backward,
           "compute the norm rows under the last backward instead of in one pass at the close "
           "(measured slower; same bits)");
  cli.flag("--copy-engine-all-reduce", &o.copy_engine_all_reduce,
           "under data parallelism on two GPUs of one host: sum the gradient buckets on the "
           "copy engines instead of NCCL's kernels (Note [Copy-engine all-reduce]; NCCL's bits; "
           "within noise of NCCL for GPT-2 on 2 x H200, bench/RESULTS.md)");
  cli.flag("--copy-engine-whole-buckets", &o.copy_engine_whole_buckets,
           "with --copy-engine-all-reduce: each rank pulls the other's whole bucket and adds it "
           "after the backward, no kernel beside it (4 more bytes a parameter; NCCL's bits)");
  declare_gradient_sync(cli, o.grad_sync);
  declare_close_under_forward(cli, o.close_under_forward, "; not with --composed");
  cli.path("--gemm-tuning", &o.gemm_tuning, "FILE",
           "time cuBLASLt's candidates and cublasGemmEx for each GEMM shape on first use and "
           "keep the fastest, recorded in FILE; a run with the same FILE reads the choices back "
           "and computes the same bits");
  cli.flag("--cuda-graphs", &o.cuda_graphs,
           "replay the micro-steps and the close from CUDA graphs (same bits; dropout and, "
           "under data parallelism, the last micro-step and the close stay eager, with a "
           "warning)");
  declare_concurrent_micro_batches(cli, o.concurrent_micro_batches);
  declare_weight_grad_branch(cli, o.weight_grad_branch);
  cli.choice("--dtype", &o.dtype, {"f32", "bf16", "f16"},
             "compute dtype over fp32 master weights; f16 adds dynamic loss scaling")
      .default_text("bf16 on a GPU, f32 on the CPU");
  declare_fp8(cli, o.fp8);
  declare_loss_scale_start(cli, o.init_scale, o.calibrate_scale);
  cli.integer("--seed", &o.seed, "S", "initialization, dropout and synthetic data");

  cli.section("evaluation and checkpoints");
  declare_validation_schedule(cli, o.val_every, o.val_batches);
  cli.flag("--nvtx", &o.nvtx,
           "NVTX ranges for Nsight Systems: each window, micro-step backward, close and bucket "
           "collective (ACCRUE_NVTX=1 too)");
  cli.path("--metrics", &o.metrics, "FILE",
           "one JSON line per window (loss, grad norm before and after clipping, lr, loss scale, "
           "skips, tokens/s, MFU, peak memory, validation loss, z-scores); appended to on "
           "--resume; tools/plot_metrics.py plots it. The progress line shows an ALERT when the "
           "loss or grad norm is 3 standard deviations off the last 128 windows");
  cli.integer("--layer-metrics-every", &o.layer_metrics_every, "N",
              "every N windows, add each layer's and parameter group's gradient norm and "
              "update-to-weight ratio to the --metrics line (Note [Layer monitor]; a copy of the "
              "weights in those windows)")
      .min(1)
      .default_text("none");
  cli.integer("--noise-scale-every", &o.noise_scale_every, "N",
              "every N windows, estimate the gradient noise scale B_simple from the first "
              "micro-batch's gradient and the window's (McCandlish et al. 2018; needs K >= 2), "
              "shown in the progress line and the --metrics file")
      .min(1)
      .default_text("none");
  cli.path("--checkpoint", &o.checkpoint, "PATH", "write a checkpoint (safetensors) at the end");
  cli.integer("--checkpoint-every", &o.checkpoint_every, "N", "... and every N windows (0: never)")
      .min(0);
  cli.path("--resume", &o.resume, "PATH",
           "continue a checkpoint's run (bit-exactly); a command line that would give another "
           "run (model, K, micro-batch, seq-len, seed, dropout, data, optimizer, dtype, ...) "
           "is refused, naming each difference");
  cli.text("--allow-changed", &o.allow_changed, "WORDS",
           "with --resume, let these settings differ from the checkpoint's run (comma-separated; "
           "each acts from the next window on): lr (--lr, --warmup-windows, --min-lr-factor), "
           "windows (--windows), validation (--val-every, --val-batches, --val-data), metrics "
           "(--metrics); the run prints what changed")
      .default_text("none");
  cli.integer("--max-skipped-windows", &o.max_skipped_windows, "N",
              "fail the run when more than N windows in a row are skipped (non-finite "
              "gradients; Note [Honest exit codes])")
      .min(0);

  cli.section("benchmark");
  cli.flag("--bench", &o.bench,
           "timing mode: warmup windows, then timed windows; prints one JSON line (tokens/s, "
           "window ms, peak memory, MFU)");
  declare_bench_timing(cli, o.bench_warmup, o.bench_windows, o.peak_tflops);

  cli.section("device");
  cli.flag("--cpu", &o.force_cpu, "run on the CPU even when a GPU is present");
}

}  // namespace

bool parse_gpt2_options(int argc, char** argv, Gpt2Options& o) {
  OptionTable cli("accrue_train_gpt2",
                  "Trains GPT-2 on llm.c-format token shards (tools/make_shards.py writes them) "
                  "or on synthetic tokens. One optimizer step per window of K micro-batches, "
                  "with K = total-batch-tokens / (micro-batch * seq-len * world size).");
  declare(cli, o);
  if (!cli.parse(argc, argv)) return false;
  if (o.synthetic == !o.train_data.empty())
    usage_error(o.synthetic ? "--synthetic and --train-data exclude each other"
                            : "needs --train-data GLOB or --synthetic");
  if (o.checkpoint_every > 0 && o.checkpoint.empty())
    usage_error("--checkpoint-every needs --checkpoint PATH");
  if (!o.allow_changed.empty()) {
    if (o.resume.empty()) usage_error("--allow-changed needs --resume PATH");
    o.allowed_changes = parse_change_words("--allow-changed", o.allow_changed,
                                           {"lr", "windows", "validation", "metrics"});
  }
  if (o.layer_metrics_every > 0 && o.metrics.empty())
    usage_error("--layer-metrics-every needs --metrics FILE");
  check_fp8(o.fp8);
  if (o.composed && (o.dropout > 0.0 || o.activation_checkpointing || o.fp8.on))
    usage_error("--composed has no dropout, no activation checkpointing and no FP8");
  if (o.copy_engine_whole_buckets && !o.copy_engine_all_reduce)
    usage_error("--copy-engine-whole-buckets is a form of --copy-engine-all-reduce; give both");
  if (o.copy_engine_all_reduce && o.grad_sync.transport)
    usage_error("--copy-engine-all-reduce sums f32 buckets; it is not taken with --grad-transport ",
                o.grad_sync.transport_name());
  check_close_under_forward(cli, o.close_under_forward, {o.composed ? "--composed" : nullptr});
  check_concurrent_micro_batches(o.concurrent_micro_batches, o.cuda_graphs,
                                 {o.close_under_forward.on ? "--close-under-forward" : nullptr});
  check_weight_grad_branch(o.weight_grad_branch, o.cuda_graphs, o.concurrent_micro_batches);
  if (o.bench && (!o.checkpoint.empty() || !o.resume.empty()))
    usage_error("--bench takes no --checkpoint or --resume");
  if (o.bench) o.windows = bench_window_count(o.bench_warmup, o.bench_windows);
  if (o.stop_after && *o.stop_after > o.windows)
    usage_error("--stop-after ", *o.stop_after, " is beyond --windows ", o.windows);
  if (o.stop_micro_steps > 0 && (!o.stop_after || o.checkpoint.empty()))
    usage_error("--stop-micro-steps needs --stop-after N and --checkpoint PATH");
  if (o.stop_micro_steps > 0 && *o.stop_after >= o.windows)
    usage_error("--stop-micro-steps stops inside window ", *o.stop_after + 1, ", beyond --windows ",
                o.windows);
  if (o.warmup_windows >= o.windows)
    usage_error("--warmup-windows (", o.warmup_windows, ") must be below --windows (", o.windows,
                ")");
  return true;
}

void probe_gpt2_outputs(const Gpt2Options& o) {
  if (!o.checkpoint.empty()) probe_output_file("--checkpoint", o.checkpoint);
  if (!o.metrics.empty()) probe_output_file("--metrics", o.metrics);
  if (!o.gemm_tuning.empty()) probe_output_file("--gemm-tuning", o.gemm_tuning);
}

nn::GPT2Config make_gpt2_config(const Gpt2Options& o, uint64_t dropout_seed) {
  nn::GPT2Config c;
  if (o.model == "tiny") {
    c = gpt2_tiny_config();  // accrue_train's gpt2-tiny
  } else {
    c = nn::GPT2Config::from_name(o.model);
  }
  c.dropout = o.dropout;
  c.activation_checkpointing = o.activation_checkpointing;
  c.dropout_seed = dropout_seed;
  apply_gpt2_sizes(c, o.n_layer, o.n_head, o.n_embd, o.vocab_size, o.block_size);
  return c;
}

BatchPlan plan_batch(const Gpt2Options& o, const nn::GPT2Config& config, int world_size) {
  BatchPlan p;
  p.B = o.micro_batch;
  p.T = o.seq_len.value_or(config.block_size);
  if (p.T > config.block_size)
    usage_error("--seq-len ", p.T, " exceeds the block size ", config.block_size);
  p.step_tokens =
      checked_product({{"--micro-batch", p.B}, {"--seq-len", p.T}, {"ranks", world_size}});
  const int64_t total_tokens = o.total_batch_tokens.value_or(p.step_tokens);
  if (total_tokens % p.step_tokens != 0)
    usage_error("--total-batch-tokens ", total_tokens, " is not a multiple of micro-batch ", p.B,
                " x seq-len ", p.T, " x ", world_size, " ranks = ", p.step_tokens);
  p.K = total_tokens / p.step_tokens;
  p.window_tokens = total_tokens;
  // The logits of one micro-batch: B x T x padded vocabulary.
  checked_product({{"--micro-batch", p.B},
                   {"--seq-len", p.T},
                   {"--vocab-size (padded)", config.padded_vocab()}});
  if (o.noise_scale_every > 0 && p.K < 2)
    usage_error("--noise-scale-every needs K >= 2 micro-batches per window, got K = ", p.K);
  check_stop_micro_steps(o.stop_micro_steps, p.K, world_size);
  return p;
}

DType compute_dtype(const Gpt2Options& o, bool gpu) {
  const std::string name = !o.dtype.empty() ? o.dtype : gpu ? "bf16" : "f32";
  const DType compute = name == "bf16" ? DType::bf16 : name == "f16" ? DType::f16 : DType::f32;
  if (o.init_scale && compute != DType::f16)
    usage_error("--init-scale applies to --dtype f16 only, the compute dtype is ", name);
  if (o.calibrate_scale && compute != DType::f16)
    usage_error("--calibrate-scale applies to --dtype f16 only, the compute dtype is ", name);
  return compute;
}

}  // namespace accrue::examples
