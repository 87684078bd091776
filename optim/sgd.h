// Plain stochastic gradient descent: p -= lr * grad. The accumulation Window
// and the fused optimizers build on the gradient arena (Note [Window close]
// in optim/window.h).
#pragma once

#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::optim {

class PlainSGD {
 public:
  PlainSGD(std::vector<Tensor> params, double lr);
  // Applies the step to every parameter that has a gradient, then clears the
  // gradients so that the next backward writes instead of adding.
  void step();
  double lr() const { return lr_; }
  void set_lr(double lr);

 private:
  std::vector<Tensor> params_;
  double lr_;
};

}  // namespace accrue::optim
