// The deferred index checks (Note [Deferred index checks]) exercised through a
// Window on one device: shared by the CPU tests (index_checks_test.cpp) and
// the CUDA ones (gpu_index_checks_test.cpp), which must behave the same.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue::test {

// Embedding(7, 4) -> Linear(4, 3) -> cross-entropy, AdamW, K = 2, clipping,
// in a window on `device`.
struct TinyTokenModel {
  static constexpr int64_t kVocab = 7, kClasses = 3;
  explicit TinyTokenModel(Device device, uint64_t seed = 11)
      : gen(seed),
        embedding(kVocab, 4, {device, DType::f32, &gen}, 0.5),
        linear(4, kClasses, true, {device, DType::f32, &gen}),
        opt(optim::AdamWOptions(1e-2).weight_decay(0.1)),
        arena(params(), optim::ParamStoreOptions().device(device)),
        window(arena, opt, optim::WindowOptions().micro_steps(2).max_grad_norm(1.0)),
        device_(device) {}

  std::vector<Tensor> params() const {
    std::vector<Tensor> p = embedding.parameters();
    for (const Tensor& t : linear.parameters())
      p.push_back(t);
    return p;
  }
  // A batch of 6 tokens and targets on the device (copied before any window work).
  Tensor tokens(std::vector<int64_t> v) const {
    return from_vector<int64_t>(v, {2, 3}).to(device_);
  }
  Tensor targets(std::vector<int64_t> v) const { return from_vector<int64_t>(v, {6}).to(device_); }
  Loss loss(const Tensor& tok, const Tensor& tgt) const {
    return cross_entropy(reshape(linear.forward(embedding.forward(tok)), {6, kClasses}), tgt);
  }
  void micro_step(const Tensor& tok, const Tensor& tgt) { window.backward(loss(tok, tgt)); }

  Generator gen;
  nn::Embedding embedding;
  nn::Linear linear;
  optim::Optimizer opt;
  optim::ParamStore arena;
  optim::Window window;

 private:
  Device device_;
};

// A window with a bad embedding index in its second micro-step: close() does
// not throw, the weights and moments stay bitwise, report() throws naming the
// op, the value, its position, the range, the window and the micro-step; the
// next report() shows the skip and the next clean window steps.
inline void bad_embedding_index_skips_the_window(Device device) {
  TinyTokenModel m(device);
  const Tensor good = m.tokens({0, 1, 2, 3, 4, 5}), bad = m.tokens({0, 1, 2, 9, 4, 5});
  const Tensor y = m.targets({0, 1, 2, 0, 1, 2});
  m.micro_step(good, y);
  m.micro_step(good, y);
  m.window.close();
  EXPECT_EQ(m.window.report().optimizer_steps, 1);
  const Tensor master = m.arena.master().clone(), m0 = m.arena.moment(0).clone(),
               m1 = m.arena.moment(1).clone();

  m.micro_step(good, y);
  m.micro_step(bad, y);  // the fault is only recorded: nothing synchronizes or throws
  m.window.close();
  EXPECT_TRUE(all_equal(m.arena.master(), master));
  EXPECT_TRUE(all_equal(m.arena.moment(0), m0));
  EXPECT_TRUE(all_equal(m.arena.moment(1), m1));
  EXPECT_ERROR(m.window.report(), "embedding", "index 9", "flat position 3", "shape [2, 3]",
               "out of range [0, 7)", "window 1", "micro-step 1", "skipped");
  const optim::WindowReport r = m.window.report();  // the record was cleared
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.skipped_windows, 1);
  EXPECT_EQ(r.optimizer_steps, 1);
  EXPECT_TRUE(std::isnan(r.items));
  EXPECT_NO_THROW(m.window.check());

  m.micro_step(good, y);
  m.micro_step(good, y);
  m.window.close();
  const optim::WindowReport next = m.window.report();
  EXPECT_FALSE(next.skipped);
  EXPECT_EQ(next.items, 12.0);
  EXPECT_EQ(next.optimizer_steps, 2);
  EXPECT_FALSE(all_equal(m.arena.master(), master));
}

// The first fault in call order is the one reported (a bad target in
// micro-step 0 before a bad index in micro-step 1); check() raises it before
// the window closes; the fused classifier's targets are deferred too.
inline void first_fault_in_call_order_is_reported(Device device) {
  TinyTokenModel m(device);
  const Tensor good = m.tokens({0, 1, 2, 3, 4, 5}), bad = m.tokens({6, 1, 2, 3, 4, -2});
  const Tensor y = m.targets({0, 1, 2, 0, 1, 2}), bad_y = m.targets({0, 1, -100, 0, 3, 2});
  m.micro_step(good, bad_y);
  m.micro_step(bad, y);
  EXPECT_ERROR(m.window.check(), "cross_entropy", "target 3", "flat position 4",
               "out of range [0, 3) and not ignore_index -100", "window 0", "micro-step 0");
  m.window.close();
  EXPECT_TRUE(m.window.report().skipped);  // the bad index of micro-step 1 was not kept

  // The fused classifier (weight [V_padded = 4, 4], 3 valid classes).
  NoGradGuard no_grad;
  const Tensor hidden = random_normal({6, 4}, DType::f32, device);
  const Tensor weight = random_normal({4, 4}, DType::f32, device);
  EXPECT_NO_THROW(classifier_cross_entropy(hidden, weight, m.targets({0, 1, 2, 3, 0, 1}), 3));
  EXPECT_ERROR(m.window.check(), "classifier_forward", "target 3", "flat position 3",
               "out of range [0, 3)", "window 1", "micro-step 0");
}

// While a Window lives the direct kernel call defers; once it is gone the
// same call throws at once.
inline void outside_a_window_the_check_is_eager(Device device) {
  const Tensor weight = random_normal({5, 2}, DType::f32, device);
  const Tensor idx = from_vector<int64_t>({1, 7}, {2}).to(device);
  {
    TinyTokenModel m(device);
    EXPECT_NO_THROW(kernels::embedding(weight, idx));
    EXPECT_ERROR(m.window.check(), "embedding", "index 7", "[0, 5)");
  }
  EXPECT_ERROR(kernels::embedding(weight, idx), "embedding", "index 7", "flat position 1",
               "out of range [0, 5)");
}

}  // namespace accrue::test
