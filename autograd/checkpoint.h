// Activation checkpointing: keep a function's inputs, recompute its forward
// in backward.
//
// Note [Activation checkpointing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// checkpoint(fn, inputs) runs fn under NoGradGuard (nothing saved), records
// one node whose backward re-runs fn with grad on (over detached copies of
// the inputs that require grad, the generator's state rewound to
// what it was at forward so dropout draws the same masks) and runs a nested
// backward from fn's output seeded with the incoming gradient. Parameters
// inside fn receive their gradients in that nested backward through their
// sinks (the arena), exactly as without checkpointing; the recomputed forward
// is the same kernels on the same inputs, so the gradients are bitwise equal.
//
// Whatever fn reads that a differentiable computation produced must be one of
// the inputs: fn may capture leaves (parameters), but a captured non-leaf
// would lead the nested backward into the outer graph. With grad mode on the
// outputs always carry the checkpoint's node, because which captured leaves
// require grad is only known when fn runs with grad; a recompute that reaches
// none returns no gradients. With grad mode off checkpoint is just fn(inputs).
#pragma once

#include <functional>
#include <vector>

#include "accrue/core/random.h"
#include "accrue/core/tensor.h"

namespace accrue {

using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
// generator: the stream fn's dropout draws from (nullptr: default_generator());
// backward rewinds it to recompute, so it must outlive the graph.
Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                  Generator* generator = nullptr);

// The same for a function of several outputs (a pre-LN transformer block
// hands on both the residual stream and its normalized copy): one recompute
// serves the gradients of all of them (Note [Checkpoint outputs] in
// autograd/checkpoint.cpp). Outputs of integer dtypes carry no gradient.
using CheckpointMultiFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;
std::vector<Tensor> checkpoint_multi(const CheckpointMultiFn& fn, const std::vector<Tensor>& inputs,
                                     Generator* generator = nullptr);

}  // namespace accrue
