// The CPU kernels that split their work across threads give bitwise the same
// results with 1, 3 and 4 threads (Note [CPU threads]), on random inputs whose
// sizes split unevenly, and each of them does use the pool at that size.
#include <gmock/gmock.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/parallel.h"
#include "accrue/kernels/attention.h"
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"
#include "accrue/kernels/window_close.h"
#include "tests/kernels/optimizer_kinds.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::BinaryOp;
using kernels::CompareOp;
using kernels::UnaryOp;

class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : previous_(num_threads()) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(previous_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int previous_;
};

::testing::AssertionResult bitwise_equal(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "shape or dtype differ: " << shape_str(actual.shape()) << " "
           << dtype_name(actual.dtype()) << " vs " << shape_str(expected.shape()) << " "
           << dtype_name(expected.dtype());
  const Tensor a = detach(actual).contiguous(), e = detach(expected).contiguous();
  const size_t width = a.nbytes() / static_cast<size_t>(std::max<int64_t>(a.numel(), 1));
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * width, pe + i * width, width) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << a.reshape({a.numel()}).narrow(0, i, 1).item()
             << " vs " << e.reshape({e.numel()}).narrow(0, i, 1).item();
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs `compute` with 1 thread, then with 3 and with 4: every tensor it
// returns is bitwise the same, and with several threads the kernels used the
// pool (the sizes below are above their grains).
void expect_thread_count_invariant(const std::function<std::vector<Tensor>()>& compute) {
  std::vector<Tensor> one;
  {
    ThreadsScope scope(1);
    one = compute();
  }
  for (int threads : {3, 4}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    ThreadsScope scope(threads);
    const int64_t runs = parallel_runs();
    const std::vector<Tensor> many = compute();
    EXPECT_GT(parallel_runs(), runs) << "the kernels never used the pool";
    ASSERT_EQ(many.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(bitwise_equal(many[i], one[i])) << "result " << i;
  }
}

// With 4 threads, `run` (one kernel call) splits its range at least once.
void expect_pool_used(const char* kernel, const std::function<void()>& run) {
  ThreadsScope scope(4);
  const int64_t runs = parallel_runs();
  run();
  EXPECT_GT(parallel_runs(), runs) << kernel << " never used the pool";
}

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

TEST(CpuThreads, gemm_batched_transposed_and_mixed_precision) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = test::random_normal({5, 67, 131}, dt);
    const Tensor b = test::random_normal({5, 131, 97}, dt);
    const Tensor bt = test::random_normal({5, 97, 131}, dt);  // used as its transpose
    const Tensor a2 = test::random_normal({301, 129}, dt);
    const Tensor b2 = test::random_normal({211, 301}, dt);
    const Tensor out0 = test::random_normal({129, 211}, DType::f32);
    const DType out_dt = dt == DType::f64 ? DType::f64 : DType::f32;
    expect_thread_count_invariant([&] {
      Tensor out = out0.to(out_dt).clone();
      // out += 1.5 * a2^T @ b2^T (the weight-gradient form: 16-bit inputs
      // into an f32 slot).
      kernels::gemm(a2, true, b2, true, out, 1.5, 1.0);
      return std::vector<Tensor>{kernels::matmul(a, b), kernels::matmul(a, bt.transpose(1, 2)),
                                 out};
    });
  }
}

TEST(CpuThreads, elementwise_unary_binary_where_compare_and_axpy) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({331, 307}, dt);
    const Tensor y = test::random_normal({331, 307}, dt);
    const Tensor row = test::random_normal({307}, dt);
    const Tensor xt = test::random_normal({307, 331}, dt).transpose(0, 1);  // strided
    const Tensor pos = test::random_uniform({331, 307}, 0.5, 2.0, dt);
    const Tensor cond = kernels::compare(CompareOp::Gt, x, y);
    const Tensor dst0 = test::random_normal({331, 307}, dt == DType::f64 ? dt : DType::f32);
    expect_thread_count_invariant([&] {
      std::vector<Tensor> r;
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max}) {
        r.push_back(kernels::binary(op, x, row));
        r.push_back(kernels::binary(op, xt, y));
      }
      r.push_back(kernels::binary_scalar(BinaryOp::Sub, x, 0.25, true));
      for (UnaryOp op : {UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Gelu, UnaryOp::Silu, UnaryOp::Sin}) {
        r.push_back(kernels::unary(op, xt));
        r.push_back(kernels::unary_backward(op, y, x, Tensor()));
      }
      r.push_back(kernels::unary(UnaryOp::Rsqrt, pos));
      r.push_back(kernels::unary(UnaryOp::Pow, pos, -0.5));
      r.push_back(kernels::minmax_backward(BinaryOp::Max, y, x, row));
      r.push_back(kernels::clamp(x, -0.5, 0.75));
      r.push_back(kernels::clamp_backward(y, xt, -0.5, 0.75));
      r.push_back(kernels::compare(CompareOp::Le, xt, row));
      r.push_back(kernels::where(cond, x, xt));
      r.push_back(kernels::where(cond, x, -1.0));
      r.push_back(kernels::triu(x, 3));
      r.push_back(kernels::tril(xt, -2));
      Tensor dst = dst0.clone();
      kernels::axpy_(dst, 0.375, x);
      r.push_back(dst);
      return r;
    });
  }
}

TEST(CpuThreads, reductions_and_softmax) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({1013, 97}, dt);
    const Tensor g = test::random_normal({1013, 97}, dt);
    const Tensor tall = test::random_normal({4099, 37}, dt);
    const Tensor bias0 = test::random_normal({37}, DType::f32);
    expect_thread_count_invariant([&] {
      std::vector<Tensor> r{kernels::sum(x, {1}),
                            kernels::mean(x, {1}, true),
                            kernels::max(x, {1}),
                            kernels::argmax(x, 1),
                            kernels::sum(x.transpose(0, 1), {1}),
                            kernels::sum(tall, {0}),
                            kernels::softmax(x, 1),
                            kernels::log_softmax(x, 1)};
      r.push_back(kernels::softmax_backward(g, r[6], 1));
      r.push_back(kernels::log_softmax_backward(g, r[7], 1));
      Tensor bias = bias0.to(dt == DType::f64 ? dt : DType::f32).clone();
      kernels::sum_rows_into(tall, bias, true);
      r.push_back(bias);
      return r;
    });
  }
}

TEST(CpuThreads, layer_norm_forward_and_backward) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({1031, 67}, dt, Device::cpu(), 3.0);
    const Tensor g = test::random_normal({1031, 67}, dt);
    const Tensor w = test::random_normal({67}, dt);
    const Tensor b = test::random_normal({67}, dt);
    const DType slot = dt == DType::f64 ? dt : DType::f32;
    const Tensor dw0 = test::random_normal({67}, slot), db0 = test::random_normal({67}, slot);
    expect_thread_count_invariant([&] {
      const kernels::LayerNormOutput fwd = kernels::layer_norm(x, w, b, 1e-5);
      Tensor dw = dw0.clone(), db = db0.clone(), dw_set = zeros({67}, slot);
      const Tensor dx = kernels::layer_norm_backward(g, x, w, fwd.mean, fwd.rstd, dw, db, true);
      const Tensor dx_plain =
          kernels::layer_norm_backward(g, x, Tensor(), fwd.mean, fwd.rstd, dw_set, Tensor(), false);
      const kernels::LayerNormOutput bare = kernels::layer_norm(x, Tensor(), Tensor(), 1e-5);
      return std::vector<Tensor>{fwd.out, fwd.mean, fwd.rstd, dx,      dw,
                                 db,      dx_plain, dw_set,   bare.out};
    });
  }
}

TEST(CpuThreads, cross_entropy_and_embedding) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor logits = test::random_normal({1031, 101}, dt, Device::cpu(), 2.0);
    Tensor targets = randint(0, 101, {1031}, DType::i64);
    // Some ignored rows, so the count and the ordered sum skip them.
    std::vector<int64_t> t = targets.to_vector<int64_t>();
    for (size_t i = 0; i < t.size(); i += 7)
      t[i] = -100;
    targets = from_vector<int64_t>(t, {1031}, DType::i64);
    const Tensor seed = full({}, 0.5, dt == DType::f64 ? dt : DType::f32);
    const Tensor weight = test::random_normal({61, 2053}, dt);
    const Tensor indices = randint(0, 61, {7, 73}, DType::i32);
    const Tensor grad = test::random_normal({7, 73, 2053}, dt);
    const DType slot = dt == DType::f64 ? dt : DType::f32;
    const Tensor gw0 = test::random_normal({61, 2053}, slot);
    expect_thread_count_invariant([&] {
      const kernels::LossSum loss = kernels::cross_entropy(logits, targets);
      const Tensor dlogits = kernels::cross_entropy_backward(logits, targets, -100, seed);
      Tensor gw = gw0.clone(), gw_set = empty({61, 2053}, slot);
      kernels::embedding_backward(grad, indices, gw, true);
      kernels::embedding_backward(grad, indices, gw_set, false);
      return std::vector<Tensor>{loss.sum, loss.count, dlogits, kernels::embedding(weight, indices),
                                 gw,       gw_set};
    });
  }
}

// Attention forward splits (b, h, query row); backward splits (b, kv head),
// so dK, dV and an unbroadcast dbias sum in one thread; a dbias broadcast over
// b stays on one thread. Grouped-query heads, causal, window, dropout.
TEST(CpuThreads, attention_forward_and_backward) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t B = 3, H = 6, Hkv = 2, Tq = 37, Tk = 41, d = 24, dv = 20;
    const Tensor q = test::random_normal({B, H, Tq, d}, dt);
    const Tensor k = test::random_normal({B, Hkv, Tk, d}, dt);
    const Tensor v = test::random_normal({B, Hkv, Tk, dv}, dt);
    const Tensor g = test::random_normal({B, H, Tq, dv}, dt);
    const Tensor bias = test::random_normal({B, H, Tq, Tk}, dt);
    const Tensor bias_b1 = test::random_normal({1, H, Tq, Tk}, dt);
    using kernels::AttentionOptions;
    const AttentionOptions plain = AttentionOptions().causal(kernels::MaskAlignment::bottom_right);
    const AttentionOptions windowed = AttentionOptions().causal().window(9).dropout(0.25, 1234, 77);
    const AttentionOptions biased = AttentionOptions().bias(bias);
    const AttentionOptions biased_b1 = AttentionOptions().bias(bias_b1).causal();
    expect_thread_count_invariant([&] {
      std::vector<Tensor> r;
      for (const AttentionOptions* o : {&plain, &windowed, &biased, &biased_b1}) {
        const kernels::AttentionResult fwd = kernels::attention(q, k, v, *o);
        const Tensor dq = empty(q.shape(), dt), dk = empty(k.shape(), dt),
                     dvv = empty(v.shape(), dt);
        const Tensor& bt = o->get_bias();
        const Tensor dbias = bt.defined() ? empty(bt.shape(), dt) : Tensor();
        kernels::attention_backward_into(g, q, k, v, fwd.out, fwd.lse, *o, dq, dk, dvv, dbias);
        r.insert(r.end(), {fwd.out, fwd.lse, dq, dk, dvv});
        if (dbias.defined()) r.push_back(dbias);
      }
      return r;
    });
    expect_pool_used("attention", [&] { kernels::attention(q, k, v, plain); });
    const kernels::AttentionResult fwd = kernels::attention(q, k, v, biased);
    expect_pool_used("attention_backward", [&] {
      kernels::attention_backward_into(g, q, k, v, fwd.out, fwd.lse, biased, empty(q.shape(), dt),
                                       empty(k.shape(), dt), empty(v.shape(), dt),
                                       empty(bias.shape(), dt));
    });
  }
}

// The transformer fusions split rows (RMSNorm's dweight: columns, each summed
// over the rows in order), the rotary embedding (b, t) positions.
TEST(CpuThreads, rms_norm_rope_swiglu_and_linear_gelu) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const DType slot = dt == DType::f64 ? dt : DType::f32;
    const Tensor x = test::random_normal({1031, 67}, dt, Device::cpu(), 2.0);
    const Tensor res = test::random_normal({1031, 67}, dt);
    const Tensor gx = test::random_normal({1031, 67}, dt);
    const Tensor w = test::random_normal({67}, dt);
    const Tensor dw0 = test::random_normal({67}, slot);
    const Tensor qk = test::random_normal({3, 53, 7, 34}, dt);
    const Tensor positions = randint(0, 1000, {3, 53}, DType::i64);
    const Tensor gate = test::random_normal({523, 131}, dt),
                 up = test::random_normal({523, 131}, dt);
    const Tensor gs = test::random_normal({523, 131}, dt);
    const Tensor lx = test::random_normal({203, 61}, dt), lw = test::random_normal({83, 61}, dt);
    const Tensor lb = test::random_normal({83}, dt);
    expect_thread_count_invariant([&] {
      const kernels::RmsNormOutput fwd = kernels::rms_norm(x, w, 1e-5);
      Tensor dw = dw0.clone();
      const Tensor dx = kernels::rms_norm_backward(gx, x, w, fwd.rstd, dw, true);
      const Tensor dx_plain =
          kernels::rms_norm_backward(gx, x, Tensor(), fwd.rstd, Tensor(), false);
      const kernels::ResidualRmsNormOutput fused = kernels::add_rms_norm(x, res, w, 1e-6);
      // Per-head norm of a strided view (two row levels).
      const kernels::RmsNormOutput heads = kernels::rms_norm(qk.narrow(3, 0, 17), Tensor(), 1e-5);
      const kernels::SwigluGrads sg = kernels::swiglu_backward(gs, gate, up);
      Tensor pre;
      const Tensor gelu = kernels::linear_gelu(lx, lw, lb, &pre);
      return std::vector<Tensor>{
          fwd.out,
          fwd.rstd,
          dx,
          dw,
          dx_plain,
          fused.sum,
          fused.out,
          fused.rstd,
          heads.out,
          heads.rstd,
          kernels::rope(qk, positions, 10000.0, RopeStyle::RotateHalf),
          kernels::rope(qk.transpose(1, 2).contiguous().transpose(1, 2), positions, 500000.0,
                        RopeStyle::Interleaved, {}, true),
          kernels::swiglu(gate, up),
          kernels::swiglu(gate.transpose(0, 1), up.transpose(0, 1)),
          sg.dgate,
          sg.dup,
          gelu,
          pre};
    });
    expect_pool_used("rms_norm", [&] { kernels::rms_norm(x, w, 1e-5); });
    const Tensor rstd = kernels::rms_norm(x, w, 1e-5).rstd;
    expect_pool_used("rms_norm_backward",
                     [&] { kernels::rms_norm_backward(gx, x, w, rstd, Tensor(), false); });
    expect_pool_used("rope", [&] { kernels::rope(qk, positions, 1e4, RopeStyle::RotateHalf); });
    expect_pool_used("swiglu", [&] { kernels::swiglu(gate, up); });
    expect_pool_used("swiglu_backward", [&] { kernels::swiglu_backward(gs, gate, up); });
  }
}

// Strided copies, conversions and fills split rows of the last dim; a copy
// whose destination overlaps its source stays in the one-thread order.
TEST(CpuThreads, strided_copies_conversions_and_fills) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({37, 211, 29}, dt);
    const Tensor row = test::random_normal({29}, dt);
    expect_thread_count_invariant([&] {
      Tensor into = empty({37, 29, 211}, dt);
      into.copy_(x.transpose(1, 2));
      Tensor broadcast = empty({37, 211, 29}, DType::f64);
      broadcast.copy_(row);
      Tensor filled = empty({211, 37 * 29}, dt).transpose(0, 1);
      filled.fill_(0.375);
      // Overlapping: shifts a buffer by one row within itself.
      Tensor shifted = x.clone().reshape({37 * 211, 29});
      shifted.narrow(0, 1, 37 * 211 - 1).copy_(shifted.narrow(0, 0, 37 * 211 - 1));
      return std::vector<Tensor>{x.transpose(0, 2).contiguous(),
                                 x.to(DType::f64),
                                 x.transpose(0, 1).to(DType::f32),
                                 into,
                                 broadcast,
                                 filled,
                                 shifted};
    });
    expect_pool_used("copy", [&] { x.transpose(0, 2).contiguous(); });
    expect_pool_used("fill", [&] { empty({37, 211, 29}, dt).fill_(1.0); });
  }
}

// The window close: norm partials split their fixed-length rows, the fused
// optimizer step splits kChunk chunks (a chunk's step_sums row in one
// thread), on a range of an arena starting mid-table, with a compute copy.
TEST(CpuThreads, window_close_norm_and_optimizer_step) {
  const int64_t chunks = 3301, n = chunks * kernels::kChunk, first = 7 * kernels::kChunk;
  std::vector<int32_t> groups;
  for (int64_t c = 0; c < chunks + 7; ++c)
    groups.push_back(static_cast<int32_t>((c * 7 / 3) % 3));
  const Tensor chunk_groups = from_vector<int32_t>(groups, {chunks + 7}, DType::i32);
  for (DType dt : {DType::f64, DType::f32}) {
    for (bool adam : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (adam ? " adamw amsgrad" : " sgd nesterov"));
      kernels::OptimizerConfig config;
      test::set_kind(config, adam ? test::Kind::AdamW : test::Kind::SGD);
      config.amsgrad = adam;
      config.momentum = adam ? 0.0 : 0.9;
      config.nesterov = !adam;
      config.groups = {{1e-2, 0.1}, {3e-3, 0.0}, {5e-3, 0.02}};
      const Tensor p0 = test::random_normal({n}, dt), g0 = test::random_normal({n}, dt);
      const Tensor m0 = test::random_normal({n}, dt, Device::cpu(), 0.1);
      const Tensor v0 = test::random_uniform({n}, 0.01, 0.1, dt);
      const Tensor vmax0 = test::random_uniform({n}, 0.01, 0.1, dt);
      auto buffers = [&] {
        kernels::OptimizerBuffers b;
        b.params = p0.clone();
        b.grads = g0.clone();
        b.exp_avg = m0.clone();
        if (adam) {
          b.exp_avg_sq = v0.clone();
          b.max_exp_avg_sq = vmax0.clone();
        }
        b.compute = empty({n}, DType::bf16);
        b.chunk_groups = chunk_groups;
        b.first_element = first;
        b.step_sums = full({chunks + 7, 3}, -1.0, DType::f64);
        return b;
      };
      expect_thread_count_invariant([&] {
        const kernels::OptimizerBuffers b = buffers();
        const Tensor partials = empty({kernels::norm_partials_rows(b.grads), 2}, DType::f64);
        kernels::grad_norm_partials(b.grads, partials);
        const Tensor state = kernels::make_window_state(1.0, Device::cpu());
        state.narrow(0, kernels::kItems, 1).fill_(3.0);
        kernels::CloseConfig close;
        close.max_norm = 10.0;
        kernels::window_scalar_step(partials, state, close);
        kernels::fused_optimizer_step(config, b, state);
        std::vector<Tensor> r{partials, state, b.params, b.exp_avg, b.compute, b.step_sums};
        if (adam) r.insert(r.end(), {b.exp_avg_sq, b.max_exp_avg_sq});
        return r;
      });
      const Tensor partials = empty({kernels::norm_partials_rows(g0), 2}, DType::f64);
      expect_pool_used("grad_norm_partials", [&] { kernels::grad_norm_partials(g0, partials); });
      const kernels::OptimizerBuffers b = buffers();
      const Tensor state = kernels::make_window_state(1.0, Device::cpu());
      expect_pool_used("fused_optimizer_step",
                       [&] { kernels::fused_optimizer_step(config, b, state); });
    }
  }
}

// A small network through autograd (embedding, GEMMs, GELU, layer norm,
// softmax, cross-entropy, forward and backward): the loss and every gradient
// are bitwise the same for any thread count.
TEST(CpuThreads, a_small_network_forward_and_backward) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 263, d = 96, h = 301, c = 53;
    const Tensor x0 = test::random_normal({n, d}, dt);
    const Tensor e0 = test::random_normal({c, d}, dt);
    const Tensor w10 = test::random_normal({d, h}, dt, Device::cpu(), 0.1);
    const Tensor lnw0 = test::random_normal({h}, dt), lnb0 = test::random_normal({h}, dt);
    const Tensor w20 = test::random_normal({h, c}, dt, Device::cpu(), 0.1);
    const Tensor tokens = randint(0, c, {n}, DType::i64);
    std::vector<int64_t> t = randint(0, c, {n}, DType::i64).to_vector<int64_t>();
    for (size_t i = 0; i < t.size(); i += 5)
      t[i] = -100;
    const Tensor targets = from_vector<int64_t>(t, {n}, DType::i64);
    expect_thread_count_invariant([&] {
      const Tensor x = requires_grad_(x0.clone()), e = requires_grad_(e0.clone());
      const Tensor w1 = requires_grad_(w10.clone()), w2 = requires_grad_(w20.clone());
      const Tensor lnw = requires_grad_(lnw0.clone()), lnb = requires_grad_(lnb0.clone());
      const Tensor hidden = gelu(matmul(x + embedding(e, tokens), w1));
      const Tensor normed = layer_norm(hidden, lnw, lnb);
      const Tensor logits = matmul(normed * softmax(normed, 1), w2);
      const Loss loss = cross_entropy(logits, targets);
      backward(loss.sum);
      return std::vector<Tensor>{loss.sum, grad(x),   grad(e),  grad(w1),
                                 grad(w2), grad(lnw), grad(lnb)};
    });
  }
}

}  // namespace
}  // namespace accrue
