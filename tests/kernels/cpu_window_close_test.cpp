// The CPU window close (kernels/window_close.h): norm partials, the scalar
// step (found_inf, norm, clip, coefficient, loss scale, step count) and the
// fused optimizer step, against an independent per-element reference written
// here in f64 from the pseudo-code of PyTorch's documentation (torch.optim.SGD,
// Adam, AdamW), GradScaler's update and clip_grad_norm_. Several windows in a
// row, every optimizer state compared after each.
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "accrue/kernels/window_close.h"
#include "tests/kernels/optimizer_kinds.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using namespace kernels;  // NOLINT: the window-close names read better unqualified here
using ::testing::HasSubstr;

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

double field(const Tensor& state, WindowField f) {
  return state.to_vector<double>()[f];
}
void set_field(const Tensor& state, WindowField f, double value) {
  state.narrow(0, f, 1).fill_(value);
}

// Same dtype, shape and bytes: what "bitwise unchanged" means.
::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  if (x.dtype() != y.dtype() || x.shape() != y.shape())
    return ::testing::AssertionFailure() << "dtype or shape differs";
  if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// Within rtol of each element or rtol of the largest element: a rounding
// difference in a sum like b1 m + (1 - b1) g is an ulp of its largest term,
// which can be far more than an ulp of a result that cancelled.
::testing::AssertionResult close_at_scale(const Tensor& actual, const Tensor& expected,
                                          double rtol) {
  double scale = 0;
  for (double x : expected.to_vector<double>())
    scale = std::max(scale, std::fabs(x));
  return test::all_close(actual, expected, rtol, rtol * scale);
}

Tensor partials_of(const std::vector<double>& rows) {
  return from_vector<double>(rows, {static_cast<int64_t>(rows.size() / 2), 2}, DType::f64);
}

// ---- the independent reference ------------------------------------------------------------

struct Reference {
  std::vector<double> p, m, v, vmax;
  int64_t t = 0;
};

// One optimizer step on the already unscaled, normalized and clipped gradient,
// written from the pseudo-code of PyTorch's docs.
void reference_step(const OptimizerConfig& c, const std::vector<int32_t>& chunk_groups,
                    const std::vector<double>& grad, Reference& r) {
  r.t += 1;
  const double t = static_cast<double>(r.t);
  for (size_t i = 0; i < r.p.size(); ++i) {
    const GroupHyper& h = c.groups[chunk_groups[i / kChunk]];
    double g = grad[i];
    double& theta = r.p[i];
    if (!c.adam) {
      if (h.weight_decay != 0) g += h.weight_decay * theta;
      if (c.momentum != 0) {
        r.m[i] = r.t > 1 ? c.momentum * r.m[i] + (1 - c.dampening) * g : g;
        g = c.nesterov ? g + c.momentum * r.m[i] : r.m[i];
      }
      theta -= h.lr * g;
      continue;
    }
    if (c.decoupled_weight_decay) {
      theta -= h.lr * h.weight_decay * theta;
    } else if (h.weight_decay != 0) {
      g += h.weight_decay * theta;
    }
    r.m[i] = c.beta1 * r.m[i] + (1 - c.beta1) * g;
    r.v[i] = c.beta2 * r.v[i] + (1 - c.beta2) * g * g;
    const double m_hat = r.m[i] / (1 - std::pow(c.beta1, t));
    double v_used = r.v[i];
    if (c.amsgrad) {
      r.vmax[i] = std::max(r.vmax[i], r.v[i]);
      v_used = r.vmax[i];
    }
    const double v_hat = v_used / (1 - std::pow(c.beta2, t));
    theta -= h.lr * m_hat / (std::sqrt(v_hat) + c.eps);
  }
}

// GradScaler's unscale, the 1/N normalization and clip_grad_norm_ on the raw
// (scaled, summed) gradient: the gradient the optimizer should see, and the clip
// coefficient.
std::vector<double> reference_gradient(const std::vector<double>& raw, double scale, double items,
                                       double max_norm, double* clip_out) {
  std::vector<double> g(raw.size());
  double sumsq = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    g[i] = raw[i] / scale / items;
    sumsq += g[i] * g[i];
  }
  const double norm = std::sqrt(sumsq);
  const double clip = max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
  for (double& x : g)
    x *= clip;
  *clip_out = clip;
  return g;
}

// ---- an arena and one window close ----------------------------------------------------------

struct Arena {
  OptimizerBuffers b;
  std::vector<int32_t> groups;
};

// n elements of dtype with every optimizer buffer, a bf16 compute copy, and
// chunks dealt to `groups` groups in an uneven pattern.
Arena make_arena(int64_t n, DType dtype, int groups) {
  Arena a;
  a.b.params = test::random_normal({n}, dtype);
  a.b.grads = test::random_normal({n}, dtype);
  a.b.exp_avg = test::random_normal({n}, dtype, Device::cpu(), 0.1);
  a.b.exp_avg_sq = test::random_uniform({n}, 0.01, 0.1, dtype);
  a.b.max_exp_avg_sq = test::random_uniform({n}, 0.01, 0.1, dtype);
  a.b.compute = empty({n}, DType::bf16);
  test::poison(a.b.compute);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  for (int64_t c = 0; c < chunks; ++c)
    a.groups.push_back(static_cast<int32_t>((c * 7 / 3) % groups));
  a.b.chunk_groups = from_vector<int32_t>(a.groups, {chunks}, DType::i32);
  return a;
}

// Close a window whose raw gradients are `raw` (written into the arena): norm
// partials, scalar step, fused step.
void close_window(const Arena& a, const Tensor& raw, const Tensor& state, double items,
                  const CloseConfig& close, const OptimizerConfig& opt) {
  a.b.grads.copy_(raw);
  const Tensor partials = empty({norm_partials_rows(a.b.grads), 2}, DType::f64);
  test::poison(partials);
  grad_norm_partials(a.b.grads, partials);
  set_field(state, kItems, items);
  window_scalar_step(partials, state, close);
  fused_optimizer_step(opt, a.b, state);
}

OptimizerConfig sgd(double momentum, double dampening, bool nesterov) {
  OptimizerConfig c;
  test::set_kind(c, test::Kind::SGD);
  c.momentum = momentum;
  c.dampening = dampening;
  c.nesterov = nesterov;
  c.groups = {{0.05, 0.0}, {0.02, 0.01}};
  return c;
}

OptimizerConfig adam(test::Kind kind, bool amsgrad) {
  OptimizerConfig c;
  test::set_kind(c, kind);
  c.amsgrad = amsgrad;
  c.beta1 = 0.8;
  c.beta2 = 0.95;
  c.eps = 1e-6;
  c.groups = {{1e-2, 0.1}, {3e-3, 0.0}};
  return c;
}

struct Variant {
  std::string name;
  OptimizerConfig config;
};

std::vector<Variant> all_variants() {
  return {{"sgd", sgd(0, 0, false)},
          {"sgd_momentum", sgd(0.9, 0, false)},
          {"sgd_momentum_dampening", sgd(0.9, 0.3, false)},
          {"sgd_nesterov", sgd(0.9, 0, true)},
          {"adam", adam(test::Kind::Adam, false)},
          {"adam_amsgrad", adam(test::Kind::Adam, true)},
          {"adamw", adam(test::Kind::AdamW, false)},
          {"adamw_amsgrad", adam(test::Kind::AdamW, true)}};
}

// ---- make_window_state and the norm partials ------------------------------------------------

TEST(CpuWindowClose, fresh_state_is_zero_but_the_scale) {
  const Tensor state = make_window_state(65536.0, Device::cpu());
  ASSERT_EQ(state.dtype(), DType::f64);
  ASSERT_EQ(state.shape(), Shape{kWindowStateSize});
  const std::vector<double> s = state.to_vector<double>();
  for (int i = 0; i < kWindowStateSize; ++i)
    EXPECT_EQ(s[i], i == kScale ? 65536.0 : 0.0) << "field " << i;
}

TEST(CpuWindowClose, norm_partials_equal_an_f64_sum_over_the_arena) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (int64_t n : {1, 7, 1000, 100003}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      const Tensor g = test::random_normal({n}, dt, Device::cpu(), 3.0);
      const int64_t rows = norm_partials_rows(g);
      ASSERT_GE(rows, 1);
      const Tensor partials = empty({rows, 2}, DType::f64);
      test::poison(partials);
      grad_norm_partials(g, partials);
      double expected = 0;
      for (double x : g.to_vector<double>())
        expected += x * x;
      const std::vector<double> p = partials.to_vector<double>();
      double sumsq = 0, nonfinite = 0;
      for (int64_t r = 0; r < rows; ++r) {
        sumsq += p[2 * r];
        nonfinite += p[2 * r + 1];
      }
      EXPECT_NEAR(sumsq, expected, 1e-12 * expected);
      EXPECT_EQ(nonfinite, 0.0);
    }
  }
}

TEST(CpuWindowClose, norm_partials_count_every_non_finite_element) {
  for (DType dt : {DType::f32, DType::f64}) {
    std::vector<double> v = test::random_normal({500}, DType::f64).to_vector<double>();
    v[3] = kInf;
    v[100] = -kInf;
    v[499] = kNaN;
    const Tensor g = from_vector<double>(v, {500}, dt);
    const Tensor partials = empty({norm_partials_rows(g), 2}, DType::f64);
    grad_norm_partials(g, partials);
    const std::vector<double> p = partials.to_vector<double>();
    double nonfinite = 0;
    for (size_t r = 0; r < p.size() / 2; ++r)
      nonfinite += p[2 * r + 1];
    EXPECT_EQ(nonfinite, 3.0) << dtype_name(dt);
  }
}

// ---- the scalar step ---------------------------------------------------------------------

CloseConfig dynamic_close(double max_norm, int64_t growth_interval = 2000) {
  CloseConfig c;
  test::set_dynamic_scaler(c.scaler);
  c.scaler.growth_interval = growth_interval;
  c.max_norm = max_norm;
  return c;
}

TEST(CpuWindowClose, clip_is_max_norm_over_norm_plus_eps_only_above_max_norm) {
  // sumsq split over two rows; norm = sqrt(sumsq) / scale / N.
  const double scale = 1024, items = 37, sumsq = 2.5e12;
  const double norm = std::sqrt(sumsq) / scale / items;  // about 41.7
  for (double max_norm : {10.0, 41.0, 42.0, 1000.0, 0.0}) {
    SCOPED_TRACE("max_norm=" + std::to_string(max_norm));
    const Tensor state = make_window_state(scale, Device::cpu());
    set_field(state, kItems, items);
    window_scalar_step(partials_of({1e12, 0, 1.5e12, 0}), state, dynamic_close(max_norm));
    const double clip = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
    EXPECT_NEAR(field(state, kGradNorm), norm, 1e-14 * norm);
    EXPECT_NEAR(field(state, kClipCoef), clip, 1e-15);
    EXPECT_NEAR(field(state, kCoef), clip / scale / items, 1e-15 * clip / scale / items);
    EXPECT_EQ(field(state, kFoundInf), 0.0);
    EXPECT_EQ(field(state, kStep), 1.0);
    EXPECT_EQ(field(state, kItems), items) << "kItems is the caller's to reset";
  }
}

TEST(CpuWindowClose, mean_of_means_divides_by_the_micro_steps) {
  CloseConfig c = dynamic_close(0.0);
  c.normalization = Normalization::MeanOfMicroBatchMeans;
  c.micro_steps = 4;
  const Tensor state = make_window_state(8.0, Device::cpu());
  set_field(state, kItems, 1000.0);  // ignored in this mode
  window_scalar_step(partials_of({64.0, 0}), state, c);
  EXPECT_DOUBLE_EQ(field(state, kGradNorm), 8.0 / 8.0 / 4.0);
  EXPECT_DOUBLE_EQ(field(state, kCoef), 1.0 / 8.0 / 4.0);
}

TEST(CpuWindowClose, a_window_without_items_steps_with_coefficient_zero) {
  const Tensor state = make_window_state(8.0, Device::cpu());
  window_scalar_step(partials_of({64.0, 0}), state, dynamic_close(1.0));
  EXPECT_EQ(field(state, kFoundInf), 0.0);
  EXPECT_EQ(field(state, kCoef), 0.0);
  EXPECT_EQ(field(state, kGradNorm), 0.0);
  EXPECT_EQ(field(state, kStep), 1.0);
}

TEST(CpuWindowClose, non_finite_window_is_skipped_and_the_scale_backs_off) {
  for (const std::vector<double>& rows :
       {std::vector<double>{5.0, 0, 7.0, 2.0}, std::vector<double>{kInf, 0, 1.0, 0},
        std::vector<double>{kNaN, 0}}) {
    const Tensor state = make_window_state(1024.0, Device::cpu());
    set_field(state, kItems, 10);
    set_field(state, kStep, 5);
    set_field(state, kGrowthTracker, 17);
    window_scalar_step(partials_of(rows), state, dynamic_close(1.0));
    EXPECT_EQ(field(state, kFoundInf), 1.0);
    EXPECT_EQ(field(state, kSkippedWindows), 1.0);
    EXPECT_EQ(field(state, kStep), 5.0);
    EXPECT_EQ(field(state, kScale), 512.0);
    EXPECT_EQ(field(state, kGrowthTracker), 0.0);
    EXPECT_EQ(field(state, kCoef), 0.0);
  }
}

// max_scale = inf is no cap (torch.amp.GradScaler has none); the default caps
// at 2^24.
TEST(CpuWindowClose, an_infinite_max_scale_lets_the_scale_grow_past_the_default_cap) {
  for (double cap : {16777216.0, std::numeric_limits<double>::infinity()}) {
    CloseConfig c = dynamic_close(0.0, 1);
    c.scaler.max_scale = cap;
    const Tensor state = make_window_state(16777216.0, Device::cpu());
    set_field(state, kItems, 1);
    window_scalar_step(partials_of({1.0, 0}), state, c);
    EXPECT_EQ(field(state, kScale), std::isinf(cap) ? 33554432.0 : 16777216.0) << cap;
  }
  EXPECT_EQ(ScalerConfig{}.max_scale, 16777216.0);
}

TEST(CpuWindowClose, scale_grows_after_growth_interval_clean_windows_within_bounds) {
  CloseConfig c = dynamic_close(0.0, 3);
  c.scaler.max_scale = 4096;
  c.scaler.min_scale = 256;
  const Tensor state = make_window_state(1024.0, Device::cpu());
  set_field(state, kItems, 1);
  const Tensor clean = partials_of({1.0, 0}), bad = partials_of({1.0, 1.0});
  const double expected_scale[] = {1024, 1024, 2048, 2048, 2048, 4096, 4096, 4096, 4096};
  const double expected_tracker[] = {1, 2, 0, 1, 2, 0, 1, 2, 0};
  for (int w = 0; w < 9; ++w) {
    window_scalar_step(clean, state, c);
    EXPECT_EQ(field(state, kScale), expected_scale[w]) << "window " << w;
    EXPECT_EQ(field(state, kGrowthTracker), expected_tracker[w]) << "window " << w;
  }
  EXPECT_EQ(field(state, kStep), 9.0);
  // Back off down to min_scale and no further.
  for (double expected : {2048.0, 1024.0, 512.0, 256.0, 256.0}) {
    window_scalar_step(bad, state, c);
    EXPECT_EQ(field(state, kScale), expected);
  }
  EXPECT_EQ(field(state, kSkippedWindows), 5.0);
  EXPECT_EQ(field(state, kStep), 9.0);
}

TEST(CpuWindowClose, static_and_no_scaler_keep_the_scale) {
  for (bool scaled : {true, false}) {  // a static scaler, then none
    CloseConfig c;
    c.scaler.scaled = scaled;
    c.scaler.growth_interval = 1;
    const Tensor state = make_window_state(128.0, Device::cpu());
    set_field(state, kItems, 2);
    window_scalar_step(partials_of({16.0, 0}), state, c);
    const double used = scaled ? 128.0 : 1.0;
    EXPECT_EQ(field(state, kScale), 128.0);
    EXPECT_EQ(field(state, kGrowthTracker), 0.0);
    EXPECT_DOUBLE_EQ(field(state, kGradNorm), 4.0 / used / 2.0);
    EXPECT_DOUBLE_EQ(field(state, kCoef), 1.0 / used / 2.0);
    window_scalar_step(partials_of({kInf, 0}), state, c);
    EXPECT_EQ(field(state, kScale), 128.0);
    EXPECT_EQ(field(state, kFoundInf), 1.0);
    EXPECT_EQ(field(state, kStep), 1.0);
  }
}

// ---- the fused optimizer step over several windows -----------------------------------------

// Five windows of fresh random gradients of varying size (so that clipping
// happens in some and not others, and amsgrad's max matters), scale 1024 and
// N = 37, against the reference; every buffer compared after every window.
void expect_matches_reference(const Variant& variant, DType dt) {
  SCOPED_TRACE(variant.name + " " + dtype_name(dt));
  const OptimizerConfig& opt = variant.config;
  const int64_t n = 1000;  // 31.25 chunks
  const double scale = 1024, items = 37, max_norm = 40;
  Arena a = make_arena(n, dt, 2);
  if (!opt.adam && opt.momentum == 0) a.b.exp_avg = Tensor();  // unused
  Reference r;
  r.p = a.b.params.to_vector<double>();
  if (a.b.exp_avg.defined()) r.m = a.b.exp_avg.to_vector<double>();
  r.v = a.b.exp_avg_sq.to_vector<double>();
  r.vmax = a.b.max_exp_avg_sq.to_vector<double>();
  const Tensor state = make_window_state(scale, Device::cpu());
  CloseConfig close = dynamic_close(max_norm);

  // f32 against an f64 reference: a few f32 roundings per step, five steps.
  const double rtol = dt == DType::f64 ? 1e-11 : 1e-5;
  const double atol = dt == DType::f64 ? 1e-13 : 1e-6;
  const double scale_rtol = dt == DType::f64 ? 1e-13 : 2e-6;
  const double sizes[] = {3.0, 1.0, 0.3, 2.0, 0.5};  // unscaled norm about 31.6 * size
  int clipped = 0;
  for (int w = 0; w < 5; ++w) {
    SCOPED_TRACE("window " + std::to_string(w));
    const Tensor raw = test::random_normal({n}, dt, Device::cpu(), sizes[w] * scale * items);
    close_window(a, raw, state, items, close, opt);
    ASSERT_EQ(field(state, kFoundInf), 0.0);
    EXPECT_EQ(field(state, kStep), w + 1.0);
    double clip = 0;
    reference_step(opt, a.groups,
                   reference_gradient(raw.to_vector<double>(), scale, items, max_norm, &clip), r);
    EXPECT_NEAR(field(state, kClipCoef), clip, 1e-12);
    clipped += clip < 1.0;
    EXPECT_TRUE(test::all_close(a.b.params, from_vector(r.p, {n}, DType::f64), rtol, atol));
    if (!r.m.empty()) {
      EXPECT_TRUE(close_at_scale(a.b.exp_avg, from_vector(r.m, {n}, DType::f64), scale_rtol));
    }
    EXPECT_TRUE(
        test::all_close(a.b.exp_avg_sq, from_vector(r.v, {n}, DType::f64), rtol, atol * atol));
    EXPECT_TRUE(test::all_close(a.b.max_exp_avg_sq, from_vector(r.vmax, {n}, DType::f64), rtol,
                                atol * atol));
    EXPECT_TRUE(test::all_equal(a.b.compute, a.b.params.to(DType::bf16)));
  }
  EXPECT_EQ(clipped, 2) << "clipping is active in the windows of sizes 3 and 2 only";
}

TEST(CpuWindowClose, every_optimizer_matches_the_pytorch_reference_over_five_windows_f64) {
  for (const Variant& v : all_variants())
    expect_matches_reference(v, DType::f64);
}

TEST(CpuWindowClose, every_optimizer_matches_the_pytorch_reference_over_five_windows_f32) {
  for (const Variant& v : all_variants())
    expect_matches_reference(v, DType::f32);
}

TEST(CpuWindowClose, skipped_window_leaves_params_and_moments_bitwise_unchanged) {
  for (const Variant& variant : all_variants()) {
    SCOPED_TRACE(variant.name);
    const int64_t n = 333;
    const Arena a = make_arena(n, DType::f32, 2);
    const Tensor state = make_window_state(1024, Device::cpu());
    const CloseConfig close = dynamic_close(1.0);
    close_window(a, test::random_normal({n}), state, 5, close, variant.config);  // one clean step
    const Tensor p = a.b.params.clone(), m = a.b.exp_avg.clone(), v = a.b.exp_avg_sq.clone(),
                 vmax = a.b.max_exp_avg_sq.clone(), copy = a.b.compute.clone();
    for (double bad : {kInf, -kInf, kNaN}) {
      std::vector<double> raw = test::random_normal({n}).to_vector<double>();
      raw[n / 2] = bad;
      close_window(a, from_vector(raw, {n}, DType::f32), state, 5, close, variant.config);
      EXPECT_EQ(field(state, kFoundInf), 1.0);
      EXPECT_TRUE(bitwise_equal(a.b.params, p));
      EXPECT_TRUE(bitwise_equal(a.b.exp_avg, m));
      EXPECT_TRUE(bitwise_equal(a.b.exp_avg_sq, v));
      EXPECT_TRUE(bitwise_equal(a.b.max_exp_avg_sq, vmax));
      EXPECT_TRUE(bitwise_equal(a.b.compute, copy));
    }
    EXPECT_EQ(field(state, kStep), 1.0);
    EXPECT_EQ(field(state, kSkippedWindows), 3.0);
    EXPECT_EQ(field(state, kScale), 1024.0 / 8);
    EXPECT_EQ(field(state, kGrowthTracker), 0.0);
    // The next clean window steps again, as step 2.
    close_window(a, test::random_normal({n}), state, 5, close, variant.config);
    EXPECT_EQ(field(state, kStep), 2.0);
    EXPECT_FALSE(bitwise_equal(a.b.params, p));
  }
}

// Note [ZeRO-1]: a rank steps ranges of the arena, each a view of params and
// grads at its offset, its moments packed elsewhere, and the whole arena's
// chunk table with first_element = the offset. Stepping every range so must
// be the one whole pass, bit for bit (ranges starting off a chunk and a pack).
OptimizerBuffers range_of(const OptimizerBuffers& whole, int64_t offset, int64_t numel) {
  OptimizerBuffers r = whole;
  for (Tensor* t : {&r.params, &r.grads, &r.exp_avg, &r.exp_avg_sq, &r.max_exp_avg_sq, &r.compute})
    *t = t->narrow(0, offset, numel).clone();
  r.first_element = offset;
  return r;
}

TEST(CpuWindowClose, stepping_ranges_with_first_element_equals_one_whole_pass) {
  for (const Variant& variant : all_variants()) {
    SCOPED_TRACE(variant.name);
    const int64_t n = 517;
    const Arena a = make_arena(n, DType::f64, 2);
    const Tensor raw = test::random_normal({n}, DType::f64);
    a.b.grads.copy_(raw);
    const Tensor state = make_window_state(1.0, Device::cpu());
    set_field(state, kItems, 3);
    const Tensor partials = empty({norm_partials_rows(a.b.grads), 2}, DType::f64);
    grad_norm_partials(a.b.grads, partials);
    window_scalar_step(partials, state, dynamic_close(0.5));
    const std::vector<std::pair<int64_t, int64_t>> ranges{
        {0, 64}, {64, 37}, {101, 300}, {401, 116}};
    std::vector<OptimizerBuffers> parts;
    for (auto [offset, numel] : ranges)
      parts.push_back(range_of(a.b, offset, numel));
    fused_optimizer_step(variant.config, a.b, state);
    for (size_t k = 0; k < ranges.size(); ++k) {
      fused_optimizer_step(variant.config, parts[k], state);
      const auto [offset, numel] = ranges[k];
      EXPECT_TRUE(bitwise_equal(parts[k].params, a.b.params.narrow(0, offset, numel))) << k;
      EXPECT_TRUE(bitwise_equal(parts[k].exp_avg, a.b.exp_avg.narrow(0, offset, numel))) << k;
      EXPECT_TRUE(bitwise_equal(parts[k].exp_avg_sq, a.b.exp_avg_sq.narrow(0, offset, numel))) << k;
      EXPECT_TRUE(bitwise_equal(parts[k].compute, a.b.compute.narrow(0, offset, numel))) << k;
    }
  }
}

TEST(CpuWindowClose, sgd_without_momentum_never_touches_exp_avg) {
  const Arena a = make_arena(100, DType::f32, 1);
  const Tensor before = a.b.exp_avg.clone();
  OptimizerConfig opt = sgd(0, 0, false);
  opt.groups = {{0.1, 0.01}};
  const Tensor state = make_window_state(1, Device::cpu());
  close_window(a, test::random_normal({100}), state, 3, dynamic_close(0), opt);
  EXPECT_TRUE(bitwise_equal(a.b.exp_avg, before));
}

TEST(CpuWindowClose, f16_compute_copy_equals_the_rounded_params) {
  Arena a = make_arena(77, DType::f32, 1);
  a.b.compute = empty({77}, DType::f16);
  test::poison(a.b.compute);
  a.b.exp_avg = Tensor();
  OptimizerConfig opt = sgd(0, 0, false);
  opt.groups = {{0.1, 0.0}};
  const Tensor state = make_window_state(1, Device::cpu());
  close_window(a, test::random_normal({77}), state, 3, dynamic_close(0), opt);
  EXPECT_TRUE(test::all_equal(a.b.compute, a.b.params.to(DType::f16)));
}

// ---- bad inputs ---------------------------------------------------------------------------

TEST(CpuWindowClose, bad_inputs_throw_naming_the_op_and_the_values) {
  EXPECT_ERROR(make_window_state(-1.0, Device::cpu()), "make_window_state", "-1");
  EXPECT_ERROR(make_window_state(kInf, Device::cpu()), "make_window_state", "inf");

  const Tensor g = test::random_normal({100});
  EXPECT_ERROR(norm_partials_rows(g.to(DType::bf16)), "norm_partials_rows", "bf16");
  EXPECT_ERROR(grad_norm_partials(g, empty({3, 2}, DType::f64)), "grad_norm_partials", "[3, 2]",
               "[1, 2]");
  EXPECT_ERROR(grad_norm_partials(g, empty({1, 2}, DType::f32)), "grad_norm_partials", "f32");
  EXPECT_ERROR(grad_norm_partials(g.view({10, 10}).transpose(0, 1), empty({1, 2}, DType::f64)),
               "grad_norm_partials", "contiguous");

  const Tensor state = make_window_state(1, Device::cpu());
  const Tensor partials = partials_of({1.0, 0});
  EXPECT_ERROR(window_scalar_step(partials, zeros({8}, DType::f64), CloseConfig{}),
               "window_scalar_step", "[8]", "[16]");
  EXPECT_ERROR(window_scalar_step(partials, zeros({16}, DType::f32), CloseConfig{}),
               "window_scalar_step", "f32");
  EXPECT_ERROR(window_scalar_step(zeros({1, 3}, DType::f64), state, CloseConfig{}),
               "window_scalar_step", "[1, 3]");
  CloseConfig c = dynamic_close(0);
  c.scaler.growth_factor = 0.5;
  EXPECT_ERROR(window_scalar_step(partials, state, c), "window_scalar_step", "growth_factor",
               "0.5");
  c = dynamic_close(0);
  c.scaler.backoff_factor = 1.5;
  EXPECT_ERROR(window_scalar_step(partials, state, c), "backoff_factor", "1.5");
  c = dynamic_close(0);
  c.scaler.growth_interval = 0;
  EXPECT_ERROR(window_scalar_step(partials, state, c), "growth_interval", "0");
  c = CloseConfig{};
  c.micro_steps = 0;
  EXPECT_ERROR(window_scalar_step(partials, state, c), "micro_steps", "0");
  c = CloseConfig{};
  c.max_norm = kNaN;
  EXPECT_ERROR(window_scalar_step(partials, state, c), "max_norm");

  const Arena a = make_arena(100, DType::f32, 2);
  OptimizerConfig opt = adam(test::Kind::AdamW, true);
  const char* op = "fused_optimizer_step";
  {
    OptimizerConfig o = opt;
    o.groups.clear();
    EXPECT_ERROR(fused_optimizer_step(o, a.b, state), op, "0 parameter groups", "1 to 8");
    o.groups.assign(9, GroupHyper{});
    EXPECT_ERROR(fused_optimizer_step(o, a.b, state), op, "9 parameter groups");
    o = opt;
    o.groups[1].lr = -0.5;
    EXPECT_ERROR(fused_optimizer_step(o, a.b, state), op, "group 1", "lr = -0.5");
    o = opt;
    o.groups[0].weight_decay = -1;
    EXPECT_ERROR(fused_optimizer_step(o, a.b, state), op, "weight_decay = -1");
    o = opt;
    o.beta2 = 1.0;
    EXPECT_ERROR(fused_optimizer_step(o, a.b, state), op, "beta2 = 1");
    o = sgd(0.9, 0.1, true);
    EXPECT_ERROR(fused_optimizer_step(o, a.b, state), op, "nesterov", "dampening = 0.1");
  }
  {
    OptimizerBuffers b = a.b;
    b.max_exp_avg_sq = Tensor();
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "max_exp_avg_sq", "amsgrad");
    b = a.b;
    b.exp_avg_sq = test::random_normal({99});
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "exp_avg_sq", "[99]", "99 elements");
    b = a.b;
    b.exp_avg = a.b.exp_avg.to(DType::f64);
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "exp_avg", "f64");
    b = a.b;
    b.params = a.b.params.to(DType::bf16);
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "params", "bf16");
    b = a.b;
    b.compute = empty({100}, DType::f32);
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "compute", "f32");
    b = a.b;
    b.chunk_groups = zeros({3}, DType::i32);
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "chunk_groups", "[3]", "= 4");
    b = a.b;
    b.first_element = -3;
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "first_element = -3");
    b = a.b;
    b.first_element = 40;  // 40 + 100 elements need 5 chunks, the table has 4
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "chunk_groups", "from element 40", "= 5");
    b = a.b;
    b.chunk_groups = zeros({4}, DType::i64);
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "chunk_groups", "i64");
    b = a.b;
    b.chunk_groups = from_vector<int32_t>({0, 1, 2, 0}, {4}, DType::i32);
    const Tensor p = a.b.params.clone();
    EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "chunk_groups[2] = 2", "[0, 2)");
    EXPECT_TRUE(bitwise_equal(a.b.params, p)) << "nothing is written before the check";
  }
  EXPECT_ERROR(fused_optimizer_step(opt, a.b, zeros({16}, DType::f32)), op, "state", "f32");
}

// Note [Unused parameters]: the slot tables go together, fit the arena, and
// hold slots that exist; the kernels that fill them check their shapes.
TEST(CpuWindowClose, bad_slot_tables_throw_naming_the_op_and_the_values) {
  const Tensor state = make_window_state(1.0, Device::cpu());
  const Arena a = make_arena(100, DType::f32, 2);
  const OptimizerConfig opt = adam(test::Kind::AdamW, true);
  const char* op = "fused_optimizer_step";
  OptimizerBuffers b = a.b;
  b.slot_used = zeros({2}, DType::f64);
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "go together", "1 of the 3");
  b.chunk_slots = zeros({4}, DType::i32);
  b.slot_steps = zeros({3, 3}, DType::f64);
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "slot_steps", "[3, 3]", "[2, 3]");
  b.slot_steps = zeros({2, 3}, DType::f64);
  b.chunk_slots = zeros({2}, DType::i32);
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "chunk_slots", "[2]", "4 chunks");
  b.chunk_slots = from_vector<int32_t>({0, 1, 5, 0}, {4}, DType::i32);
  const Tensor p = a.b.params.clone();
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), op, "chunk_slots[2] = 5", "[0, 2)");
  EXPECT_TRUE(bitwise_equal(a.b.params, p)) << "nothing is written before the check";
  EXPECT_ERROR(store_slot_flags({true, false, true}, zeros({2}, DType::f64)), "store_slot_flags",
               "3 written flags", "2 slots");
  EXPECT_ERROR(store_slot_flags({true}, zeros({1}, DType::f32)), "store_slot_flags", "slot_used",
               "f32");
  EXPECT_ERROR(advance_slot_steps(opt, zeros({2}, DType::f64), zeros({2}, DType::f64), state),
               "advance_slot_steps", "slot_steps", "[2]", "[2, 3]");
}

// Note [Unused parameters]: with every slot used, the per-slot path is the
// window-wide path bit for bit (same counts, same roundings); an unused slot
// is untouched, and a used one with its own count differs from the window's.
TEST(CpuWindowClose, per_slot_steps_equal_the_window_count_when_every_slot_is_used) {
  for (test::Kind kind : {test::Kind::SGD, test::Kind::Adam, test::Kind::AdamW}) {
    OptimizerConfig opt = kind == test::Kind::SGD ? sgd(0.9, 0.0, false) : adam(kind, true);
    const Arena plain = make_arena(128, DType::f64, 2), slots = make_arena(128, DType::f64, 2);
    slots.b.params.copy_(plain.b.params);
    slots.b.grads.copy_(plain.b.grads);
    for (const Tensor* t : {&slots.b.exp_avg, &slots.b.exp_avg_sq, &slots.b.max_exp_avg_sq})
      if (t->defined()) t->fill_(0.0);
    for (const Tensor* t : {&plain.b.exp_avg, &plain.b.exp_avg_sq, &plain.b.max_exp_avg_sq})
      if (t->defined()) t->fill_(0.0);
    OptimizerBuffers b = slots.b;
    b.chunk_slots = from_vector<int32_t>({0, 0, 1, 1}, {4}, DType::i32);
    b.slot_used = zeros({2}, DType::f64);
    b.slot_steps = zeros({2, 3}, DType::f64);
    const Tensor state = make_window_state(1.0, Device::cpu());
    for (int w = 0; w < 3; ++w) {
      state.narrow(0, kItems, 1).fill_(1.0);
      window_scalar_step(zeros({1, 2}, DType::f64), state, CloseConfig{});
      store_slot_flags({true, true}, b.slot_used);
      advance_slot_steps(opt, b.slot_used, b.slot_steps, state);
      fused_optimizer_step(opt, plain.b, state);
      fused_optimizer_step(opt, b, state);
      EXPECT_TRUE(bitwise_equal(b.params, plain.b.params)) << "window " << w;
      EXPECT_TRUE(bitwise_equal(b.exp_avg, plain.b.exp_avg)) << "window " << w;
    }
    // Slot 1 unused for a window: untouched, and its count stays at 3.
    const Tensor before = b.params.clone();
    store_slot_flags({true, false}, b.slot_used);
    window_scalar_step(zeros({1, 2}, DType::f64), state, CloseConfig{});
    advance_slot_steps(opt, b.slot_used, b.slot_steps, state);
    fused_optimizer_step(opt, b, state);
    EXPECT_TRUE(bitwise_equal(b.params.narrow(0, 64, 64), before.narrow(0, 64, 64)));
    EXPECT_FALSE(bitwise_equal(b.params.narrow(0, 0, 64), before.narrow(0, 0, 64)));
    EXPECT_EQ(b.slot_steps.to_vector<double>()[0], 4.0);
    EXPECT_EQ(b.slot_steps.to_vector<double>()[3], 3.0);
  }
}

// Note [Step sums]: with step_sums defined the pass writes each chunk's
// (sum g^2, sum (after - before)^2, sum before^2), summed in index order, and
// the update itself is bitwise the one without the sums; an unused slot under
// UnusedParameters::skip gets (sum g^2, 0, sum p^2) and stays unchanged.
TEST(CpuWindowClose, step_sums_are_each_chunks_sums_and_leave_the_update_unchanged) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const Variant& variant : all_variants()) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + variant.name);
      const int64_t chunks = 37, n = chunks * kChunk;
      Arena plain = make_arena(n, dtype, 2);
      OptimizerBuffers b = plain.b;
      for (Tensor* t :
           {&b.params, &b.grads, &b.exp_avg, &b.exp_avg_sq, &b.max_exp_avg_sq, &b.compute})
        *t = t->clone();
      // Slot 0 is chunks [0, 20), slot 1 (unused) [20, 37).
      std::vector<int32_t> chunk_slots(chunks, 0);
      std::fill(chunk_slots.begin() + 20, chunk_slots.end(), 1);
      for (OptimizerBuffers* x : {&plain.b, &b}) {
        x->chunk_slots = from_vector<int32_t>(chunk_slots, {chunks}, DType::i32);
        x->slot_used = from_vector<double>({1.0, 0.0}, {2}, DType::f64);
        x->slot_steps = zeros({2, 3}, DType::f64);
      }
      b.slot_steps = plain.b.slot_steps;  // one count for both passes
      b.step_sums = empty({chunks, 3}, DType::f64);
      test::poison(b.step_sums);
      const Tensor state = make_window_state(1.0, Device::cpu());
      set_field(state, kItems, 3);
      const Tensor partials = empty({norm_partials_rows(plain.b.grads), 2}, DType::f64);
      grad_norm_partials(plain.b.grads, partials);
      window_scalar_step(partials, state, dynamic_close(0.5));
      advance_slot_steps(variant.config, plain.b.slot_used, plain.b.slot_steps, state);
      const std::vector<double> before = b.params.to(DType::f64).to_vector<double>();
      fused_optimizer_step(variant.config, plain.b, state);
      fused_optimizer_step(variant.config, b, state);
      const std::vector<std::pair<Tensor, Tensor>> same{{b.params, plain.b.params},
                                                        {b.exp_avg, plain.b.exp_avg},
                                                        {b.exp_avg_sq, plain.b.exp_avg_sq},
                                                        {b.compute, plain.b.compute}};
      for (const auto& [x, y] : same)
        EXPECT_TRUE(bitwise_equal(x, y));
      const std::vector<double> after = b.params.to(DType::f64).to_vector<double>();
      const std::vector<double> g = b.grads.to(DType::f64).to_vector<double>();
      const std::vector<double> rows = b.step_sums.to_vector<double>();
      for (int64_t c = 0; c < chunks; ++c) {
        double g2 = 0, d2 = 0, p2 = 0;
        for (int64_t i = c * kChunk; i < (c + 1) * kChunk; ++i) {
          g2 += g[i] * g[i];
          d2 += (after[i] - before[i]) * (after[i] - before[i]);
          p2 += before[i] * before[i];
        }
        EXPECT_EQ(rows[3 * c], g2) << "chunk " << c;
        EXPECT_EQ(rows[3 * c + 1], d2) << "chunk " << c;
        EXPECT_EQ(rows[3 * c + 2], p2) << "chunk " << c;
        EXPECT_EQ(d2 > 0, c < 20) << "chunk " << c << ": only the used slot moves";
      }
    }
  }
}

TEST(CpuWindowClose, step_sums_per_slot_folds_rows_or_reads_a_skipped_windows_arena) {
  const int64_t chunks = 10, n = chunks * kChunk;
  const Tensor rows = test::random_uniform({chunks, 3}, 0.0, 1.0, DType::f64);
  const Tensor slot_chunks = from_vector<int64_t>({0, 3, 3, 3, 3, 10}, {3, 2}, DType::i64);
  const Tensor grads = test::random_normal({n}, DType::f32), params = test::random_normal({n});
  const Tensor state = make_window_state(1.0, Device::cpu());
  const Tensor out = empty({3, 3}, DType::f64);
  step_sums_per_slot(rows, slot_chunks, grads, params, state, out);
  const std::vector<double> r = rows.to_vector<double>(), o = out.to_vector<double>();
  const int64_t ranges[3][2] = {{0, 3}, {3, 3}, {3, 10}};
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 3; ++k) {
      double sum = 0;
      for (int64_t c = ranges[i][0]; c < ranges[i][1]; ++c)
        sum += r[3 * c + k];
      EXPECT_EQ(o[3 * i + k], sum) << "slot " << i << " column " << k;
    }
  }
  // After a skipped window no row was written: the arena itself, a NaN
  // gradient making the slot's |g|^2 infinite.
  std::vector<double> g = grads.to(DType::f64).to_vector<double>();
  g[5 * kChunk + 3] = kNaN;
  const Tensor bad = from_vector(g, {n}, DType::f32);
  set_field(state, kFoundInf, 1.0);
  step_sums_per_slot(rows, slot_chunks, bad, params, state, out);
  const std::vector<double> s = out.to_vector<double>();
  const std::vector<double> p = params.to(DType::f64).to_vector<double>();
  double g2 = 0, p2 = 0;
  for (int64_t e = 0; e < 3 * kChunk; ++e) {
    g2 += g[e] * g[e];
    p2 += p[e] * p[e];
  }
  EXPECT_NEAR(s[0], g2, 1e-12 * g2);
  EXPECT_EQ(s[1], 0.0);
  EXPECT_NEAR(s[2], p2, 1e-12 * p2);
  EXPECT_EQ(s[3], 0.0);  // the empty slot
  EXPECT_EQ(s[6], kInf);
  EXPECT_EQ(s[7], 0.0);
}

TEST(CpuWindowClose, bad_step_sums_throw_naming_the_op_and_the_values) {
  const Arena a = make_arena(64, DType::f32, 1);
  const OptimizerConfig opt = adam(test::Kind::AdamW, false);
  const Tensor state = make_window_state(1.0, Device::cpu());
  OptimizerBuffers b = a.b;
  b.step_sums = zeros({2, 3}, DType::f32);
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), "fused_optimizer_step", "step_sums", "f32");
  b.step_sums = zeros({1, 3}, DType::f64);
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), "fused_optimizer_step", "[1, 3]", "[>= 2, 3]");
  b.step_sums = zeros({2, 3}, DType::f64);
  b.params = b.params.narrow(0, 0, 40);
  for (Tensor* t : {&b.grads, &b.exp_avg, &b.exp_avg_sq, &b.max_exp_avg_sq, &b.compute})
    *t = t->narrow(0, 0, 40);
  EXPECT_ERROR(fused_optimizer_step(opt, b, state), "fused_optimizer_step", "whole chunks of 32",
               "40 params");

  const Tensor rows = zeros({2, 3}, DType::f64), out = empty({1, 3}, DType::f64);
  const Tensor g = zeros({64}), p = zeros({64});
  EXPECT_ERROR(
      step_sums_per_slot(rows, from_vector<int64_t>({1, 0}, {1, 2}, DType::i64), g, p, state, out),
      "step_sums_per_slot", "slot 0 has chunks [1, 0)", "[0, 2]");
  EXPECT_ERROR(
      step_sums_per_slot(rows, from_vector<int64_t>({0, 3}, {1, 2}, DType::i64), g, p, state, out),
      "step_sums_per_slot", "slot 0 has chunks [0, 3)");
  EXPECT_ERROR(step_sums_per_slot(rows, from_vector<int64_t>({0, 2, 1, 2}, {2, 2}, DType::i64), g,
                                  p, state, empty({2, 3}, DType::f64)),
               "step_sums_per_slot", "slot 1 has chunks [1, 2)", "slot 0's end 2",
               "ascending and disjoint");
  EXPECT_ERROR(step_sums_per_slot(rows, from_vector<int64_t>({0, 2}, {1, 2}, DType::i64), g, p,
                                  state, empty({2, 3}, DType::f64)),
               "step_sums_per_slot", "out of shape [2, 3]", "[1, 3]");
  EXPECT_ERROR(step_sums_per_slot(rows, from_vector<int64_t>({0, 2}, {1, 2}, DType::i64), g,
                                  zeros({32}), state, out),
               "step_sums_per_slot", "grads has 64", "params 32");
}

}  // namespace
}  // namespace accrue
