// The differentiable fused classifier: Note [Fused classifier] (kernels/classifier.h).
#include "accrue/autograd/node.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/sink_target.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/kernels/classifier.h"

namespace accrue {

using autograd::record;
using autograd::saved;
using autograd::wants_grad;

Loss classifier_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                              int64_t valid_classes, int64_t ignore_index) {
  const char* name = "classifier_cross_entropy";
  ACCRUE_CHECK(hidden.defined() && weight.defined() && targets.defined(), name,
               ": hidden, weight and targets must all be defined tensors");
  ACCRUE_CHECK(hidden.dim() >= 1, name, ": hidden must be [..., D], got a 0-d tensor");
  const Shape leading(hidden.shape().begin(), hidden.shape().end() - 1);
  ACCRUE_CHECK(targets.shape() == leading, name, ": targets of shape ", shape_str(targets.shape()),
               " do not match hidden of shape ", shape_str(hidden.shape()), " (expected ",
               shape_str(leading), ")");
  const int64_t n = shape_numel(leading), d = hidden.size(-1);
  // Raw views of the data (Note [Raw views]); the node below records the op itself.
  const Tensor h2 = detach(hidden).reshape({n, d});
  const Tensor w = detach(weight);
  kernels::ClassifierOutput r =
      kernels::classifier_forward(h2, w, detach(targets).reshape({n}), valid_classes, ignore_index);

  // The node owns dlogits (the only big saved tensor): it is freed with the
  // node's saved tensors after backward, or right here when nothing records.
  const Tensor dlogits = r.dlogits, sh = saved(h2), sw = saved(weight);
  const bool gh = wants_grad(hidden), gw = wants_grad(weight);
  const Shape h_shape = hidden.shape();
  const autograd::SinkTarget w_target = autograd::sink_target(weight);
  Tensor sum = record(
      "ClassifierCrossEntropyBackward", r.sum, {hidden, weight},
      [=](const Tensor& g) -> std::vector<Tensor> {
        // Note [Fused weight-gradient accumulation]: dW is one GEMM into the arena's slot,
        // beta 0 on the window's first contribution and 1 after; without a slot, a fresh tensor.
        // Note [Weight gradients on a branch]: beside dh when it goes into the slot.
        double beta = 0.0;
        bool in_slot = false;
        Tensor dw;
        if (gw) {
          in_slot = w_target.peek(&beta);
          autograd::write_slots_beside(in_slot, {dlogits, sh, g}, [&] {
            dw = in_slot ? w_target.claim(&beta) : empty(sw.shape(), sw.dtype(), sw.device());
            kernels::classifier_backward(dlogits, sh, sw, g, /*need_dh=*/false, dw, beta);
          });
        }
        Tensor dh;
        if (gh)
          dh = kernels::classifier_backward(dlogits, sh, sw, g, /*need_dh=*/true, Tensor(), 0.0);
        return {gh ? dh.reshape(h_shape) : Tensor(), in_slot ? autograd::delivered() : dw};
      });
  return {sum, r.count};
}

}  // namespace accrue
