// accrue_train_gpt2's command line: its option table (`--help` prints it),
// the checks between options, and what follows from them before anything is
// built: the model configuration, the batch arithmetic and the compute dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/nn/gpt2.h"

#include "examples/common/trainer_options.h"
namespace accrue::examples {

struct Gpt2Options {
  std::string model = "d12";
  std::optional<int64_t> n_layer, n_head, n_embd, vocab_size, block_size;
  double dropout = 0.0;
  bool activation_checkpointing = false;
  bool composed = false;
  Fp8Choice fp8;  // --fp8, --fp8-recipe, --fp8-cast-every-micro-batch
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
  bool copy_engine_all_reduce = false;     // Note [Copy-engine all-reduce]
  bool copy_engine_whole_buckets = false;  // ... its Direct::whole form
  GradientSyncChoice grad_sync;  // --bucket-mb, --grad-transport, --gemm-sm-margin, --nccl-max-ctas
  CloseUnderForward close_under_forward;
  bool cuda_graphs = false;
  int64_t concurrent_micro_batches = 1;  // Note [Concurrent micro-batches]
  int64_t weight_grad_branch = 0;        // Note [Weight gradients on a branch]: the lag, 0 off
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
  std::string allow_changed;                 // --allow-changed as typed
  std::vector<std::string> allowed_changes;  // its words (Note [Run record])
  int64_t max_skipped_windows = 32;          // Note [Honest exit codes]
  bool bench = false;
  int64_t bench_warmup = 3, bench_windows = 10;
  std::optional<double> peak_tflops;
  bool force_cpu = false;
};

// Parses and cross-checks the command line (UsageError on a bad one); false
// after --help. With --bench, o.windows becomes warm-up plus timed windows.
bool parse_gpt2_options(int argc, char** argv, Gpt2Options& o);

// Refuses --checkpoint, --metrics and --gemm-tuning paths that could not be
// written (probe_output_file), before the run starts.
void probe_gpt2_outputs(const Gpt2Options& o);

// The preset and the size overrides; a configuration GPT-2 cannot have, or
// whose sizes overflow, is a usage error.
nn::GPT2Config make_gpt2_config(const Gpt2Options& o, uint64_t dropout_seed);

// One window's shape: B sequences of T tokens per micro-step on each of the
// ranks, K micro-steps.
struct BatchPlan {
  int64_t B = 0, T = 0, K = 0;
  int64_t step_tokens = 0;    // one micro-step over all ranks: B * T * ranks
  int64_t window_tokens = 0;  // K * step_tokens
};
BatchPlan plan_batch(const Gpt2Options& o, const nn::GPT2Config& config, int world_size);

// --dtype, or bf16 on a GPU and f32 on the CPU; the f16-only options refused otherwise.
DType compute_dtype(const Gpt2Options& o, bool gpu);

}  // namespace accrue::examples
