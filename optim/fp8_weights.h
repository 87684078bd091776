// The FP8 copies of a store's weights, kept up to date by the window's close.
//
// Note [Window FP8 weights]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Within a window the weights do not change, so the FP8 copy of a weight
// that fp8_linear reads (codes, transposed codes, scale_inv: Note [FP8
// linear] in autograd/fp8_ops.h) is the same for all K micro-batches. A
// ParamStore asked to keep FP8 copies (ParamStore::keep_fp8_copies) holds
// them in persistent buffers and casts them from the forward's weights (the
// compute copy, else the master), with per-tensor current scaling, or for
// the block recipe (Note [FP8 block recipe]) in 128 x 128 blocks, W and W^T
// each with its blocks' scales:
//  - when they are first kept, and whenever a loader writes the weight (Note
//    [One load path]), so a loaded or resumed model's copies are its
//    weights' own;
//  - at every window's close, as the stage "fp8 weights" after the optimizer
//    step (and after ZeRO-1's gather of the forward's weights; under
//    close_under_forward range by range after each range's step, Note
//    [Close under the forward] in optim/layer_steps.h), so the next
//    window's micro-batches read fresh copies without casting. Under CUDA
//    graphs the stage replays inside the close's graph into the same
//    buffers, which the micro-steps' graphs read.
// fp8_linear finds a weight's copy through its owner
// (ParameterOwner::fp8_copy) and otherwise casts the weight itself, once per
// call. With current scaling the copies' scales are a function of the
// weights: there is no amax history to checkpoint (a resume recasts them
// from the restored weights, bit for bit), and data-parallel ranks, whose
// weights are equal, hold equal copies. A skipped window (Note [Skipped
// window]) leaves the weights, and so the recast copies, as they were.
// The copies cost 2 bytes per weight element (codes and their transpose),
// and a block copy 8 bytes per 128 x 128 block (two scales), counted in
// StoreMemory::fp8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accrue/autograd/fp8_ops.h"
#include "accrue/core/tensor.h"

namespace accrue::optim {

class Fp8WeightCopies {
 public:
  // recipe: per tensor, or 128 x 128 blocks (margin 0: Note [FP8 block scaling]).
  Fp8WeightCopies(DType dtype, int margin, Fp8Recipe recipe = Fp8Recipe::tensor);

  // Keeps a copy of `param` (the store's slot `slot`, named `name` in
  // errors, a 2-D weight whose sizes are multiples of 16) and casts it now.
  void add(size_t slot, const std::string& name, const Tensor& param);
  // Recasts every copy from its weight's current values.
  void refresh();
  // Recasts the copy of `slot`, if it has one.
  void refresh_slot(size_t slot);
  // The copy of `slot`, or nullptr.
  const Fp8Weight* find(size_t slot) const;
  bool empty() const { return copies_.empty(); }
  size_t size() const { return copies_.size(); }
  DType dtype() const { return dtype_; }
  int margin() const { return margin_; }
  Fp8Recipe recipe() const { return recipe_; }
  int64_t bytes() const;

 private:
  struct Copy {
    size_t slot;
    Tensor param;
    Fp8Weight weight;  // q [N, K], q_t [K, N], scale_inv f32 [1] or per block
    Tensor amax;       // f32 [1]; a block copy's weight.amax too
  };
  void cast(Copy& c) const;

  DType dtype_;
  int margin_;
  Fp8Recipe recipe_;
  std::vector<Copy> copies_;
};

}  // namespace accrue::optim
