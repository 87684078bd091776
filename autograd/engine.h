// The backward engine.
#pragma once

#include "accrue/core/tensor.h"

namespace accrue {

// Computes gradients of `root` with respect to every leaf that requires grad
// and lands them through Note [Leaf gradient]. `seed` is d(objective)/d(root);
// it defaults to ones for a single-element root (a loss) and is required
// otherwise. Without retain_graph the saved tensors are freed as each node
// runs, and a second backward through the same graph throws.
void backward(const Tensor& root, const Tensor& seed = Tensor(), bool retain_graph = false);

namespace autograd {
// Note [Leaf gradient]: the one place where a backward's gradient for a leaf lands.
// `grad` may be undefined when every contribution was delivered directly
// (Note [Delivered gradients]); then only the hooks run.
void accumulate_leaf_grad(const Tensor& leaf, const Tensor& grad);
}  // namespace autograd

}  // namespace accrue
