// Note [FP8 delayed scaling] (optim/fp8_scaling.h): the first window casts
// with current scaling and seeds the rows; every close pushes the window's
// amax and makes the next scales from the history; an overflow skips the
// window and leaves the scales; a checkpoint resumes bit for bit; the
// misuses are errors.
#include "accrue/optim/fp8_scaling.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/kernels/fp8.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using optim::Fp8DelayedOptions;
using optim::ParamStore;
using optim::ParamStoreOptions;

constexpr int64_t kRows = 16, kIn = 48, kOut = 32;

struct Batch {
  Tensor x, r;
};

Batch batch(double x_scale) {
  return {test::random_normal({kRows, kIn}, DType::bf16, Device::cpu(), x_scale),
          test::random_normal({kRows, kOut}, DType::f32)};
}

// One FP8 layer y = x W^T + b trained by a Window of `micro` micro-steps; its
// store keeps the copy and, with `delayed`, the delayed-scaling rows.
struct Trainer {
  Tensor w, b;
  optim::Optimizer opt;
  ParamStore store;
  optim::Window window;

  Trainer(const Tensor& w0, const Tensor& b0, double lr, int micro, bool delayed, int history = 4)
      : w(requires_grad_(w0.clone())),
        b(requires_grad_(b0.clone())),
        opt(optim::AdamWOptions(lr)),
        store(std::vector<Tensor>{w, b}, ParamStoreOptions().moments(opt.moments_needed())),
        window(keep(store, w, delayed, history), opt, optim::WindowOptions().micro_steps(micro)) {}

  // The copy and the rows, before the Window is built (its close must hold them).
  static ParamStore& keep(ParamStore& s, const Tensor& w, bool delayed, int history) {
    s.keep_fp8_copies({w});
    if (delayed) s.keep_fp8_delayed_scaling({w}, Fp8DelayedOptions().history(history));
    return s;
  }

  void step(const Batch& m) {
    window.backward(Loss{sum(fp8_linear(m.x, w, b) * to_dtype(m.r, DType::bf16)),
                         full({}, static_cast<double>(kRows), DType::f64)});
  }
  optim::WindowReport window_of(const std::vector<Batch>& batches) {
    for (const Batch& m : batches)
      step(m);
    window.close();
    return window.report();
  }
  // Row 0 of x's or dy's state: scale, scale_inv, window amax, history.
  std::vector<float> row(bool x) const {
    const optim::Fp8DelayedScaling* s = store.fp8_delayed_scaling();
    return (x ? s->x_state() : s->dy_state()).select(0, 0).to_vector<float>();
  }
};

float amax_of(const Tensor& t) {
  return kernels::fp8_amax(t).data<float>()[0];
}

// Window 1 is current scaling itself; with the same inputs every window and
// lr 0, the window amax is the one current scaling takes, so every later
// window's scale is current scaling's too: the same bits throughout.
TEST(Fp8DelayedScaling, equals_current_scaling_when_every_window_sees_the_same_tensors) {
  const Tensor w0 = test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({kOut}, DType::f32);
  const Batch m = batch(3.0);
  Trainer current(w0, b0, 0.0, 2, false), delayed(w0, b0, 0.0, 2, true);
  EXPECT_TRUE(delayed.window.calibrating());  // the first window seeds the scales
  for (int window = 0; window < 3; ++window) {
    SCOPED_TRACE("window " + std::to_string(window));
    const auto a = current.window_of({m, m}), d = delayed.window_of({m, m});
    EXPECT_EQ(a.loss, d.loss);
    EXPECT_TRUE(test::all_equal(current.store.grads(), delayed.store.grads()));
    EXPECT_FALSE(delayed.window.calibrating());
  }
  EXPECT_THAT(delayed.window.describe_close(), ::testing::HasSubstr("fp8 scaling"));
  const std::vector<float> x = delayed.row(true);
  const float amax = amax_of(m.x);
  const auto rule = kernels::fp8_scale_from_amax(full({1}, amax), DType::f8e4m3);
  EXPECT_EQ(x[0], rule.scale.data<float>()[0]);
  EXPECT_EQ(x[1], rule.scale_inv.data<float>()[0]);
  EXPECT_EQ(x[2], 0.0f);  // reset at the close
  for (int j = 0; j < 3; ++j)
    EXPECT_EQ(x[3 + j], amax) << "history " << j;  // three closes of four slots
  EXPECT_EQ(x[6], 0.0f);
}

// Each close pushes the window's amax (the max over its micro-batches) and
// scales from the history's max: a large window keeps the scale down for
// `history` windows, then it drops out.
TEST(Fp8DelayedScaling, the_scale_follows_the_history_max) {
  const Tensor w0 = test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({kOut}, DType::f32);
  Trainer run(w0, b0, 1e-3, 2, true, /*history=*/2), current(w0, b0, 1e-3, 2, false);
  std::vector<float> window_amax;
  for (double size : {1.0, 30.0, 2.0, 3.0}) {
    const Batch a = batch(size), c = batch(size);
    window_amax.push_back(std::max(amax_of(a.x), amax_of(c.x)));
    run.window_of({a, c});
    current.window_of({a, c});
    // The first window is current scaling; later ones cast with other scales.
    EXPECT_EQ(test::all_equal(run.store.grads(), current.store.grads()), window_amax.size() == 1)
        << "window " << window_amax.size();
  }
  const std::vector<float> x = run.row(true);
  EXPECT_EQ(x[3], window_amax[3]);  // newest first
  EXPECT_EQ(x[4], window_amax[2]);  // window 2's 30 dropped out of a history of 2
  const float m = std::max(window_amax[2], window_amax[3]);
  EXPECT_EQ(x[0], kernels::fp8_scale_from_amax(full({1}, m), DType::f8e4m3).scale.item());
  // dy's rows are e5m2's, from the gradients' amax.
  const std::vector<float> dy = run.row(false);
  EXPECT_GT(dy[3], 0.0f);
  EXPECT_EQ(
      dy[0],
      kernels::fp8_scale_from_amax(full({1}, std::max(dy[3], dy[4])), DType::f8e5m2).scale.item());
}

// Note [FP8 overflow]: an infinity in x makes the window skip, and its close
// leaves the scales as they were (the window amax is reset).
TEST(Fp8DelayedScaling, an_overflow_skips_the_window_and_keeps_the_scale) {
  const Tensor w0 = test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({kOut}, DType::f32);
  Trainer run(w0, b0, 1e-3, 2, true);
  run.window_of({batch(2.0), batch(2.0)});
  run.window_of({batch(2.0), batch(2.0)});
  const std::vector<float> before = run.row(true);
  const Tensor w_before = run.store.master().clone();
  Batch bad = batch(2.0);
  bad.x.data<bf16>()[5] = bf16(std::numeric_limits<float>::infinity());
  const auto report = run.window_of({batch(2.0), bad});
  EXPECT_TRUE(report.skipped);
  EXPECT_TRUE(test::all_equal(run.store.master(), w_before));
  std::vector<float> after = run.row(true);
  EXPECT_EQ(after[2], 0.0f);
  after[2] = before[2];
  EXPECT_EQ(after, before);
}

// A checkpoint (between windows and inside one) resumes on the uninterrupted
// run's weights and rows, bit for bit; the resumed run is past calibration.
TEST(Fp8DelayedScaling, resumes_bit_for_bit) {
  const Tensor w0 = test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({kOut}, DType::f32);
  std::vector<Batch> data;
  for (int i = 0; i < 8; ++i)
    data.push_back(batch(1.0 + i));
  Trainer whole(w0, b0, 1e-2, 2, true);
  for (int w = 0; w < 4; ++w)
    whole.window_of({data[2 * w], data[2 * w + 1]});
  for (int stop : {2, 5}) {  // micro-batches done at the checkpoint: between windows, inside one
    SCOPED_TRACE("checkpoint after " + std::to_string(stop) + " micro-batches");
    Trainer first(w0, b0, 1e-2, 2, true);
    for (int i = 0; i < stop; ++i) {
      first.step(data[i]);
      if (first.window.ready()) first.window.close();
    }
    const std::map<std::string, Tensor> saved = first.window.state_dict();
    Trainer second(w0, b0, 1e-2, 2, true);
    second.window.load_state_dict(saved);
    EXPECT_FALSE(second.window.calibrating());
    for (int i = stop; i < 8; ++i) {
      second.step(data[i]);
      if (second.window.ready()) second.window.close();
    }
    EXPECT_TRUE(test::all_equal(second.store.master(), whole.store.master()));
    EXPECT_EQ(second.row(true), whole.row(true));
    EXPECT_EQ(second.row(false), whole.row(false));
  }
  // A corrupt row is refused, naming the entry, and leaves the window as it was.
  Trainer target(w0, b0, 1e-2, 2, true);
  std::map<std::string, Tensor> bad = whole.window.state_dict();
  bad["fp8_scaling_dy"] = bad["fp8_scaling_dy"].clone();
  bad["fp8_scaling_dy"].data<float>()[0] = -1.0f;
  EXPECT_ERROR(target.window.load_state_dict(bad), "load_state_dict", "'fp8_scaling_dy'[0, 0]",
               "-1", "finite positive scale");
  bad["fp8_scaling_dy"].data<float>()[0] = 1.0f;
  bad["fp8_scaling_dy"].data<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_ERROR(target.window.load_state_dict(bad), "load_state_dict", "'fp8_scaling_dy'[0, 4]",
               "finite non-negative amax");
  EXPECT_TRUE(target.window.calibrating());  // nothing was loaded
  // A checkpoint of a store without the rows does not load into one with them.
  Trainer plain(w0, b0, 1e-2, 2, false), with(w0, b0, 1e-2, 2, true);
  EXPECT_ERROR(with.window.load_state_dict(plain.window.state_dict()), "load_state_dict",
               "FP8 delayed scaling");
}

// Note [FP8 shared input]: a cast shared by two layers takes the first
// layer's x row (the second's stays unused); each layer's dy row its own.
// The first window equals current scaling's shared cast bit for bit.
TEST(Fp8DelayedScaling, a_shared_input_takes_the_first_layers_x_row) {
  Tensor w1 = requires_grad_(test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1));
  Tensor w2 = requires_grad_(test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1));
  optim::Optimizer opt(optim::SGDOptions(0.1));
  ParamStore store(std::vector<Tensor>{w1, w2}, ParamStoreOptions().moments(0));
  store.keep_fp8_delayed_scaling({w1, w2});
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(1));
  std::vector<float> x_amax;
  for (int w = 0; w < 2; ++w) {
    const Batch m = batch(2.0 + w);
    x_amax.push_back(amax_of(m.x));
    const Fp8Input x8 = fp8_input(m.x, {}, w1);
    if (w == 0) {  // calibrating: current scaling's codes
      const Fp8Input plain = fp8_input(m.x);
      EXPECT_TRUE(test::all_equal(x8.q, plain.q));
      EXPECT_TRUE(test::all_equal(x8.scale_inv, plain.scale_inv));
    }
    const Tensor y = fp8_linear(m.x, x8, w1) + fp8_linear(m.x, x8, w2);
    window.backward(Loss{sum(y * to_dtype(m.r, DType::bf16)),
                         full({}, static_cast<double>(kRows), DType::f64)});
    window.close();
  }
  const Tensor xs = store.fp8_delayed_scaling()->x_state();
  const Tensor dys = store.fp8_delayed_scaling()->dy_state();
  EXPECT_EQ(xs.select(0, 0).to_vector<float>()[3], x_amax[1]);  // w1's row: the shared cast's
  EXPECT_EQ(xs.select(0, 0).to_vector<float>()[4], x_amax[0]);
  EXPECT_EQ(xs.select(0, 1).to_vector<float>()[3], 0.0f);   // w2's x row: unused
  EXPECT_GT(dys.select(0, 0).to_vector<float>()[3], 0.0f);  // each layer's dy row: its own
  EXPECT_GT(dys.select(0, 1).to_vector<float>()[3], 0.0f);
  Fp8LinearOptions e5m2;
  e5m2.forward_dtype = DType::f8e5m2;
  EXPECT_ERROR(fp8_input(batch(1.0).x, e5m2, w1), "fp8_input", "delayed scaling", "f8e4m3");
}

TEST(Fp8DelayedScaling, misuses_are_errors) {
  Tensor w = requires_grad_(test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1));
  Tensor b = requires_grad_(test::random_normal({kOut}, DType::f32));
  ParamStore store(std::vector<Tensor>{w, b}, ParamStoreOptions().moments(0));
  const char* op = "keep_fp8_delayed_scaling";
  EXPECT_ERROR(store.keep_fp8_delayed_scaling({w}, Fp8DelayedOptions().history(0)), op,
               "history 0");
  EXPECT_ERROR(store.keep_fp8_delayed_scaling({w}, Fp8DelayedOptions().margin(7)), op, "margin 7");
  EXPECT_ERROR(
      store.keep_fp8_delayed_scaling({w}, Fp8DelayedOptions().dtypes(DType::bf16, DType::f8e5m2)),
      op, "bf16");
  EXPECT_ERROR(store.keep_fp8_delayed_scaling({w, w}), op, "given twice");
  EXPECT_ERROR(store.keep_fp8_delayed_scaling({test::random_normal({4})}), op);
  store.keep_fp8_delayed_scaling({w});
  EXPECT_ERROR(store.keep_fp8_delayed_scaling({w}), op, "already");
  EXPECT_EQ(store.memory().fp8, 2 * 4 * (3 + 16));  // x's row and dy's, history 16
  // The layer must ask for what the rows were made for.
  const Tensor x = test::random_normal({kRows, kIn}, DType::bf16);
  Fp8LinearOptions block;
  block.recipe = Fp8Recipe::block;
  EXPECT_ERROR(fp8_linear(x, w, b, block), "fp8_linear", "delayed scaling", "block");
  Fp8LinearOptions e4m3_grads;
  e4m3_grads.grad_dtype = DType::f8e4m3;
  EXPECT_ERROR(fp8_linear(x, w, b, e4m3_grads), "fp8_linear", "delayed scaling", "f8e5m2");
  // Asked for after the Window was built: its close refuses.
  Tensor w2 = requires_grad_(test::random_normal({kOut, kIn}, DType::f32, Device::cpu(), 0.1));
  optim::Optimizer opt(optim::SGDOptions(0.1));
  ParamStore late(std::vector<Tensor>{w2}, ParamStoreOptions().moments(0));
  optim::Window window(late, opt, optim::WindowOptions().micro_steps(1));
  late.keep_fp8_delayed_scaling({w2});
  window.backward(Loss{sum(to_dtype(fp8_linear(x, w2), DType::f32)),
                       full({}, static_cast<double>(kRows), DType::f64)});
  EXPECT_ERROR(window.close(), "Window::close", "keep_fp8_delayed_scaling");
}

}  // namespace
}  // namespace accrue
