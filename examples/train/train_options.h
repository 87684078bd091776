// accrue_train's command line: its option table (`--help` prints it), the
// checks between options, and the checks and the K that need the world size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"

#include "examples/common/trainer_options.h"
namespace accrue::examples {

// --synthetic-documents: random lengths packed into the rows, or each row one
// document of T tokens (plain causal attention, no offsets).
enum class SyntheticDocuments { random, full };

struct TrainOptions {
  std::string model = "llama-tiny", train_data, val_data, checkpoint, resume, metrics, gemm_tuning;
  std::string init_from, allow_changed;
  std::vector<std::string> allowed_changes;  // --allow-changed's words (Note [Run record])
  bool norm_under_backward = false;
  CloseUnderForward close_under_forward;
  double dropout = 0.0;
  bool composed = false;
  int64_t stop_micro_steps = 0;
  std::optional<int64_t> n_layer, n_head, n_embd, vocab_size, block_size;
  bool synthetic = false, cuda_graphs = false, force_cpu = false;
  int64_t concurrent_micro_batches = 1;  // Note [Concurrent micro-batches]
  int64_t weight_grad_branch = 0;        // Note [Weight gradients on a branch]: the lag, 0 off
  bool activation_checkpointing = false, zero1 = false, nvtx = false;
  GradientSyncChoice grad_sync;  // --bucket-mb, --grad-transport, --gemm-sm-margin, --nccl-max-ctas
  Fp8Choice fp8;                 // --fp8, --fp8-recipe, --fp8-cast-every-micro-batch
  SyntheticDocuments synthetic_documents = SyntheticDocuments::random;  // GPT-2: full
  bool contiguous_rows = false;  // Note [GPT-2 rows]: a Llama model reads rows too
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

// Parses and cross-checks the command line (UsageError on a bad one); false
// after --help. With --bench, o.windows becomes warm-up plus timed windows.
bool parse_train_options(const char* program, int argc, char** argv, TrainOptions& o);

// Refuses --checkpoint, --metrics and --gemm-tuning paths that could not be
// written (probe_output_file), before the run starts. Rank 0 writes them.
void probe_train_outputs(const TrainOptions& o);

// The checks that need the world size; --total-batch-tokens sets K.
void resolve_window(TrainOptions& o, int ranks);

// Where the tokens come from, as the bench line and the run record name it:
// "shards, contiguous rows" (GPT-2, --contiguous-rows), "shards, documents
// within rows" (a Llama model's shards), or the synthetic documents' "full"
// or "random".
const char* documents_name(const TrainOptions& o);

}  // namespace accrue::examples
