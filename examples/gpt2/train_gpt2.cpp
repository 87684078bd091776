// The GPT-2 trainer: llm.c-format token shards (or synthetic tokens) through
// nn::GPT2, K micro-batches per optimizer step in one accumulation Window,
// AdamW with GPT-2's decay groups and a warmup + cosine schedule, bf16/f16
// compute copies, checkpoints that resume bit-exactly, and data parallelism
// under torchrun/mpirun. `accrue_train_gpt2 --help` lists every option.
//
//   python3 tools/make_shards.py README.md --output-prefix /tmp/readme
//   accrue_train_gpt2 --model tiny --train-data '/tmp/readme_train_*.bin'
//                     --val-data '/tmp/readme_val_*.bin' --micro-batch 4 --seq-len 32
//   accrue_train_gpt2 --model d12 --synthetic --bench      # one JSON line of timings
//
// Data parallel, one process per GPU, as the demo (examples/demo/train_mlp.cpp):
//   torchrun --nproc-per-node=2 --no-python build/ci/examples/accrue_train_gpt2 ...
//   mpirun -np 2 build/ci/examples/accrue_train_gpt2 ...
// Each rank reads its own disjoint tokens of every step (Note [Loader
// positions] in data/token_shards.h); the reducer all-reduces the gradient
// buckets during the last micro-step's backward.
//
// Note [Trainer synchronization]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Tokens are read and validated against the vocabulary on the host (so
// kernels::set_check_indices(false) drops the device-side index checks, which
// inside the Window would be deferred, Note [Deferred index checks], but still
// cost two launches per call), and the Window keeps the loss, the item count, the
// norm and the loss scale on the device. The host reads them once per
// window, through window.report() after close(); --bench does not even do
// that until its last window (CUDA events time each window). One wait is
// left: with --train-data each micro-batch's tokens are copied from pageable
// host memory, and that copy waits for the stream to drain (core/copy.cpp)
// before the host may reuse the buffer, so the host cannot run ahead of the
// GPU by more than one micro-step. --synthetic draws its tokens on the device
// and its windows never wait. Validation and checkpoints happen between
// windows and may synchronize.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "core/nvtx.h"
#include "data/token_shards.h"
#include "dist/bucket_plan.h"
#include "dist/launch_env.h"
#include "dist/mpi_bootstrap.h"
#include "dist/reducer.h"
#include "examples/composed_gpt2/composed_gpt2.h"
#include "nn/gpt2.h"
#include "nn/gpt2_hf.h"
#ifdef ACCRUE_WITH_NCCL
#include "dist/nccl_communicator.h"
#endif
#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/status_check.h"
#endif

using namespace accrue;

namespace {

constexpr const char* kProgram = "accrue_train_gpt2";

// A bad command line: one line on stderr and exit code 2 (every other error: 1).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void usage_error(const Args&... args) {
  throw UsageError(detail::str_cat(args...));
}

constexpr const char* kHelp = R"(usage: accrue_train_gpt2 [options]

Trains GPT-2 on llm.c-format token shards (tools/make_shards.py writes them) or
on synthetic tokens. One optimizer step per window of K micro-batches, with
K = total-batch-tokens / (micro-batch * seq-len * world size).

model
  --model NAME                 d12 | d24 | d36 | d48 | tiny (default d12; tiny: 2 layers,
                               4 heads, width 64, vocab 256 bytes, block 64)
  --n-layer N, --n-head N, --n-embd N, --vocab-size N, --block-size N
                               override the preset's sizes
  --dropout P                  dropout probability in [0, 1) (default 0)
  --activation-checkpointing   recompute each block's forward in backward
  --composed                   run the model written from the public primitives only
                               (examples/composed_gpt2: attention as matmul, mask and
                               softmax, materialized logits; no fused op), same weights
  --init-from FILE             start from Hugging Face GPT-2 safetensors weights
data
  --train-data GLOB            training shards (quote the pattern)
  --val-data GLOB              validation shards
  --synthetic                  random tokens from the seed instead of --train-data
  --micro-batch B              sequences per micro-batch (default 4)
  --seq-len T                  tokens per sequence (default: the block size)
  --total-batch-tokens N       tokens per optimizer step over all ranks (default B*T*ranks)
optimization
  --windows N                  optimizer steps (windows) in all (default 50)
  --stop-after N               end after window N, as if preempted (the schedule still
                               spans --windows; resume with --resume)
  --stop-micro-steps M         with --stop-after N and --checkpoint: run M more micro-steps
                               (0 < M < K) into window N+1, save there and end; the resumed
                               run finishes that window bit-exactly (one process only)
  --lr LR                      peak learning rate (default 6e-4)
  --warmup-windows N           linear warmup windows (default 0)
  --min-lr-factor F            cosine decay ends at F * lr (default 0.1)
  --weight-decay W             AdamW decay of the Linear weights (default 0.1; never
                               biases, LayerNorms, wte, wpe)
  --beta1 B1, --beta2 B2       AdamW betas (default 0.9, 0.95)
  --eps E                      AdamW epsilon (default 1e-8)
  --max-grad-norm N            global gradient-norm clipping; 0 turns it off (default 1.0)
  --norm-under-backward        compute the norm rows under the last backward instead of
                               in one pass at the close (measured slower; same bits)
  --gemm-tuning FILE           time cuBLASLt's candidates and cublasGemmEx for each GEMM
                               shape on first use and keep the fastest, recorded in FILE;
                               a run with the same FILE reads the choices back and
                               computes the same bits
  --cuda-graphs                replay the micro-steps and the close from CUDA graphs
                               (same bits; dropout and, under data parallelism, the last
                               micro-step and the close stay eager, with a warning)
  --dtype f32|bf16|f16         compute dtype over fp32 master weights; f16 adds dynamic
                               loss scaling (default bf16 on a GPU, f32 on the CPU)
  --init-scale S               f16: the dynamic loss scale's start (default 65536 / (B * T)
                               rounded down to a power of two, see Note [Normalization])
  --calibrate-scale            f16: run the first window at scale 1 and start the dynamic
                               scale from its largest gradient (Note [Scale calibration];
                               --init-scale is then not used)
  --seed S                     initialization, dropout and synthetic data (default 1337)
evaluation and checkpoints
  --val-every N                validation loss every N windows (default 0: at the end only)
  --val-batches N              micro-batches per validation (default 20)
  --nvtx                       NVTX ranges for Nsight Systems: each window, micro-step
                               backward, close and bucket collective (ACCRUE_NVTX=1 too)
  --metrics FILE               one JSON line per window (loss, grad norm before and after
                               clipping, lr, loss scale, skips, tokens/s, MFU, peak memory,
                               validation loss, z-scores); appended to on --resume;
                               tools/plot_metrics.py plots it. The progress line shows
                               an ALERT when the loss or grad norm is 3 standard
                               deviations off the last 128 windows
  --layer-metrics-every N      every N windows, add each layer's and parameter group's
                               gradient norm and update-to-weight ratio to the --metrics
                               line (Note [Layer monitor]; a copy of the weights in those
                               windows)
  --noise-scale-every N        every N windows, estimate the gradient noise scale
                               B_simple from the first micro-batch's gradient and the
                               window's (McCandlish et al. 2018; needs K >= 2), shown in
                               the progress line and the --metrics file
  --checkpoint PATH            write a checkpoint (safetensors) at the end
  --checkpoint-every N         ... and every N windows
  --resume PATH                continue a checkpoint's run (bit-exactly)
benchmark
  --bench                      timing mode: warmup windows, then timed windows; prints
                               one JSON line (tokens/s, window ms, peak memory, MFU)
  --bench-warmup N             untimed windows first (default 3)
  --bench-windows N            timed windows (default 10)
  --peak-tflops F              the device's peak for MFU (default: bf16 dense peak of
                               H100/H200 SXM, 989)
device
  --cpu                        run on the CPU even when a GPU is present
  -h, --help                   this text
)";

struct Options {
  std::string model = "d12";
  std::optional<int64_t> n_layer, n_head, n_embd, vocab_size, block_size;
  double dropout = 0.0;
  bool activation_checkpointing = false;
  bool composed = false;
  std::string init_from;
  std::string train_data, val_data;
  bool synthetic = false;
  int64_t micro_batch = 4;
  std::optional<int64_t> seq_len, total_batch_tokens;
  int64_t windows = 50;
  std::optional<int64_t> stop_after;
  int64_t stop_micro_steps = 0;
  double lr = 6e-4;
  int64_t warmup_windows = 0;
  double min_lr_factor = 0.1;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double max_grad_norm = 1.0;
  bool norm_under_backward = false;
  bool cuda_graphs = false;
  std::string gemm_tuning;
  std::string dtype;  // empty: bf16 on a GPU, f32 on the CPU
  std::optional<double> init_scale;
  bool calibrate_scale = false;
  uint64_t seed = 1337;
  int64_t val_every = 0, val_batches = 20;
  std::string metrics;
  int64_t layer_metrics_every = 0;
  int64_t noise_scale_every = 0;
  bool nvtx = false;
  std::string checkpoint, resume;
  int64_t checkpoint_every = 0;
  bool bench = false;
  int64_t bench_warmup = 3, bench_windows = 10;
  std::optional<double> peak_tflops;
  bool force_cpu = false;
  bool help = false;
};

int64_t parse_int(const std::string& option, const std::string& text, int64_t min) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty())
    usage_error(option, " expects an integer, got '", text, "'");
  if (v < min) usage_error(option, " must be >= ", min, ", got ", v);
  return v;
}

// A finite number in [lo, hi] (hi_open: [lo, hi)).
double parse_double(const std::string& option, const std::string& text, double lo, double hi,
                    bool hi_open = false) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
    usage_error(option, " expects a number, got '", text, "'");
  if (v < lo || v > hi || (hi_open && v == hi))
    usage_error(option, " must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", text);
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a, " needs a value");
      return argv[++i];
    };
    auto positive = [&]() { return parse_int(a, value(), 1); };
    auto non_negative = [&]() { return parse_int(a, value(), 0); };
    if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (a == "--model") {
      o.model = value();
      if (o.model != "tiny" && o.model != "d12" && o.model != "d24" && o.model != "d36" &&
          o.model != "d48")
        usage_error("--model must be d12, d24, d36, d48 or tiny, got '", o.model, "'");
    } else if (a == "--n-layer") {
      o.n_layer = positive();
    } else if (a == "--n-head") {
      o.n_head = positive();
    } else if (a == "--n-embd") {
      o.n_embd = positive();
    } else if (a == "--vocab-size") {
      o.vocab_size = positive();
    } else if (a == "--block-size") {
      o.block_size = positive();
    } else if (a == "--dropout") {
      o.dropout = parse_double(a, value(), 0.0, 1.0, /*hi_open=*/true);
    } else if (a == "--activation-checkpointing") {
      o.activation_checkpointing = true;
    } else if (a == "--init-from") {
      o.init_from = value();
    } else if (a == "--train-data") {
      o.train_data = value();
    } else if (a == "--val-data") {
      o.val_data = value();
    } else if (a == "--synthetic") {
      o.synthetic = true;
    } else if (a == "--micro-batch") {
      o.micro_batch = positive();
    } else if (a == "--seq-len") {
      o.seq_len = positive();
    } else if (a == "--total-batch-tokens") {
      o.total_batch_tokens = positive();
    } else if (a == "--windows") {
      o.windows = positive();
    } else if (a == "--stop-after") {
      o.stop_after = positive();
    } else if (a == "--stop-micro-steps") {
      o.stop_micro_steps = positive();
    } else if (a == "--lr") {
      o.lr = parse_double(a, value(), 0.0, kInf);
      if (o.lr == 0.0) usage_error("--lr must be > 0, got 0");
    } else if (a == "--warmup-windows") {
      o.warmup_windows = non_negative();
    } else if (a == "--min-lr-factor") {
      o.min_lr_factor = parse_double(a, value(), 0.0, 1.0);
    } else if (a == "--weight-decay") {
      o.weight_decay = parse_double(a, value(), 0.0, kInf);
    } else if (a == "--beta1") {
      o.beta1 = parse_double(a, value(), 0.0, 1.0, /*hi_open=*/true);
    } else if (a == "--beta2") {
      o.beta2 = parse_double(a, value(), 0.0, 1.0, /*hi_open=*/true);
    } else if (a == "--eps") {
      o.eps = parse_double(a, value(), 0.0, kInf);
      if (o.eps == 0.0) usage_error("--eps must be > 0, got 0");
    } else if (a == "--max-grad-norm") {
      o.max_grad_norm = parse_double(a, value(), 0.0, kInf);
    } else if (a == "--norm-under-backward") {
      o.norm_under_backward = true;
    } else if (a == "--cuda-graphs") {
      o.cuda_graphs = true;
    } else if (a == "--composed") {
      o.composed = true;
    } else if (a == "--gemm-tuning") {
      o.gemm_tuning = value();
      if (o.gemm_tuning.empty()) usage_error("--gemm-tuning needs a file name");
    } else if (a == "--dtype") {
      o.dtype = value();
      if (o.dtype != "f32" && o.dtype != "bf16" && o.dtype != "f16")
        usage_error("--dtype must be f32, bf16 or f16, got '", o.dtype, "'");
    } else if (a == "--calibrate-scale") {
      o.calibrate_scale = true;
    } else if (a == "--init-scale") {
      o.init_scale = parse_double(a, value(), 0.0, kInf);
      if (*o.init_scale < 1.0) usage_error("--init-scale must be >= 1, got ", *o.init_scale);
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(non_negative());
    } else if (a == "--val-every") {
      o.val_every = non_negative();
    } else if (a == "--metrics") {
      o.metrics = value();
    } else if (a == "--layer-metrics-every") {
      o.layer_metrics_every = positive();
    } else if (a == "--noise-scale-every") {
      o.noise_scale_every = positive();
    } else if (a == "--nvtx") {
      o.nvtx = true;
    } else if (a == "--val-batches") {
      o.val_batches = positive();
    } else if (a == "--checkpoint") {
      o.checkpoint = value();
    } else if (a == "--checkpoint-every") {
      o.checkpoint_every = non_negative();
    } else if (a == "--resume") {
      o.resume = value();
    } else if (a == "--bench") {
      o.bench = true;
    } else if (a == "--bench-warmup") {
      o.bench_warmup = non_negative();
    } else if (a == "--bench-windows") {
      o.bench_windows = positive();
    } else if (a == "--peak-tflops") {
      o.peak_tflops = parse_double(a, value(), 0.0, kInf);
      if (*o.peak_tflops == 0.0) usage_error("--peak-tflops must be > 0, got 0");
    } else if (a == "--cpu") {
      o.force_cpu = true;
    } else {
      usage_error("unknown option '", a, "'");
    }
  }
  if (o.help) return o;
  if (o.synthetic == !o.train_data.empty())
    usage_error(o.synthetic ? "--synthetic and --train-data exclude each other"
                            : "needs --train-data GLOB or --synthetic");
  if (o.checkpoint_every > 0 && o.checkpoint.empty())
    usage_error("--checkpoint-every needs --checkpoint PATH");
  if (o.layer_metrics_every > 0 && o.metrics.empty())
    usage_error("--layer-metrics-every needs --metrics FILE");
  if (o.composed && (o.dropout > 0.0 || o.activation_checkpointing))
    usage_error("--composed has no dropout and no activation checkpointing");
  if (o.bench && (!o.checkpoint.empty() || !o.resume.empty()))
    usage_error("--bench takes no --checkpoint or --resume");
  if (o.bench) o.windows = o.bench_warmup + o.bench_windows;
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
  return o;
}

// The preset and the size overrides; a configuration GPT-2 cannot have is a usage error.
nn::GPT2Config make_config(const Options& o, uint64_t dropout_seed) {
  nn::GPT2Config c;
  if (o.model == "tiny") {
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.vocab_size = 256;
    c.block_size = 64;
  } else {
    c = nn::GPT2Config::from_name(o.model);
  }
  if (o.n_layer) c.n_layer = *o.n_layer;
  if (o.n_head) c.n_head = *o.n_head;
  if (o.n_embd) c.n_embd = *o.n_embd;
  if (o.vocab_size) c.vocab_size = *o.vocab_size;
  if (o.block_size) c.block_size = *o.block_size;
  c.padded_vocab_size = 0;  // the default padding of whatever vocab_size is now
  c.dropout = o.dropout;
  c.activation_checkpointing = o.activation_checkpointing;
  c.dropout_seed = dropout_seed;
  try {
    c.validate();
  } catch (const Error& e) {
    // The message without accrue's " (file:line)" suffix: the user needs only the values.
    std::string message = e.what();
    const size_t at = message.rfind(" (");
    if (at != std::string::npos && message.back() == ')') message.resize(at);
    usage_error(message);
  }
  if (c.vocab_size > 65536)
    usage_error("--vocab-size ", c.vocab_size, " does not fit the shards' uint16 tokens");
  return c;
}

// Model FLOPs per token of one training step (forward + backward), the
// standard estimate (Kaplan et al.; PaLM appendix B; nanoGPT's estimate_mfu):
//   6 N + 12 L T C,
// N the parameters every token's matmuls use: all of them except wpe (a
// lookup, no matmul) and wte's padded rows (never part of the softmax); wte
// stays in, as the tied output layer's weight. 6 N: 2 FLOPs per multiply-add
// forward, 4 backward. 12 L T C: attention's QK^T and AV over T keys
// (causal masking not discounted).
double flops_per_token(const nn::GPT2Config& c, int64_t T) {
  const int64_t N =
      c.parameter_count() - c.block_size * c.n_embd - (c.padded_vocab() - c.vocab_size) * c.n_embd;
  return 6.0 * static_cast<double>(N) + 12.0 * static_cast<double>(c.n_layer * T * c.n_embd);
}

std::string device_name(Device device) {
#ifdef ACCRUE_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
    return prop.name;
  }
#endif
  (void)device;
  return "CPU";
}

// Peak dense bf16 FLOP/s for MFU, or 0 when unknown (MFU is then "n/a").
double peak_flops(const Options& o, Device device, const std::string& name) {
  if (o.peak_tflops) return *o.peak_tflops * 1e12;
  if (!device.is_cuda()) return 0.0;
  // H100 SXM and H200 SXM: 989.4 TFLOP/s dense bf16; the PCIe and NVL cards are slower.
  const bool hopper =
      name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (hopper && name.find("PCIe") != std::string::npos) return 756e12;
  if (hopper && name.find("NVL") != std::string::npos) return 835e12;
  return hopper ? 989e12 : 0.0;
}

// Bytes in use on the device (all processes), or -1 on the CPU.
int64_t device_bytes_in_use(Device device) {
#ifdef ACCRUE_WITH_CUDA
  if (device.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    ACCRUE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(total_bytes - free_bytes);
  }
#endif
  (void)device;
  return -1;
}

// Where micro-batches come from: this rank's shard windows, or synthetic tokens.
class BatchSource {
 public:
  // Shards: `shards` must outlive the source.
  BatchSource(const data::TokenShards& shards, const data::LoaderOptions& options, Device device)
      : loader_(std::make_unique<data::DataLoader>(shards, options)), device_(device) {}
  // Synthetic: tokens uniform on [1, vocab) (never the all-zero batch), drawn on the device.
  BatchSource(int64_t B, int64_t T, int64_t vocab, uint64_t seed, Device device)
      : B_(B), T_(T), vocab_(vocab), gen_(seed), device_(device) {}

  std::pair<Tensor, Tensor> next() {
    if (loader_) {
      data::Batch b = loader_->next_batch();
      return {b.inputs.to(device_), b.targets.to(device_)};
    }
    const Tensor tokens = randint(1, vocab_, {B_, T_ + 1}, DType::i32, device_, &gen_);
    return {tokens.narrow(1, 0, T_).contiguous(), tokens.narrow(1, 1, T_).contiguous()};
  }
  data::DataLoader* loader() const { return loader_.get(); }
  Generator& generator() { return gen_; }

 private:
  std::unique_ptr<data::DataLoader> loader_;
  int64_t B_ = 0, T_ = 0, vocab_ = 0;
  Generator gen_{0};
  Device device_;
};

// Note [Trainer checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// One safetensors file holds everything a bit-exact resume needs:
//   model.<name>            each parameter's fp32 master weights, accrue names
//                           (nn/gpt2.h lists them), readable by any tool;
//   optim.<key>             Window::state_dict() but its flat master: the
//                           moment arenas, the window state (loss scale, its
//                           tracker, the optimizer step) and the window count;
// and in the metadata the model's sizes, the compute dtype and the world
// size (all checked on resume: a difference is refused, naming it), the
// windows closed, the loader position (Note [Loader positions]) and the
// dropout and synthetic-data generators' offsets. Saved inside a window
// (--stop-micro-steps), optim.* also holds the micro-step and the gradients
// so far (Note [Mid-window checkpoints] in optim/window.h); those are this
// rank's own, so only a one-process run saves there. The compute copy is not
// stored: it is the master cast to the compute dtype, which the Window
// re-derives on load.
// The LR schedule follows the window count, so it needs nothing of its own.
// Rank 0 writes it (every rank's master and moments are equal under plain data
// parallelism, and the loader position is the same step on every rank), to
// PATH.tmp first and then renamed, so a crash mid-write leaves the old file.
// v2 added the checked dtype and world size and mid-window checkpoints.
constexpr const char* kCheckpointFormat = "accrue_train_gpt2 checkpoint v2";

std::map<std::string, std::string> config_metadata(const nn::GPT2Config& c) {
  return {{"config.n_layer", std::to_string(c.n_layer)},
          {"config.n_head", std::to_string(c.n_head)},
          {"config.n_embd", std::to_string(c.n_embd)},
          {"config.block_size", std::to_string(c.block_size)},
          {"config.vocab_size", std::to_string(c.vocab_size)},
          {"config.padded_vocab_size", std::to_string(c.padded_vocab())},
          {"config.bias", c.bias ? "1" : "0"}};
}

struct TrainState {
  GradArena& arena;
  optim::Window& window;
  nn::GPT2& model;
  BatchSource& source;
  std::string dtype;  // the compute dtype's name
  int world_size = 1;
};

// "1424.6 MiB in 2.61 s": a checkpoint file's size and the seconds its save or load took.
std::string file_report(const std::string& path, std::chrono::steady_clock::time_point since) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  char s[64];
  std::snprintf(s, sizeof s, "%s in %.2f s", ec ? "?" : mib(static_cast<int64_t>(bytes)).c_str(),
                seconds);
  return s;
}

void save_checkpoint(const std::string& path, const TrainState& s, const Options& o) {
  ACCRUE_CHECK(s.window.micro_step() == 0 || s.world_size == 1,
               "a checkpoint inside a window holds this rank's own gradients; with ", s.world_size,
               " ranks save between windows");
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < s.arena.size(); ++i)
    tensors["model." + s.arena.slots()[i].name] = s.arena.master_view(i);
  for (const auto& [key, t] : s.window.state_dict())
    if (key != "master") tensors["optim." + key] = t;
  std::map<std::string, std::string> meta = config_metadata(s.model.config());
  meta["format"] = kCheckpointFormat;
  meta["dtype"] = s.dtype;
  meta["world_size"] = std::to_string(s.world_size);
  meta["windows_closed"] = std::to_string(s.window.windows_closed());
  meta["micro_step"] = std::to_string(s.window.micro_step());
  meta["dropout.offset"] = std::to_string(s.model.dropout_generator().offset());
  meta["synthetic.offset"] = std::to_string(s.source.generator().offset());
  if (const data::DataLoader* l = s.source.loader()) {
    meta["loader.shard"] = std::to_string(l->position().shard);
    meta["loader.offset"] = std::to_string(l->position().offset);
    meta["loader.epoch"] = std::to_string(l->position().epoch);
  }
  // For the reader: how the run was set up (not needed to resume).
  meta["micro_batch"] = std::to_string(o.micro_batch);
  const std::string tmp = path + ".tmp";
  save_safetensors(tmp, tensors, meta);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ACCRUE_CHECK(!ec, "cannot move the checkpoint ", tmp, " to ", path, ": ", ec.message());
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key,
                 const std::string& path) {
  auto it = meta.find(key);
  ACCRUE_CHECK(it != meta.end(), "checkpoint ", path, " has no '", key, "' in its metadata");
  int64_t v = 0;
  const std::string& s = it->second;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  ACCRUE_CHECK(ec == std::errc() && ptr == s.data() + s.size() && !s.empty(), "checkpoint ", path,
               ": metadata '", key, "' = '", s, "' is not an integer");
  return v;
}

// See Note [Trainer checkpoint]: this reads what save_checkpoint wrote. Returns the
// windows closed.
int64_t load_checkpoint(const std::string& path, const TrainState& s) {
  std::map<std::string, std::string> meta;
  const std::map<std::string, Tensor> tensors = load_safetensors(path, &meta);
  ACCRUE_CHECK(meta["format"] == kCheckpointFormat, path, " is not a trainer checkpoint (format '",
               meta["format"], "', expected '", kCheckpointFormat, "')");
  std::map<std::string, std::string> expected = config_metadata(s.model.config());
  expected["dtype"] = s.dtype;
  expected["world_size"] = std::to_string(s.world_size);
  for (const auto& [key, value] : expected)
    ACCRUE_CHECK(meta[key] == value, "checkpoint ", path, " has ", key, " = ", meta[key],
                 " but this run has ", value);
  // The flat master, rebuilt slot by slot (alignment padding stays 0, Note [Grad arena]).
  Tensor master = zeros({s.arena.padded_numel()}, s.arena.master().dtype());
  for (const GradArena::Slot& slot : s.arena.slots()) {
    auto it = tensors.find("model." + slot.name);
    ACCRUE_CHECK(it != tensors.end(), "checkpoint ", path, " has no 'model.", slot.name, "'");
    ACCRUE_CHECK(it->second.shape() == slot.shape, "checkpoint ", path, ": 'model.", slot.name,
                 "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(slot.shape));
    master.narrow(0, slot.offset, slot.numel).copy_(it->second.reshape({slot.numel}));
  }
  std::map<std::string, Tensor> state{{"master", master}};
  for (const auto& [key, t] : tensors)
    if (key.rfind("optim.", 0) == 0) state[key.substr(6)] = t;
  s.window.load_state_dict(state);
  Generator& dropout = s.model.dropout_generator();
  dropout.set_state(dropout.seed(), static_cast<uint64_t>(meta_int(meta, "dropout.offset", path)));
  Generator& synthetic = s.source.generator();
  synthetic.set_state(synthetic.seed(),
                      static_cast<uint64_t>(meta_int(meta, "synthetic.offset", path)));
  if (data::DataLoader* l = s.source.loader()) {
    ACCRUE_CHECK(meta.count("loader.shard"), "checkpoint ", path,
                 " was written by a run on synthetic data; resume it with --synthetic");
    l->set_position({meta_int(meta, "loader.shard", path), meta_int(meta, "loader.offset", path),
                     meta_int(meta, "loader.epoch", path)});
  }
  const int64_t windows = meta_int(meta, "windows_closed", path);
  ACCRUE_CHECK(windows == s.window.windows_closed(), "checkpoint ", path,
               ": metadata windows_closed ", windows, " disagrees with its window state (",
               s.window.windows_closed(), ")");
  return windows;
}

// The mean validation loss over `batches` micro-batches from the start of the
// validation shards, summed over every rank (dropout off, no graph).
double validation_loss(nn::GPT2& model, data::DataLoader& loader, int64_t batches,
                       dist::Communicator* comm, Device device) {
  NoGradGuard no_grad;
  model.eval();
  loader.reset();  // the same tokens every time, so the numbers compare
  double sum = 0.0, count = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    data::Batch b = loader.next_batch();
    const Loss loss = model.loss(b.inputs.to(device), b.targets.to(device));
    sum += loss.sum.item();
    count += loss.count.item();
  }
  model.train();
  if (comm != nullptr) {
    const Tensor totals = from_vector(std::vector<double>{sum, count}, {2}).to(device);
    Event produced;
    produced.record(current_stream(device.index));
    produced.block(comm->stream());  // Note [Collective ordering]
    comm->all_reduce(totals);
    comm->synchronize();
    const std::vector<double> v = totals.to_vector<double>();
    sum = v[0];
    count = v[1];
  }
  return sum / count;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  if (opt.help) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const dist::RankInfo rank = dist::discover_rank();
  const bool gpu = cuda_available() && !opt.force_cpu;
  ACCRUE_CHECK(!rank.distributed() || gpu, "data parallelism (", dist::describe(rank),
               ") needs a GPU per rank");
  const Device device = gpu ? Device::cuda(rank.local_rank) : Device::cpu();
  if (gpu) set_cuda_device(device.index);
  const bool main_rank = rank.rank == 0;
  // One rank reports; the others train silently.
  if (!main_rank && !std::freopen("/dev/null", "w", stdout))
    ACCRUE_FAIL("cannot silence rank ", rank.rank);

  // Each rank its own dropout masks and synthetic tokens; everything else from the seed.
  const nn::GPT2Config config = make_config(opt, opt.seed + 1 + rank.rank);
  const int64_t B = opt.micro_batch, T = opt.seq_len.value_or(config.block_size);
  if (T > config.block_size)
    usage_error("--seq-len ", T, " exceeds the block size ", config.block_size);
  const int64_t step_tokens = B * T * rank.world_size;  // one micro-step over all ranks
  const int64_t total_tokens = opt.total_batch_tokens.value_or(step_tokens);
  if (total_tokens % step_tokens != 0)
    usage_error("--total-batch-tokens ", total_tokens, " is not a multiple of micro-batch ", B,
                " x seq-len ", T, " x ", rank.world_size, " ranks = ", step_tokens);
  const int64_t K = total_tokens / step_tokens;
  if (opt.noise_scale_every > 0 && K < 2)
    usage_error("--noise-scale-every needs K >= 2 micro-batches per window, got K = ", K);
  // Note [Mid-window checkpoints]: a checkpoint inside a window holds this rank's own gradients.
  ACCRUE_CHECK(opt.stop_micro_steps == 0 || rank.world_size == 1,
               "--stop-micro-steps saves this rank's own gradients: run it on one process, not ",
               rank.world_size);
  ACCRUE_CHECK(opt.stop_micro_steps < K, "--stop-micro-steps ", opt.stop_micro_steps,
               " is not inside a window of K = ", K, " micro-steps");
  const std::string dtype_text = !opt.dtype.empty() ? opt.dtype : gpu ? "bf16" : "f32";
  const DType compute = dtype_text == "bf16"  ? DType::bf16
                        : dtype_text == "f16" ? DType::f16
                                              : DType::f32;
  if (opt.init_scale && compute != DType::f16)
    usage_error("--init-scale applies to --dtype f16 only, the compute dtype is ", dtype_text);
  if (opt.calibrate_scale && compute != DType::f16)
    usage_error("--calibrate-scale applies to --dtype f16 only, the compute dtype is ", dtype_text);

  // Data first: a bad shard fails before a large model is built.
  std::unique_ptr<data::TokenShards> train_shards, val_shards;
  const data::LoaderOptions loader_options = data::LoaderOptions()
                                                 .batch(B)
                                                 .seq_len(T)
                                                 .rank(rank.rank)
                                                 .world_size(rank.world_size)
                                                 .vocab_size(config.vocab_size);
  std::unique_ptr<BatchSource> source;
  if (opt.synthetic) {
    source =
        std::make_unique<BatchSource>(B, T, config.vocab_size, opt.seed + 1000 + rank.rank, device);
  } else {
    train_shards = std::make_unique<data::TokenShards>(opt.train_data);
    source = std::make_unique<BatchSource>(*train_shards, loader_options, device);
  }
  std::unique_ptr<data::DataLoader> val_loader;
  if (!opt.val_data.empty()) {
    val_shards = std::make_unique<data::TokenShards>(opt.val_data);
    val_loader = std::make_unique<data::DataLoader>(*val_shards, loader_options);
  }

  const std::string gpu_name = device_name(device);
  std::printf("accrue GPT-2 trainer on %s (%s)%s\n", device.str().c_str(), gpu_name.c_str(),
              gpu ? "" : (std::string(", ") + cuda_unavailable_reason()).c_str());
  std::printf(
      "model: %lld layers, %lld heads, width %lld, vocab %lld (padded %lld), block %lld, "
      "%lld parameters, dropout %g%s\n",
      (long long)config.n_layer, (long long)config.n_head, (long long)config.n_embd,
      (long long)config.vocab_size, (long long)config.padded_vocab(), (long long)config.block_size,
      (long long)config.parameter_count(), config.dropout,
      config.activation_checkpointing ? ", activation checkpointing" : "");
  std::printf("batch: micro-batch %lld x seq %lld x %d rank(s) x K=%lld = %lld tokens per window\n",
              (long long)B, (long long)T, rank.world_size, (long long)K,
              (long long)(K * step_tokens));
  std::printf("data: %s\n", opt.synthetic ? "synthetic tokens" : train_shards->describe().c_str());
  if (val_shards) std::printf("validation: %s\n", val_shards->describe().c_str());

  Generator init_gen(opt.seed);
  nn::GPT2 model(config, {device, DType::f32, &init_gen});
  if (!opt.init_from.empty()) {
    nn::load_hf_gpt2(model, opt.init_from);
    std::printf("initialized from %s\n", opt.init_from.c_str());
  }

  // AdamW; GPT-2 decays only the Linear weights (2-d, not the embeddings).
  optim::Optimizer optimizer(optim::AdamWOptions(opt.lr)
                                 .betas(opt.beta1, opt.beta2)
                                 .eps(opt.eps)
                                 .weight_decay(opt.weight_decay));
  std::vector<Tensor> params, no_decay;
  std::vector<std::string> names;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    params.push_back(p.tensor);
    names.push_back(p.name);
    if (p.tensor.dim() < 2 || p.name == "wte" || p.name == "wpe") no_decay.push_back(p.tensor);
  }
  optimizer.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optimizer.set_schedule(
      std::make_shared<optim::WarmupCosine>(opt.warmup_windows, opt.windows, opt.min_lr_factor));
  GradArena arena(params, names, {device, DType::f32, compute, optimizer.moments_needed()});

  // Data parallelism: a communicator and a reducer that the Window drives.
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::Reducer> reducer;
  if (rank.distributed()) {
#ifdef ACCRUE_WITH_NCCL
    comm = dist::connect_nccl(rank, dist::layout_fingerprint(arena));
    reducer = std::make_unique<dist::Reducer>(arena, *comm);
    reducer->broadcast_parameters();  // every rank starts from rank 0's weights
    std::printf("data parallel: %s, %zu buckets, NCCL id bootstrap: %s\n",
                dist::describe(rank).c_str(), reducer->plan().buckets().size(),
                dist::bootstrap_name(dist::bootstrap_method(rank)));
#else
    ACCRUE_FAIL("launched as ", dist::describe(rank), " but accrue was built without NCCL");
#endif
  }
  // f16: the Window seeds each micro-batch's summed loss with the scale (Note
  // [Normalization]), so every activation gradient is B * T times what a mean
  // loss gives at the same scale. GradScaler's 65536 for a mean loss is
  // therefore 65536 / (B * T) here (a power of two, at least 1).
  double init_scale = 65536.0;
  while (init_scale > 1.0 && init_scale * static_cast<double>(B * T) > 65536.0)
    init_scale /= 2;
  if (opt.init_scale) init_scale = *opt.init_scale;
  const optim::LossScalerOptions scaler = compute == DType::f16
                                              ? optim::LossScalerOptions::dynamic()
                                                    .init_scale(init_scale)
                                                    .calibrate(opt.calibrate_scale)
                                              : optim::LossScalerOptions::none();
  optim::Window window(arena, optimizer,
                       optim::WindowOptions()
                           .micro_steps(K)
                           .max_grad_norm(opt.max_grad_norm)
                           .scaler(scaler)
                           .norm_under_backward(opt.norm_under_backward)
                           .noise_scale(opt.noise_scale_every),
                       reducer.get());
  std::printf(
      "optimizer: AdamW lr %g (warmup %lld, cosine to %g x over %lld windows), betas "
      "(%g, %g), eps %g, weight decay %g, clip %g, compute %s%s\n",
      opt.lr, (long long)opt.warmup_windows, opt.min_lr_factor, (long long)opt.windows, opt.beta1,
      opt.beta2, opt.eps, opt.weight_decay, opt.max_grad_norm, dtype_name(compute),
      compute == DType::f16 ? " with dynamic loss scaling" : "");
  std::printf("memory per rank: %s\n", arena.memory().describe().c_str());

  const TrainState state{arena, window, model, *source, dtype_name(compute), rank.world_size};
  int64_t start = 0;
  if (!opt.resume.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    start = load_checkpoint(opt.resume, state);
    std::printf("resumed %s at window %lld", opt.resume.c_str(), (long long)start);
    if (window.micro_step() > 0)
      std::printf(", micro-step %lld of window %lld", (long long)window.micro_step(),
                  (long long)start + 1);
    std::printf(" (%s)\n", file_report(opt.resume, t0).c_str());
  }

  // --composed: the same weights through the public primitives only (no fused op).
  std::unique_ptr<examples::ComposedGPT2> composed;
  if (opt.composed) composed = std::make_unique<examples::ComposedGPT2>(model);
  auto loss_of = [&model, &composed](const Tensor& x, const Tensor& y) {
    return composed ? composed->loss(x, y) : model.loss(x, y);
  };

  if (!opt.gemm_tuning.empty())
    kernels::set_gemm_tuning_file(opt.gemm_tuning);  // Note [GEMM autotuning]
  // Note [Trainer synchronization]: the loader checked every token against the vocabulary.
  kernels::set_check_indices(false);
  reset_peak_memory(device);
  const int64_t tokens_per_window = K * step_tokens;
  const double flops_token = flops_per_token(config, T);
  const double peak = peak_flops(opt, device, gpu_name);
  auto mfu = [&](double tokens_per_s) {
    return peak > 0 ? tokens_per_s * flops_token / (peak * rank.world_size) : NAN;
  };
  if (opt.nvtx) set_nvtx(true);  // Note [NVTX ranges]
  // Note [Graphed window]: on a GPU with --cuda-graphs; the CPU would run it eagerly anyway.
  std::unique_ptr<optim::GraphedWindow> graphed;
  if (opt.cuda_graphs && gpu) {
    graphed = std::make_unique<optim::GraphedWindow>(
        window, [&loss_of](const std::vector<Tensor>& in) { return loss_of(in[0], in[1]); });
    std::printf("cuda graphs: micro-steps and close captured after one eager warm-up each\n");
  }
  // Note [Layer monitor]: measured in every --layer-metrics-every-th window.
  std::unique_ptr<optim::LayerMonitor> layers;
  if (opt.layer_metrics_every > 0) {
    // Note [Step sums]: from the close's own pass, unless the close is replayed
    // from a graph or steps ZeRO-1 ranges (then separate passes).
    layers = graphed || arena.moments_sharded()
                 ? std::make_unique<optim::LayerMonitor>(arena)
                 : std::make_unique<optim::LayerMonitor>(arena, optimizer);
  }
  auto measures_layers = [&](int64_t window_number) {
    return layers && window_number % opt.layer_metrics_every == 0;
  };
  auto run_window = [&]() {
    const NvtxRange range("accrue window");
    const bool measure = measures_layers(window.windows_closed() + 1);
    for (int64_t k = window.micro_step(); k < K; ++k) {  // a resumed window continues
      auto [x, y] = source->next();
      if (graphed) {
        graphed->backward({x, y});
      } else {
        window.backward(loss_of(x, y));
      }
    }
    if (measure) layers->before_close();
    if (graphed) {
      graphed->close();
    } else {
      window.close();
    }
    if (measure) layers->after_close();
  };

  if (opt.bench) {
    // Timing mode: warmup windows, then timed windows; no report until the end.
    std::vector<double> window_ms;
    if (gpu) {
      const StreamHandle stream = current_stream(device.index);
      for (int64_t w = 0; w < opt.bench_warmup; ++w)
        run_window();
      std::vector<std::unique_ptr<Event>> marks;
      for (int64_t w = 0; w <= opt.bench_windows; ++w)
        marks.push_back(std::make_unique<Event>(/*timing=*/true));
      marks[0]->record(stream);
      for (int64_t w = 1; w <= opt.bench_windows; ++w) {
        run_window();
        marks[w]->record(stream);
      }
      marks.back()->synchronize();
      for (int64_t w = 1; w <= opt.bench_windows; ++w)
        window_ms.push_back(marks[w - 1]->elapsed_ms(*marks[w]));
    } else {
      // The CPU backend runs synchronously: host time is the window's time.
      for (int64_t w = 0; w < opt.bench_warmup; ++w)
        run_window();
      for (int64_t w = 0; w < opt.bench_windows; ++w) {
        const auto t0 = std::chrono::steady_clock::now();
        run_window();
        window_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
    const optim::WindowReport r = window.report();
    const double ms = median(window_ms);
    const double tokens_per_s = tokens_per_window / (ms / 1000.0);
    std::printf(
        "{\"bench\": \"accrue_train_gpt2\", \"device\": \"%s\", \"world_size\": %d, "
        "\"tokens_per_s_median\": %s, \"window_ms_median\": %s, \"window_ms_min\": %s, "
        "\"peak_memory_bytes\": %lld, \"device_memory_in_use_bytes\": %s, \"mfu\": %s, "
        "\"flops_per_token\": %s, \"peak_flops\": %s, \"final_loss\": %s, "
        "\"config\": {\"model\": \"%s\", \"n_layer\": %lld, \"n_head\": %lld, \"n_embd\": %lld, "
        "\"vocab_size\": %lld, \"block_size\": %lld, \"parameters\": %lld, \"micro_batch\": %lld, "
        "\"seq_len\": %lld, \"micro_steps\": %lld, \"tokens_per_window\": %lld, \"dtype\": \"%s\", "
        "\"activation_checkpointing\": %s, \"dropout\": %g, \"warmup_windows\": %lld, "
        "\"timed_windows\": %lld, \"cuda_graphs\": %s, \"graph_memory_bytes\": %s, \"composed\": "
        "%s}}\n",
        gpu_name.c_str(), rank.world_size, json_number(tokens_per_s).c_str(),
        json_number(ms).c_str(),
        json_number(*std::min_element(window_ms.begin(), window_ms.end())).c_str(),
        (long long)memory_stats(device).peak_bytes,
        gpu ? std::to_string(device_bytes_in_use(device)).c_str() : "null",
        json_number(mfu(tokens_per_s)).c_str(), json_number(flops_token).c_str(),
        json_number(peak > 0 ? peak : NAN).c_str(), json_number(r.loss).c_str(), opt.model.c_str(),
        (long long)config.n_layer, (long long)config.n_head, (long long)config.n_embd,
        (long long)config.vocab_size, (long long)config.block_size,
        (long long)config.parameter_count(), (long long)B, (long long)T, (long long)K,
        (long long)tokens_per_window, dtype_name(compute),
        config.activation_checkpointing ? "true" : "false", config.dropout,
        (long long)opt.bench_warmup, (long long)opt.bench_windows, graphed ? "true" : "false",
        graphed ? std::to_string(graph_memory(device.index).reserved_high_bytes).c_str() : "null",
        composed ? "true" : "false");
    return std::isfinite(r.loss) ? 0 : 1;
  }

  const int64_t end = opt.stop_after.value_or(opt.windows);
  // --metrics (Note [Metrics log]): rank 0 writes, appending when the run resumes.
  optim::MetricsLog metrics;
  if (!opt.metrics.empty() && main_rank)
    metrics = optim::MetricsLog(opt.metrics, !opt.resume.empty());
  optim::ZScore loss_z_score, norm_z_score;  // the progress line's alerts
  double first_loss = NAN, last_loss = NAN;
  auto last_time = std::chrono::steady_clock::now();
  for (int64_t w = start + 1; w <= end; ++w) {
    run_window();
    const optim::WindowReport r = window.report();  // the window's one host synchronization
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_time).count();
    last_time = now;
    if (std::isnan(first_loss)) first_loss = r.loss;
    last_loss = r.loss;
    const double tokens_per_s = tokens_per_window / seconds;
    const double m = mfu(tokens_per_s);
    char mfu_text[16] = "n/a";
    if (!std::isnan(m)) std::snprintf(mfu_text, sizeof(mfu_text), "%.1f%%", 100 * m);
    const int64_t in_use = device_bytes_in_use(device);
    char scale_text[32] = "";
    if (compute == DType::f16)
      std::snprintf(scale_text, sizeof(scale_text), " | scale %g", r.loss_scale);
    // Alerts: a loss or gradient norm 3 standard deviations off the last 128 windows.
    const double loss_z = loss_z_score.add(r.loss), norm_z = norm_z_score.add(r.grad_norm);
    char noise_text[48] = "";
    if (r.noise_windows > 0)
      std::snprintf(noise_text, sizeof(noise_text), " | noise scale %.4g", r.noise_scale);
    char alert_text[64] = "";
    if (std::fabs(loss_z) >= 3.0 || std::fabs(norm_z) >= 3.0)
      std::snprintf(alert_text, sizeof(alert_text), " | ALERT z: loss %.1f, grad-norm %.1f", loss_z,
                    norm_z);
    std::printf(
        "window %lld/%lld | loss %.4f | grad-norm %.4f | lr %.3e | %.0f tok/s | MFU %s | "
        "peak %s%s | skipped %lld%s%s%s\n",
        (long long)w, (long long)opt.windows, r.loss, r.grad_norm,
        optimizer.config_at(r.window - 1).groups[0].lr, tokens_per_s, mfu_text,
        mib(memory_stats(device).peak_bytes).c_str(),
        in_use >= 0 ? (" (device " + mib(in_use) + " in use)").c_str() : "",
        (long long)r.skipped_windows, scale_text, noise_text, alert_text);
    double val = NAN;
    if (val_loader && ((opt.val_every > 0 && w % opt.val_every == 0) || w == end)) {
      val = validation_loss(model, *val_loader, opt.val_batches, comm.get(), device);
      std::printf("window %lld/%lld | val loss %.4f\n", (long long)w, (long long)opt.windows, val);
    }
    std::vector<std::pair<std::string, double>> extras = {
        {"lr", optimizer.config_at(r.window - 1).groups[0].lr},
        {"tokens_per_s", tokens_per_s},
        {"mfu", m},
        {"peak_bytes", static_cast<double>(memory_stats(device).peak_bytes)},
        {"val_loss", val},
        {"loss_z", loss_z},
        {"grad_norm_z", norm_z}};
    if (measures_layers(r.window)) {
      for (const optim::LayerReport& l : layers->read(r)) {
        extras.emplace_back("grad_norm/" + l.name, l.grad_norm);
        extras.emplace_back("update_ratio/" + l.name, l.update_ratio);
      }
      extras.emplace_back("update_ratio", layers->total_update_ratio());
      // Per parameter group: 0 decays (the Linear weights), 1 does not.
      for (const optim::GroupReport& g : layers->groups(optimizer.slot_groups(arena))) {
        extras.emplace_back("group_grad_norm/" + std::to_string(g.group), g.grad_norm);
        extras.emplace_back("group_update_ratio/" + std::to_string(g.group), g.update_ratio);
      }
    }
    metrics.write(r, extras);
    if (!opt.checkpoint.empty() &&
        ((opt.checkpoint_every > 0 && w % opt.checkpoint_every == 0) || w == end) && main_rank) {
      const auto t0 = std::chrono::steady_clock::now();
      save_checkpoint(opt.checkpoint, state, opt);
      std::printf("checkpoint: %s (window %lld; %s)\n", opt.checkpoint.c_str(), (long long)w,
                  file_report(opt.checkpoint, t0).c_str());
    }
    std::fflush(stdout);
  }
  if (opt.stop_micro_steps > 0) {  // preempted inside the next window
    for (int64_t k = window.micro_step(); k < opt.stop_micro_steps; ++k) {
      auto [x, y] = source->next();
      window.backward(loss_of(x, y));
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (main_rank) save_checkpoint(opt.checkpoint, state, opt);
    std::printf("checkpoint: %s (window %lld, micro-step %lld; %s)\n", opt.checkpoint.c_str(),
                (long long)end + 1, (long long)window.micro_step(),
                file_report(opt.checkpoint, t0).c_str());
  }
  if (std::isnan(last_loss)) {
    std::printf("nothing to do: the run is already at window %lld (--stop-after/--windows %lld)\n",
                (long long)start, (long long)end);
    return 0;
  }
  std::printf("loss %.4f -> %.4f over windows %lld..%lld\n", first_loss, last_loss,
              (long long)start + 1, (long long)end);
  // All digits: a resumed run must print exactly the uninterrupted run's line.
  std::printf("final: window %lld loss %.17g\n", (long long)end, last_loss);
  if (!std::isfinite(last_loss)) {
    std::fprintf(stderr, "%s: the loss is not finite\n", kProgram);
    return 1;
  }
  return 0;
} catch (const UsageError& e) {
  std::fprintf(stderr, "%s: error: %s (see --help)\n", kProgram, e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
  return 1;
}
