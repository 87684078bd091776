#include "tests/equivalence/equivalence_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"

namespace accrue::equivalence {

namespace {

constexpr uint64_t kModelSeed = 7;

const char* metric_name(Metric m) {
  return m == Metric::SlotMax ? "max|a-b|/max|b| per slot" : "||a-b||/||b||";
}

// The error of two plain vectors under a precision's metric (one "slot").
double vector_error(Metric m, const std::vector<double>& a, const std::vector<double>& b) {
  return m == Metric::SlotMax ? max_relative(a, b) : l2_relative(a, b);
}

std::vector<double> scaled(std::vector<double> v, double s) {
  for (double& x : v)
    x *= s;
  return v;
}

// Everything the optimizer owns for one run, as bytes.
struct Snapshot {
  std::vector<unsigned char> master;
  std::vector<std::vector<unsigned char>> moments;
  double step = 0.0;
  double scale = 0.0;
};

Snapshot snapshot(Run& run) {
  Snapshot s;
  s.master = bytes_of(run.arena().master());
  for (int i = 0; i < run.arena().options().moments(); ++i)
    s.moments.push_back(bytes_of(run.arena().moment(i)));
  const std::vector<double> state = host(run.window().state());
  s.step = state[kernels::kStep];
  s.scale = state[kernels::kScale];
  return s;
}

int64_t counted_targets(const Tensor& targets) {
  int64_t n = 0;
  for (int64_t t : targets.to_vector<int64_t>())
    n += t != kIgnoreIndex;
  return n;
}

}  // namespace

// ---- 1 --------------------------------------------------------------------------------------

void check_accumulated_equals_full_batch(ModelKind kind, const Precision& p) {
  constexpr int64_t kBatch = 32, kWindows = 20;
  const std::vector<Batch> data = make_batches(kind, kWindows, kBatch, p, /*seed=*/100);
  std::vector<double> grads_full, params_full;
  double loss_full = 0.0;
  for (int64_t K : {1, 2, 4, 8, 16}) {
    Run run(make_model(kind, p, kModelSeed), p, adamw(), clipped_window(K));
    std::vector<double> first_grads;
    double first_loss = 0.0;
    int clipped = 0;
    for (int64_t w = 0; w < kWindows; ++w) {
      const optim::WindowReport r = run.step(data[w]);
      ASSERT_FALSE(r.skipped) << "window " << w << " K=" << K;
      if (r.clip_coef < 1.0) ++clipped;
      if (w == 0) {
        first_grads = host(run.arena().grads());
        first_loss = r.loss;
      }
    }
    // The windows' gradient norms exceed max_grad_norm: clipping took part.
    EXPECT_GT(clipped, 0) << "K=" << K << ": clipping was never active";
    const std::vector<double> params = host(run.arena().master());
    if (K == 1) {
      grads_full = first_grads;
      params_full = params;
      loss_full = first_loss;
      ASSERT_GT(l2_norm(grads_full), 0.0);
      std::printf(
          "[equivalence] %s %s: K=1 window-1 grad norm (raw sum) %.6g, clipped in %d of %d "
          "windows\n",
          p.name.c_str(), model_name(kind), l2_norm(grads_full), clipped, int(kWindows));
      continue;
    }
    const double grad_err = arena_error(p.metric, run.arena(), first_grads, grads_full);
    const double param_err = arena_error(p.metric, run.arena(), params, params_full);
    std::printf(
        "[equivalence] %s %s: K=%2d grads after 1 window %.3g, params after %d windows "
        "%.3g (%s); max-rel grads %.3g params %.3g\n",
        p.name.c_str(), model_name(kind), int(K), grad_err, int(kWindows), param_err,
        metric_name(p.metric), max_relative(first_grads, grads_full),
        max_relative(params, params_full));
    EXPECT_LE(grad_err, p.grad_tol) << model_name(kind) << " K=" << K;
    EXPECT_LE(param_err, p.param_tol) << model_name(kind) << " K=" << K;
    EXPECT_NEAR(first_loss, loss_full, 10 * p.grad_tol * std::fabs(loss_full));
  }
}

// ---- 2 --------------------------------------------------------------------------------------

void check_item_count_normalization_is_exact_for_padded_micro_batches(const Precision& p) {
  constexpr int64_t kBatch = 32, kWindows = 20, K = 4;
  const std::vector<Batch> data =
      make_batches(ModelKind::LM, kWindows, kBatch, p, /*seed=*/200, /*variable_length=*/true);
  std::printf("[equivalence] %s padded LM: tokens per micro-batch of window 1:", p.name.c_str());
  for (int64_t k = 0; k < K; ++k)
    std::printf(" %lld", static_cast<long long>(counted_targets(data[0].micro(k, K).targets)));
  std::printf(" (of %lld each)\n", static_cast<long long>(kBatch / K * kSeq));

  // No clipping here: it would rescale both updates and blur the comparison.
  const auto window = [](int64_t k) { return optim::WindowOptions().micro_steps(k); };
  Run full(make_model(ModelKind::LM, p, kModelSeed), p, adamw(), window(1));
  Run tokens(make_model(ModelKind::LM, p, kModelSeed), p, adamw(), window(K));
  Run means(make_model(ModelKind::LM, p, kModelSeed), p, adamw(),
            window(K).normalization(kernels::Normalization::MeanOfMicroBatchMeans));
  std::vector<double> g_full, g_tokens, g_means;
  for (int64_t w = 0; w < kWindows; ++w) {
    const optim::WindowReport r_full = full.step(data[w]);
    const optim::WindowReport r_tokens = tokens.step(data[w]);
    means.step(data[w]);
    // N is the window's token count, padding excluded, whatever K is.
    EXPECT_EQ(r_full.items, static_cast<double>(counted_targets(data[w].targets)));
    EXPECT_EQ(r_tokens.items, r_full.items);
    if (w == 0) {
      // What the optimizer applied: the raw gradient times the close's coefficient.
      g_full = full.applied_gradient();
      g_tokens = tokens.applied_gradient();
      g_means = means.applied_gradient();
    }
  }
  const double tokens_err = arena_error(p.metric, tokens.arena(), g_tokens, g_full);
  const double means_diff = l2_relative(g_means, g_full);
  const std::vector<double> p_full = host(full.arena().master());
  const double tokens_param_err =
      arena_error(p.metric, tokens.arena(), host(tokens.arena().master()), p_full);
  const double means_param_diff = l2_relative(host(means.arena().master()), p_full);
  std::printf(
      "[equivalence] %s padded LM, K=%d: applied gradient vs full batch: ItemCount %.3g "
      "(%s), MeanOfMicroBatchMeans %.3g (||a-b||/||b||)\n",
      p.name.c_str(), int(K), tokens_err, metric_name(p.metric), means_diff);
  std::printf(
      "[equivalence] %s padded LM, K=%d: params after %d windows: ItemCount %.3g, "
      "MeanOfMicroBatchMeans %.3g (||a-b||/||b||)\n",
      p.name.c_str(), int(K), int(kWindows), tokens_param_err, means_param_diff);
  EXPECT_LE(tokens_err, p.grad_tol);
  EXPECT_LE(tokens_param_err, p.param_tol);
  // Why ItemCount is the default: the mean of means weighs a short
  // micro-batch's tokens more than a long one's.
  EXPECT_GT(means_diff, 1e-3);
}

// ---- 3 --------------------------------------------------------------------------------------

// Note [Skipped window reference]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The run under test uses the dynamic scaler (65536, halved to 32768 by the
// bad window); the reference uses no scaler and never sees the bad window.
// They agree bitwise: every scale is a power of two, and multiplying by a
// power of two commutes exactly with every rounding (add, multiply, divide,
// sqrt of a square, fma, f64 -> f32) as long as nothing overflows or goes
// subnormal. The backward is linear in its seed, so the raw gradients are the
// reference's times the scale exactly; the close computes the norm as
// sqrt(sumsq) / scale (exact) and the coefficient (1 / scale) * inv_N * clip
// (exactly the reference's divided by the scale), so the optimizer sees
// bitwise the same g * coef. The Adam step count t does not advance on the
// skipped window, so the bias corrections match too.
void check_skipped_window_leaves_state_bitwise_unchanged(const Precision& p) {
  constexpr int64_t kBatch = 32, K = 4;
  // Windows 0, 2 and 3 are clean; window 1 gets an inf in micro-batch j.
  const std::vector<Batch> data = make_batches(ModelKind::Classifier, 4, kBatch, p, /*seed=*/300);
  const optim::LossScalerOptions dynamic = optim::LossScalerOptions::dynamic();
  const double initial_scale = dynamic.init_scale();

  Run ref(make_model(ModelKind::Classifier, p, kModelSeed), p, adamw(), clipped_window(K));
  std::vector<Snapshot> ref_states;
  std::vector<std::vector<double>> ref_grads;
  std::vector<optim::WindowReport> ref_reports;
  for (int64_t w : {0, 2, 3}) {
    ref_reports.push_back(ref.step(data[w]));
    ref_states.push_back(snapshot(ref));
    ref_grads.push_back(host(ref.arena().grads()));
  }

  for (int64_t j = 0; j < K; ++j) {
    SCOPED_TRACE("inf in micro-batch " + std::to_string(j));
    Run run(make_model(ModelKind::Classifier, p, kModelSeed), p, adamw(),
            clipped_window(K).scaler(dynamic));
    // Compares the run with the reference after its i-th clean window.
    const auto expect_matches_reference = [&](size_t i, double scale) {
      const Snapshot s = snapshot(run);
      EXPECT_TRUE(s.master == ref_states[i].master) << "master differs after clean window " << i;
      for (size_t m = 0; m < s.moments.size(); ++m)
        EXPECT_TRUE(s.moments[m] == ref_states[i].moments[m]) << "moment " << m << ", window " << i;
      EXPECT_EQ(s.step, ref_states[i].step);
      EXPECT_TRUE(scaled(host(run.arena().grads()), 1.0 / scale) == ref_grads[i])
          << "raw gradient / scale differs from the unscaled reference, window " << i;
      const optim::WindowReport r = run.window().report();
      EXPECT_EQ(r.grad_norm, ref_reports[i].grad_norm);
      EXPECT_EQ(r.clip_coef, ref_reports[i].clip_coef);
      EXPECT_EQ(r.optimizer_steps, ref_reports[i].optimizer_steps);
    };

    run.step(data[0]);
    expect_matches_reference(0, initial_scale);

    // Window 1: one input element of micro-batch j is inf, so its forward and
    // backward are non-finite and so is the window's gradient.
    Batch bad{data[1].inputs.clone(), data[1].targets};
    const int64_t row = j * (kBatch / K) + 3;
    bad.inputs.narrow(0, row, 1).narrow(1, 5, 1).fill_(INFINITY);
    const Snapshot before = snapshot(run);
    const optim::WindowReport r = run.step(bad);
    const Snapshot after = snapshot(run);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(r.skipped_windows, 1);
    bool poisoned = false;
    for (double g : host(run.arena().grads()))
      poisoned = poisoned || !std::isfinite(g);
    EXPECT_TRUE(poisoned) << "the inf never reached the gradient arena";
    EXPECT_TRUE(after.master == before.master) << "master changed in a skipped window";
    ASSERT_EQ(after.moments.size(), before.moments.size());
    for (size_t m = 0; m < after.moments.size(); ++m)
      EXPECT_TRUE(after.moments[m] == before.moments[m]) << "moment " << m << " changed";
    EXPECT_EQ(std::memcmp(&after.step, &before.step, sizeof(double)), 0);
    EXPECT_EQ(after.scale, before.scale * 0.5);
    EXPECT_EQ(r.loss_scale, initial_scale * 0.5);

    // The next windows overwrite the poisoned arena (Note [Overwrite first]).
    run.step(data[2]);
    expect_matches_reference(1, initial_scale * 0.5);
    run.step(data[3]);
    expect_matches_reference(2, initial_scale * 0.5);
  }
}

// ---- 4 --------------------------------------------------------------------------------------

void check_clipping_applies_once_to_the_window_gradient(const Precision& p) {
  constexpr int64_t kBatch = 32, K = 4;
  constexpr double kLr = 0.1, kClipEps = 1e-6;  // kClipEps: CloseConfig's default
  const Batch batch = make_batches(ModelKind::Classifier, 1, kBatch, p, /*seed=*/400)[0];

  // The reference, by hand from the K = 1 raw gradient: mean, norm, clip.
  std::unique_ptr<Model> ref_model = make_model(ModelKind::Classifier, p, kModelSeed);
  optim::ParamStoreOptions ao;
  ao.device(p.device);
  ao.master_dtype(p.dtype);
  ao.moments(0);
  optim::ParamStore ref_arena(ref_model->named_parameters(), ao);
  const std::vector<double> p0 = host(ref_arena.master());
  const std::vector<double> mean =
      scaled(summed_gradient(*ref_model, ref_arena, {batch}), 1.0 / kBatch);
  const double norm = l2_norm(mean);
  const double max_norm = 0.25 * norm;  // clipping active, coefficient about 0.25
  const double clip = std::min(1.0, max_norm / (norm + kClipEps));
  const std::vector<double> expected = scaled(mean, clip);
  std::vector<double> expected_params(p0.size());
  for (size_t i = 0; i < p0.size(); ++i)
    expected_params[i] = p0[i] - kLr * expected[i];

  // The window: K micro-batches, clipped once at close.
  Run run(make_model(ModelKind::Classifier, p, kModelSeed), p,
          optim::Optimizer(optim::SGDOptions(kLr)), clipped_window(K, max_norm));
  const optim::WindowReport r = run.step(batch);
  const double applied_err = arena_error(p.metric, run.arena(), run.applied_gradient(), expected);
  const double param_err =
      arena_error(p.metric, run.arena(), host(run.arena().master()), expected_params);

  // The alternative: clip each micro-batch's share of the window gradient, then sum.
  std::vector<double> per_micro(mean.size(), 0.0);
  for (int64_t k = 0; k < K; ++k) {
    const std::vector<double> share =
        scaled(summed_gradient(*ref_model, ref_arena, {batch.micro(k, K)}), 1.0 / kBatch);
    const double c = std::min(1.0, max_norm / (l2_norm(share) + kClipEps));
    for (size_t i = 0; i < share.size(); ++i)
      per_micro[i] += c * share[i];
  }
  const double alternative_diff = l2_relative(per_micro, expected);

  std::printf(
      "[equivalence] %s clipping: window norm %.6g (by hand %.6g), clip coef %.6g (by "
      "hand %.6g); applied gradient vs by hand %.3g, params %.3g (%s)\n",
      p.name.c_str(), r.grad_norm, norm, r.clip_coef, clip, applied_err, param_err,
      metric_name(p.metric));
  std::printf(
      "[equivalence] %s clipping: sum of per-micro-batch clipped gradients: norm %.6g vs "
      "%.6g, differs by %.3g (||a-b||/||b||)\n",
      p.name.c_str(), l2_norm(per_micro), l2_norm(expected), alternative_diff);
  EXPECT_LT(r.clip_coef, 1.0);
  EXPECT_NEAR(r.grad_norm, norm, 10 * p.grad_tol * norm);
  EXPECT_NEAR(r.clip_coef, clip, 10 * p.grad_tol * clip);
  EXPECT_LE(applied_err, p.grad_tol);
  EXPECT_LE(param_err, p.grad_tol);
  EXPECT_GT(alternative_diff, 1e-3);
}

// ---- 5 --------------------------------------------------------------------------------------

namespace {

// Two linear heads over the same input; head b can be switched off.
class TwoHeads : public Model {
 public:
  explicit TwoHeads(const nn::ParamOptions& o) {
    a_ = &register_module("a", std::make_unique<nn::Linear>(kFeatures, kClasses, true, o));
    b_ = &register_module("b", std::make_unique<nn::Linear>(kFeatures, kClasses, true, o));
  }
  Loss loss(const Batch& batch) const override {
    Tensor logits = a_->forward(batch.inputs);
    if (use_b) logits = logits + b_->forward(batch.inputs);
    return cross_entropy(logits, batch.targets, kIgnoreIndex);
  }
  bool use_b = true;

 private:
  nn::Linear* a_;
  nn::Linear* b_;
};

std::unique_ptr<TwoHeads> make_two_heads(const Precision& p) {
  Generator gen(kModelSeed);
  return std::make_unique<TwoHeads>(nn::ParamOptions{p.device, p.dtype, &gen});
}

// Embedding -> LayerNorm -> projection to the vocabulary, with the projection
// either the embedding table itself (tied) or an independent copy of it.
class TiedLM : public Model {
 public:
  TiedLM(const nn::ParamOptions& o, bool tied) {
    embed_ = &register_module("embed", std::make_unique<nn::Embedding>(kVocab, kModel, o, 0.5));
    norm_ = &register_module("norm", std::make_unique<nn::LayerNorm>(kModel, o));
    if (!tied) {
      NoGradGuard no_grad;
      out_ = register_parameter("out", detach(embed_->weight()).clone());
    }
  }
  Loss loss(const Batch& b) const override {
    Tensor h = norm_->forward(embed_->forward(b.inputs));
    const Tensor& w = out_.defined() ? out_ : embed_->weight();
    Tensor logits = linear(h, w, Tensor());  // h @ w^T
    const int64_t tokens = b.inputs.numel();
    return cross_entropy(reshape(logits, {tokens, kVocab}), b.targets.reshape({tokens}),
                         kIgnoreIndex);
  }

 private:
  nn::Embedding* embed_;
  nn::LayerNorm* norm_;
  Tensor out_;
};

}  // namespace

void check_unused_parameter_reads_zero(const Precision& p) {
  constexpr int64_t kBatch = 16, K = 2;
  const std::vector<Batch> data = make_batches(ModelKind::Classifier, 2, kBatch, p, /*seed=*/500);
  // lr 0: the parameters stay put, so a fresh run can recompute window 2 alone.
  const optim::Optimizer sgd0{optim::SGDOptions(0.0)};
  const auto window = optim::WindowOptions().micro_steps(K);

  auto model = make_two_heads(p);
  TwoHeads& heads = *model;
  Run run(std::move(model), p, sgd0, window);
  const std::vector<optim::ParamStore::Slot>& slots = run.arena().slots();
  ASSERT_EQ(slots.size(), 4u);  // a.weight, a.bias, b.weight, b.bias

  run.step(data[0]);  // both heads used
  for (size_t i : {2, 3}) {
    double largest = 0.0;
    for (double g : host(run.arena().grad_view(i)))
      largest = std::max(largest, std::fabs(g));
    EXPECT_GT(largest, 0.0) << slots[i].name << " got no gradient in window 1";
  }

  heads.use_b = false;
  run.step(data[1]);  // head b unused
  for (size_t i : {2, 3}) {
    for (double g : host(run.arena().grad_view(i)))
      ASSERT_EQ(g, 0.0) << slots[i].name << " kept a stale gradient after the window it sat out";
  }

  // Head a holds window 2's gradient alone (written, not added to window 1's).
  auto fresh_model = make_two_heads(p);
  fresh_model->use_b = false;
  Run fresh(std::move(fresh_model), p, sgd0, window);
  fresh.step(data[1]);
  for (size_t i : {0, 1})
    EXPECT_TRUE(same_bytes(run.arena().grad_view(i), fresh.arena().grad_view(i))) << slots[i].name;
}

void check_tied_parameter_accumulates_both_uses(const Precision& p) {
  constexpr int64_t kBatch = 16, K = 2;
  const Batch batch = make_batches(ModelKind::LM, 1, kBatch, p, /*seed=*/600)[0];
  const optim::Optimizer sgd0{optim::SGDOptions(0.0)};
  const auto window = optim::WindowOptions().micro_steps(K);
  const auto make = [&](bool tied) {
    Generator gen(kModelSeed);
    return std::make_unique<TiedLM>(nn::ParamOptions{p.device, p.dtype, &gen}, tied);
  };
  Run tied(make(true), p, sgd0, window);     // embed.weight, norm.weight, norm.bias
  Run untied(make(false), p, sgd0, window);  // embed.weight, norm.weight, norm.bias, out
  ASSERT_EQ(tied.arena().size(), 3u);
  ASSERT_EQ(untied.arena().size(), 4u);
  tied.step(batch);
  untied.step(batch);

  const std::vector<double> g_tied = host(tied.arena().grad_view(0));
  const std::vector<double> g_in = host(untied.arena().grad_view(0));
  const std::vector<double> g_out = host(untied.arena().grad_view(3));
  std::vector<double> g_sum(g_in.size());
  for (size_t i = 0; i < g_sum.size(); ++i)
    g_sum[i] = g_in[i] + g_out[i];
  const double err = vector_error(p.metric, g_tied, g_sum);
  std::printf(
      "[equivalence] %s tied embedding: |embedding part| %.4g, |projection part| %.4g, "
      "tied vs sum %.3g (%s)\n",
      p.name.c_str(), l2_norm(g_in), l2_norm(g_out), err, metric_name(p.metric));
  EXPECT_LE(err, p.grad_tol);
  // Both uses matter: the tied gradient is far from either part alone.
  EXPECT_GT(l2_relative(g_tied, g_in), 1e-2);
  EXPECT_GT(l2_relative(g_tied, g_out), 1e-2);
  // The LayerNorm sees identical values and gradients in both graphs.
  for (size_t i : {1, 2})
    EXPECT_TRUE(same_bytes(tied.arena().grad_view(i), untied.arena().grad_view(i)))
        << tied.arena().slots()[i].name;
}

// ---- 6 --------------------------------------------------------------------------------------

namespace {

// Inputs |normal| + 0.5 and every target class 0: the per-sample gradients of
// the output layer share their signs, so a low-precision running sum rounds
// the same way again and again (the bias that a bf16 buffer accumulates).
Batch one_sided_batch(int64_t n, Device device, DType dtype, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> x =
      randn({n, kFeatures}, DType::f64, Device::cpu(), &gen).to_vector<double>();
  for (double& v : x)
    v = std::fabs(v) + 0.5;
  return Batch{from_vector(x, {n, kFeatures}, dtype, device), zeros({n}, DType::i64, device)};
}

}  // namespace

void check_bf16_compute_with_fp32_arena_error_does_not_grow_with_K(const Precision& p) {
  ASSERT_EQ(p.dtype, DType::f32) << "the bf16 compute check runs with an f32 arena";
  constexpr int64_t kBatch = 64;
  const Batch batch = one_sided_batch(kBatch, p.device, DType::bf16, /*seed=*/700);
  const optim::Optimizer sgd0{optim::SGDOptions(0.0)};  // lr 0: the weights never move

  // The reference: the exact (f64, CPU) gradient of the model the bf16 runs
  // compute with, i.e. of its bf16-rounded weights at the bf16 inputs. The
  // runs' remaining error is bf16 rounding of activations and of whatever
  // buffer the gradient is summed in.
  std::vector<double> reference;
  {
    Run probe(make_model(ModelKind::Classifier, p, kModelSeed), p, sgd0, optim::WindowOptions(),
              DType::bf16);
    std::unique_ptr<Model> ref_model = make_model(ModelKind::Classifier, cpu_f64(), kModelSeed);
    const std::vector<Tensor> ref_params = ref_model->parameters();
    const std::vector<Tensor>& bf16_params = probe.arena().params();
    ASSERT_EQ(ref_params.size(), bf16_params.size());
    for (size_t i = 0; i < ref_params.size(); ++i) {
      ASSERT_EQ(bf16_params[i].dtype(), DType::bf16);
      NoGradGuard no_grad;
      ref_params[i].copy_(bf16_params[i].to(Device::cpu()));
    }
    optim::ParamStoreOptions ao;
    ao.master_dtype(DType::f64);
    ao.moments(0);
    optim::ParamStore ref_arena(ref_params, ao);
    const Batch ref_batch{batch.inputs.to(Device::cpu()).to(DType::f64),
                          batch.targets.to(Device::cpu())};
    reference = slot_elements(ref_arena, summed_gradient(*ref_model, ref_arena, {ref_batch}));
  }

  std::vector<int64_t> ks;
  std::vector<double> arena_err, buffer_err;
  for (int64_t K = 1; K <= kBatch; K *= 2) {
    Run run(make_model(ModelKind::Classifier, p, kModelSeed), p, sgd0,
            optim::WindowOptions().micro_steps(K), DType::bf16);
    run.step(batch);
    const std::vector<double> arena_grads = slot_elements(run.arena(), host(run.arena().grads()));
    // The same micro-batch gradients, each rounded to bf16 (what a bf16
    // weight-gradient GEMM outputs) and summed in a bf16 buffer (each add in
    // fp32, rounded back to bf16: a bf16 parameter's .grad += ...).
    Tensor buffer;
    for (int64_t k = 0; k < K; ++k) {
      run.arena().begin_window();
      backward(run.model().loss(batch.micro(k, K)).sum);
      run.arena().zero_unwritten();
      NoGradGuard no_grad;
      const Tensor g = run.arena().grads().to(DType::bf16);
      buffer = k == 0 ? g : kernels::binary(kernels::BinaryOp::Add, buffer, g);
    }
    ASSERT_EQ(buffer.dtype(), DType::bf16);
    ks.push_back(K);
    arena_err.push_back(l2_relative(arena_grads, reference));
    buffer_err.push_back(l2_relative(slot_elements(run.arena(), host(buffer)), reference));
  }
  std::printf("[equivalence] %s bf16 compute, ||g - g_f64|| / ||g_f64|| by K (global batch %d):\n",
              p.name.c_str(), int(kBatch));
  std::printf("[equivalence]    K   fp32 arena   bf16 buffer\n");
  for (size_t i = 0; i < ks.size(); ++i)
    std::printf("[equivalence]   %2d   %.4e   %.4e\n", int(ks[i]), arena_err[i], buffer_err[i]);
  const double arena_first = arena_err.front(), arena_last = arena_err.back();
  const double buffer_first = buffer_err.front(), buffer_last = buffer_err.back();
  EXPECT_LE(arena_last, 1.5 * arena_first) << "the fp32 arena's error grew with K";
  EXPECT_GT(buffer_last, 2.0 * buffer_first) << "the bf16 buffer's error did not grow with K";
  EXPECT_GT(buffer_last, 2.0 * arena_last);
}

// ---- 7 --------------------------------------------------------------------------------------

void check_windows_are_bitwise_reproducible(const Precision& p) {
  constexpr int64_t kBatch = 32, K = 4, kWindows = 3;
  const std::vector<Batch> data = make_batches(ModelKind::LM, kWindows, kBatch, p, /*seed=*/800);
  Run a(make_model(ModelKind::LM, p, kModelSeed), p, adamw(), clipped_window(K));
  Run b(make_model(ModelKind::LM, p, kModelSeed), p, adamw(), clipped_window(K));
  for (int64_t w = 0; w < kWindows; ++w) {
    a.step(data[w]);
    b.step(data[w]);
    EXPECT_TRUE(same_bytes(a.arena().grads(), b.arena().grads())) << "grads, window " << w;
    EXPECT_TRUE(same_bytes(a.arena().master(), b.arena().master())) << "params, window " << w;
    for (int m = 0; m < a.arena().options().moments(); ++m)
      EXPECT_TRUE(same_bytes(a.arena().moment(m), b.arena().moment(m)))
          << "moment " << m << ", window " << w;
    EXPECT_TRUE(same_bytes(a.window().state(), b.window().state())) << "state, window " << w;
  }
}

// ---- 8 --------------------------------------------------------------------------------------

// Note [Counting gradient temporaries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// memory_stats(device).allocations counts Storage allocations (every empty()
// and every tensor a kernel returns), views excluded. We count one backward
// only (the loss is built before the count starts), for the same model and
// batch, once with the parameters in an arena and once with plain .grad
// storage. Both backwards allocate the same activation gradients (the seed,
// the logits' gradient, each hidden layer's dx and GELU's gradient); they
// differ only in where the parameter gradients go:
//   arena:  Linear's dW GEMM and db row sum write into the slot: 0 allocations,
//           on the window's first backward (beta 0) and on later ones (beta 1);
//   .grad:  dW and db are fresh tensors (1 allocation each) that the engine
//           adds into .grad; on the very first backward it also clones them to
//           own them (1 more each).
// A warm-up backward on a third model first allocates whatever a backend
// creates once (a GEMM workspace), so that it counts for neither side.
void check_arena_backward_allocates_no_weight_gradient_temporary(const Precision& p) {
  const Batch batch = make_batches(ModelKind::Classifier, 1, 8, p, /*seed=*/900)[0];
  std::unique_ptr<Model> warm = make_model(ModelKind::Classifier, p, kModelSeed);
  std::unique_ptr<Model> in_arena = make_model(ModelKind::Classifier, p, kModelSeed);
  std::unique_ptr<Model> plain = make_model(ModelKind::Classifier, p, kModelSeed);
  optim::ParamStoreOptions ao;
  ao.device(p.device);
  ao.master_dtype(p.dtype);
  ao.moments(0);
  optim::ParamStore arena(in_arena->named_parameters(), ao);
  const int64_t gradient_tensors = static_cast<int64_t>(arena.size());  // 3 weights + 3 biases

  const auto backward_allocations = [&](Model& m) {
    Loss loss = m.loss(batch);
    const int64_t before = memory_stats(p.device).allocations;
    backward(loss.sum);
    return memory_stats(p.device).allocations - before;
  };
  backward_allocations(*warm);
  arena.begin_window();
  const int64_t arena_write = backward_allocations(*in_arena);  // beta 0
  const int64_t arena_add = backward_allocations(*in_arena);    // beta 1
  const int64_t plain_first = backward_allocations(*plain);     // .grad undefined
  const int64_t plain_steady = backward_allocations(*plain);    // .grad defined
  std::printf(
      "[equivalence] %s allocations per backward (%lld parameter tensors): arena %lld "
      "(write) %lld (add), plain .grad %lld (first) %lld (later)\n",
      p.name.c_str(), static_cast<long long>(gradient_tensors), static_cast<long long>(arena_write),
      static_cast<long long>(arena_add), static_cast<long long>(plain_first),
      static_cast<long long>(plain_steady));
  EXPECT_EQ(arena_write, arena_add);
  EXPECT_EQ(plain_steady - arena_add, gradient_tensors);
  EXPECT_GE(plain_first - arena_write, gradient_tensors);
  // Both computed the same gradients.
  std::vector<double> plain_grads;
  for (const Tensor& t : plain->parameters())
    for (double g : host(grad(t)))
      plain_grads.push_back(g);
  std::vector<double> arena_grads;
  for (size_t i = 0; i < arena.size(); ++i)
    for (double g : host(arena.grad_view(i)))
      arena_grads.push_back(g);
  EXPECT_LE(vector_error(p.metric, arena_grads, plain_grads), p.grad_tol);
}

}  // namespace accrue::equivalence
