// fp8_linear (Note [FP8 linear]) on the CPU reference: the output and both
// gradients within the FP8 rounding model of the exact float64 products, the
// weight gradient landing in its fp32 arena slot as the GEMM writes it, K
// micro-batches against the big batch within the model's bound, and the
// refusals.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/fp8.h"
#include "accrue/kernels/ops.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// The rounding model of a current-scaled cast to `d` (Note [FP8 scaling]):
// |fp8(v) - v| <= u |v| + floor, u half the format's relative spacing, the
// floor half its smallest subnormal step, both in the tensor's own units
// (divided by the scale, fp8_max / amax).
struct CastError {
  double u, floor;
};
CastError cast_error(DType d, double amax) {
  const bool e4m3 = d == DType::f8e4m3;
  const double u = e4m3 ? std::ldexp(1.0, -4) : std::ldexp(1.0, -3);
  const double half_step = e4m3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
  return {u, half_step * amax / fp8_max(d)};
}

double amax(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

// out[i][j] = sum_k a[i][k] b[j][k] and its FP8 error bound: per product
// |a'b' - ab| <= (|a| (1 + ua) + fa)(ub |b| + fb) + |b| (ua |a| + fa), plus
// the f32 rounding of the sum.
void exact_and_bound(const std::vector<double>& a, const std::vector<double>& b, int64_t m,
                     int64_t n, int64_t k, CastError ea, CastError eb, std::vector<double>& exact,
                     std::vector<double>& bound) {
  exact.assign(static_cast<size_t>(m * n), 0.0);
  bound.assign(exact.size(), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, e = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = a[static_cast<size_t>(i * k + p)], y = b[static_cast<size_t>(j * k + p)];
        s += x * y;
        e += (std::fabs(x) * (1 + ea.u) + ea.floor) * (eb.u * std::fabs(y) + eb.floor) +
             std::fabs(y) * (ea.u * std::fabs(x) + ea.floor);
      }
      exact[static_cast<size_t>(i * n + j)] = s;
      bound[static_cast<size_t>(i * n + j)] = e + std::ldexp(std::fabs(s) + e, -24);
    }
}

std::vector<double> transposed(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> t(v.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      t[static_cast<size_t>(j * rows + i)] = v[static_cast<size_t>(i * cols + j)];
  return t;
}

// Every |got - exact| <= bound; returns the largest error / bound seen.
double worst_ratio(const Tensor& got, const std::vector<double>& exact,
                   const std::vector<double>& bound) {
  const std::vector<double> g = got.to(DType::f64).contiguous().to_vector<double>();
  EXPECT_EQ(g.size(), exact.size());
  double worst = 0;
  for (size_t i = 0; i < g.size() && i < exact.size(); ++i) {
    EXPECT_LE(std::fabs(g[i] - exact[i]), bound[i]) << "element " << i;
    worst = std::max(worst, std::fabs(g[i] - exact[i]) / bound[i]);
  }
  return worst;
}

Fp8LinearOptions f32_out() {
  Fp8LinearOptions o;
  o.out_dtype = DType::f32;
  return o;
}

// Both formats of the output gradient (Fp8LinearOptions::grad_dtype): e5m2,
// the default, and e4m3, whose dx and dW are held to its own tighter bound
// (u = 2^-4 against e5m2's 2^-3, cast_error above).
TEST(Fp8Linear, output_and_gradients_within_the_fp8_rounding_model) {
  constexpr int64_t M = 32, K = 48, N = 16;
  for (DType grad_dtype : {DType::f8e5m2, DType::f8e4m3}) {
    SCOPED_TRACE(dtype_name(grad_dtype));
    Tensor x = requires_grad_(test::random_normal({2, M / 2, K}, DType::f32));
    Tensor w = requires_grad_(test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1));
    const Tensor r = test::random_normal({2, M / 2, N}, DType::f32);
    const Fp8Weight w8 = fp8_weight(w);
    Fp8LinearOptions o = f32_out();
    o.grad_dtype = grad_dtype;
    const Tensor y = fp8_linear(x, w, w8, Tensor(), o);
    EXPECT_EQ(y.shape(), (Shape{2, M / 2, N}));
    EXPECT_EQ(y.dtype(), DType::f32);
    backward(sum(y * r));

    const std::vector<double> xv = detach(x).to(DType::f64).to_vector<double>(),
                              wv = detach(w).to(DType::f64).to_vector<double>(),
                              gv = r.to(DType::f64).to_vector<double>();
    const CastError ex = cast_error(DType::f8e4m3, amax(xv)),
                    ew = cast_error(DType::f8e4m3, amax(wv)), eg = cast_error(grad_dtype, amax(gv));
    std::vector<double> exact, bound;
    // y = x W^T.
    exact_and_bound(xv, wv, M, N, K, ex, ew, exact, bound);
    const double fwd = worst_ratio(detach(y).reshape({M, N}), exact, bound);
    // dx = dy W: the rows of dy against the columns of W.
    exact_and_bound(gv, transposed(wv, N, K), M, K, N, eg, ew, exact, bound);
    const double dx = worst_ratio(grad(x).reshape({M, K}), exact, bound);
    // dW = dy^T x.
    exact_and_bound(transposed(gv, M, N), transposed(xv, M, K), N, K, M, eg, ex, exact, bound);
    const double dw = worst_ratio(grad(w), exact, bound);
    std::printf("fp8_linear, %s gradients: worst error / bound: y %.3f, dx %.3f, dW %.3f\n",
                dtype_name(grad_dtype), fwd, dx, dw);
    // The bound is not vacuous: FP8 did round, by a visible part of it.
    EXPECT_GT(fwd, 0.01);
    EXPECT_GT(dx, 0.01);
    EXPECT_GT(dw, 0.01);
  }
}

TEST(Fp8Linear, bf16_input_bias_and_bf16_output) {
  constexpr int64_t M = 16, K = 32, N = 32;
  Tensor x = requires_grad_(test::random_normal({M, K}, DType::bf16));
  Tensor w = requires_grad_(test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1));
  Tensor b = requires_grad_(test::random_normal({N}, DType::f32));
  const Tensor y = fp8_linear(x, w, fp8_weight(w), b);
  EXPECT_EQ(y.dtype(), DType::bf16);
  // The bias is added after the GEMM: y - bias is the no-bias output.
  const Tensor y0 = fp8_linear(detach(x), detach(w), fp8_weight(w));
  const std::vector<double> with = detach(y).to(DType::f64).to_vector<double>(),
                            without = y0.to(DType::f64).to_vector<double>(),
                            bias = detach(b).to(DType::f64).to_vector<double>();
  for (int64_t i = 0; i < M * N; ++i)
    EXPECT_NEAR(with[i], without[i] + bias[i % N], 0.02 * (std::fabs(without[i]) + 1)) << i;
  backward(sum(to_dtype(y, DType::f32)));
  EXPECT_EQ(grad(x).dtype(), DType::bf16);
  EXPECT_EQ(grad(w).dtype(), DType::f32);
  EXPECT_EQ(grad(b).dtype(), DType::f32);
  for (double g : grad(b).to_vector<double>())
    EXPECT_EQ(g, static_cast<double>(M));  // dy = 1: the bias gradient counts the rows
}

// The weight gradient lands in the fp32 slot in the GEMM (beta 0 on the
// window's first micro-batch, 1 after): the slot holds exactly what
// fp8_matmul_into leaves in a buffer given the same codes, in the same order.
TEST(Fp8Linear, the_weight_gradient_lands_in_its_arena_slot_micro_batch_by_micro_batch) {
  constexpr int64_t M = 16, K = 32, N = 16, kMicro = 3;
  Tensor w = requires_grad_(test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1));
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::ParamStore store(std::vector<Tensor>{w}, optim::ParamStoreOptions().moments(0));
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(kMicro));
  const Fp8Weight w8 = fp8_weight(w);
  const Tensor expected = zeros({N, K}, DType::f32);
  for (int64_t k = 0; k < kMicro; ++k) {
    const Tensor x = test::random_normal({M, K}, DType::f32);
    const Tensor r = test::random_normal({M, N}, DType::f32);
    window.backward(Loss{sum(fp8_linear(x, w, w8, Tensor(), f32_out()) * r),
                         full({}, static_cast<double>(M), DType::f64)});
    // The same casts and GEMM by hand: dy = r (no loss scale), x as the forward cast it.
    auto cast = [](const Tensor& t, DType d) {
      const Tensor amax =
          kernels::max(kernels::unary(kernels::UnaryOp::Abs, t)).to(DType::f32).reshape({1});
      const kernels::Fp8Scale s = kernels::fp8_scale_from_amax(amax, d);
      return std::make_pair(kernels::cast_to_fp8_transpose(t, s.scale, d), s.scale_inv);
    };
    const auto [cx, sx] = cast(x, DType::f8e4m3);
    const auto [cg, sg] = cast(r, DType::f8e5m2);
    kernels::fp8_matmul_into(cg.q_t, cx.q_t, sg, sx, expected, /*accumulate=*/k > 0);
    EXPECT_TRUE(test::all_equal(store.grad_view(0), expected)) << "micro-batch " << k;
  }
  window.close();
}

// K micro-batches against one big batch: the scales differ (each micro-batch
// takes its own amax), so the fp32 slots differ, each within the rounding
// model of the exact gradient: |dW_K - dW_1| <= bound_K + bound_1.
TEST(Fp8Linear, k_micro_batches_match_the_big_batch_within_the_rounding_model) {
  constexpr int64_t M = 16, K = 32, N = 16, kMicro = 4;
  const Tensor x = test::random_normal({kMicro * M, K}, DType::f32);
  const Tensor r = test::random_normal({kMicro * M, N}, DType::f32);
  const Tensor w0 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1);
  auto slot_after = [&](int64_t micro_steps) {
    Tensor w = requires_grad_(w0.clone());
    optim::Optimizer opt(optim::SGDOptions(0.1));
    optim::ParamStore store(std::vector<Tensor>{w}, optim::ParamStoreOptions().moments(0));
    optim::Window window(store, opt, optim::WindowOptions().micro_steps(micro_steps));
    const Fp8Weight w8 = fp8_weight(w);
    const int64_t rows = kMicro * M / micro_steps;
    for (int64_t k = 0; k < micro_steps; ++k) {
      const Tensor xk = x.narrow(0, k * rows, rows), rk = r.narrow(0, k * rows, rows);
      window.backward(Loss{sum(fp8_linear(xk, w, w8, Tensor(), f32_out()) * rk),
                           full({}, static_cast<double>(rows), DType::f64)});
    }
    return store.grad_view(0).clone();
  };
  const Tensor many = slot_after(kMicro), one = slot_after(1);
  // The bound of each from the exact dW = r^T x, with each run's own amaxes.
  const std::vector<double> xv = x.to(DType::f64).to_vector<double>(),
                            gv = r.to(DType::f64).to_vector<double>();
  std::vector<double> exact, bound_one, bound_many(static_cast<size_t>(N * K), 0.0), b;
  exact_and_bound(transposed(gv, kMicro * M, N), transposed(xv, kMicro * M, K), N, K, kMicro * M,
                  cast_error(DType::f8e5m2, amax(gv)), cast_error(DType::f8e4m3, amax(xv)), exact,
                  bound_one);
  for (int64_t k = 0; k < kMicro; ++k) {
    const std::vector<double> xk(xv.begin() + k * M * K, xv.begin() + (k + 1) * M * K),
        gk(gv.begin() + k * M * N, gv.begin() + (k + 1) * M * N);
    std::vector<double> e;
    exact_and_bound(transposed(gk, M, N), transposed(xk, M, K), N, K, M,
                    cast_error(DType::f8e5m2, amax(gk)), cast_error(DType::f8e4m3, amax(xk)), e, b);
    for (size_t i = 0; i < b.size(); ++i)
      bound_many[i] += b[i] + std::ldexp(std::fabs(exact[i]) + bound_one[i], -24);  // the adds
  }
  const std::vector<double> a = many.to(DType::f64).to_vector<double>(),
                            c = one.to(DType::f64).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::fabs(a[i] - exact[i]), bound_many[i]) << i;
    EXPECT_LE(std::fabs(c[i] - exact[i]), bound_one[i]) << i;
    EXPECT_LE(std::fabs(a[i] - c[i]), bound_many[i] + bound_one[i]) << i;
    worst = std::max(worst, std::fabs(a[i] - c[i]) / (bound_many[i] + bound_one[i]));
  }
  std::printf("fp8_linear: K = %d against one batch: worst |dW_K - dW_1| / bound %.3f\n",
              int(kMicro), worst);
  EXPECT_FALSE(test::all_equal(many, one)) << "the scales differ, so the slots should";
}

// Note [FP8 overflow]: a NaN or an infinity in x or in dy (which a saturating
// cast would turn into the format's max) reaches the gradients as NaN, so the
// window skips as on a loss-scale overflow: the weights do not move and a
// dynamic scaler halves its scale.
// Note [FP8 overflow]: the scale rule's nan_on_overflow gives the bits of
// fp8_guarded_scale_inv on the unguarded scale_inv (NaN as NaN), the claim
// that folding the guard into the rule changed nothing.
TEST(Fp8Linear, the_scale_rules_guard_is_fp8_guarded_scale_inv) {
  for (float a : {0.0f, 1e-30f, 0.37f, 448.0f, 3e38f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    const Tensor amax = from_vector<float>({a}, {1});
    const float folded = kernels::fp8_scale_from_amax(amax, DType::f8e4m3, 0, false, true)
                             .scale_inv.data<float>()[0];
    const float separate =
        fp8_guarded_scale_inv(kernels::fp8_scale_from_amax(amax, DType::f8e4m3).scale_inv, amax)
            .data<float>()[0];
    if (std::isnan(separate)) {
      EXPECT_TRUE(std::isnan(folded)) << a;
    } else {
      EXPECT_EQ(std::memcmp(&folded, &separate, sizeof folded), 0) << a;
    }
  }
}

TEST(Fp8Linear, an_overflowed_input_or_gradient_makes_the_window_skip) {
  constexpr int64_t M = 16, K = 16, N = 16;
  struct Plant {
    const char* what;
    float x_value, dy_value;
  };
  for (const Plant& p : {Plant{"NaN in x", NAN, 1.0f}, Plant{"inf in x", INFINITY, 1.0f},
                         Plant{"-inf in x", -INFINITY, 1.0f}, Plant{"inf in dy", 0.5f, INFINITY}}) {
    SCOPED_TRACE(p.what);
    Tensor w = requires_grad_(test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1));
    const Tensor before = detach(w).clone();
    optim::Optimizer opt(optim::SGDOptions(0.1));
    optim::ParamStore store(std::vector<Tensor>{w}, optim::ParamStoreOptions().moments(0));
    optim::Window window(
        store, opt,
        optim::WindowOptions().micro_steps(1).scaler(optim::LossScalerOptions::dynamic()));
    const double initial = optim::LossScalerOptions::dynamic().init_scale();
    std::vector<float> xv(M * K, 0.5f), rv(M * N, 1.0f);
    xv[7] = p.x_value;
    rv[9] = p.dy_value;
    const Tensor x = from_vector<float>(xv, {M, K}), r = from_vector<float>(rv, {M, N});
    window.backward(Loss{sum(fp8_linear(x, w, fp8_weight(w), Tensor(), f32_out()) * r),
                         full({}, static_cast<double>(M), DType::f64)});
    window.close();
    EXPECT_TRUE(window.report().skipped);
    EXPECT_TRUE(test::all_equal(detach(w), before));
    EXPECT_EQ(window.report().loss_scale, initial / 2);
  }
}

Fp8LinearOptions block_recipe() {
  Fp8LinearOptions o;
  o.recipe = Fp8Recipe::block;
  o.out_dtype = DType::f32;
  return o;
}

// Note [FP8 block recipe]: an outlier costs precision in its own 1 x 128 tile
// only. With one value of 1e6 in x, per-tensor scaling pushes every other
// row below e4m3's smallest subnormal; per-tile scales keep them.
TEST(Fp8Linear, block_scaling_confines_an_outlier_to_its_tile) {
  constexpr int64_t M = 32, K = 256, N = 16;
  std::vector<float> xv = test::random_normal({M, K}, DType::f32).to_vector<float>();
  xv[5] = 1e6f;  // row 0, tile 0
  const Tensor x = from_vector<float>(xv, {M, K});
  const Tensor w = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1);
  const std::vector<double> exact =
      linear(x.to(DType::f64), w.to(DType::f64), Tensor()).to_vector<double>();
  auto rows_error = [&](const Tensor& y) {  // relative error over rows 1.. (no outlier)
    const std::vector<double> v = detach(y).to(DType::f64).to_vector<double>();
    double d = 0, e = 0;
    for (size_t i = N; i < v.size(); ++i) {
      d += (v[i] - exact[i]) * (v[i] - exact[i]);
      e += exact[i] * exact[i];
    }
    return std::sqrt(d / e);
  };
  const double block = rows_error(fp8_linear(x, w, Tensor(), block_recipe()));
  const double tensor = rows_error(fp8_linear(x, w, fp8_weight(w), Tensor(), f32_out()));
  std::printf("fp8_linear with an outlier, rows without it: block %.3g, per-tensor %.3g\n", block,
              tensor);
  EXPECT_LT(block, 0.1);
  EXPECT_GT(tensor, 0.5);
}

// The block recipe's gradients: near the exact ones, and the weight gradient
// summed micro-batch by micro-batch in the fp32 slot as without a store.
TEST(Fp8Linear, block_recipe_gradients_and_the_slot) {
  constexpr int64_t M = 16, K = 160, N = 32, kMicro = 3;
  const Tensor w0 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1);
  std::vector<Tensor> xs, rs;
  for (int64_t k = 0; k < kMicro; ++k) {
    xs.push_back(test::random_normal({M, K}, DType::f32));
    rs.push_back(test::random_normal({M, N}, DType::f32));
  }
  // Without a store: each micro-batch's gradients, against the exact linear's.
  Tensor expected = zeros({N, K}, DType::f32);
  for (int64_t k = 0; k < kMicro; ++k) {
    Tensor x = requires_grad_(xs[k].clone()), w = requires_grad_(w0.clone());
    backward(sum(fp8_linear(x, w, Tensor(), block_recipe()) * rs[k]));
    Tensor xe = requires_grad_(xs[k].clone()), we = requires_grad_(w0.clone());
    backward(sum(linear(xe, we, Tensor()) * rs[k]));
    EXPECT_LT(test::relative_error(grad(x), grad(xe)), 0.1) << "dx, micro-batch " << k;
    EXPECT_LT(test::relative_error(grad(w), grad(we)), 0.1) << "dW, micro-batch " << k;
    EXPECT_GT(test::relative_error(grad(w), grad(we)), 0.0) << "FP8 rounds";
    expected = kernels::binary(kernels::BinaryOp::Add, expected, grad(w));
  }
  // Into the slot: the same sums, in micro-batch order.
  Tensor w = requires_grad_(w0.clone());
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::ParamStore store(std::vector<Tensor>{w}, optim::ParamStoreOptions().moments(0));
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(kMicro));
  for (int64_t k = 0; k < kMicro; ++k)
    window.backward(Loss{sum(fp8_linear(xs[k], w, Tensor(), block_recipe()) * rs[k]),
                         full({}, static_cast<double>(M), DType::f64)});
  EXPECT_LT(test::relative_error(store.grad_view(0), expected), 1e-6);
  window.close();
  // An infinity makes the window skip here too (Note [FP8 overflow]).
  std::vector<float> bad = xs[0].to_vector<float>();
  bad[3] = INFINITY;
  const Tensor before = detach(w).clone();
  for (int64_t k = 0; k < kMicro; ++k)
    window.backward(Loss{sum(fp8_linear(k == 0 ? from_vector<float>(bad, {M, K}) : xs[k], w,
                                        Tensor(), block_recipe()) *
                             rs[k]),
                         full({}, static_cast<double>(M), DType::f64)});
  window.close();
  EXPECT_TRUE(window.report().skipped);
  EXPECT_TRUE(test::all_equal(detach(w), before));
}

// Note [FP8 shared input]: three layers reading one cast of x give the bits
// of three layers casting it each: outputs, the summed gradient to x and
// each weight's gradient; in either recipe (the block recipe's tiles span
// both of x's dimensions: K = 384 and M = 256 hold several 128-wide tiles).
void expect_shared_input_bits(const Fp8LinearOptions& o, int64_t M, int64_t K, int64_t N) {
  const Tensor x0 = test::random_normal({2, M / 2, K}, DType::bf16);
  std::vector<Tensor> w0;
  for (int i = 0; i < 3; ++i)
    w0.push_back(test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1));
  auto run = [&](bool shared) {
    Tensor x = requires_grad_(x0.clone());
    std::vector<Tensor> ws;
    for (const Tensor& w : w0)
      ws.push_back(requires_grad_(w.clone()));
    const Fp8Input x8 = fp8_input(x, o);
    Tensor loss;
    std::vector<Tensor> outs;
    for (size_t i = 0; i < ws.size(); ++i) {
      const Tensor y =
          shared ? fp8_linear(x, x8, ws[i], Tensor(), o) : fp8_linear(x, ws[i], Tensor(), o);
      outs.push_back(detach(y));
      const Tensor term = sum(to_dtype(y, DType::f32) * static_cast<double>(i + 1));
      loss = loss.defined() ? loss + term : term;
    }
    backward(loss);
    outs.push_back(grad(x));
    for (const Tensor& w : ws)
      outs.push_back(grad(w));
    return outs;
  };
  const std::vector<Tensor> each = run(false), shared = run(true);
  ASSERT_EQ(each.size(), shared.size());
  for (size_t i = 0; i < each.size(); ++i)
    EXPECT_TRUE(test::all_equal(shared[i], each[i])) << "result " << i;
}

TEST(Fp8Linear, a_shared_input_cast_gives_the_bits_of_casting_per_layer) {
  expect_shared_input_bits(Fp8LinearOptions{}, 32, 48, 16);
  expect_shared_input_bits(block_recipe(), 256, 384, 128);
}

// Without grad mode the block recipe's shared cast skips x^T (no weight
// gradient will read it); the outputs are the same.
TEST(Fp8Linear, a_shared_block_cast_without_grad_mode_has_no_transpose) {
  const Tensor x = test::random_normal({128, 256}, DType::bf16);
  const Tensor w = test::random_normal({128, 256}, DType::f32, Device::cpu(), 0.1);
  NoGradGuard no_grad;
  const Fp8Input x8 = fp8_input(x, block_recipe());
  EXPECT_FALSE(x8.q_t.defined());
  EXPECT_EQ(x8.recipe, Fp8Recipe::block);
  EXPECT_TRUE(test::all_equal(fp8_linear(x, x8, w, Tensor(), block_recipe()),
                              fp8_linear(x, w, Tensor(), block_recipe())));
}

TEST(Fp8Linear, a_shared_input_cast_is_refused_for_another_tensor_or_options) {
  const Tensor x = test::random_normal({16, 32}, DType::f32);
  const Tensor w = test::random_normal({16, 32}, DType::f32);
  const Fp8Input x8 = fp8_input(x);
  EXPECT_ERROR(fp8_linear(x.clone(), x8, w), "fp8_linear", "input cast", "[16, 32]",
               "not made by fp8_input from this x");
  Fp8LinearOptions o;
  o.margin = 2;
  EXPECT_ERROR(fp8_linear(x, x8, w, Tensor(), o), "fp8_linear", "margin 0", "margin 2");
  o = Fp8LinearOptions();
  o.forward_dtype = DType::f8e5m2;
  EXPECT_ERROR(fp8_linear(x, x8, w, Tensor(), o), "fp8_linear", "f8e4m3", "f8e5m2");
  EXPECT_ERROR(fp8_linear(x, Fp8Input{}, w), "fp8_linear", "input cast (none");
  EXPECT_ERROR(fp8_linear(x, x8, w, Tensor(), block_recipe()), "fp8_linear", "tensor recipe",
               "block recipe");
  EXPECT_ERROR(fp8_linear(x, fp8_input(x, block_recipe()), w), "fp8_linear", "block recipe",
               "tensor recipe");
  EXPECT_ERROR(fp8_input(x.to(DType::f64)), "fp8_input", "f64", "[16, 32]");
  EXPECT_ERROR(fp8_input(Tensor()), "fp8_input", "undefined");
  o = Fp8LinearOptions();
  o.forward_dtype = DType::bf16;
  EXPECT_ERROR(fp8_input(x, o), "fp8_input", "forward_dtype bf16");
  // The weight side is checked as without a shared cast.
  EXPECT_ERROR(fp8_linear(x, x8, test::random_normal({16, 24}, DType::f32)), "fp8_linear",
               "[16, 32]", "[16, 24]");
}

// fp8_linear_gelu on the CPU gives the bits of gelu(fp8_linear(...)): the
// reference rounds the biased product once, then runs GELU's own kernel, and
// the two nodes' backwards are those of the two ops.
TEST(Fp8Linear, linear_gelu_gives_the_bits_of_the_two_ops) {
  constexpr int64_t M = 32, K = 48, N = 64;
  const Tensor x0 = test::random_normal({2, M / 2, K}, DType::bf16);
  const Tensor w0 = test::random_normal({N, K}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({N}, DType::f32);
  const Tensor r = test::random_normal({2, M / 2, N}, DType::f32);
  Fp8LinearOptions o;  // bf16 out
  auto run = [&](bool fused) {
    Tensor x = requires_grad_(x0.clone()), w = requires_grad_(w0.clone()),
           b = requires_grad_(b0.clone());
    const Tensor y = fused ? fp8_linear_gelu(x, w, b, o) : gelu(fp8_linear(x, w, b, o));
    backward(sum(to_dtype(y, DType::f32) * r));
    return std::vector<Tensor>{detach(y), grad(x), grad(w), grad(b)};
  };
  const std::vector<Tensor> fused = run(true), apart = run(false);
  const char* names[] = {"y", "dx", "dW", "db"};
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_TRUE(test::all_equal(fused[i], apart[i])) << names[i];
  const Tensor x = test::random_normal({M, K}, DType::bf16);
  EXPECT_ERROR(fp8_linear_gelu(x, w0, Tensor(), o), "fp8_linear_gelu", "no bias");
  EXPECT_ERROR(fp8_linear_gelu(x, w0, b0, f32_out()), "fp8_linear_gelu", "f32");
  Fp8LinearOptions blocks;
  blocks.recipe = Fp8Recipe::block;
  EXPECT_ERROR(fp8_linear_gelu(x, w0, b0, blocks), "fp8_linear", "per-tensor");
}

TEST(Fp8Linear, bad_inputs_are_errors_naming_the_op_and_the_values) {
  const Tensor w = test::random_normal({16, 32}, DType::f32);
  const Fp8Weight w8 = fp8_weight(w);
  EXPECT_ERROR(fp8_linear(test::random_normal({10, 32}, DType::f32), w, w8), "fp8_linear",
               "rows 10", "multiples of 16");
  EXPECT_ERROR(fp8_linear(test::random_normal({16, 24}, DType::f32), w, w8), "fp8_linear",
               "[16, 24]", "[16, 32]");
  const Tensor other = test::random_normal({32, 16}, DType::f32);
  EXPECT_ERROR(fp8_linear(test::random_normal({16, 16}, DType::f32), other, w8), "fp8_linear",
               "not a copy of the weight", "fp8_weight");
  EXPECT_ERROR(fp8_linear(test::random_normal({16, 32}, DType::f32), w, w8,
                          test::random_normal({8}, DType::f32)),
               "fp8_linear", "bias of shape [8]");
  Fp8LinearOptions o;
  o.grad_dtype = DType::bf16;
  EXPECT_ERROR(fp8_linear(test::random_normal({16, 32}, DType::f32), w, w8, Tensor(), o),
               "fp8_linear", "grad_dtype bf16", "FP8 dtypes");
  o = Fp8LinearOptions();
  o.out_dtype = DType::i64;
  EXPECT_ERROR(fp8_linear(test::random_normal({16, 32}, DType::f32), w, w8, Tensor(), o),
               "fp8_linear", "out_dtype i64");
  EXPECT_ERROR(fp8_linear(test::random_normal({16, 32}, DType::f64), w, w8), "fp8_linear",
               "input dtype f64");
  EXPECT_ERROR(fp8_weight(test::random_normal({16}, DType::f32)), "fp8_weight", "2-D", "[16]");
  EXPECT_ERROR(
      fp8_linear(test::random_normal({16, 32}, DType::f32), w, w8, Tensor(), block_recipe()),
      "fp8_linear", "per-tensor", "block recipe");
}

}  // namespace
}  // namespace accrue
