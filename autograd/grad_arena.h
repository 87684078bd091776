// GradArena: every trainable parameter's gradient in one flat, 256-byte-aligned
// arena, and the sink that routes each backward's gradients into it.
//
// Note [Grad arena]
// ~~~~~~~~~~~~~~~~~
// Parameters are registered in a fixed order, each a slot at a 256-byte
// aligned offset of one flat allocation in the gradient dtype (fp32; f64 for
// the CPU reference), padding kept at zero. Every leaf's gradient IS its slot.
// Flat arenas make every window-close operation one launch over one range,
// make buckets zero-copy slices, and make checkpoints one write per role.
// The optimizer's side of each parameter (master weights, compute copy,
// moments) is laid out over the same slots by optim::ParamStore (Note
// [Parameter store]); autograd keeps only what a backward needs: the slots,
// the gradients, the sink and which slots this window has written.
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

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "accrue/autograd/variable.h"
#include "accrue/core/tensor.h"
#include "accrue/core/write_order.h"

namespace accrue {

// Elements [offset, offset + numel) of a flat arena.
struct ArenaRange {
  int64_t offset = 0;
  int64_t numel = 0;
};

//   GradArena arena(model.named_parameters(),
//                   GradArenaOptions().device(Device::cuda(0)).name("model"));
class GradArenaOptions {
 public:
  GradArenaOptions& device(Device d) {
    device_ = d;
    return *this;
  }
  // The gradients' dtype: f32, or f64 for the CPU reference.
  GradArenaOptions& dtype(DType d) {
    dtype_ = d;
    return *this;
  }
  // Slots are padded to a multiple of shard_ranks x 256 bytes, so that ZeRO-1
  // over this many ranks cuts every bucket into equal chunks (Note [ZeRO-1]).
  GradArenaOptions& shard_ranks(int n) {
    shard_ranks_ = n;
    return *this;
  }
  // What errors call the arena (Note [One owner]); empty: unnamed.
  GradArenaOptions& name(std::string n) {
    name_ = std::move(n);
    return *this;
  }
  // On a GPU: the slots in an allocation of their own from cudaMalloc, which
  // another process can map by CUDA IPC (the stream-ordered pool's cannot),
  // so that the copy engines sum straight from the peer's arena (Note
  // [Copy-engine all-reduce]). Default false.
  GradArenaOptions& shareable(bool on) {
    shareable_ = on;
    return *this;
  }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  int shard_ranks() const { return shard_ranks_; }
  const std::string& name() const { return name_; }
  bool shareable() const { return shareable_; }

 private:
  Device device_ = Device::cpu();
  DType dtype_ = DType::f32;
  int shard_ranks_ = 1;
  std::string name_;
  bool shareable_ = false;
};

// Note [One owner]
// ~~~~~~~~~~~~~~~~
// A parameter's gradient goes to one place: the GradSink its meta names. A
// second arena over a parameter would silently take it over: the first
// arena's window would then read slots nobody writes (grad_norm 0) and never
// move its weights. So an arena refuses a parameter another sink holds,
// naming the parameter and the holder (its arena's name and the parameter's
// name there), before it changes anything; the holder's destructor lets the
// parameter go, after which another arena may take it. For the same reason
// gradcheck refuses an arena-held input: its gradient lands in the arena's
// slot by Note [Overwrite first] (written or added, by the window's flags),
// not in the .grad gradcheck reads.

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

  // Lays out a slot per parameter (leaves that require grad, any float dtype)
  // in the given order, named as given (nn::Module::named_parameters()), and
  // routes their gradients here. The parameters' values are not touched.
  GradArena(const std::vector<NamedParameter>& params, const GradArenaOptions& options = {});
  // The same for tensors without names: they are called "param0", "param1", ...
  GradArena(const std::vector<Tensor>& params, const GradArenaOptions& options = {});
  ~GradArena() override;
  GradArena(const GradArena&) = delete;
  GradArena& operator=(const GradArena&) = delete;

  const GradArenaOptions& options() const { return options_; }
  const std::vector<Slot>& slots() const { return slots_; }
  size_t size() const { return slots_.size(); }
  // Real elements and elements including alignment padding.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  // The flat gradients, [padded_numel].
  const Tensor& grads() const { return grads_; }
  // The parameters as registered.
  const std::vector<Tensor>& params() const { return params_; }

  // A slot of `flat` (a [padded_numel] tensor laid out like this arena), shaped
  // and laid out like the parameter.
  Tensor slot_view(const Tensor& flat, size_t i) const;
  Tensor grad_view(size_t i) const { return slot_view(grads_, i); }
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
  // GradSink: the leaf's writes of this backward are issued (Note [Ordered writes]).
  void finished(const Tensor& leaf) override;
  // The order of the slots' writes across streams, one key per slot (Note
  // [Ordered writes] in core/write_order.h): active while micro-batches run
  // on streams of their own (Note [Concurrent micro-batches] in
  // optim/graphed_window.h); inactive, nothing is waited for or recorded.
  WriteOrder& write_order() { return *order_; }
  double next_beta(const Tensor& leaf) const override;
  // GradSink: "the gradient arena 'name' (3 parameters), as its 'fc.weight'".
  std::string describe(const Tensor& leaf) const override;

 private:
  size_t slot_of(const Tensor& leaf, const char* op) const;

  GradArenaOptions options_;
  std::vector<Slot> slots_;
  std::vector<Tensor> params_;
  std::unordered_map<const TensorImpl*, size_t> index_;
  std::vector<bool> written_;
  int64_t numel_ = 0, padded_numel_ = 0;
  Tensor grads_;
  std::unique_ptr<WriteOrder> order_;
};

}  // namespace accrue
