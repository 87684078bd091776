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
#pragma once

#include <string>

#include "accrue.h"
#include "examples/gpt2/gpt2_data.h"
#include "accrue/nn/gpt2.h"

namespace accrue::examples {

// What a checkpoint saves and restores.
struct TrainState {
  optim::ParamStore& arena;
  optim::Window& window;
  nn::GPT2& model;
  BatchSource& source;
  std::string dtype;  // the compute dtype's name
  int world_size = 1;
  int64_t micro_batch = 0;  // recorded for the reader, not checked
};

void save_checkpoint(const std::string& path, const TrainState& s);

// Restores what save_checkpoint wrote; returns the windows closed.
int64_t load_checkpoint(const std::string& path, const TrainState& s);

// load_checkpoint, and a line saying where the run resumes and how long it took.
int64_t resume_checkpoint(const std::string& path, const TrainState& s);

// save_checkpoint on rank 0 (Note [Trainer checkpoint]), and a line naming
// the point of the run (`at`: "window 12"), the file's size and the time taken.
void save_checkpoint_reported(const std::string& path, const TrainState& s, bool main_rank,
                              const std::string& at);

}  // namespace accrue::examples
