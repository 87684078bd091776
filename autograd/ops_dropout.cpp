// Differentiable dropout: the mask is regenerated from (seed, offset) in
// backward, never saved (Note [Dropout mask from the counter], kernels/dropout.h).
#include "accrue/autograd/node.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/dropout.h"

namespace accrue {

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  // Written so that NaN fails too; checked even when nothing is dropped.
  ACCRUE_CHECK(p >= 0.0 && p < 1.0, "dropout: p = ", p, " is outside [0, 1)");
  ACCRUE_CHECK(x.defined(), "dropout: input is an undefined tensor");
  if (!training || p == 0.0) return x;
  // Note [Capturable code]: a replay would repeat this offset, and so the mask.
  refuse_in_graph(
      "dropout advances its Philox offset on the host, so a replay would repeat "
      "the mask");
  Generator& gen = generator ? *generator : default_generator();
  const uint64_t seed = gen.seed();
  // The counters this mask uses are reserved even if the kernel then throws on
  // a bad input: a later draw never reuses them either way.
  const uint64_t offset = gen.reserve(x.numel());
  Tensor out = kernels::dropout(x, p, seed, offset);
  return autograd::record("DropoutBackward", out, {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::dropout_backward(g, p, seed, offset)};
  });
}

}  // namespace accrue
