// accrue_train_gpt2's checkpoints: save and bit-exact resume.
//
// Note [Trainer checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// One safetensors file holds everything a bit-exact resume needs:
//   model.<name>            each parameter's fp32 master weights, accrue names
//                           (nn/gpt2.h lists them), readable by any tool;
//   optim.<key>             Window::state_dict() but its flat master: the
//                           moment arenas, the window state (loss scale, its
//                           tracker, the optimizer step) and the window count;
// and in the metadata the run record (Note [Run record] in
// examples/common/checkpoint_file.h: model sizes, compute dtype, world size,
// K, micro-batch, sequence length, seed, dropout, data source, optimizer,
// scaler and schedule options, validation and metrics settings; resume
// refuses another run, naming each field), the windows closed, the skipped
// windows in a row (Note [Honest exit codes]), the loader position (Note
// [Loader positions]) and the dropout and synthetic-data generators'
// offsets. Saved inside a window
// (--stop-micro-steps), optim.* also holds the micro-step and the gradients
// so far (Note [Mid-window checkpoints] in optim/window.h); those are this
// rank's own, so only a one-process run saves there, and its K can never
// change on resume. The compute copy is not
// stored: it is the master cast to the compute dtype, which the Window
// re-derives on load.
// The LR schedule follows the window count, so it needs nothing of its own.
// Rank 0 writes it (every rank's master and moments are equal under plain data
// parallelism, and the loader position is the same step on every rank), to
// PATH.tmp first and then renamed, so a crash mid-write leaves the old file.
// v2 added the checked dtype and world size and mid-window checkpoints; v3
// the run record (a v2 checkpoint is checked on the fields it has).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/nn/gpt2.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/run_guard.h"
#include "examples/gpt2/gpt2_data.h"
#include "examples/gpt2/gpt2_options.h"

namespace accrue::examples {

// What a checkpoint saves and restores.
struct TrainState {
  optim::ParamStore& arena;
  optim::Window& window;
  nn::GPT2& model;
  BatchSource& source;
  int world_size = 1;
  const RunRecord& record;
  const RunGuard* guard = nullptr;  // its skips in a row are saved (Note [Honest exit codes])
};

// The run record of this command line (Note [Run record]).
RunRecord gpt2_run_record(const Gpt2Options& o, const nn::GPT2Config& config, const BatchPlan& plan,
                          DType compute, int world_size, const std::string& loss_scaler);

void save_checkpoint(const std::string& path, const TrainState& s);

// A checkpoint read whole, before the model is built.
struct CheckpointFile {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  int64_t windows_closed = 0, micro_step = 0, skipped_in_a_row = 0;
  std::chrono::steady_clock::duration read_time{};  // reported with the restore's
};

// Reads a trainer checkpoint and compares its run record with `record`
// (Note [Run record]): refuses another run, and prints the changes
// `allowed_changes` let through.
CheckpointFile read_checkpoint(const std::string& path, const RunRecord& record,
                               const std::vector<std::string>& allowed_changes);

// Restores what read_checkpoint read into the run, and prints where it
// resumes and how long it took; returns the windows closed.
int64_t resume_checkpoint(const CheckpointFile& file, const TrainState& s);

// save_checkpoint on rank 0 (Note [Trainer checkpoint]), and a line naming
// the point of the run (`at`: "window 12"), the file's size and the time taken.
void save_checkpoint_reported(const std::string& path, const TrainState& s, bool main_rank,
                              const std::string& at);

}  // namespace accrue::examples
