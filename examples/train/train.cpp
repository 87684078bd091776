// accrue_train: one trainer for every model (examples/common/train_model.h):
// GPT-2 (gpt2-tiny, gpt2-d12 .. gpt2-d48) and the Llama family (Llama 2/3/3.2,
// Qwen3, or a Hugging Face directory). The Llama family trains on packed
// documents from token shards (or synthetic documents of random lengths);
// GPT-2 on full rows (Note [GPT-2 rows]). K micro-batches per optimizer step in one
// accumulation Window, AdamW with a warmup + cosine schedule, optional CUDA
// graphs, checkpoints that resume bit-exactly, data parallelism under
// torchrun/mpirun (with ZeRO-1), and --bench's JSON line of timings.
// `accrue_train --help` lists every option.
//
//   accrue_train --model llama-tiny --synthetic --cpu --windows 20
//   accrue_train --model llama-125m --train-data '/data/fw_train_*.bin' --eos-id 2
//   accrue_train --model gpt2-d12 --train-data '/data/fineweb_train_*.bin' --seq-len 1024
//                --micro-batch 16 --total-batch-tokens 524288 --dtype bf16
//   accrue_train --model llama-125m --synthetic --synthetic-documents full
//                --dtype bf16 --micro-batch 8 --seq-len 2048 --accum 8 --bench
//
// Data parallel, one process per GPU (examples/common/launch.h):
//   torchrun --nproc-per-node=2 --no-python build/ci/examples/accrue_train ...
// Each rank reads its own part of every step (DocumentBatches' rank split, or
// its own synthetic stream); the Window's count of real tokens is summed over
// the ranks at close (Note [Normalization]), so the loss is the mean over the
// whole window's tokens, however they fell.
//
// Note [Llama trainer checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The checkpoint of every model accrue_train trains (the name is older than
// its GPT-2 models). As Note [Trainer checkpoint] for accrue_train_gpt2: one
// safetensors file with model.<name> (the fp32/f64 master weights under the
// model's parameter names: Hugging Face's for Llama, nn::GPT2's for GPT-2)
// and optim.<key> (Window::state_dict() but its flat master), and in the
// metadata the run record (Note [Run record]), the windows closed, the
// skipped windows in a row (Note [Honest exit codes]), GPT-2's dropout
// generator offset, and where the data continues: the DocumentBatches
// position (Note [Document batches]), the DataLoader position (Note [GPT-2
// rows]) or the synthetic generator's offset. Checkpoints are written between
// windows, or with --stop-micro-steps after a micro-step (then with the
// window's partial gradients, Note [Mid-window checkpoints]), so the resumed
// run draws exactly the batches the uninterrupted run would have, and its
// final checkpoint equals that run's byte for byte.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/core/nvtx.h"
#include "accrue/data/document_batches.h"
#include "accrue/data/token_shards.h"
#include "accrue/nn/llama.h"
#include "examples/common/bench_line.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/json.h"
#include "examples/common/launch.h"
#include "examples/common/layer_metrics.h"
#include "examples/common/loss_scaling.h"
#include "examples/common/options.h"
#include "examples/common/run_guard.h"
#include "examples/common/run_main.h"
#include "examples/common/timing.h"
#include "examples/common/train_model.h"
#include "examples/common/validation.h"
#include "examples/common/window_reporter.h"
#include "examples/train/train_data.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_train";
constexpr const char* kFormat = "accrue_train checkpoint v1";

// --synthetic-documents: random lengths packed into the rows, or each row one
// document of T tokens (plain causal attention, no offsets).
enum class SyntheticDocuments { random, full };

// Note [GPT-2 rows]
// ~~~~~~~~~~~~~~~~~
// nn::GPT2 has no document offsets nor position ids: each row is one sequence
// from position 0. So for a GPT-2 model accrue_train reads --train-data as
// accrue_train_gpt2 does, contiguous rows of the shards (data::DataLoader,
// this rank's own rows of each step) that run across document boundaries, and
// takes no --eos-id; --synthetic draws full rows (--synthetic-documents full,
// its default there, Note [Synthetic rows]). A packed layout
// (--synthetic-documents random) is refused for GPT-2, not approximated.

std::string preset_list() {
  std::string s;
  for (const std::string& n : train_model_presets())
    s += n + ", ";
  return s + "or hf:DIR";
}

struct Options {
  std::string model = "llama-tiny", train_data, val_data, checkpoint, resume, metrics, gemm_tuning;
  std::string init_from, allow_changed;
  std::vector<std::string> allowed_changes;  // --allow-changed's words (Note [Run record])
  bool norm_under_backward = false;
  double dropout = 0.0;
  bool composed = false;
  int64_t stop_micro_steps = 0;
  std::optional<int64_t> n_layer, n_head, n_embd, vocab_size, block_size;
  bool synthetic = false, cuda_graphs = false, force_cpu = false;
  bool activation_checkpointing = false, zero1 = false, nvtx = false;
  SyntheticDocuments synthetic_documents = SyntheticDocuments::random;  // GPT-2: full
  int64_t eos_id = -1, micro_batch = 4, seq_len = 64, accum = 4, windows = 20, warmup_windows = 0;
  int64_t seed = 1, checkpoint_every = 0, max_skipped_windows = 32, layer_metrics_every = 0;
  int64_t val_every = 0, val_batches = 20;
  std::optional<int64_t> stop_after, total_batch_tokens;
  double lr = 3e-4, weight_decay = 0.1, max_grad_norm = 1.0, min_lr_factor = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int64_t noise_scale_every = 0;
  std::optional<double> init_scale;
  bool calibrate_scale = false;
  DType dtype = DType::f32;
  bool bench = false;
  int64_t bench_warmup = 3, bench_windows = 10;
  std::optional<double> peak_tflops;
};

bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Trains GPT-2 on full rows or a Llama-family model (Llama 2/3, Qwen3, or a "
                  "Hugging Face directory) on packed documents, K micro-batches per optimizer "
                  "step.");
  cli.section("model and data");
  const std::string presets = preset_list();
  cli.text("--model", &o.model, "NAME",
           "a preset (" + presets +
               ": a Llama-family Hugging Face directory). gpt2-tiny: 2 layers, 4 heads, width "
               "64, vocab 256, block 64");
  cli.path("--init-from", &o.init_from, "PATH",
           "start from Hugging Face weights: GPT-2, a GPT2LMHeadModel model.safetensors file; "
           "a Llama-family preset, a directory whose config.json describes it (or use "
           "--model hf:DIR)");
  cli.path("--train-data", &o.train_data, "GLOB",
           "token shards (tools/make_shards.py); GPT-2 reads contiguous rows across documents "
           "(Note [GPT-2 rows])");
  cli.integer("--eos-id", &o.eos_id, "ID", "the token that ends a document in the shards")
      .min(0)
      .default_text("required with --train-data, not taken by GPT-2");
  cli.path("--val-data", &o.val_data, "GLOB",
           "validation shards, read as --train-data is (the same micro-batches from their start "
           "each time)");
  cli.integer("--val-every", &o.val_every, "N",
              "validation loss every N windows (0: at the end only)")
      .min(0);
  cli.integer("--val-batches", &o.val_batches, "N", "micro-batches per validation").min(1);
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
  const char* kOverride = "overrides a GPT-2 preset's size";
  cli.integer("--n-layer", &o.n_layer, "N", kOverride).min(1).default_text("the preset's");
  cli.integer("--n-head", &o.n_head, "N", kOverride).min(1).default_text("the preset's");
  cli.integer("--n-embd", &o.n_embd, "N", kOverride).min(1).default_text("the preset's");
  cli.integer("--vocab-size", &o.vocab_size, "N", kOverride).min(1).default_text("the preset's");
  cli.integer("--block-size", &o.block_size, "N", kOverride).min(1).default_text("the preset's");
  cli.flag("--activation-checkpointing", &o.activation_checkpointing,
           "recompute each block's forward in backward (Note [Activation checkpointing])");
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
  cli.number("--beta1", &o.beta1, "B1", "AdamW beta1").min(0).below(1);
  cli.number("--beta2", &o.beta2, "B2", "AdamW beta2").min(0).below(1);
  cli.number("--eps", &o.eps, "E", "AdamW epsilon").above(0);
  cli.number("--max-grad-norm", &o.max_grad_norm, "C", "clip the global norm (0: off)").min(0);
  cli.choice<DType>(
      "--dtype", &o.dtype,
      {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}, {"f64", DType::f64}},
      "compute dtype (bf16 and f16 over f32 master weights; f16 adds dynamic loss "
      "scaling)");
  cli.number("--init-scale", &o.init_scale, "S", "f16: the dynamic loss scale's start")
      .min(1)
      .default_text("65536 / (B * T) rounded down to a power of two, Note [Normalization]");
  cli.flag("--calibrate-scale", &o.calibrate_scale,
           "f16: run the first window at scale 1 and start the dynamic scale from its largest "
           "gradient (Note [Scale calibration]; --init-scale is then not used)");
  cli.integer("--seed", &o.seed, "S", "seed of the weights and the synthetic data").min(0);
  cli.section("run");
  cli.flag("--norm-under-backward", &o.norm_under_backward,
           "compute the norm rows under the last backward instead of in one pass at the close "
           "(measured slower for GPT-2; same bits)");
  cli.flag("--cuda-graphs", &o.cuda_graphs, "replay micro-steps and close as CUDA graphs (GPU)");
  cli.path("--gemm-tuning", &o.gemm_tuning, "FILE",
           "time the GEMM candidates per shape on first use and keep the fastest, recorded in "
           "FILE (Note [GEMM autotuning]); a run with the same FILE computes the same bits");
  cli.flag("--nvtx", &o.nvtx, "NVTX ranges for Nsight Systems (each window, micro-step, close)");
  cli.flag("--zero1", &o.zero1,
           "under a data-parallel launcher, shard the optimizer state over the ranks (Note "
           "[ZeRO-1]); on one process it changes nothing");
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
  cli.section("benchmark");
  cli.flag("--bench", &o.bench,
           "timing mode: warm-up windows, then timed windows; prints one JSON line (tokens/s, "
           "window ms, peak memory, MFU, memory per rank)");
  cli.integer("--bench-warmup", &o.bench_warmup, "N", "untimed windows first").min(0);
  cli.integer("--bench-windows", &o.bench_windows, "N", "timed windows").min(1);
  cli.number("--peak-tflops", &o.peak_tflops, "F", "the device's peak for MFU")
      .above(0)
      .default_text("the bf16 dense peak of H100/H200 SXM, 989");
  if (!cli.parse(argc, argv)) return false;
  if (o.synthetic == !o.train_data.empty())
    usage_error("give exactly one of --train-data and --synthetic");
  if (!is_train_model_name(o.model))
    usage_error("--model '", o.model, "' is not one of ", preset_list());
  const bool gpt2 = is_gpt2_model_name(o.model);
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
  if (!gpt2 && !o.train_data.empty() && o.eos_id < 0) usage_error("--train-data needs --eos-id");
  if (!gpt2 && !o.val_data.empty() && o.eos_id < 0) usage_error("--val-data needs --eos-id");
  if (o.val_data.empty() && (cli.given("--val-every") || cli.given("--val-batches")))
    usage_error("--val-every and --val-batches need --val-data GLOB");
  if (o.bench && (!o.checkpoint.empty() || !o.resume.empty()))
    usage_error("--bench takes no --checkpoint or --resume");
  if (o.bench && o.stop_after) usage_error("--bench takes no --stop-after");
  if (o.init_scale && o.dtype != DType::f16)
    usage_error("--init-scale applies to --dtype f16 only, the compute dtype is ",
                dtype_name(o.dtype));
  if (o.calibrate_scale && o.dtype != DType::f16)
    usage_error("--calibrate-scale applies to --dtype f16 only, the compute dtype is ",
                dtype_name(o.dtype));
  if (o.composed && (o.dropout > 0.0 || o.activation_checkpointing))
    usage_error("--composed has no dropout and no activation checkpointing");
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
  if (o.bench) {
    const int64_t windows = o.bench_warmup + o.bench_windows;
    if (windows < o.bench_warmup) usage_error("--bench-warmup + --bench-windows overflows");
    o.windows = windows;  // the schedule spans the windows run
  }
  // Note [ZeRO-1]: each rank's optimizer state is its own shard, which the
  // one-file checkpoint of rank 0 (Note [Llama trainer checkpoint]) cannot hold.
  if (o.zero1 && (!o.checkpoint.empty() || !o.resume.empty()))
    usage_error(
        "--zero1 takes no --checkpoint or --resume (each rank holds its own shard of the "
        "optimizer state)");
  if (o.stop_after && *o.stop_after > o.windows)
    usage_error("--stop-after ", *o.stop_after, " is past --windows ", o.windows);
  checked_product({{"--micro-batch", o.micro_batch}, {"--seq-len", o.seq_len}});
  return true;
}

// Rank 0 writes them.
void probe_outputs(const Options& o) {
  if (!o.checkpoint.empty()) probe_output_file("--checkpoint", o.checkpoint);
  if (!o.metrics.empty()) probe_output_file("--metrics", o.metrics);
  if (!o.gemm_tuning.empty()) probe_output_file("--gemm-tuning", o.gemm_tuning);
}

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

JsonObject memory_json(const optim::StoreMemory& m) {
  JsonObject j;
  j.integer("master", m.master)
      .integer("grads", m.grads)
      .integer("compute", m.compute)
      .integer("moments", m.moments)
      .integer("total", m.total())
      .boolean("master_sharded", m.master_sharded)
      .boolean("moments_sharded", m.moments_sharded);
  return j;
}

const char* documents_name(const Options& o) {
  if (!o.synthetic) return "shards";
  return o.synthetic_documents == SyntheticDocuments::full ? "full" : "random";
}

// The checks that need the world size; --total-batch-tokens sets K.
void resolve_window(Options& opt, int ranks) {
  if (opt.total_batch_tokens) {
    const int64_t step = checked_product(
        {{"--micro-batch", opt.micro_batch}, {"--seq-len", opt.seq_len}, {"ranks", ranks}});
    if (*opt.total_batch_tokens % step != 0)
      usage_error("--total-batch-tokens ", *opt.total_batch_tokens,
                  " is not a multiple of micro-batch ", opt.micro_batch, " x seq-len ", opt.seq_len,
                  " x ", ranks, " ranks = ", step);
    opt.accum = *opt.total_batch_tokens / step;
  }
  // Note [Mid-window checkpoints]: the checkpoint holds this rank's own gradients.
  if (opt.stop_micro_steps > 0 && ranks != 1)
    usage_error("--stop-micro-steps saves this rank's own gradients: run it on one process, not ",
                ranks);
  if (opt.stop_micro_steps >= opt.accum)
    usage_error("--stop-micro-steps ", opt.stop_micro_steps,
                " is not inside a window of K = ", opt.accum, " micro-steps");
  if (opt.noise_scale_every > 0 && opt.accum < 2)
    usage_error("--noise-scale-every needs K >= 2 micro-batches per window, got K = ", opt.accum);
}

TrainModelOptions model_options_of(const Options& opt, int rank) {
  TrainModelOptions o;
  o.name = opt.model;
  o.seq_len = opt.seq_len;
  o.activation_checkpointing = opt.activation_checkpointing;
  o.dropout = opt.dropout;
  o.dropout_seed = static_cast<uint64_t>(opt.seed) + 1 + static_cast<uint64_t>(rank);
  o.n_layer = opt.n_layer;
  o.n_head = opt.n_head;
  o.n_embd = opt.n_embd;
  o.vocab_size = opt.vocab_size;
  o.block_size = opt.block_size;
  o.composed = opt.composed;
  return o;
}

// Note [Run record]: what a resume must match (or --allow-changed lets differ).
RunRecord run_record(const Options& opt, const TrainModel& model, int ranks,
                     const LossScaling& scaling) {
  RunRecord record;
  record.text("model", opt.model.rfind("hf:", 0) == 0 ? "hf:" + absolute_path(opt.model.substr(3))
                                                      : opt.model);
  record.integer("parameters", model.parameter_count());
  JsonObject sizes;  // the model's configuration, overrides included
  model.describe_json(sizes);
  record.text("model_config", sizes.str());
  record.text("init_from", absolute_path(opt.init_from));
  record.number("dropout", opt.dropout);
  record.text("dtype", dtype_name(opt.dtype));
  record.integer("micro_batch", opt.micro_batch);
  record.integer("seq_len", opt.seq_len);
  record.integer("micro_steps", opt.accum);
  record.integer("world_size", ranks);
  record.integer("seed", opt.seed);
  record.text("data", opt.synthetic ? "synthetic" : absolute_path(opt.train_data));
  if (opt.synthetic_documents != SyntheticDocuments::random)
    record.text("synthetic_documents", documents_name(opt));
  record.integer("eos_id", opt.eos_id);
  record.number("weight_decay", opt.weight_decay);
  record.number("max_grad_norm", opt.max_grad_norm);
  record.text("loss_scaler", loss_scaler_text(scaling));
  record.number("beta1", opt.beta1);
  record.number("beta2", opt.beta2);
  record.number("eps", opt.eps);
  record.number("min_lr_factor", opt.min_lr_factor, "lr");
  record.number("lr", opt.lr, "lr");
  record.integer("warmup_windows", opt.warmup_windows, "lr");
  record.integer("windows", opt.windows, "windows");
  return record;
}

// Restores a run from its checkpoint (already read and checked against the
// run record): the master weights, the window's state, the data's and the
// dropout's positions; the windows it had closed.
int64_t resume_run(const Options& opt, std::map<std::string, Tensor>& resumed,
                   const std::map<std::string, std::string>& resumed_meta, optim::ParamStore& store,
                   optim::Window& window, TrainData& train_data, TrainModel& model) {
  Tensor flat = zeros({store.padded_numel()}, store.master().dtype());
  for (const optim::ParamStore::Slot& slot : store.slots()) {
    auto it = resumed.find("model." + slot.name);
    ACCRUE_CHECK(it != resumed.end(), "checkpoint ", opt.resume, " has no 'model.", slot.name, "'");
    ACCRUE_CHECK(it->second.shape() == slot.shape, "checkpoint ", opt.resume, ": 'model.",
                 slot.name, "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(slot.shape));
    flat.narrow(0, slot.offset, slot.numel).copy_(it->second.reshape({slot.numel}));
  }
  std::map<std::string, Tensor> state{{"master", flat}};
  for (const auto& [key, t] : resumed)
    if (key.rfind("optim.", 0) == 0) state[key.substr(6)] = t;
  window.load_state_dict(state);
  const int64_t start = meta_int(resumed_meta, "windows_closed", opt.resume);
  // A mid-window checkpoint (--stop-micro-steps) resumes at its micro-step.
  ACCRUE_CHECK(start == window.windows_closed(), "checkpoint ", opt.resume, ": windows_closed ",
               start, " disagrees with its window state");
  train_data.read_position(resumed_meta, opt.resume);
  if (Generator* g = model.dropout_generator())
    g->set_state(g->seed(),
                 static_cast<uint64_t>(meta_int(resumed_meta, "dropout.offset", opt.resume)));
  resumed.clear();
  std::printf("resumed %s at window %lld%s\n", opt.resume.c_str(), (long long)start,
              window.micro_step() > 0 ? (", inside window " + std::to_string(start + 1) +
                                         " after micro-step " + std::to_string(window.micro_step()))
                                            .c_str()
                                      : "");
  return start;
}

int train(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  const Launch where = launch(opt.force_cpu);
  if (where.main_rank()) probe_outputs(opt);
  const Device device = where.device;
  const int ranks = where.world_size();
  resolve_window(opt, ranks);
  const DType master = opt.dtype == DType::f64 ? DType::f64 : DType::f32;
  // Every rank the same weights (rank 0's are broadcast anyway).
  Generator init(static_cast<uint64_t>(opt.seed));
  const TrainModelOptions model_options = model_options_of(opt, where.rank.rank);
  const std::unique_ptr<TrainModel> model =
      make_train_model(model_options, {device, master, &init});
  if (!opt.init_from.empty()) {  // before the store is built: the master weights copy them
    model->init_from(opt.init_from);
    std::printf("initialized from %s\n", opt.init_from.c_str());
  }
  const int64_t vocab = model->vocab_size();
  ACCRUE_CHECK(opt.synthetic || opt.eos_id < vocab, "--eos-id ", opt.eos_id,
               " is outside the vocabulary [0, ", vocab, ")");
  // Each rank its own synthetic stream (Note [Synthetic rows]).
  const SyntheticRows rows = model->synthetic_rows();
  const int64_t B = opt.micro_batch, T = opt.seq_len;
  const int64_t window_tokens = checked_product(
      {{"--micro-batch", B}, {"--seq-len", T}, {"--accum", opt.accum}, {"ranks", ranks}});

  const LossScaling scaling{opt.dtype, B * T, opt.init_scale, opt.calibrate_scale};
  const RunRecord record = run_record(opt, *model, ranks, scaling);

  std::map<std::string, Tensor> resumed;
  std::map<std::string, std::string> resumed_meta;
  if (!opt.resume.empty()) {
    resumed = load_safetensors(opt.resume, &resumed_meta);
    const auto f = resumed_meta.find("format");
    ACCRUE_CHECK(f != resumed_meta.end() && f->second == kFormat, opt.resume,
                 " is not an accrue_train checkpoint (format '",
                 f == resumed_meta.end() ? "" : f->second, "', expected '", kFormat, "')");
    for (const std::string& line : record.compare(opt.resume, resumed_meta, opt.allowed_changes))
      std::printf("%s\n", line.c_str());
  }

  // Note [Document batches]: rank r reads its own B rows of every step; GPT-2
  // reads contiguous rows instead (Note [GPT-2 rows]), rank r its own too.
  TrainDataOptions data_options;
  data_options.path = opt.synthetic ? "" : opt.train_data;
  data_options.packed = model->packed_documents();
  data_options.full_rows = opt.synthetic_documents == SyntheticDocuments::full;
  data_options.batch = opt.micro_batch;
  data_options.seq_len = opt.seq_len;
  data_options.eos_id = opt.eos_id;
  data_options.vocab = vocab;
  data_options.rank = where.rank.rank;
  data_options.world_size = ranks;
  data_options.device = device;
  data_options.rows = rows;
  data_options.synthetic_seed =
      static_cast<uint64_t>(opt.seed) + rows.seed_offset + static_cast<uint64_t>(where.rank.rank);
  TrainData train_data(data_options);
  // Validation, read as the training data is (this rank's part of each step).
  std::unique_ptr<TrainData> val_data;
  if (!opt.val_data.empty()) {
    data_options.path = opt.val_data;
    val_data = std::make_unique<TrainData>(data_options);
  }

  std::printf("%s on %s: %s%s\n", kProgram, where.describe().c_str(), model->describe().c_str(),
              model->activation_checkpointing() ? ", activation checkpointing" : "");
  std::printf(
      "batch: micro-batch %lld x seq %lld x %d rank(s) x K=%lld = %lld tokens per window; "
      "data: %s\n",
      (long long)opt.micro_batch, (long long)opt.seq_len, ranks, (long long)opt.accum,
      (long long)window_tokens,
      !opt.synthetic                                        ? opt.train_data.c_str()
      : opt.synthetic_documents == SyntheticDocuments::full ? "synthetic, one sequence per row"
                                                            : "synthetic packed documents");

  // AdamW; the model says which parameters decay (never norms and biases).
  optim::Optimizer optimizer(optim::AdamWOptions(opt.lr)
                                 .betas(opt.beta1, opt.beta2)
                                 .eps(opt.eps)
                                 .weight_decay(opt.weight_decay));
  std::vector<Tensor> no_decay;
  for (const nn::NamedParameter& p : model->named_parameters())
    if (!model->decays(p)) no_decay.push_back(p.tensor);
  optimizer.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optimizer.set_schedule(
      std::make_shared<optim::WarmupCosine>(opt.warmup_windows, opt.windows, opt.min_lr_factor));
  optim::ParamStoreOptions store_options = optim::ParamStoreOptions()
                                               .device(device)
                                               .master_dtype(master)
                                               .compute_dtype(opt.dtype)
                                               .moments(optimizer.moments_needed());
  // Note [ZeRO-1]: slots padded so that every bucket splits evenly over the ranks.
  if (opt.zero1) store_options.shard_ranks(ranks);
  optim::ParamStore store(model->named_parameters(), store_options);
  const DataParallel dp = connect_data_parallel(where, store, opt.zero1);
  optim::Window window(store, optimizer,
                       optim::WindowOptions()
                           .micro_steps(opt.accum)
                           .max_grad_norm(opt.max_grad_norm)
                           .scaler(loss_scaler_options(scaling))
                           .norm_under_backward(opt.norm_under_backward)
                           .noise_scale(opt.noise_scale_every),
                       dp.reducer.get());
  std::printf("memory per rank: %s\n", store.memory().describe().c_str());

  RunGuard guard(opt.max_skipped_windows,
                 resumed_meta.count("skipped_in_a_row")
                     ? meta_int(resumed_meta, "skipped_in_a_row", opt.resume)
                     : 0);
  const int64_t start = opt.resume.empty() ? 0
                                           : resume_run(opt, resumed, resumed_meta, store, window,
                                                        train_data, *model);

  // Rank 0 writes the checkpoint: without ZeRO-1 every rank holds the same state.
  auto save = [&](const std::string& at) {
    if (!where.main_rank()) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, Tensor> tensors;
    for (size_t i = 0; i < store.size(); ++i)
      tensors["model." + store.slots()[i].name] = store.master_view(i);
    for (const auto& [key, t] : window.state_dict())
      if (key != "master") tensors["optim." + key] = t;
    std::map<std::string, std::string> meta;
    record.write(&meta);
    meta["format"] = kFormat;
    meta["windows_closed"] = std::to_string(window.windows_closed());
    meta["skipped_in_a_row"] = std::to_string(guard.skipped_in_a_row());
    if (Generator* g = model->dropout_generator())
      meta["dropout.offset"] = std::to_string(g->offset());
    train_data.write_position(&meta);
    save_checkpoint_file(opt.checkpoint, tensors, meta);
    std::printf("checkpoint: %s (%s; %s)\n", opt.checkpoint.c_str(), at.c_str(),
                file_report(opt.checkpoint, t0).c_str());
  };

  if (!opt.gemm_tuning.empty())
    kernels::set_gemm_tuning_file(opt.gemm_tuning);  // Note [GEMM autotuning]
  // Note [Trainer synchronization]: DocumentBatches checked every token against the
  // vocabulary at open (Note [Tokens checked at open]); synthetic tokens are drawn in it.
  kernels::set_check_indices(false);
  if (opt.nvtx) set_nvtx(true);  // Note [NVTX ranges]
  // Note [Graphed window]: the graphs read fixed-shape buffers, so the
  // documents' offsets are padded to B * T + 1 entries with B * T (empty
  // documents at the end, which attend to nothing).
  std::unique_ptr<optim::GraphedWindow> graphed;
  if (opt.cuda_graphs) {  // on the CPU it runs eagerly, with the same padded offsets
    graphed = std::make_unique<optim::GraphedWindow>(window, [&](const std::vector<Tensor>& in) {
      return model->loss(
          in[0], in[1],
          in.size() == 4 ? nn::BatchLayout::packed(in[2], in[3]) : nn::BatchLayout::full());
    });
    std::printf("%s\n", where.gpu
                            ? "cuda graphs: micro-steps and close captured after one eager "
                              "warm-up each"
                            : "--cuda-graphs on the CPU: run eagerly, with the graphs' inputs");
  }
  auto padded_offsets = [&](const Tensor& cu) {
    const int64_t n = cu.numel();
    Tensor out = full({B * T + 1}, static_cast<double>(B * T), DType::i64, device);
    out.narrow(0, 0, n).copy_(cu.to(DType::i64));
    return out;
  };
  std::unique_ptr<optim::LayerMonitor> layers =
      make_layer_monitor(opt.layer_metrics_every, store, optimizer, graphed != nullptr);
  auto measures_layers = [&](int64_t w) { return layers && w % opt.layer_metrics_every == 0; };
  auto micro_step = [&] {
    Batch b = train_data.next();
    if (graphed && b.cu_seqlens.defined()) {
      graphed->backward({b.inputs, b.targets, padded_offsets(b.cu_seqlens), b.positions});
    } else if (graphed) {
      graphed->backward({b.inputs, b.targets});
    } else {
      window.backward(model->loss(b.inputs, b.targets, layout_of(b)));
    }
  };
  auto run_window = [&] {
    run_one_window(window, graphed.get(), layers.get(),
                   measures_layers(window.windows_closed() + 1), opt.accum, micro_step);
  };
  reset_peak_memory(device);
  const double flops_per_token = model->flops_per_token(T);
  const double peak = peak_flops(opt.peak_tflops, device, device_name(device));

  if (opt.bench) {  // timing mode: the host reads nothing back until the last window
    BenchTiming t;
    t.window_ms = time_windows(device, opt.bench_warmup, opt.bench_windows, run_window);
    const optim::WindowReport r = window.report();
    t.window_tokens = window_tokens;
    t.flops_per_token = flops_per_token;
    t.peak_flops = peak;
    t.world_size = ranks;
    t.final_loss = r.loss;
    JsonObject c;
    c.text("model", opt.model);
    model->describe_json(c);
    c.integer("parameters", model->parameter_count())
        .integer("micro_batch", B)
        .integer("seq_len", T)
        .integer("micro_steps", opt.accum)
        .integer("tokens_per_window", window_tokens)
        .text("dtype", dtype_name(opt.dtype))
        .text("documents", documents_name(opt))
        .boolean("activation_checkpointing", model->activation_checkpointing())
        .boolean("zero1", opt.zero1)
        .integer("warmup_windows", opt.bench_warmup)
        .integer("timed_windows", opt.bench_windows)
        .boolean("cuda_graphs", graphed != nullptr && where.gpu);
    if (graphed && where.gpu) {
      c.integer("graph_memory_bytes", graph_memory(device.index).reserved_high_bytes);
    } else {
      c.null("graph_memory_bytes");
    }
    JsonObject line = bench_summary(kProgram, device, t);
    line.object("store_memory_bytes", memory_json(store.memory())).object("config", c);
    std::printf("%s\n", line.str().c_str());
    std::fflush(stdout);
    guard.finish(r);
    return 0;
  }

  optim::MetricsLog metrics;
  if (!opt.metrics.empty() && where.main_rank()) {
    if (!opt.resume.empty()) truncate_metrics_log(opt.metrics, start);
    metrics = optim::MetricsLog(opt.metrics, !opt.resume.empty());
  }
  const int64_t end = opt.stop_after.value_or(opt.windows);
  optim::WindowReport last;
  double first_loss = NAN;
  WindowReporter reporter(opt.windows, window_tokens, opt.dtype, device, flops_per_token, peak,
                          ranks);
  for (int64_t w = start + 1; w <= end; ++w) {
    run_window();
    const optim::WindowReport r = window.report();  // the window's one host synchronization
    if (w == start + 1) first_loss = r.loss;
    last = r;
    reporter.print(w, r, optimizer.config_at(r.window - 1).groups[0].lr);
    double val = NAN;
    if (val_data && ((opt.val_every > 0 && w % opt.val_every == 0) || w == end)) {
      val_data->reset();
      model->set_training(false);  // no dropout
      val = validation_loss(
          [&] {
            const Batch b = val_data->next();
            return model->loss(b.inputs, b.targets, layout_of(b));
          },
          opt.val_batches, dp.comm.get(), device);
      model->set_training(true);
      std::printf("window %lld/%lld | val loss %.4f\n", (long long)w, (long long)opt.windows, val);
    }
    std::vector<std::pair<std::string, double>> extras = reporter.extras(val);
    if (measures_layers(r.window))
      add_layer_extras(*layers, r, optimizer.slot_groups(store), &extras);
    metrics.write(r, extras);
    guard.after_window(r);
    if (!opt.checkpoint.empty() && opt.checkpoint_every > 0 && w % opt.checkpoint_every == 0 &&
        w < end && std::isfinite(r.loss))
      save("window " + std::to_string(w));
    std::fflush(stdout);
  }
  if (end <= start) {
    std::printf("nothing to do: the run is already at window %lld\n", (long long)start);
    return 0;
  }
  std::printf("loss %.4f -> %.4f over windows %lld..%lld\n", first_loss, last.loss,
              (long long)start + 1, (long long)end);
  std::printf("final: window %lld loss %.17g\n", (long long)end, last.loss);
  std::fflush(stdout);
  guard.finish(last, {}, end == opt.windows);
  if (!opt.checkpoint.empty()) save("window " + std::to_string(end));
  if (opt.stop_micro_steps > 0) {  // preempted inside the next window
    for (int64_t k = window.micro_step(); k < opt.stop_micro_steps; ++k)
      micro_step();
    save("window " + std::to_string(end + 1) + ", micro-step " +
         std::to_string(window.micro_step()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
