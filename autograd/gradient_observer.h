// A hook on every gradient the backward engine passes between ops.
//
// Note [Gradient observer]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// While a GradientObserverScope is alive on a thread, the engine hands the
// observer each node's incoming gradient (the sum over its consumers, Note
// [Leaf gradient] aside: leaves are not observed) right before the node's
// backward runs: every activation gradient of the graph, once. The observer
// must not change the tensor and must not synchronize the host (it runs
// inside a window, Note [Deferred index checks]); it may launch kernels on
// the current stream. One observer per thread; scopes nest and restore the
// one before. Used by the loss scale's calibration (Note [Scale calibration]).
#pragma once

#include "accrue/core/tensor.h"

namespace accrue::autograd {

class GradientObserver {
 public:
  virtual ~GradientObserver() = default;
  virtual void observe(const Tensor& grad) = 0;
};

// The observer of this thread's backward passes, or null.
GradientObserver* current_gradient_observer();

class GradientObserverScope {
 public:
  explicit GradientObserverScope(GradientObserver* observer);
  ~GradientObserverScope();
  GradientObserverScope(const GradientObserverScope&) = delete;
  GradientObserverScope& operator=(const GradientObserverScope&) = delete;

 private:
  GradientObserver* previous_;
};

}  // namespace accrue::autograd
