// nn::BatchNorm and Note [Window statistics], on the CPU in f64: gradients by
// finite differences, PyTorch's per-micro-batch running statistics, and the
// window mode's once-per-window update equal to one forward of the whole batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/nn/batch_norm.h"
#include "accrue/optim/graphed_window.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const nn::ParamOptions kF64{Device::cpu(), DType::f64, nullptr};

nn::BatchNormOptions mode(nn::BatchNormStatistics s) {
  nn::BatchNormOptions o;
  o.statistics = s;
  return o;
}

// The tensors stacked along dim 0.
Tensor cat_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts.front().shape();
  shape[0] = 0;
  for (const Tensor& p : parts)
    shape[0] += p.size(0);
  Tensor out = empty(shape, parts.front().dtype());
  int64_t row = 0;
  for (const Tensor& p : parts) {
    out.narrow(0, row, p.size(0)).copy_(p);
    row += p.size(0);
  }
  return out;
}

// Per-channel mean and unbiased variance of x [N, C, ...] (host doubles).
void channel_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t c = x.size(1), inner = x.numel() / (x.size(0) * c);
  const std::vector<double> v = x.contiguous().to_vector<double>();
  mean.assign(static_cast<size_t>(c), 0.0);
  var.assign(static_cast<size_t>(c), 0.0);
  const double n = static_cast<double>(x.numel() / c);
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i)
    mean[static_cast<size_t>((i / inner) % c)] += v[static_cast<size_t>(i)] / n;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    const double d = v[static_cast<size_t>(i)] - mean[static_cast<size_t>((i / inner) % c)];
    var[static_cast<size_t>((i / inner) % c)] += d * d / (n - 1.0);
  }
}

TEST(BatchNorm, passes_gradcheck_in_training_and_in_eval) {
  for (const Shape& shape : {Shape{5, 3}, Shape{3, 2, 2, 3}}) {
    nn::BatchNorm bn(shape[1], kF64);
    const std::vector<nn::NamedParameter> p = bn.named_parameters();
    const Tensor x = requires_grad_(test::random_normal(shape, DType::f64));
    load_parameter(p[0].tensor, test::random_uniform({shape[1]}, 0.5, 2.0, DType::f64));
    load_parameter(p[1].tensor, test::random_normal({shape[1]}, DType::f64));
    auto f = [&](const std::vector<Tensor>& v) { return bn.forward(v[0]); };
    GradcheckResult r = gradcheck(f, {x, p[0].tensor, p[1].tensor});
    EXPECT_TRUE(r.ok) << shape_str(shape) << " training: " << r.message;
    bn.eval();
    r = gradcheck(f, {x, p[0].tensor, p[1].tensor});
    EXPECT_TRUE(r.ok) << shape_str(shape) << " eval: " << r.message;
  }
}

TEST(BatchNorm, per_micro_batch_moves_the_running_statistics_every_forward) {
  nn::BatchNorm bn(3, kF64, mode(nn::BatchNormStatistics::PerMicroBatch));
  std::vector<double> rm(3, 0.0), rv(3, 1.0), m, v;
  for (int k = 0; k < 4; ++k) {
    const Tensor x = test::random_normal({4, 3, 5}, DType::f64, Device::cpu(), 1.0 + k);
    bn.forward(x);
    channel_stats(x, m, v);
    for (size_t c = 0; c < 3; ++c) {
      rm[c] = 0.9 * rm[c] + 0.1 * m[c];
      rv[c] = 0.9 * rv[c] + 0.1 * v[c];
    }
  }
  const std::vector<double> got_m = bn.running_mean().to_vector<double>();
  const std::vector<double> got_v = bn.running_var().to_vector<double>();
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(got_m[c], rm[c], 1e-14) << c;
    EXPECT_NEAR(got_v[c], rv[c], 1e-14) << c;
  }
}

// Note [BatchNorm in f32]: a bf16 input far from zero (channel means near
// 100 and -300, where bf16's spacing is 0.5 and 2) gets its statistics in
// f32: the running mean and variance after one forward at momentum 1 equal
// the f64 statistics of the same bf16 values to f32 accuracy (in bf16 the
// mean alone would be off by up to a quarter of a spacing, ~1e-3 relative);
// the output is bf16, and in eval mode the normalized values match the f64
// formula to bf16 accuracy.
TEST(BatchNorm, bf16_inputs_get_f32_statistics) {
  nn::BatchNormOptions o = mode(nn::BatchNormStatistics::PerMicroBatch);
  o.momentum = 1.0;
  nn::BatchNorm bn(2, {Device::cpu(), DType::bf16, nullptr}, o);
  Tensor x64 = test::random_normal({8, 2, 5, 5}, DType::f64, Device::cpu(), 3.0);
  x64.narrow(1, 0, 1).copy_(x64.narrow(1, 0, 1) + 100.0);
  x64.narrow(1, 1, 1).copy_(x64.narrow(1, 1, 1) - 300.0);
  const Tensor x = x64.to(DType::bf16);
  const Tensor y = bn.forward(x);
  EXPECT_EQ(y.dtype(), DType::bf16);
  std::vector<double> m, v;
  channel_stats(x.to(DType::f64), m, v);
  const std::vector<double> got_m = bn.running_mean().to_vector<double>();
  const std::vector<double> got_v = bn.running_var().to_vector<double>();
  for (size_t c = 0; c < 2; ++c) {
    EXPECT_NEAR(got_m[c], m[c], 1e-6 * std::abs(m[c])) << c;
    EXPECT_NEAR(got_v[c], v[c], 1e-5 * v[c]) << c;
  }
  bn.eval();
  const std::vector<double> yv =
      detach(bn.forward(x)).to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> xv = x.to(DType::f64).contiguous().to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 25) % 2;
    const double want = (xv[i] - got_m[c]) / std::sqrt(got_v[c] + 1e-5);
    worst = std::max(worst, std::abs(yv[i] - want));
  }
  EXPECT_LT(worst, 2e-2) << "eval output against the f64 formula";
}

// Note [Window statistics]: K micro-batches, one close: the running
// statistics of one forward over the concatenated batch, which PyTorch's
// per-forward update of the whole batch also gives.
TEST(BatchNorm, window_mode_updates_once_as_the_whole_batch_would) {
  std::vector<Tensor> micro;
  for (int k = 0; k < 4; ++k)  // different scales and offsets per micro-batch
    micro.push_back(test::random_normal({3, 2, 4}, DType::f64, Device::cpu(), 0.5 + k) + 0.3 * k);
  nn::BatchNorm windowed(2, kF64);
  for (const Tensor& x : micro)
    windowed.forward(x);
  EXPECT_TRUE(test::all_equal(windowed.running_mean(), zeros({2}, DType::f64)))
      << "moved before the close";
  windowed.on_window_close();

  nn::BatchNorm whole(2, kF64, mode(nn::BatchNormStatistics::PerMicroBatch));
  whole.forward(cat_rows(micro));
  const double dm = test::relative_error(windowed.running_mean(), whole.running_mean());
  const double dv = test::relative_error(windowed.running_var(), whole.running_var());
  std::printf("[batch norm] window of 4 vs one batch of 12: running mean %.1e, var %.1e\n", dm, dv);
  EXPECT_LT(dm, 1e-12);
  EXPECT_LT(dv, 1e-12);

  // K updates of small samples land elsewhere: the mode matters.
  nn::BatchNorm per(2, kF64, mode(nn::BatchNormStatistics::PerMicroBatch));
  for (const Tensor& x : micro)
    per.forward(x);
  EXPECT_GT(test::relative_error(per.running_var(), whole.running_var()), 1e-3);

  // A close with no forward, and a restart, leave the running statistics alone.
  const Tensor mean = windowed.running_mean().clone(), var = windowed.running_var().clone();
  windowed.on_window_close();
  windowed.forward(micro[0]);
  windowed.on_window_restart();
  windowed.on_window_close();
  EXPECT_TRUE(test::all_equal(windowed.running_mean(), mean));
  EXPECT_TRUE(test::all_equal(windowed.running_var(), var));
}

// compound_momentum: a window that merged F forwards moves the running
// statistics by 1 - (1 - m)^F toward the merged ones, PyTorch's pace.
TEST(BatchNorm, compound_momentum_moves_by_the_forwards_merged) {
  std::vector<Tensor> micro;
  for (int k = 0; k < 4; ++k)
    micro.push_back(test::random_normal({3, 2, 4}, DType::f64, Device::cpu(), 0.5 + k) + 0.3 * k);
  nn::BatchNormOptions o;
  o.compound_momentum = true;
  nn::BatchNorm compound(2, kF64, o);
  for (const Tensor& x : micro)
    compound.forward(x);
  compound.on_window_close();
  // The whole batch once, with momentum 1 - 0.9^4, from the same start (mean 0, var 1).
  nn::BatchNormOptions once = mode(nn::BatchNormStatistics::PerMicroBatch);
  once.momentum = 1.0 - std::pow(0.9, 4);
  nn::BatchNorm whole(2, kF64, once);
  whole.forward(cat_rows(micro));
  EXPECT_LT(test::relative_error(compound.running_mean(), whole.running_mean()), 1e-12);
  EXPECT_LT(test::relative_error(compound.running_var(), whole.running_var()), 1e-12);
  // The next window counts its own forwards: one forward moves by m again.
  nn::BatchNormOptions m1 = mode(nn::BatchNormStatistics::PerMicroBatch);
  nn::BatchNorm single(2, kF64, m1);
  {
    NoGradGuard no_grad;
    single.running_mean().copy_(compound.running_mean());
    single.running_var().copy_(compound.running_var());
  }
  compound.forward(micro[1]);
  compound.on_window_close();
  single.forward(micro[1]);
  EXPECT_LT(test::relative_error(compound.running_var(), single.running_var()), 1e-12);
}

// Through an optim::Window: the listener moves the statistics at close, and
// the pending statistics are buffers (a mid-window state dict carries them).
TEST(BatchNorm, a_window_tells_its_batch_norms_when_it_closes) {
  Generator g(4);
  nn::Linear fc(3, 2, true, {Device::cpu(), DType::f64, &g});
  nn::BatchNorm bn(2, kF64);
  std::vector<Tensor> params = fc.parameters();
  for (const Tensor& t : bn.parameters())
    params.push_back(t);
  optim::ParamStore arena(
      {{"fc.w", params[0]}, {"fc.b", params[1]}, {"bn.w", params[2]}, {"bn.b", params[3]}},
      optim::ParamStoreOptions().master_dtype(DType::f64).moments(0));
  optim::Optimizer opt(optim::SGDOptions(0.0));  // lr 0: the same weights every micro-step
  optim::Window window(arena, opt, optim::WindowOptions().micro_steps(3));
  window.add_listener(&bn);
  std::vector<Tensor> inputs;
  for (int k = 0; k < 3; ++k) {
    inputs.push_back(test::random_normal({4, 3}, DType::f64));
    const Tensor y = bn.forward(fc.forward(inputs.back()));
    window.backward({sum(y * y), full({}, 4.0, DType::i64)});
  }
  EXPECT_EQ(bn.state_dict().count("pending_m2"), 1u);
  EXPECT_EQ(bn.state_dict().at("pending_count").item(), 12.0);
  window.close();
  EXPECT_EQ(bn.state_dict().at("pending_count").item(), 0.0);
  nn::BatchNorm whole(2, kF64, mode(nn::BatchNormStatistics::PerMicroBatch));
  {
    NoGradGuard no_grad;
    whole.forward(fc.forward(cat_rows(inputs)));
  }
  EXPECT_LT(test::relative_error(bn.running_var(), whole.running_var()), 1e-12);

  // Note [Window statistics]: a skipped window still moves them (its
  // gradient is not finite; the forwards' statistics are).
  const Tensor before = bn.running_mean().clone();
  for (int k = 0; k < 3; ++k) {
    const Tensor y = bn.forward(fc.forward(inputs[static_cast<size_t>(k)] * 2.0));
    window.backward({sum(y * y) * INFINITY, full({}, 4.0, DType::i64)});
  }
  window.close();
  EXPECT_TRUE(window.report().skipped);
  EXPECT_FALSE(test::all_equal(bn.running_mean(), before));
  window.remove_listener(&bn);
}

// A model whose BatchNorm sits inside a child, as in a real network.
class Net : public nn::Module {
 public:
  explicit Net(Generator* g) {
    fc = &register_module("fc", std::make_unique<nn::Linear>(
                                    3, 2, true, nn::ParamOptions{Device::cpu(), DType::f64, g}));
    bn = &register_module("bn", std::make_unique<nn::BatchNorm>(
                                    2, kF64, mode(nn::BatchNormStatistics::PerMicroBatch)));
  }
  Tensor forward(const Tensor& x) { return bn->forward(fc->forward(x)); }
  nn::Linear* fc;
  nn::BatchNorm* bn;
};

// Precise BN: the running statistics become those of all the batches merged,
// whatever they were, and the modes come back; a throwing pass changes nothing.
TEST(BatchNorm, recompute_statistics_over_many_batches) {
  Generator g(8);
  Net net(&g);
  std::vector<Tensor> batches;
  for (int k = 0; k < 5; ++k)
    batches.push_back(test::random_normal({6, 3}, DType::f64, Device::cpu(), 1.0 + k));
  for (const Tensor& x : batches)  // per-micro-batch updates: somewhere in between
    net.forward(x);
  net.eval();
  nn::recompute_batch_norm_statistics(net, [&] {
    for (const Tensor& x : batches)
      net.forward(x);
  });
  EXPECT_FALSE(net.training());
  Tensor features;
  {
    NoGradGuard no_grad;
    features = net.fc->forward(cat_rows(batches));
  }
  std::vector<double> mean, var;
  channel_stats(features, mean, var);
  EXPECT_LT(test::relative_error(net.bn->running_mean(), from_vector<double>(mean, {2})), 1e-12);
  EXPECT_LT(test::relative_error(net.bn->running_var(), from_vector<double>(var, {2})), 1e-12);
  // The layer is back in per-micro-batch mode: one training forward moves it.
  net.train();
  const Tensor before = net.bn->running_mean().clone();
  net.forward(batches[0]);
  EXPECT_FALSE(test::all_equal(net.bn->running_mean(), before));
  // A pass that throws leaves the statistics and the mode as they were.
  const Tensor kept = net.bn->running_var().clone();
  EXPECT_ERROR(nn::recompute_batch_norm_statistics(net,
                                                   [&] {
                                                     net.forward(batches[0]);
                                                     ACCRUE_FAIL("data ran out");
                                                   }),
               "data ran out");
  EXPECT_TRUE(test::all_equal(net.bn->running_var(), kept));
  EXPECT_TRUE(net.training());
  nn::Linear plain(3, 2, true, kF64);
  EXPECT_ERROR(nn::recompute_batch_norm_statistics(plain, [] {}), "no BatchNorm");
}

TEST(BatchNorm, bad_inputs_and_options_are_errors) {
  nn::BatchNorm bn(3, kF64);
  EXPECT_ERROR(bn.forward(zeros({4, 2, 5}, DType::f64)), "BatchNorm", "[4, 2, 5]", "3 channels");
  EXPECT_ERROR(bn.forward(zeros({4}, DType::f64)), "BatchNorm", "[4]");
  EXPECT_ERROR(bn.forward(zeros({1, 3}, DType::f64)), "BatchNorm", "more than one value", "[1, 3]");
  nn::BatchNormOptions o;
  o.momentum = 0.0;
  EXPECT_ERROR(nn::BatchNorm(3, kF64, o), "BatchNorm", "momentum", "0");
  EXPECT_ERROR(nn::BatchNorm(0, kF64), "BatchNorm", "channels", "0");
}

// Note [Graphed window]: a BatchNorm says when replayed micro-steps would
// leave its statistics wrong, and a GraphedWindow it listens to then keeps
// everything eager; otherwise nothing about it keeps the graphs away.
TEST(BatchNormListener, says_when_replays_would_leave_its_statistics_wrong) {
  nn::BatchNorm window_mode(3, kF64);
  EXPECT_EQ(window_mode.why_not_capturable(), nullptr);
  nn::BatchNorm per_micro_batch(3, kF64, mode(nn::BatchNormStatistics::PerMicroBatch));
  EXPECT_EQ(per_micro_batch.why_not_capturable(), nullptr);
  nn::BatchNormOptions compound;
  compound.compound_momentum = true;
  nn::BatchNorm counting(3, kF64, compound);
  ASSERT_NE(counting.why_not_capturable(), nullptr);
  EXPECT_NE(std::string(counting.why_not_capturable()).find("compound_momentum"),
            std::string::npos);
}

TEST(BatchNormListener, a_graphed_window_stays_eager_only_for_a_listener_that_cannot_follow) {
  for (bool compound : {false, true}) {
    SCOPED_TRACE(compound ? "compound momentum" : "window statistics");
    nn::BatchNormOptions o;
    o.compound_momentum = compound;
    nn::BatchNorm bn(3, kF64, o);
    optim::Optimizer sgd(optim::SGDOptions(0.1));
    optim::ParamStore store(bn.named_parameters(),
                            optim::ParamStoreOptions().master_dtype(DType::f64).moments(0));
    optim::Window window(store, sgd, optim::WindowOptions().micro_steps(2));
    window.add_listener(&bn);
    testing::internal::CaptureStderr();
    const optim::GraphedWindow g(window, [&](const std::vector<Tensor>& in) {
      return Loss{sum(bn.forward(in[0])), from_vector<double>({1.0}, {})};
    });
    const std::string warned = testing::internal::GetCapturedStderr();
    if (compound) {
      EXPECT_NE(g.why_eager().find("compound_momentum counts its forwards"), std::string::npos);
      EXPECT_NE(warned.find("every micro-step and close runs eagerly"), std::string::npos);
    } else {
      EXPECT_EQ(g.why_eager(), "");
      EXPECT_EQ(warned, "");
    }
  }
}

// Note [Concurrent micro-batches]: BatchNorm keeps a group's statistics and
// records them at its end, so a graphed window of concurrent micro-batches
// takes it as a listener; on the CPU the groups run one after another and
// train bitwise as a plain window, the statistics included. The group hooks
// record in the forwards' order (or drop, when abandoned). A listener that
// cannot keep a group's writes is still refused.
TEST(BatchNormListener, concurrent_micro_batches_take_batch_norms_and_train_as_a_plain_window) {
  for (nn::BatchNormStatistics stats :
       {nn::BatchNormStatistics::Window, nn::BatchNormStatistics::PerMicroBatch}) {
    SCOPED_TRACE(stats == nn::BatchNormStatistics::Window ? "window" : "per micro-batch");
    struct Run {
      nn::BatchNorm bn;
      optim::Optimizer sgd{optim::SGDOptions(0.1).momentum(0.9)};
      optim::ParamStore store;
      optim::Window window;
      explicit Run(nn::BatchNormStatistics s)
          : bn(3, kF64, mode(s)),
            store(bn.named_parameters(),
                  optim::ParamStoreOptions().master_dtype(DType::f64).moments(1)),
            window(store, sgd, optim::WindowOptions().micro_steps(3)) {
        window.add_listener(&bn);
      }
      Loss loss(const Tensor& x) {
        const Tensor y = bn.forward(x);
        return Loss{sum(y * y * y), from_vector<double>({1.0}, {})};
      }
    } plain(stats), grouped(stats);
    EXPECT_TRUE(grouped.bn.defers_group_writes());
    optim::GraphedWindow g(grouped.window,
                           [&](const std::vector<Tensor>& in) { return grouped.loss(in[0]); });
    g.set_concurrent_micro_batches(2);  // K = 3: a group of 2, then one of 1
    for (int w = 0; w < 2; ++w) {
      for (int k = 0; k < 3; ++k) {
        const Tensor x = test::random_normal({5, 3, 2}, DType::f64, Device::cpu(), 2.0);
        plain.window.backward(plain.loss(x));
        g.backward({x});
      }
      plain.window.close();
      g.close();
    }
    EXPECT_TRUE(test::all_equal(grouped.store.master(), plain.store.master()));
    EXPECT_TRUE(test::all_equal(grouped.bn.running_mean(), plain.bn.running_mean()));
    EXPECT_TRUE(test::all_equal(grouped.bn.running_var(), plain.bn.running_var()));
  }
  // The hooks themselves: a group's forwards record at its end, in their
  // order; an abandoned group records nothing.
  nn::BatchNorm sequential(3, kF64), grouped_bn(3, kF64), abandoned(3, kF64);
  const Tensor x1 = test::random_normal({4, 3}, DType::f64, Device::cpu(), 2.0);
  const Tensor x2 = test::random_normal({6, 3}, DType::f64, Device::cpu(), 2.0);
  sequential.forward(x1);
  sequential.forward(x2);
  sequential.on_window_close();
  grouped_bn.on_group_begin();
  grouped_bn.forward(x1);
  grouped_bn.forward(x2);
  grouped_bn.on_group_end();
  grouped_bn.on_window_close();
  EXPECT_TRUE(test::all_equal(grouped_bn.running_mean(), sequential.running_mean()));
  EXPECT_TRUE(test::all_equal(grouped_bn.running_var(), sequential.running_var()));
  const Tensor before = abandoned.running_mean().clone();
  abandoned.on_group_begin();
  abandoned.forward(x1);
  abandoned.on_group_abandon();
  abandoned.on_window_close();
  EXPECT_TRUE(test::all_equal(abandoned.running_mean(), before));
  EXPECT_FALSE(test::all_equal(sequential.running_mean(), before));  // the forwards did record
  // A listener with window state that cannot keep a group's writes.
  struct Unordered : WindowListener {
    void on_window_close() override {}
    void on_window_restart() override {}
    const char* why_not_capturable() const override { return nullptr; }
  } unordered;
  nn::BatchNorm bn(3, kF64);
  optim::Optimizer sgd(optim::SGDOptions(0.1));
  optim::ParamStore store(bn.named_parameters(),
                          optim::ParamStoreOptions().master_dtype(DType::f64).moments(0));
  optim::Window window(store, sgd, optim::WindowOptions().micro_steps(2));
  window.add_listener(&bn);
  window.add_listener(&unordered);
  optim::GraphedWindow g(window, [&](const std::vector<Tensor>& in) {
    return Loss{sum(bn.forward(in[0])), from_vector<double>({1.0}, {})};
  });
  EXPECT_ERROR(g.set_concurrent_micro_batches(2), "set_concurrent_micro_batches(2)",
               "not with a window listener that cannot keep a group's writes in order");
}

}  // namespace
}  // namespace accrue
