// Note [Unused parameters]: a parameter no gradient reached is named, once by
// default (warn), as an error (error), or not at all (ignore); the stepping
// semantics stay those of UnusedParameters.
#include <gmock/gmock.h>

#include <algorithm>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Parameters "p0".."p{n-1}" of 3 ones each; the loss reaches the first `used` only.
struct Model {
  std::vector<NamedParameter> params;
  explicit Model(int n) {
    for (int i = 0; i < n; ++i)
      params.push_back({detail::str_cat("p", i), requires_grad_(full({3}, 1.0, DType::f64))});
  }
  Loss loss(int used) const {
    Tensor s = sum(params[0].tensor);
    for (int i = 1; i < used; ++i)
      s = s + sum(params[i].tensor);
    return {s, full({}, 1.0, DType::i64)};
  }
};

optim::ParamStore make_store(const Model& m) {
  return optim::ParamStore(m.params, optim::ParamStoreOptions().master_dtype(DType::f64));
}

// A one-rank GradientSync: the Window then checks the world's flags at report().
class OneRankSync final : public optim::GradientSync {
 public:
  void before_backward(int64_t, int64_t) override {}
  void finish(const Tensor&) override {}
};

TEST(UnusedParameterCheck, warn_is_the_default_and_says_it_once_naming_them) {
  EXPECT_EQ(optim::WindowOptions().unused_parameter_check(), optim::UnusedParameterCheck::warn);
  Model m(3);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::AdamWOptions(0.1).weight_decay(0.5));
  std::vector<std::string> lines;
  optim::Window window(store, opt,
                       optim::WindowOptions().unused_parameter_log(
                           [&](const std::string& l) { lines.push_back(l); }));
  for (int w = 0; w < 3; ++w) {
    window.backward(m.loss(1));
    window.close();
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("2 of 3 parameters got no gradient in window 1: 'p1', 'p2'"));
  EXPECT_THAT(lines[0], Not(HasSubstr("'p0'")));
  EXPECT_THAT(lines[0], HasSubstr("step_with_zero"));
  EXPECT_THAT(lines[0], HasSubstr("UnusedParameterCheck::ignore"));
  // Today's semantics, unchanged: the unused parameter decays (three windows).
  const double decayed = (1.0 - 0.05) * (1.0 - 0.05) * (1.0 - 0.05);
  for (double v : store.master_view(1).to_vector<double>())
    EXPECT_DOUBLE_EQ(v, decayed);
}

TEST(UnusedParameterCheck, warn_goes_to_stderr_without_a_log_and_not_when_all_are_used) {
  Model m(2);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::Window window(store, opt, optim::WindowOptions());
  testing::internal::CaptureStderr();
  window.backward(m.loss(2));
  window.close();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  window.backward(m.loss(1));
  window.close();
  window.backward(m.loss(1));
  window.close();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("1 of 2 parameters got no gradient in window 2: 'p1'"));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1);
}

TEST(UnusedParameterCheck, many_names_are_cut_after_ten) {
  Model m(16);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::SGDOptions(0.1));
  std::string line;
  optim::Window window(store, opt,
                       optim::WindowOptions().unused_parameter_log([&](auto& l) { line = l; }));
  window.backward(m.loss(1));
  window.close();
  EXPECT_THAT(line, HasSubstr("15 of 16 parameters got no gradient"));
  EXPECT_THAT(line, HasSubstr("'p1', 'p2'"));
  EXPECT_THAT(line, HasSubstr("'p10' and 5 more"));
  EXPECT_THAT(line, Not(HasSubstr("'p11'")));
}

TEST(UnusedParameterCheck, error_throws_at_the_close_before_anything_steps) {
  Model m(3);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::AdamWOptions(0.1).weight_decay(0.5));
  optim::Window window(
      store, opt,
      optim::WindowOptions().unused_parameter_check(optim::UnusedParameterCheck::error));
  window.backward(m.loss(3));
  window.close();  // every parameter used: no error
  const std::vector<double> before = store.master().to_vector<double>();
  window.backward(m.loss(2));
  EXPECT_ERROR(window.close(), "Window::close", "1 of 3 parameters got no gradient in window 2",
               "'p2'", "UnusedParameterCheck::error", "nothing was stepped");
  EXPECT_EQ(store.master().to_vector<double>(), before);
  EXPECT_TRUE(window.ready());
  EXPECT_EQ(window.windows_closed(), 1);
  // Under skip the message says the parameter would have been left unchanged.
  Model s(2);
  optim::ParamStore skip_store = make_store(s);
  optim::Window skipping(skip_store, opt,
                         optim::WindowOptions()
                             .unused_parameters(optim::UnusedParameters::skip)
                             .unused_parameter_check(optim::UnusedParameterCheck::error));
  skipping.backward(s.loss(1));
  EXPECT_ERROR(skipping.close(), "'p1'", "UnusedParameters::skip leaves them unchanged");
}

TEST(UnusedParameterCheck, ignore_says_nothing) {
  Model m(2);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::SGDOptions(0.1));
  int calls = 0;
  optim::Window window(store, opt,
                       optim::WindowOptions()
                           .unused_parameter_check(optim::UnusedParameterCheck::ignore)
                           .unused_parameter_log([&](auto&) { ++calls; }));
  testing::internal::CaptureStderr();
  window.backward(m.loss(1));
  window.close();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(window.report().optimizer_steps, 1);
  EXPECT_EQ(optim::unused_parameter_check_name(optim::UnusedParameterCheck::ignore),
            std::string("ignore"));
  EXPECT_ERROR(optim::Window(store, opt,
                             optim::WindowOptions().unused_parameter_check(
                                 static_cast<optim::UnusedParameterCheck>(7))),
               "unused_parameter_check", "7");
}

TEST(UnusedParameterCheck, under_a_sync_the_worlds_flags_are_checked_at_report) {
  for (auto unused : {optim::UnusedParameters::step_with_zero, optim::UnusedParameters::skip}) {
    Model m(3);
    optim::ParamStore store = make_store(m);
    optim::Optimizer opt(optim::SGDOptions(0.1));
    OneRankSync sync;
    std::vector<std::string> lines;
    optim::Window window(store, opt,
                         optim::WindowOptions().unused_parameters(unused).unused_parameter_log(
                             [&](auto& l) { lines.push_back(l); }),
                         &sync);
    EXPECT_THAT(window.describe_close(), HasSubstr("unused flags"));
    window.backward(m.loss(2));
    window.close();
    EXPECT_TRUE(lines.empty());  // the host does not know the world's flags at close
    window.report();
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_THAT(lines[0], HasSubstr("1 of 3 parameters got no gradient in window 1: 'p2'"));
    window.report();
    EXPECT_EQ(lines.size(), 1u);

    Model m2(3);
    optim::ParamStore store2 = make_store(m2);
    optim::Window strict(store2, opt,
                         optim::WindowOptions().unused_parameters(unused).unused_parameter_check(
                             optim::UnusedParameterCheck::error),
                         &sync);
    strict.backward(m2.loss(1));
    strict.close();
    EXPECT_ERROR(strict.report(), "Window::check", "2 of 3", "'p1', 'p2'", "has stepped");
  }
  // ignore adds no stage: the close is as before the check existed.
  Model m(2);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::SGDOptions(0.1));
  OneRankSync sync;
  optim::Window quiet(
      store, opt,
      optim::WindowOptions().unused_parameter_check(optim::UnusedParameterCheck::ignore), &sync);
  EXPECT_THAT(quiet.describe_close(), Not(HasSubstr("unused flags")));
}

// The two failures together: a parameter reached only through copies
// (a transposed weight made contiguous, cast to f32 and back) used to get a
// detached copy and no gradient, silently. Now the copies carry it, and the
// strict check confirms every parameter was reached.
TEST(UnusedParameterCheck, parameters_reached_through_copies_are_used) {
  Model m(2);
  optim::ParamStore store = make_store(m);
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::Window window(
      store, opt,
      optim::WindowOptions().unused_parameter_check(optim::UnusedParameterCheck::error));
  const Tensor& a = m.params[0].tensor;
  const Tensor& b = m.params[1].tensor;
  const Tensor t = contiguous(transpose(unsqueeze(a, 0), 0, 1));  // [3, 1]
  const Tensor s =
      sum(to_dtype(to_dtype(t, DType::f32), DType::f64)) + sum(clone(to_device(b, Device::cpu())));
  window.backward({s, full({}, 1.0, DType::i64)});
  window.close();
  for (size_t i = 0; i < store.size(); ++i)
    for (double v : store.master_view(i).to_vector<double>())
      EXPECT_DOUBLE_EQ(v, 1.0 - 0.1) << i;
}

}  // namespace
}  // namespace accrue
