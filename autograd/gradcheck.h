// Finite-difference gradient checking in float64 on the CPU.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue {

struct GradcheckOptions {
  double eps = 1e-6;  // central-difference step
  double atol = 1e-7;
  double rtol = 1e-5;
  uint64_t seed = 1;  // for the random projection of the output
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytic and numeric values
};

// Checks the gradients of f at `inputs` (f64 CPU tensors; those marked with
// requires_grad_ are checked). The output y is projected onto a fixed random
// vector v: the analytic gradient of <v, y> comes from one backward, the
// numeric one from central differences (f(x + eps e_i) - f(x - eps e_i)) / 2 eps
// for every element i of every checked input.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace accrue
