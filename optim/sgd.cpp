#include "accrue/optim/sgd.h"

#include <cmath>

#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"

namespace accrue::optim {

PlainSGD::PlainSGD(std::vector<Tensor> params, double lr) : params_(std::move(params)) {
  set_lr(lr);
  for (const Tensor& p : params_)
    ACCRUE_CHECK(p.defined() && p.requires_grad(), "PlainSGD: every parameter must require grad");
}

void PlainSGD::set_lr(double lr) {
  ACCRUE_CHECK(std::isfinite(lr) && lr >= 0, "PlainSGD: invalid learning rate ", lr);
  lr_ = lr;
}

void PlainSGD::step() {
  NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    Tensor g = grad(p);
    if (!g.defined()) continue;
    kernels::axpy_(p, -lr_, g);
    clear_grad(p);
  }
}

}  // namespace accrue::optim
