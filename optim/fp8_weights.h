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
// StoreMemory::fp8, unless they live in the compute copy's slots (below).
//
// Note [FP8 codes in the compute slots]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With a bf16 or f16 compute copy, an FP8-cast weight's compute slot is
// read by nothing but the recast: the layers read the copy. Its 2 bytes an
// element are exactly the codes' 1 + 1, so by default (ParamStoreOptions::
// fp8_codes_in_compute_slots) the store puts the codes and their transpose
// there: beyond bf16's memory the copies then cost only the staging buffer
// below, where apart they cost 2 bytes a weight element, which put FP8's
// peak over bf16's at small micro-batches (bench/RESULTS.md). Then:
//  - the parameter points at its master slot (the master dtype), so whoever
//    reads the weight reads its value, never codes; nn::Linear rounds it to
//    the input's dtype when it takes its bf16 path (rows the FP8 GEMMs do not
//    take);
//  - the copy is cast from the master slot, rounded first to the compute
//    dtype in a staging buffer the size of the largest such weight, with the
//    conversion the optimizer step uses for the compute copy. So the codes
//    are bit for bit those cast from a compute copy, and a skipped window's
//    recast, which follows a step that wrote nothing, casts the same weights
//    again;
//  - the optimizer step still writes the slot (its pass covers the whole
//    arena), and the recast, after it on the same stream, overwrites it.
// Not under ZeRO-1: the master is sharded there, so ParamStore::shard_master
// moves the codes to buffers of their own and points the parameters back at
// the compute copy, which the ranks' gather fills.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
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
  // Note [FP8 codes in the compute slots]: the same for the weight whose
  // master slot is `master`, with the codes and their transpose kept in the
  // bytes of `home`, its slot of a 16-bit compute copy (flat, as many
  // elements as the weight), and cast from `master` rounded to home's dtype.
  void add_in_slot(size_t slot, const std::string& name, const Tensor& master, const Tensor& home);
  // Whether slot's codes live in its compute slot.
  bool in_slot(size_t slot) const;
  bool any_in_slot() const;
  // Gives slot's copy codes of their own, cast from `param` from now on.
  void move_out_of_slot(size_t slot, const Tensor& param);
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
    Tensor param;      // what the codes are cast from: the weight, or its master slot
    Fp8Weight weight;  // q [N, K], q_t [K, N], scale_inv f32 [1] or per block
    Tensor amax;       // f32 [1]; a block copy's weight.amax too
    Tensor home;       // the compute slot holding q and q_t, or undefined
  };
  Copy make(size_t slot, const std::string& name, const Tensor& param) const;
  Copy* find_copy(size_t slot);
  void cast(Copy& c) const;

  DType dtype_;
  int margin_;
  Fp8Recipe recipe_;
  std::vector<Copy> copies_;
  std::unordered_map<size_t, size_t> index_;  // slot -> its copy in copies_
  size_t in_slot_ = 0;                        // copies whose codes live in their compute slot
  Tensor staging_;  // the compute dtype, as large as the largest copy in a slot
};

}  // namespace accrue::optim
