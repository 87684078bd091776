// Parameter gradients written straight into their gradient-arena slots: the
// destination captured at forward time, and the backward pieces of the ops
// that write it (defined in autograd/ops_nn.cpp, reused by the fused
// transformer ops of autograd/ops_fused.cpp). Private to autograd/.
//
// Note [Fused weight-gradient accumulation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter with a sink (the arena, Note [Grad arena]) gets its gradient
// without a temporary: backward claim()s the slot, which gives beta 0 on the
// window's first contribution and 1 on every later one (Note [Overwrite
// first]), and the kernel writes or adds in place. dW = g^T x is one GEMM
// whose output is the fp32 slot (bf16/f16 inputs, fp32 accumulation), the
// bias gradient a row sum into its slot, LayerNorm's dweight/dbias its column
// sums. The formula then returns autograd::delivered() for that input (Note
// [Delivered gradients]): no add kernel, no gradient buffer.
#pragma once

#include "accrue/autograd/node.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/tensor.h"

namespace accrue::autograd {

// A parameter's direct gradient destination (Note [Delivered gradients]),
// captured at forward time: the leaf and its sink, when it has one.
struct SinkTarget {
  Tensor leaf;
  GradSink* sink = nullptr;
  // The slot to write into (and its beta), marking it written; undefined when none.
  Tensor claim(double* beta) const { return sink ? sink->claim(leaf, beta) : Tensor(); }
  // Whether a slot exists and the beta a claim would give, without claiming.
  bool peek(double* beta) const {
    if (!sink) return false;
    *beta = sink->next_beta(leaf);
    return *beta >= 0.0;
  }
};

inline SinkTarget sink_target(const Tensor& t) {
  GradSink* sink = t.defined() ? sink_of(t) : nullptr;
  return sink ? SinkTarget{t, sink} : SinkTarget{};
}

// Linear's parameter gradients for g2 [N, out] and the saved input x2 [N, in]
// (Note [Fused weight-gradient accumulation]): dW = g2^T x2 and db = the row
// sum of g2, each into its slot (returning delivered()) or, without a slot,
// into a fresh tensor of the weight's dtype / g2's dtype that is returned.
Tensor linear_weight_grad(const Tensor& g2, const Tensor& x2, const Tensor& weight_like,
                          const SinkTarget& target);
Tensor linear_bias_grad(const Tensor& g2, const SinkTarget& target);
// Both of them for the targets given (null: that gradient is not wanted), into
// *dw and *db; on the weight-gradient branch when one is in force and both
// land in slots (Note [Weight gradients on a branch]), else inline.
void linear_param_grads(const Tensor& g2, const Tensor& x2, const Tensor& weight_like,
                        const SinkTarget* w_target, const SinkTarget* b_target, Tensor* dw,
                        Tensor* db);

// The gradient gathered so far for a norm's input x (Note [Fan-out sums in
// the backward] in autograd/engine.cpp), split by where it is added: into the
// backward kernel as dx_add when it has x's shape, dtype and device, else by
// an add after the kernel (added_to). Both undefined when nothing was gathered.
struct GatheredForInput {
  GatheredForInput(const Tensor& gathered, const Tensor& x);
  Tensor dx_add;  // for the kernel
  Tensor after;   // for added_to
  // dx with the gathered gradient the kernel did not add.
  Tensor added_to(const Tensor& dx) const;
};

// The backward of the LayerNorm node over saved input x (its affine
// parameters' gradients into their slots, both or neither): what
// accrue::layer_norm records, and what residual_layer_norm records for the
// normalized half. mean and rstd are the forward's statistics. It gathers x's
// gradient (input 0: Note [Fan-out sums in the backward] in autograd/engine.cpp).
GatheringBackwardFn layer_norm_backward_fn(const Tensor& x, const Tensor& weight,
                                           const Tensor& bias, const Tensor& mean,
                                           const Tensor& rstd);

}  // namespace accrue::autograd
