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

// Note [Window captured whole]: the host bookkeeping around a capture of a
// whole window and its replays, here around eager windows on the CPU (the
// capture itself is CUDA's: python/tests/test_bridge.py replays one against
// the eager windows, bitwise).
TEST(WindowCapturedWhole, the_capture_counts_nothing_and_each_replay_one_window) {
  Fixture f;
  optim::Window w(f.store, f.opt, optim::WindowOptions().micro_steps(2));
  const Tensor x = test::random_normal({5, 3}, DType::f64);
  const Tensor y = from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  const optim::Window::WholeCapture before{w.micro_step(), w.windows_closed(),
                                           f.store.written_flags()};
  for (int k = 0; k < 2; ++k)  // what a capture records runs eagerly here
    w.backward(cross_entropy(f.model.forward(x), y));
  w.close();
  const std::vector<bool> written = w.end_whole_capture(before);
  EXPECT_EQ(w.windows_closed(), 0);
  EXPECT_EQ(w.micro_step(), 0);
  EXPECT_EQ(written, std::vector<bool>(f.store.size(), true));
  EXPECT_EQ(f.store.written_flags(), before.written);
  for (int replay = 1; replay <= 3; ++replay) {
    w.before_whole_replay(written);
    w.after_whole_replay(written);
    EXPECT_EQ(w.windows_closed(), replay);
    EXPECT_EQ(w.micro_step(), 0);
    EXPECT_EQ(f.store.written_flags(), written);
  }
}

TEST(WindowCapturedWhole, a_capture_of_less_or_more_than_one_window_is_an_error) {
  Fixture f;
  optim::Window w(f.store, f.opt, optim::WindowOptions().micro_steps(2));
  const Tensor x = test::random_normal({5, 3}, DType::f64);
  const Tensor y = from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  const optim::Window::WholeCapture before{0, 0, f.store.written_flags()};
  w.backward(cross_entropy(f.model.forward(x), y));
  EXPECT_ERROR(w.end_whole_capture(before), "end_whole_capture", "0 close(s)", "1 micro-step(s)",
               "exactly 2 backward() calls and one close()");
  EXPECT_EQ(w.micro_step(), 0);  // the host state is put back all the same
  EXPECT_EQ(w.windows_closed(), 0);
}

TEST(WindowCapturedWhole, what_a_replay_would_get_wrong_is_refused_at_the_start) {
  Fixture f;
  optim::Window w(f.store, f.opt, optim::WindowOptions().micro_steps(2));
  EXPECT_ERROR(w.begin_whole_capture(), "begin_whole_capture", "cpu", "CUDA graphs are CUDA's");
  const Tensor x = test::random_normal({5, 3}, DType::f64);
  const Tensor y = from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  w.backward(cross_entropy(f.model.forward(x), y));
  EXPECT_ERROR(w.begin_whole_capture(), "begin_whole_capture", "1 of 2 micro-steps",
               "capture from a window's start");
  EXPECT_ERROR(w.before_whole_replay(f.store.written_flags()), "before_whole_replay",
               "1 micro-steps done eagerly");
  FakeSync sync;
  optim::Optimizer opt2{optim::SGDOptions(0.1)};
  optim::Window synced(f.store, opt2, optim::WindowOptions().micro_steps(2), &sync);
  EXPECT_ERROR(synced.begin_whole_capture(), "begin_whole_capture", "GradientSync");
  optim::Optimizer opt3{optim::SGDOptions(0.1)};
  optim::Window noisy(f.store, opt3, optim::WindowOptions().micro_steps(2).noise_scale(2));
  EXPECT_ERROR(noisy.begin_whole_capture(), "begin_whole_capture",
               "the noise scale decides on the host");
}

}  // namespace
}  // namespace accrue
