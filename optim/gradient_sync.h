// The interface through which the Window talks to data parallelism. optim
// defines it and dist implements it (optim never includes dist).
#pragma once

#include "core/tensor.h"

namespace accrue::optim {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Before the backward of micro-step `index` (0-based) of a window of
  // `micro_steps`. Note [Buckets]: only the last one communicates.
  virtual void before_backward(int64_t index, int64_t micro_steps) = 0;
  // At close, before the norm pass: the gradient arena must be reduced and
  // `items` (a 0-d f64 device tensor, this rank's N) summed over ranks, both
  // ordered before the current stream's next work. No host synchronization.
  virtual void finish(const Tensor& items) = 0;
  // Ranks whose gradients the reduction sums (the legacy mean-of-means mode divides by K x this).
  virtual int64_t world_size() const { return 1; }
};

}  // namespace accrue::optim
