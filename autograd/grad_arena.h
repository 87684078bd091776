// GradArena: every trainable parameter in flat, 256-byte-aligned arenas.
//
// Note [Grad arena]
// ~~~~~~~~~~~~~~~~~
// Parameters are registered in a fixed order. Each role — master weights,
// gradients, optimizer moments — is one flat allocation in the master dtype
// (fp32; f64 for the CPU reference), every parameter a slot at a 256-byte
// aligned offset, padding kept at zero. After registration each parameter's
// data IS its master slot (or, with a bf16/f16 compute dtype, a slot of the
// compute-copy arena that the GEMMs read and the optimizer writes), and its
// gradient is its gradient slot. Flat arenas make every window-close
// operation one launch over one range, make buckets zero-copy slices, and
// make checkpoints one write per role.
//
// Note [Parameter layouts]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A slot keeps the memory order of the parameter it was made from: row-major
// (contiguous), or channels-last for a 4-D parameter laid out N, H, W, C
// (nn::Module::to_channels_last, PyTorch's
// model.to(memory_format=torch.channels_last)). The master, gradient and
// compute-copy views of the slot all take that layout, so a channels-last
// convolution reads its weight without a copy and cuDNN writes its weight
// gradient straight into the slot. Everything that sees the arena flat (the
// norm pass, the optimizer, buckets, ZeRO-1 shards) is indifferent to the
// order. Two things are not, and both check it: the ranks of a data-parallel
// run, whose layout fingerprint holds each slot's strides
// (dist::layout_fingerprint), and the window checkpoint, which holds the flat
// master and refuses one saved with other layouts (Window::load_state_dict).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace accrue {

// Elements [offset, offset + numel) of a flat arena.
struct ArenaRange {
  int64_t offset = 0;
  int64_t numel = 0;
};

struct ArenaOptions {
  Device device = Device::cpu();
  // The dtype of master weights, gradients and moments: f32, or f64 for the CPU reference.
  DType master_dtype = DType::f32;
  // The dtype parameters compute in: master_dtype, or bf16/f16 for a compute copy.
  DType compute_dtype = DType::f32;
  // How many moment arenas to allocate (0 to 3: SGD momentum, Adam m and v, amsgrad's max).
  int moments = 2;
  // Slots are padded to a multiple of shard_ranks x 256 bytes, so that ZeRO-1
  // over this many ranks cuts every bucket into equal chunks (Note [ZeRO-1]).
  // 1 suffices for a world size that divides 256 bytes' worth of elements (a
  // power of two up to 64 for f32, 32 for f64); other world sizes set it to W.
  int shard_ranks = 1;
};

// Bytes an arena holds on its device, by role (the report of Note [ZeRO-1]).
struct ArenaMemory {
  int64_t master = 0, grads = 0, compute = 0, moments = 0;
  bool master_sharded = false, moments_sharded = false;
  int64_t total() const { return master + grads + compute + moments; }
  // "master 237.5 MiB (sharded), grads 475.0 MiB, compute 237.5 MiB, moments 475.0 MiB
  // (sharded), total 1.39 GiB"
  std::string describe() const;
};

class GradArena final : public GradSink {
 public:
  struct Slot {
    std::string name;
    Shape shape;
    int64_t offset = 0;  // in elements, a multiple of 256 bytes
    int64_t numel = 0;
    // The parameter's layout over the slot (Note [Parameter layouts]).
    Shape strides;
  };

  // Moves `params` (leaves that require grad, any float dtype and device) into
  // the arenas: their values are copied into the master arena, each tensor is
  // re-pointed at its slot (and converted to the compute dtype), and its
  // gradients are routed here. names may be empty.
  GradArena(const std::vector<Tensor>& params, const std::vector<std::string>& names,
            const ArenaOptions& options);
  ~GradArena() override;
  GradArena(const GradArena&) = delete;
  GradArena& operator=(const GradArena&) = delete;

  const ArenaOptions& options() const { return options_; }
  const std::vector<Slot>& slots() const { return slots_; }
  size_t size() const { return slots_.size(); }
  // Real elements and elements including alignment padding.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }

  // The flat arenas, each [padded_numel] (the moments [moment_numel()]).
  const Tensor& master() const { return master_; }
  const Tensor& grads() const { return grads_; }
  const Tensor& moment(int i) const;
  int64_t moment_numel() const { return moment_numel_; }
  // Note [ZeRO-1] (dist/reducer.h): this rank keeps optimizer moments only for
  // its shard, `numel` elements (its owned ranges packed in order). Replaces
  // every moment arena with a zeroed one of that size; before the first step.
  void shard_moments(int64_t numel);
  bool moments_sharded() const { return moment_numel_ != padded_numel_; }
  // Note [ZeRO-1]: with a compute copy (which the forward reads, so the
  // master is only the optimizer's), this rank keeps master weights only for
  // its owned ranges, packed in order as the moments are. Needs the compute
  // copy; afterwards master() is that packed shard and master_view() throws.
  void shard_master(const std::vector<ArenaRange>& owned);
  bool master_sharded() const { return master_sharded_; }
  ArenaMemory memory() const;
  // The compute copy, or undefined when the compute dtype is the master dtype.
  const Tensor& compute() const { return compute_; }
  // The parameters as registered (re-pointed into the arenas).
  const std::vector<Tensor>& params() const { return params_; }

  // Views of one slot, shaped and laid out like the parameter.
  Tensor master_view(size_t i) const;
  Tensor grad_view(size_t i) const;
  // Slot index of a registered parameter, or -1.
  int index_of(const Tensor& param) const;

  // Note [Overwrite first]
  // ~~~~~~~~~~~~~~~~~~~~~~
  // Gradients are never zeroed. Within a window the first contribution to a
  // slot writes it (GEMM beta 0, a plain store) and every later one adds
  // (beta 1); which slots have been written this window is host-side
  // bookkeeping. A parameter used twice in a graph (tied embeddings) simply
  // receives a write then an add. At close, slots that got nothing this
  // window are zeroed, so an unused parameter reads 0, never an old gradient.
  void begin_window();
  bool written(size_t i) const { return written_[i]; }
  // All the flags, and setting them back: a checkpoint taken inside a window
  // must resume with the same slots written (Note [Mid-window checkpoints] in
  // optim/window.h).
  const std::vector<bool>& written_flags() const { return written_; }
  void set_written_flags(const std::vector<bool>& flags);
  // Zeroes the slots no gradient reached this window; returns how many.
  int zero_unwritten();

  // GradSink: writes or adds one backward's gradient into the slot.
  void accumulate(const Tensor& leaf, const Tensor& grad) override;
  // GradSink: the slot a fused kernel writes into directly, and its beta.
  Tensor claim(const Tensor& leaf, double* beta) override;
  double next_beta(const Tensor& leaf) const override;

 private:
  size_t slot_of(const Tensor& leaf, const char* op) const;

  ArenaOptions options_;
  std::vector<Slot> slots_;
  std::vector<Tensor> params_;
  std::unordered_map<const TensorImpl*, size_t> index_;
  std::vector<bool> written_;
  int64_t numel_ = 0, padded_numel_ = 0, moment_numel_ = 0;
  bool master_sharded_ = false;
  Tensor master_, grads_, compute_;
  std::vector<Tensor> moments_;
};

}  // namespace accrue
