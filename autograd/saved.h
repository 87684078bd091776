// Helpers shared by the backward formulas in autograd/ops_*.cpp.
#pragma once

#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/tensor.h"

namespace accrue::autograd {

// Note [Saved tensors are detached]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A backward closure keeps data, never autograd identity: saving an op's own
// output with its meta would make a cycle (output -> grad_fn -> closure ->
// output) and leak the graph.
inline Tensor saved(const Tensor& t) {
  return t.defined() ? detach(t) : Tensor();
}

// Whether input t needs its gradient computed (checked inside backward closures).
inline bool wants_grad(const Tensor& t) {
  return t.defined() && t.requires_grad();
}

}  // namespace accrue::autograd
