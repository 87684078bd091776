// fp8_linear on the GPU (cuBLASLt's FP8 GEMMs, Note [FP8 linear]) against
// the CPU reference. The casts are bitwise the same on both devices (Note
// [FP8 scaling]); the GEMMs sum the same products in another order (f32 on
// the tensor cores, exact in double on the CPU), so results agree to f32
// rounding of sums of |products|.
#include <array>
#include <functional>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

// An f32 output of an FP8 GEMM against the CPU's exactly summed one: a few
// times 2^-13, Hopper's FP8 accumulator precision (Note [FP8 GEMM]).
constexpr double kFp8GemmF32 = 5e-4;

// A fresh leaf on `d`: `t.to(d)` is `t` itself when it is already there, and
// requires_grad_ would then mark the shared input for the other device's run.
Tensor leaf(const Tensor& t, Device d) {
  return requires_grad_(t.to(d).clone());
}

// y = layer(x, w, b) forward and backward on the CPU and on the GPU: y, dx,
// dW and db (in that order) each within its tolerance of the CPU's.
void expect_layer_matches_cpu(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& layer, int64_t m,
    int64_t k, int64_t n, const std::array<double, 4>& tol) {
  const Tensor x0 = test::random_normal({m, k}, DType::bf16);
  const Tensor w0 = test::random_normal({n, k}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({n}, DType::f32);
  const Tensor r = test::random_normal({m, n}, DType::f32);
  auto run = [&](Device d) {
    Tensor x = leaf(x0, d), w = leaf(w0, d), b = leaf(b0, d);
    const Tensor y = layer(x, w, b);
    backward(sum(to_dtype(y, DType::f32) * r.to(d)));
    return std::vector<Tensor>{detach(y).to(Device::cpu()), grad(x).to(Device::cpu()),
                               grad(w).to(Device::cpu()), grad(b).to(Device::cpu())};
  };
  const std::vector<Tensor> cpu = run(Device::cpu()), gpu = run(kGpu);
  const char* names[] = {"y", "dx", "dW", "db"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i].dtype(), cpu[i].dtype()) << names[i];
    EXPECT_LT(test::relative_error(gpu[i], cpu[i]), tol[i]) << names[i];
  }
}

// bf16 outputs (y, dx) can differ by one rounding step of bf16. dW is an f32
// FP8 GEMM output: the CPU sums exact products in double, while Hopper's FP8
// tensor cores keep about 14 bits of a partial sum between cuBLASLt's
// promotions to f32 (Note [FP8 GEMM]), so the two differ by up to about
// 2^-13 of the sum (6.2e-5 measured on an H200). db is a plain f32 reduction.
TEST(GpuFp8Linear, output_and_gradients_match_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  expect_layer_matches_cpu([](const Tensor& x, const Tensor& w,
                              const Tensor& b) { return fp8_linear(x, w, fp8_weight(w), b); },
                           64, 96, 48, {1e-2, 1e-2, kFp8GemmF32, 1e-5});
}

// The output gradients in e4m3 (Fp8LinearOptions::grad_dtype, `--fp8-grad-dtype
// e4m3`): the data and weight gradients' GEMMs take two e4m3 operands, as the
// forward does; the same tolerances as e5m2's, in both recipes.
TEST(GpuFp8Linear, e4m3_gradients_match_the_cpu_in_both_recipes) {
  ACCRUE_REQUIRE_CUDA();
  for (Fp8Recipe recipe : {Fp8Recipe::tensor, Fp8Recipe::block}) {
    SCOPED_TRACE(recipe == Fp8Recipe::block ? "block" : "tensor");
    Fp8LinearOptions o;
    o.recipe = recipe;
    o.grad_dtype = DType::f8e4m3;
    expect_layer_matches_cpu(
        [&o](const Tensor& x, const Tensor& w, const Tensor& b) { return fp8_linear(x, w, b, o); },
        128, 256, 128, {1e-2, 1e-2, kFp8GemmF32, 1e-5});
  }
}

// Three micro-batches into the fp32 slots on the GPU (beta 0, then 1): the
// weight's slot as the CPU's, within the FP8 accumulator's rounding
// (kFp8GemmF32); the bias's, summed by the cast of dy (Note [FP8 bias
// gradient in the cast]), within f32 rounding, with M = 48 (a row tile of 64
// partly filled) and 80 (two row tiles, the second partly filled); M stays a
// multiple of 16, the FP8 GEMMs' rule.
TEST(GpuFp8Linear, micro_batches_accumulate_into_the_slot_as_on_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  constexpr int64_t K = 64, N = 32, kMicro = 3;
  for (int64_t M : {48, 80}) {
    const Tensor w0 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1);
    const Tensor b0 = test::random_normal({N}, DType::f32);
    std::vector<Tensor> xs, rs;
    for (int64_t k = 0; k < kMicro; ++k) {
      xs.push_back(test::random_normal({M, K}, DType::bf16));
      rs.push_back(test::random_normal({M, N}, DType::f32));
    }
    auto slots = [&](Device d) {
      Tensor w = leaf(w0, d), b = leaf(b0, d);
      optim::Optimizer opt(optim::SGDOptions(0.1));
      optim::ParamStore store(std::vector<Tensor>{w, b}, optim::ParamStoreOptions().moments(0));
      optim::Window window(store, opt, optim::WindowOptions().micro_steps(kMicro));
      const Fp8Weight w8 = fp8_weight(w);
      for (int64_t k = 0; k < kMicro; ++k) {
        const Tensor y = fp8_linear(xs[k].to(d), w, w8, b);
        window.backward(Loss{sum(to_dtype(y, DType::f32) * rs[k].to(d)),
                             full({}, static_cast<double>(M), DType::f64, d)});
      }
      return std::vector<Tensor>{store.grad_view(0).to(Device::cpu()),
                                 store.grad_view(1).to(Device::cpu())};
    };
    const std::vector<Tensor> gpu = slots(kGpu), cpu = slots(Device::cpu());
    EXPECT_LT(test::relative_error(gpu[0], cpu[0]), kFp8GemmF32) << "M = " << M;
    EXPECT_LT(test::relative_error(gpu[1], cpu[1]), 1e-5) << "M = " << M;
  }
}

// The block recipe (Note [FP8 block recipe]) on cuBLASLt's block-scaled
// GEMMs against the CPU's exact sums: the same casts on both devices, three
// GEMMs each (forward, dx, dW; the bf16 outputs to a rounding step), micro-
// batches summed into the fp32 slot. K = 384 and N = 256 span several
// 128-long slices and a weight of several 128 x 128 blocks.
TEST(GpuFp8Linear, block_recipe_matches_the_cpu_and_fills_the_slot) {
  ACCRUE_REQUIRE_CUDA();
  constexpr int64_t M = 128, K = 384, N = 256, kMicro = 2;
  Fp8LinearOptions o;
  o.recipe = Fp8Recipe::block;
  const Tensor w0 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.05);
  std::vector<Tensor> xs, rs;
  for (int64_t k = 0; k < kMicro; ++k) {
    xs.push_back(test::random_normal({M, K}, DType::bf16));
    rs.push_back(test::random_normal({M, N}, DType::f32));
  }
  auto run = [&](Device d) {
    Tensor x = leaf(xs[0], d), w = leaf(w0, d);
    const Tensor y = fp8_linear(x, w, Tensor(), o);
    backward(sum(to_dtype(y, DType::f32) * rs[0].to(d)));
    std::vector<Tensor> r{detach(y).to(Device::cpu()), grad(x).to(Device::cpu()),
                          grad(w).to(Device::cpu())};
    Tensor ws = leaf(w0, d);
    optim::Optimizer opt(optim::SGDOptions(0.1));
    optim::ParamStore store(std::vector<Tensor>{ws}, optim::ParamStoreOptions().moments(0));
    optim::Window window(store, opt, optim::WindowOptions().micro_steps(kMicro));
    for (int64_t k = 0; k < kMicro; ++k) {
      const Tensor yk = fp8_linear(xs[k].to(d), ws, Tensor(), o);
      window.backward(Loss{sum(to_dtype(yk, DType::f32) * rs[k].to(d)),
                           full({}, static_cast<double>(M), DType::f64, d)});
    }
    r.push_back(store.grad_view(0).to(Device::cpu()));
    return r;
  };
  const std::vector<Tensor> cpu = run(Device::cpu()), gpu = run(kGpu);
  const char* names[] = {"y", "dx", "dW", "slot"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i].dtype(), cpu[i].dtype()) << names[i];
    const double tol = cpu[i].dtype() == DType::bf16 ? 1e-2 : kFp8GemmF32;
    EXPECT_LT(test::relative_error(gpu[i], cpu[i]), tol) << names[i];
  }
}

// Note [FP8 shared input] under the block recipe on the GPU: two layers
// reading one cast of x give the bits of each casting it (the same kernels on
// the same device): outputs, the summed dx and each weight's gradient.
TEST(GpuFp8Linear, a_shared_block_input_gives_the_bits_of_casting_per_layer) {
  ACCRUE_REQUIRE_CUDA();
  constexpr int64_t M = 256, K = 384, N = 128;
  Fp8LinearOptions o;
  o.recipe = Fp8Recipe::block;
  const Tensor x0 = test::random_normal({M, K}, DType::bf16);
  const Tensor w0 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.05);
  const Tensor w1 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.05);
  auto run = [&](bool shared) {
    Tensor x = leaf(x0, kGpu), a = leaf(w0, kGpu), b = leaf(w1, kGpu);
    const Fp8Input x8 = fp8_input(x, o);
    const Tensor ya = shared ? fp8_linear(x, x8, a, Tensor(), o) : fp8_linear(x, a, Tensor(), o);
    const Tensor yb = shared ? fp8_linear(x, x8, b, Tensor(), o) : fp8_linear(x, b, Tensor(), o);
    backward(sum(to_dtype(ya, DType::f32)) + sum(to_dtype(yb, DType::f32) * 2.0));
    return std::vector<Tensor>{detach(ya), detach(yb), grad(x), grad(a), grad(b)};
  };
  const std::vector<Tensor> each = run(false), shared = run(true);
  for (size_t i = 0; i < each.size(); ++i)
    EXPECT_TRUE(test::all_equal(shared[i].to(Device::cpu()), each[i].to(Device::cpu())))
        << "result " << i;
}

// fp8_linear_gelu's one GEMM with the bias and GELU in cuBLASLt's epilogue
// (GELU of the f32 value) against the CPU's two ops (GELU of the rounded
// pre-activation). GELU's bf16 gradient follows the pre-activation's last
// bit, and dW and dx take it through the e5m2 cast, where one bf16 step can
// move a value across a rounding boundary of e5m2's 2-bit mantissa: dW is
// then off by whole e5m2 steps in a few elements (3.7e-3 measured on an
// H100), not by the accumulator's 2^-13. db sums that gradient: bf16's
// tolerance for all three.
TEST(GpuFp8Linear, linear_gelu_in_the_epilogue_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  expect_layer_matches_cpu(
      [](const Tensor& x, const Tensor& w, const Tensor& b) { return fp8_linear_gelu(x, w, b); },
      64, 96, 128, {1e-2, 1e-2, 1e-2, 1e-2});
}

}  // namespace
}  // namespace accrue
