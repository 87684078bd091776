// Gradients through the indexing ops (autograd/indexing_ops.h) computed on the
// GPU equal the CPU reference's: one composite function of every
// differentiable op, its backward seeded with the same random gradient.
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

struct Inputs {
  Tensor x, w, idx, gidx, sidx;
};

// x [6, 8], w [10, 3] -> [2, 10, 2] through chunk, cat, repeat_interleave,
// index_select, gather, scatter_add, index_add, cumsum, topk, sort and stack.
Tensor composite(const Inputs& in) {
  const std::vector<Tensor> parts = chunk(in.x, 2, 1);                        // 2 x [6, 4]
  const Tensor joined = cat({parts[1], parts[0]}, 0);                         // [12, 4]
  const Tensor repeated = repeat_interleave(joined, 2, 1);                    // [12, 8]
  const Tensor rows = index_select(repeated, 0, in.idx);                      // [10, 8]
  const Tensor picked = gather(rows, 1, in.gidx);                             // [10, 3]
  const Tensor scattered = scatter_add(picked, 1, in.sidx, in.w);             // [10, 3]
  const Tensor added = index_add(scattered, 0, in.idx, mul(in.w, 0.5), 2.0);  // [10, 3]
  const Tensor running = cumsum(added, 1);                                    // [10, 3]
  const Tensor top = topk(running, 2, 1).values;                              // [10, 2]
  const Tensor sorted = sort(top, 0, true).values;                            // [10, 2]
  return stack({top, sorted}, 0);                                             // [2, 10, 2]
}

TEST(GpuIndexingAutograd, gradients_match_the_cpu) {
  const Device gpu = Device::cuda(0);
  Inputs cpu_in;
  cpu_in.idx = test::random_integers({10}, 0, 9, DType::i64);  // rows of `rows`, repeated
  cpu_in.gidx = test::random_integers({10, 3}, 0, 7, DType::i64);
  cpu_in.sidx = test::random_integers({10, 3}, 0, 2, DType::i64);
  const Tensor x64 = test::random_normal({6, 8}, DType::f64);
  const Tensor w64 = test::random_normal({10, 3}, DType::f64);
  const Tensor seed = test::random_normal({2, 10, 2}, DType::f64);
  cpu_in.x = requires_grad_(x64.clone());
  cpu_in.w = requires_grad_(w64.clone());
  backward(composite(cpu_in), seed);
  ASSERT_TRUE(grad(cpu_in.x).defined() && grad(cpu_in.w).defined());
  ACCRUE_REQUIRE_CUDA();  // the CPU half runs everywhere
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Inputs g;
    g.idx = cpu_in.idx.to(gpu);
    g.gidx = cpu_in.gidx.to(gpu);
    g.sidx = cpu_in.sidx.to(gpu);
    g.x = requires_grad_(x64.to(dt).to(gpu));
    g.w = requires_grad_(w64.to(dt).to(gpu));
    backward(composite(g), seed.to(dt).to(gpu));
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_LT(test::relative_error(grad(g.x), grad(cpu_in.x)), tol);
    EXPECT_LT(test::relative_error(grad(g.w), grad(cpu_in.w)), tol);
  }
}

}  // namespace
}  // namespace accrue
