// Note [Accumulation verifier]: PASS for accrue's Window and for a correct
// hand-written loop; FAIL for each classic mistake, planted here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/verify.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

constexpr int64_t kBatch = 16, kFeatures = 6, kClasses = 4, kIgnore = -100;

// Window w's global batch: later items are padding more often, so the
// micro-batches hold different numbers of counted items.
struct Data {
  Tensor x, y;
};
Data window_data(int64_t w) {
  Generator gen(1000 + static_cast<uint64_t>(w));
  Tensor x = randn({kBatch, kFeatures}, DType::f64, Device::cpu(), &gen);
  std::vector<int64_t> y =
      randint(0, kClasses, {kBatch}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  for (int64_t i = 0; i < kBatch; ++i)
    if (i % 4 != 0 && i >= kBatch / 2) y[static_cast<size_t>(i)] = kIgnore;
  return {x, from_vector<int64_t>(y, {kBatch})};
}

// The items a window counts (what a correct loop divides by).
int64_t counted(int64_t w) {
  int64_t n = 0;
  for (int64_t v : window_data(w).y.to_vector<int64_t>())
    n += v != kIgnore;
  return n;
}

struct Model {
  Model() : gen(7), linear(kFeatures, kClasses, true, {Device::cpu(), DType::f64, &gen}) {}
  Loss loss(int64_t w, int64_t begin, int64_t end) const {
    const Data d = window_data(w);
    return cross_entropy(linear.forward(d.x.narrow(0, begin, end - begin)),
                         d.y.narrow(0, begin, end - begin), kIgnore);
  }
  std::vector<double> flat() const {
    std::vector<double> out;
    for (const Tensor& p : linear.parameters())
      for (double v : p.to_vector<double>())
        out.push_back(v);
    return out;
  }
  Generator gen;
  nn::Linear linear;
};

// accrue's Window, with the normalization under test.
class WindowRun : public optim::VerifyRun {
 public:
  WindowRun(int64_t K, kernels::Normalization n)
      : opt(optim::AdamWOptions(0.05)),
        arena(model.linear.named_parameters(), optim::ParamStoreOptions().master_dtype(DType::f64)),
        window(arena, opt,
               optim::WindowOptions().micro_steps(K).max_grad_norm(0.5).normalization(n)) {}
  void micro_step(int64_t w, int64_t begin, int64_t end) override {
    window.backward(model.loss(w, begin, end));
  }
  void close() override { window.close(); }
  std::vector<double> parameters() const override { return model.flat(); }

  Model model;
  optim::Optimizer opt;
  optim::ParamStore arena;
  optim::Window window;
};

// A hand-written loop over .grad with SGD and clipping at 0.5, correct unless
// a mistake is planted.
enum class Mistake { None, ClipPerMicroBatch, NormalizedTwice, ZeroEveryMicroStep };

class ManualRun : public optim::VerifyRun {
 public:
  ManualRun(int64_t K, Mistake m) : K_(K), mistake_(m) {
    for (const Tensor& p : model.linear.parameters())
      requires_grad_(p);
  }
  void micro_step(int64_t w, int64_t begin, int64_t end) override {
    const std::vector<Tensor> params = model.linear.parameters();
    std::vector<Tensor> before;
    if (mistake_ == Mistake::ZeroEveryMicroStep) {
      for (const Tensor& p : params)
        clear_grad(p);
    }
    if (mistake_ == Mistake::ClipPerMicroBatch) {  // this micro-batch's gradient on its own
      for (const Tensor& p : params) {
        before.push_back(grad(p).defined() ? grad(p).clone() : zeros(p.shape(), DType::f64));
        clear_grad(p);
      }
    }
    const Loss loss = model.loss(w, begin, end);
    double divide = static_cast<double>(counted(w));  // the window's items: the large batch's mean
    if (mistake_ == Mistake::NormalizedTwice) divide *= static_cast<double>(K_);
    accrue::backward(mul(loss.sum, 1.0 / divide));
    if (mistake_ == Mistake::ClipPerMicroBatch) {
      clip(params);
      NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i)
        set_grad(params[i], kernels::binary(kernels::BinaryOp::Add, grad(params[i]), before[i]));
    }
  }
  void close() override {
    const std::vector<Tensor> params = model.linear.parameters();
    if (mistake_ != Mistake::ClipPerMicroBatch) clip(params);
    NoGradGuard no_grad;
    for (const Tensor& p : params) {
      kernels::axpy_(p, -0.1, grad(p));
      clear_grad(p);
    }
  }
  std::vector<double> parameters() const override { return model.flat(); }

 private:
  // torch.nn.utils.clip_grad_norm_(params, 0.5) over the gradients held now.
  static void clip(const std::vector<Tensor>& params) {
    double sumsq = 0.0;
    for (const Tensor& p : params)
      for (double v : grad(p).to_vector<double>())
        sumsq += v * v;
    const double coef = std::min(1.0, 0.5 / (std::sqrt(sumsq) + 1e-6));
    NoGradGuard no_grad;
    for (const Tensor& p : params)
      set_grad(p, kernels::binary_scalar(kernels::BinaryOp::Mul, grad(p), coef));
  }

  Model model;
  int64_t K_;
  Mistake mistake_;
};

optim::VerifyReport verify(const optim::VerifyFactory& make, const char* name) {
  optim::VerifyOptions o;
  o.windows = 6;
  o.micro_steps = 4;
  o.batch = kBatch;
  o.tolerance = optim::VerifyOptions::tolerance_for(DType::f64);
  const optim::VerifyReport r = optim::verify_accumulation(make, o);
  std::printf("[verify] %s: worst window %.3g -> %s\n", name,
              *std::max_element(r.parameter_error.begin(), r.parameter_error.end()),
              r.passed ? "PASS" : "FAIL");
  return r;
}

TEST(Verify, the_window_passes_and_each_planted_mistake_fails) {
  using kernels::Normalization;
  EXPECT_TRUE(
      verify([](int64_t K) { return std::make_unique<WindowRun>(K, Normalization::ItemCount); },
             "Window, item count")
          .passed);
  EXPECT_TRUE(verify([](int64_t K) { return std::make_unique<ManualRun>(K, Mistake::None); },
                     "hand-written loop")
                  .passed);
  const optim::VerifyReport means = verify(
      [](int64_t K) {
        return std::make_unique<WindowRun>(K, Normalization::MeanOfMicroBatchMeans);
      },
      "mean of micro-batch means over padded batches");
  EXPECT_FALSE(means.passed);
  EXPECT_NE(means.table().find("FAIL"), std::string::npos);
  for (auto [mistake, name] :
       {std::pair{Mistake::ClipPerMicroBatch, "clipping per micro-batch"},
        std::pair{Mistake::NormalizedTwice, "loss normalized twice"},
        std::pair{Mistake::ZeroEveryMicroStep, "gradients zeroed every micro-step"}}) {
    const Mistake m = mistake;
    EXPECT_FALSE(verify([m](int64_t K) { return std::make_unique<ManualRun>(K, m); }, name).passed)
        << name;
  }
}

TEST(Verify, bad_options_and_runs_are_errors) {
  auto make = [](int64_t K) { return std::make_unique<ManualRun>(K, Mistake::None); };
  optim::VerifyOptions o;
  o.micro_steps = 3;  // 16 items do not split in 3
  EXPECT_ERROR(optim::verify_accumulation(make, o), "verify_accumulation", "K = 3");
  o.micro_steps = 1;
  EXPECT_ERROR(optim::verify_accumulation(make, o), "verify_accumulation", "K = 1");
  EXPECT_ERROR(optim::VerifyOptions::tolerance_for(DType::i64), "tolerance_for", "i64");
}

}  // namespace
}  // namespace accrue
