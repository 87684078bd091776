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
#pragma once

#include <functional>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace accrue {

using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
// generator: the stream fn's dropout draws from (nullptr: default_generator()).
Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                  Generator* generator = nullptr);

}  // namespace accrue
