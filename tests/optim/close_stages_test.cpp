// Note [Close stages]: the close's stages follow the options, in one order.
#include "accrue/optim/close_stages.h"

#include "accrue/autograd/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// A sync that owns `ranges` and does nothing else: enough to build a Window.
class FakeSync final : public optim::GradientSync {
 public:
  explicit FakeSync(std::vector<ArenaRange> ranges = {}) : ranges_(std::move(ranges)) {}
  void before_backward(int64_t, int64_t) override {}
  void finish(const Tensor&) override {}
  const std::vector<ArenaRange>& owned_ranges() const override { return ranges_; }
  void check() override {
    if (!failure.empty()) throw Error(failure);
  }
  std::string failure;  // set: a collective failed (the communicator aborted)

 private:
  std::vector<ArenaRange> ranges_;
};

struct Fixture {
  Generator gen{5};
  nn::MLP model{{3, 4, 2}, {Device::cpu(), DType::f64, &gen}};
  optim::Optimizer opt{optim::SGDOptions(0.1)};
  optim::ParamStore store{model.named_parameters(),
                          optim::ParamStoreOptions().master_dtype(DType::f64).moments(0)};
};

TEST(CloseStages, the_default_close_has_the_six_stages_every_window_needs) {
  Fixture f;
  optim::Window w(f.store, f.opt, optim::WindowOptions().micro_steps(2));
  EXPECT_EQ(w.describe_close(), "zero unwritten, items, norm, scalar step, optimizer step, report");
}

TEST(CloseStages, optional_features_are_stages_present_in_their_place) {
  Fixture f;
  optim::Window w(f.store, f.opt,
                  optim::WindowOptions()
                      .micro_steps(2)
                      .unused_parameters(optim::UnusedParameters::skip)
                      .noise_scale(2)
                      .scaler(optim::LossScalerOptions::dynamic().calibrate()));
  EXPECT_EQ(w.describe_close(),
            "unused flags, zero unwritten, items, norm, scalar step, noise scale, slot steps, "
            "optimizer step, calibration, report");
  // The calibration stage acts in the first window only, then stays spent.
  EXPECT_TRUE(w.calibrating());
  const Tensor x = test::random_normal({5, 3}, DType::f64);
  const Tensor y = from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  for (int k = 0; k < 2; ++k)
    w.backward(cross_entropy(f.model.forward(x), y));
  w.close();
  EXPECT_FALSE(w.calibrating());
  EXPECT_FALSE(w.report().skipped);
}

TEST(CloseStages, a_sync_adds_the_reduction_and_zero1_the_gather) {
  Fixture f;
  FakeSync plain;
  optim::Window a(f.store, f.opt, optim::WindowOptions().micro_steps(2), &plain);
  // Note [Unused parameters]: the check reads the world's flags at report().
  EXPECT_EQ(a.describe_close(),
            "unused flags, zero unwritten, items, reduce, norm, scalar step, optimizer step, "
            "report");
  FakeSync sharded({{0, f.store.padded_numel()}});
  optim::Optimizer opt2{optim::SGDOptions(0.1)};
  optim::Window b(f.store, opt2, optim::WindowOptions().micro_steps(2), &sharded);
  EXPECT_EQ(b.describe_close(),
            "unused flags, zero unwritten, items, reduce, norm, scalar step, optimizer step, "
            "gather parameters, report");
}

// A window whose reductions a communicator's abort cut short is never
// reported (so a trainer never saves it): report() throws the sync's error.
TEST(CloseStages, report_throws_when_the_sync_failed) {
  Fixture f;
  FakeSync sync;
  optim::Window w(f.store, f.opt, optim::WindowOptions().micro_steps(1), &sync);
  const Tensor x = test::random_normal({2, 3}, DType::f64);
  w.backward({sum(f.model.forward(x)), full({}, 2.0, DType::i64)});
  w.close();
  EXPECT_NO_THROW(w.report());
  w.backward({sum(f.model.forward(x)), full({}, 2.0, DType::i64)});
  w.close();
  sync.failure = "rank 1 of 2: all_reduce did not complete within 60 s";
  EXPECT_ERROR(w.report(), "rank 1 of 2: all_reduce did not complete within 60 s");
}

// Every stage says what it reads and writes (the table of Note [Close stages]).
TEST(CloseStages, every_stage_names_what_it_reads_and_writes) {
  Fixture f;
  optim::CloseContext c;
  c.store = &f.store;
  c.optimizer = &f.opt;
  c.state = kernels::make_window_state(1.0, Device::cpu());
  c.partials = empty({kernels::norm_partials_rows(f.store.grads()), 2}, DType::f64);
  optim::CloseFeatures all;
  all.skips_unused = true;
  all.noise_every = 1;
  all.calibrate = true;
  const auto stages = optim::make_close_stages(c, all);
  EXPECT_EQ(stages.size(), 10u);
  for (const auto& s : stages) {
    EXPECT_GT(std::string(s->reads()).size(), 0u) << s->name();
    EXPECT_GT(std::string(s->writes()).size(), 0u) << s->name();
  }
}

}  // namespace
}  // namespace accrue
