// Autograd's view of a tensor: requires_grad, its gradient, its grad_fn, and
// the hook that fires when a leaf's gradient for a backward is final.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/node.h"
#include "accrue/core/tensor.h"

namespace accrue {

struct Fp8Weight;
struct Fp8DelayedRows;  // autograd/fp8_ops.h

// Receives a leaf's gradient instead of the default `.grad` storage. The
// gradient arena implements it (Note [Overwrite first]); set per parameter.
class GradSink {
 public:
  virtual ~GradSink() = default;
  // Called once per backward with the leaf's summed gradient of that backward
  // (the part that was not written directly through claim()).
  virtual void accumulate(const Tensor& leaf, const Tensor& grad) = 0;
  // For fused kernels that write a gradient straight into its destination: returns
  // the destination (shaped like the leaf) and sets *beta to 0 (write) or 1 (add).
  // The kernel then returns autograd::delivered() for that input (see Note
  // [Delivered gradients]). Undefined means: no direct destination, return a tensor.
  virtual Tensor claim(const Tensor& leaf, double* beta) {
    (void)leaf;
    (void)beta;
    return Tensor();
  }
  // After this backward's last write for the leaf (through accumulate or a
  // claim) was issued, before its grad-ready hooks: Note [Ordered writes].
  virtual void finished(const Tensor& leaf) { (void)leaf; }
  // The beta claim() would give now, without claiming; negative when claim has no slot.
  virtual double next_beta(const Tensor& leaf) const {
    (void)leaf;
    return -1.0;
  }
  // Where the leaf's gradient goes, for errors: "the gradient arena 'model',
  // as its 'fc.weight'" (Note [One owner]).
  virtual std::string describe(const Tensor& leaf) const {
    (void)leaf;
    return "a gradient sink";
  }
};

// Holds a parameter's authoritative value when the tensor the model computes
// with is not it: optim::ParamStore keeps fp32 master weights behind a
// bf16/f16 compute copy. Set per parameter; every loader writes through it
// (Note [One load path] in optim/param_store.h).
class ParameterOwner {
 public:
  virtual ~ParameterOwner() = default;
  // Makes `value` (cast as needed) the parameter's value in every copy the owner keeps.
  virtual void load(const Tensor& param, const Tensor& value) = 0;
  // The parameter's authoritative value, shaped like it (a view, not a copy).
  virtual Tensor value(const Tensor& param) const = 0;
  // The parameter's FP8 copy that the owner keeps current (Note [Window FP8
  // weights] in optim/fp8_weights.h), or nullptr.
  virtual const Fp8Weight* fp8_copy(const Tensor& param) const {
    (void)param;
    return nullptr;
  }
  // The delayed-scaling rows of the layer whose weight is `param` (Note [FP8
  // delayed scaling] in kernels/fp8.h; optim/fp8_scaling.h), or nullptr.
  virtual const Fp8DelayedRows* fp8_scaling(const Tensor& param) const {
    (void)param;
    return nullptr;
  }
};

// A parameter and its dotted name, as nn::Module::named_parameters() lists
// them and the gradient arena and optim::ParamStore take them.
struct NamedParameter {
  std::string name;
  Tensor tensor;
};

using GradReadyHook = std::function<void(const Tensor& leaf)>;

struct AutogradMeta {
  bool requires_grad = false;  // set on leaves by the user; implied for op results
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<autograd::AccumulateGrad> accumulator;  // leaves only
  std::vector<GradReadyHook> grad_ready_hooks;
  GradSink* sink = nullptr;
  ParameterOwner* owner = nullptr;
};

// Marks a leaf as needing a gradient. Returns t for chaining.
Tensor requires_grad_(const Tensor& t, bool enable = true);
// The accumulated gradient of a leaf (undefined until a backward reaches it).
Tensor grad(const Tensor& t);
void set_grad(const Tensor& t, const Tensor& grad);
// Forgets the gradient: the next backward writes instead of adding. Refused
// for a leaf a gradient arena holds (Note [One owner]).
void clear_grad(const Tensor& t);
bool is_leaf(const Tensor& t);
std::shared_ptr<autograd::Node> grad_fn(const Tensor& t);
// The same data, cut from the graph.
Tensor detach(const Tensor& t);
// Fires after the gradient of leaf `t` for the current backward has landed
// (in .grad or in its sink): nothing later in that backward touches it.
void register_grad_ready_hook(const Tensor& t, GradReadyHook hook);
// Routes the leaf's gradients into `sink` (nullptr restores .grad storage).
void set_grad_sink(const Tensor& t, GradSink* sink);
// Hands the parameter's value to `owner` (nullptr: the tensor holds it itself).
void set_parameter_owner(const Tensor& t, ParameterOwner* owner);
// Sets a parameter's value: through its owner when it has one (the master
// weights, then the compute copy), else a copy into the tensor. No graph.
void load_parameter(const Tensor& param, const Tensor& value);
// The parameter's authoritative value: its owner's (the master weights), else the tensor.
Tensor parameter_value(const Tensor& param);

namespace autograd {
// Note [Delivered gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A backward formula that wrote an input's gradient directly into the sink's
// claimed slot returns this sentinel for that input. The engine then sums
// nothing for it, but still runs the leaf's accumulator so that the rest of
// the gradient (if other uses produced tensors) lands and the grad-ready hooks fire.
const Tensor& delivered();
bool is_delivered(const Tensor& t);
// The sink of a leaf, or nullptr.
GradSink* sink_of(const Tensor& t);
// The meta of t, created if absent.
AutogradMeta& meta_of(const Tensor& t);
// The meta of t or nullptr.
AutogradMeta* find_meta(const Tensor& t);
}  // namespace autograd

}  // namespace accrue
