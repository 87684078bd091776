// Sums over data-parallel ranks inside a forward, for layers whose statistics
// must be global (nn::BatchNorm's sync mode, SyncBatchNorm), without autograd
// or nn knowing dist: dist::CommunicatorStatisticsSync adapts a communicator.
#pragma once

#include "accrue/core/tensor.h"

namespace accrue {

class StatisticsSync {
 public:
  virtual ~StatisticsSync() = default;
  // In place: `t` (contiguous) becomes the sum over ranks of every rank's `t`.
  // Every rank calls it, in the same order, with the same shape.
  virtual void all_reduce_sum(const Tensor& t) = 0;
  virtual int world_size() const = 0;
};

// Differentiable: the sum over ranks of x. Its backward sums the incoming
// gradient over ranks the same way, which is the gradient of the sum of every
// rank's loss: every rank must run its backward through it, in the same order.
Tensor all_reduce_sum(const Tensor& x, StatisticsSync& sync);

}  // namespace accrue
