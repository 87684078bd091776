// Note [Unused parameters] against PyTorch: a model whose branch is used in
// some windows only and whose expert sits unused for eleven windows, trained
// 20 windows of K = 3 micro-batches with AdamW (weight decay, amsgrad) in f64
// on the CPU, replayed from unused_parameters.safetensors
// (make_unused_golden.py):
//   UnusedParameters::skip           == torch, zero_grad(set_to_none=True);
//   UnusedParameters::step_with_zero == torch, zero_grad(set_to_none=False)
//     (every parameter has a gradient in window 0, so torch steps all of them
//     from then on, as accrue does);
// each within 1e-12 relative (max |a - b| / max |b| per parameter), every
// window; the final moments too, and under skip each parameter's own step
// count exactly. The two policies differ measurably, and a checkpoint taken
// under skip resumes bit-exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/ops.h"
#include "accrue/core/tensor_io.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

#ifndef ACCRUE_GOLDEN_DIR
#error "ACCRUE_GOLDEN_DIR must name the fixture directory (see tests/golden/CMakeLists.txt)"
#endif

namespace accrue {
namespace {

using optim::UnusedParameters;

constexpr double kRelTol = 1e-12;
const char* const kFile = ACCRUE_GOLDEN_DIR "/unused_parameters.safetensors";

#define ACCRUE_REQUIRE_UNUSED_FIXTURE()                                                 \
  do {                                                                                  \
    if (!std::filesystem::is_directory(ACCRUE_GOLDEN_DIR))                              \
      GTEST_SKIP() << "no golden fixtures at " ACCRUE_GOLDEN_DIR                        \
                      "; generate them with PyTorch: python3 "                          \
                      "tests/golden/make_unused_golden.py --out tests/golden/fixtures"; \
  } while (0)

struct Fixture {
  std::map<std::string, Tensor> t;
  std::map<std::string, std::string> meta;
  std::vector<std::string> names;
  int64_t windows = 0, K = 0, B = 0;

  Fixture() {
    ACCRUE_CHECK(std::filesystem::is_regular_file(kFile), "golden fixture ", kFile,
                 " is missing: regenerate it with tests/golden/make_unused_golden.py");
    t = load_safetensors(kFile, &meta);
    std::stringstream s(meta.at("names"));
    for (std::string n; std::getline(s, n, ',');)
      names.push_back(n);
    windows = std::stoll(meta.at("windows"));
    K = std::stoll(meta.at("micro_steps"));
    B = std::stoll(meta.at("batch"));
  }
  const Tensor& at(const std::string& key) const {
    auto it = t.find(key);
    ACCRUE_CHECK(it != t.end(), kFile, ": no tensor '", key, "'");
    return it->second;
  }
  double number(const std::string& key) const { return std::stod(meta.at(key)); }
  bool on(const std::string& schedule, int64_t w, int64_t k) const {
    return at(schedule).select(0, w).select(0, k).item() != 0.0;
  }
};

// One accrue run of the fixture's model under `policy`.
struct PolicyRun {
  const Fixture& f;
  std::map<std::string, Tensor> p;
  std::vector<NamedParameter> params;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<optim::Window> window;

  PolicyRun(const Fixture& fixture, UnusedParameters policy) : f(fixture) {
    for (const std::string& n : f.names) {
      Tensor x = f.at("init." + n).clone();
      requires_grad_(x);
      p[n] = x;
      params.push_back({n, x});
    }
    optimizer = std::make_unique<optim::Optimizer>(optim::AdamWOptions(f.number("lr"))
                                                       .betas(f.number("beta1"), f.number("beta2"))
                                                       .eps(f.number("eps"))
                                                       .weight_decay(f.number("weight_decay"))
                                                       .amsgrad(true));
    arena = std::make_unique<optim::ParamStore>(
        params, optim::ParamStoreOptions().master_dtype(DType::f64).moments(3));
    window = std::make_unique<optim::Window>(
        *arena, *optimizer, optim::WindowOptions().micro_steps(f.K).unused_parameters(policy));
  }

  // The model of make_unused_golden.py on micro-batch k of window w.
  Loss loss(int64_t w, int64_t k) {
    const Tensor x = f.at("x").select(0, w).select(0, k).contiguous();
    const Tensor y = f.at("y").select(0, w).select(0, k).contiguous();
    const Tensor h = tanh(linear(x, p["trunk.w"], p["trunk.b"]));
    Tensor out = linear(h, p["head.w"], p["head.b"]);
    if (f.on("branch_on", w, k))
      out = add(out, linear(tanh(linear(h, p["branch.w"], p["branch.b"])), p["branch.out.w"],
                            p["branch.out.b"]));
    if (f.on("expert_on", w, k))
      out = add(out, linear(tanh(linear(x, p["expert.w"], p["expert.b"])), p["expert.out.w"],
                            p["expert.out.b"]));
    const Tensor d = sub(out, y);
    return {sum(mul(d, d)), full({}, static_cast<double>(f.B), DType::i64)};
  }

  void train_window(int64_t w) {
    for (int64_t k = 0; k < f.K; ++k)
      window->backward(loss(w, k));
    window->close();
  }

  Tensor value(size_t i) const { return arena->master_view(i).clone(); }
  Tensor moment(int k, size_t i) const {
    const optim::ParamStore::Slot& s = arena->slots()[i];
    return arena->moment(k).narrow(0, s.offset, s.numel).reshape(s.shape);
  }
};

// max |a - b| / max |b|.
double rel_err(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Replays the fixture under `policy` against torch's run `r` ("skip" or "zero").
void check_against_torch(UnusedParameters policy, const std::string& r) {
  const Fixture f;
  PolicyRun run(f, policy);
  double worst_params = 0, worst_norm = 0, worst_state = 0;
  int64_t untouched = 0;
  for (int64_t w = 0; w < f.windows; ++w) {
    std::vector<Tensor> before;
    for (size_t i = 0; i < f.names.size(); ++i)
      before.push_back(run.value(i));
    run.train_window(w);
    const optim::WindowReport rep = run.window->report();
    const double torch_norm = f.at(r + ".grad_norm").select(0, w).item();
    const double norm_err = std::fabs(rep.grad_norm - torch_norm) / torch_norm;
    EXPECT_LE(norm_err, kRelTol) << "window " << w;
    worst_norm = std::max(worst_norm, norm_err);
    for (size_t i = 0; i < f.names.size(); ++i) {
      const std::string& n = f.names[i];
      const double e = rel_err(run.value(i), f.at(r + ".params." + n).select(0, w));
      EXPECT_LE(e, kRelTol) << n << " after window " << w;
      worst_params = std::max(worst_params, e);
      // Under skip a parameter of a window that did not use it is bitwise unchanged.
      const bool expert = n.rfind("expert", 0) == 0, branch = n.rfind("branch", 0) == 0;
      bool used = !expert && !branch;
      for (int64_t k = 0; k < f.K; ++k)
        used = used || (expert && f.on("expert_on", w, k)) || (branch && f.on("branch_on", w, k));
      if (policy == UnusedParameters::skip && !used) {
        EXPECT_TRUE(bitwise_equal(run.value(i), before[i])) << n << " in window " << w;
        ++untouched;
      }
    }
  }
  const char* moments[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  for (int k = 0; k < 3; ++k)
    for (size_t i = 0; i < f.names.size(); ++i) {
      const std::string key = r + "." + moments[k] + "." + f.names[i];
      const double e = rel_err(run.moment(k, i), f.at(key));
      EXPECT_LE(e, kRelTol) << key;
      worst_state = std::max(worst_state, e);
    }
  if (policy == UnusedParameters::skip) {
    const std::vector<int64_t> steps = run.window->parameter_steps();
    for (size_t i = 0; i < f.names.size(); ++i)
      EXPECT_EQ(static_cast<double>(steps[i]), f.at(r + ".step." + f.names[i]).item())
          << f.names[i];
    EXPECT_GT(untouched, 0);
  }
  EXPECT_EQ(run.window->report().optimizer_steps, f.windows);
  std::printf(
      "[unused golden] %s vs torch %s: worst param rel err %.3g, grad norm %.3g, moments %.3g "
      "(tolerance %.0e)%s\n",
      optim::unused_parameters_name(policy), r == "skip" ? "set_to_none=True" : "set_to_none=False",
      worst_params, worst_norm, worst_state, kRelTol,
      untouched > 0
          ? (", " + std::to_string(untouched) + " unused (param, window) pairs bitwise unchanged")
                .c_str()
          : "");
}

TEST(UnusedParametersGolden, skip_matches_torch_set_to_none) {
  ACCRUE_REQUIRE_UNUSED_FIXTURE();
  check_against_torch(UnusedParameters::skip, "skip");
}

TEST(UnusedParametersGolden, step_with_zero_matches_torch_zero_grad_without_none) {
  ACCRUE_REQUIRE_UNUSED_FIXTURE();
  check_against_torch(UnusedParameters::step_with_zero, "zero");
}

TEST(UnusedParametersGolden, the_two_policies_give_measurably_different_parameters) {
  ACCRUE_REQUIRE_UNUSED_FIXTURE();
  const Fixture f;
  PolicyRun skip(f, UnusedParameters::skip), zero(f, UnusedParameters::step_with_zero);
  for (int64_t w = 0; w < f.windows; ++w) {
    skip.train_window(w);
    zero.train_window(w);
  }
  double worst = 0;
  std::string where;
  for (size_t i = 0; i < f.names.size(); ++i) {
    const double e = rel_err(zero.value(i), skip.value(i));
    std::printf("[unused golden] %-13s step_with_zero vs skip after %lld windows: %.3g relative\n",
                f.names[i].c_str(), static_cast<long long>(f.windows), e);
    if (e > worst) {
      worst = e;
      where = f.names[i];
    }
  }
  // The expert sat unused for 11 windows: step_with_zero decayed it by
  // (1 - lr wd)^11 ~ 1.1% and moved it on its aging moments.
  EXPECT_GT(worst, 1e-3) << "the policies should differ measurably (worst at " << where << ")";
  EXPECT_GT(rel_err(zero.value(8), skip.value(8)), 1e-3) << "expert.w";
}

TEST(UnusedParametersGolden, a_checkpoint_under_skip_resumes_bit_exactly) {
  ACCRUE_REQUIRE_UNUSED_FIXTURE();
  const Fixture f;
  PolicyRun whole(f, UnusedParameters::skip), first(f, UnusedParameters::skip);
  constexpr int64_t kSaveAt = 7;  // inside the expert's unused stretch: counts differ per parameter
  for (int64_t w = 0; w < kSaveAt; ++w)
    first.train_window(w);
  const std::map<std::string, Tensor> saved = first.window->state_dict();
  ASSERT_EQ(saved.count("param_steps"), 1u);
  PolicyRun resumed(f, UnusedParameters::skip);
  resumed.window->load_state_dict(saved);
  EXPECT_EQ(resumed.window->parameter_steps(), first.window->parameter_steps());
  for (int64_t w = 0; w < f.windows; ++w) {
    whole.train_window(w);
    if (w >= kSaveAt) resumed.train_window(w);
  }
  for (size_t i = 0; i < f.names.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(resumed.value(i), whole.value(i))) << f.names[i];
    for (int k = 0; k < 3; ++k)
      EXPECT_TRUE(bitwise_equal(resumed.moment(k, i), whole.moment(k, i))) << f.names[i];
  }
  EXPECT_EQ(resumed.window->parameter_steps(), whole.window->parameter_steps());
  // The counts really are per parameter: the expert's lags the trunk's.
  const std::vector<int64_t> steps = whole.window->parameter_steps();
  EXPECT_EQ(steps[0], f.windows);
  EXPECT_LT(steps[8], f.windows);

  // A skip checkpoint does not load into a step_with_zero window (its counts
  // would be lost); a step_with_zero one loads into skip with the window's count.
  PolicyRun other(f, UnusedParameters::step_with_zero);
  EXPECT_ERROR(other.window->load_state_dict(saved), "Window::load_state_dict", "param_steps",
               "step_with_zero");
  const std::map<std::string, Tensor> plain = other.window->state_dict();
  EXPECT_EQ(plain.count("param_steps"), 0u);
  for (int64_t w = 0; w < 3; ++w)
    other.train_window(w);
  PolicyRun migrated(f, UnusedParameters::skip);
  migrated.window->load_state_dict(other.window->state_dict());
  EXPECT_EQ(migrated.window->parameter_steps(), std::vector<int64_t>(f.names.size(), 3));
}

TEST(UnusedParametersGolden, a_bad_policy_or_misuse_is_an_error) {
  ACCRUE_REQUIRE_UNUSED_FIXTURE();
  const Fixture f;
  PolicyRun run(f, UnusedParameters::step_with_zero);
  EXPECT_ERROR(
      optim::Window(*run.arena, *run.optimizer,
                    optim::WindowOptions().unused_parameters(static_cast<UnusedParameters>(7))),
      "Window", "unknown unused_parameters policy 7", "step_with_zero", "skip");
  EXPECT_ERROR(run.window->parameter_steps(), "Window::parameter_steps", "step_with_zero");
}

}  // namespace
}  // namespace accrue
