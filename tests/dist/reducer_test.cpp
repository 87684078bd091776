// The Reducer's logic without a GPU: a world of one rank whose communicator
// records every collective (what, where in the arena, and the data at that
// moment). Note [Reducer]'s rules are checked where they are decided: which
// micro-step communicates, which buckets go during the backward and in what
// order, what an unused parameter contributes, and that the result equals a
// window without any reducer bit for bit. The multi-GPU behaviour (NCCL,
// streams, overlap in time, faults) is tests/dist/multi_gpu_test.cpp's.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/dist/process_group.h"
#include "accrue/dist/reducer.h"
#include "accrue/kernels/ops.h"
#include "tests/equivalence/equivalence_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using equivalence::Batch;
using equivalence::ModelKind;

// World size 1 (the stub does the work) plus a log of every collective.
class RecordingCommunicator final : public Communicator {
 public:
  struct Call {
    std::string kind;
    const void* data = nullptr;
    int64_t numel = 0;
    DType dtype = DType::f32;
    std::vector<double> values;  // the data when the collective was issued
  };

  explicit RecordingCommunicator(Device device = Device::cpu()) : stub_(device) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Device device() const override { return stub_.device(); }
  StreamHandle stream() override { return stub_.stream(); }

  void all_reduce(const Tensor& data, ReduceOp op) override {
    record("all_reduce", data);
    stub_.all_reduce(data, op);
    // A second rank with another layout: its fingerprint wins the max.
    if (other_rank_disagrees && op == ReduceOp::max && data.dtype() == DType::i64)
      data.narrow(0, 0, 1).fill_(static_cast<double>(data.to_vector<int64_t>()[0] + 1));
  }
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) override {
    record("reduce_scatter", input);
    stub_.reduce_scatter(input, output, op);
  }
  void all_gather(const Tensor& input, const Tensor& output) override {
    record("all_gather", input);
    stub_.all_gather(input, output);
  }
  void broadcast(const Tensor& data, int root) override {
    record("broadcast", data);
    stub_.broadcast(data, root);
  }
  void synchronize() override { stub_.synchronize(); }
  void check() override { ++checks; }

  std::vector<Call> calls;
  int64_t checks = 0;
  bool other_rank_disagrees = false;

 private:
  void record(const char* kind, const Tensor& t) {
    calls.push_back({kind, t.data_ptr(), t.numel(), t.dtype(), t.to_vector<double>()});
  }
  StubCommunicator stub_;
};

// Small buckets: the tiny classifier's six parameters fill six buckets.
ReducerOptions small_buckets() {
  ReducerOptions o;
  o.buckets.first_bucket_bytes = 256;
  o.buckets.bucket_bytes = 2048;
  return o;
}

// A model in its arena, optionally a reducer, and a window of K micro-steps:
// members in the order they must be destroyed in reverse.
struct DpRun {
  std::unique_ptr<equivalence::Model> model;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::Window> window;

  DpRun(int64_t K, Communicator* comm, const ReducerOptions& options = small_buckets()) {
    const equivalence::Precision p = equivalence::cpu_f64();
    model = equivalence::make_model(ModelKind::Classifier, p, 11);
    optim::ParamStoreOptions ao;
    ao.master_dtype(DType::f64);
    ao.compute_dtype(DType::f64);
    ao.moments(2);
    arena = equivalence::make_arena(*model, ao);
    if (comm) reducer = std::make_unique<Reducer>(*arena, *comm, options);
    optimizer = std::make_unique<optim::Optimizer>(equivalence::adamw());
    // The calls are counted in order: the unused-parameter check's all-reduce
    // of the used flags (Note [Unused parameters]) is not these tests' subject.
    window = std::make_unique<optim::Window>(
        *arena, *optimizer,
        equivalence::clipped_window(K).unused_parameter_check(optim::UnusedParameterCheck::ignore),
        reducer.get());
  }
  void backward(const Batch& micro) { window->backward(model->loss(micro)); }
};

std::vector<Batch> batches(int64_t count) {
  return equivalence::make_batches(ModelKind::Classifier, count, 8, equivalence::cpu_f64(), 5);
}

TEST(Reducer, no_collective_in_non_final_micro_steps_and_one_per_bucket_in_the_last) {
  RecordingCommunicator comm;
  constexpr int64_t K = 4;
  DpRun run(K, &comm);
  const BucketPlan& plan = run.reducer->plan();
  ASSERT_EQ(plan.size(), 6u) << plan.describe();
  ASSERT_EQ(comm.calls.size(), 1u);  // the layout check
  for (const Batch& global : batches(3)) {
    const size_t base = comm.calls.size();
    const int64_t issued = run.reducer->collectives_issued();
    for (int64_t k = 0; k < K; ++k) {
      run.backward(global.micro(k, K));
      if (k < K - 1) {
        EXPECT_EQ(comm.calls.size(), base) << "micro-step " << k << " communicated";
      }
    }
    // Every parameter got its last-micro-step gradient: every bucket went during the backward.
    EXPECT_EQ(comm.calls.size(), base + plan.size());
    run.window->close();
    ASSERT_EQ(comm.calls.size(), base + plan.size() + 2);
    EXPECT_EQ(run.reducer->collectives_issued() - issued, static_cast<int64_t>(plan.size()) + 2);
    EXPECT_EQ(run.reducer->buckets_sent_in_backward(), static_cast<int64_t>(plan.size()));
    // Plan order, zero-copy slices of the arena, then the item count and the loss sum.
    for (size_t b = 0; b < plan.size(); ++b) {
      const RecordingCommunicator::Call& c = comm.calls[base + b];
      EXPECT_EQ(c.kind, "all_reduce");
      EXPECT_EQ(c.data, plan.view(run.arena->grads(), b).data_ptr()) << "bucket " << b;
      EXPECT_EQ(c.numel, plan[b].numel) << "bucket " << b;
    }
    const RecordingCommunicator::Call& items = comm.calls[base + plan.size()];
    EXPECT_EQ(items.numel, 1);
    EXPECT_EQ(items.dtype, DType::f64);
    EXPECT_EQ(items.values[0], static_cast<double>(global.size()));
    // Then the window's loss sum, so that report() gives the world's mean.
    const RecordingCommunicator::Call& loss = comm.calls.back();
    EXPECT_EQ(loss.kind, "all_reduce");
    EXPECT_EQ(loss.numel, 1);
    EXPECT_EQ(loss.dtype, DType::f64);
    EXPECT_EQ(loss.values[0] / items.values[0], run.window->report().loss);
  }
  // The watchdog is consulted once per micro-step, and by each window's report().
  EXPECT_EQ(comm.checks, 3 * K + 3);
}

TEST(Reducer, first_bucket_goes_before_the_backward_ends) {
  RecordingCommunicator comm;
  constexpr int64_t K = 2;
  DpRun run(K, &comm);
  const size_t base = comm.calls.size(), buckets = run.reducer->plan().size();
  // After each gradient lands (the reducer's hook runs first), how many
  // collectives had been issued.
  std::vector<size_t> issued_at_landing;
  for (const Tensor& p : run.arena->params())
    register_grad_ready_hook(
        p, [&](const Tensor&) { issued_at_landing.push_back(comm.calls.size()); });
  const Batch global = batches(1)[0];
  run.backward(global.micro(0, K));
  EXPECT_EQ(issued_at_landing, std::vector<size_t>(run.arena->size(), base)) << "micro-step 0";
  issued_at_landing.clear();
  run.backward(global.micro(1, K));
  ASSERT_EQ(issued_at_landing.size(), run.arena->size());
  // The first gradient of the backward completes bucket 0, which goes at
  // once; the last bucket goes with the last gradient; in between, buckets
  // went while other gradients were still being computed.
  EXPECT_EQ(issued_at_landing.front(), base + 1);
  EXPECT_EQ(issued_at_landing.back(), base + buckets);
  EXPECT_TRUE(std::is_sorted(issued_at_landing.begin(), issued_at_landing.end()));
  run.window->close();
}

TEST(Reducer, world_of_one_equals_a_window_without_reducer_bitwise) {
  RecordingCommunicator comm;
  constexpr int64_t K = 4;
  DpRun with(K, &comm), without(K, nullptr);
  for (const Batch& global : batches(3)) {
    for (int64_t k = 0; k < K; ++k) {
      with.backward(global.micro(k, K));
      without.backward(global.micro(k, K));
    }
    with.window->close();
    without.window->close();
    EXPECT_TRUE(equivalence::same_bytes(with.arena->grads(), without.arena->grads()));
    EXPECT_TRUE(equivalence::same_bytes(with.arena->master(), without.arena->master()));
    EXPECT_EQ(with.window->report().items, without.window->report().items);
  }
}

// Four parameters, one bucket each (bucket 0 = d ... bucket 3 = a): `a` and
// `d` are used in every micro-step, `c` only in the first, `b` never.
TEST(Reducer, unused_and_early_only_parameters_enter_the_sum_correctly) {
  constexpr int64_t n = 40, K = 3;
  Generator gen(3);
  std::vector<Tensor> params;
  for (int i = 0; i < 4; ++i)
    params.push_back(requires_grad_(randn({n}, DType::f64, Device::cpu(), &gen)));
  optim::ParamStoreOptions ao;
  ao.master_dtype(DType::f64);
  optim::ParamStore arena({{"a", params[0]}, {"b", params[1]}, {"c", params[2]}, {"d", params[3]}},
                          ao);
  RecordingCommunicator comm;
  ReducerOptions ro;
  ro.buckets.first_bucket_bytes = ro.buckets.bucket_bytes = 256;
  Reducer reducer(arena, comm, ro);
  ASSERT_EQ(reducer.plan().size(), 4u) << reducer.plan().describe();
  optim::Optimizer sgd(optim::SGDOptions(0.1));
  optim::Window window(
      arena, sgd,
      optim::WindowOptions().micro_steps(K).unused_parameter_check(
          optim::UnusedParameterCheck::ignore),  // b is unused on purpose; calls counted in order
      &reducer);
  const Tensor& a = arena.params()[0];
  const Tensor& c = arena.params()[2];
  const Tensor& d = arena.params()[3];
  std::vector<Tensor> xs;
  for (int64_t k = 0; k < K; ++k)
    xs.push_back(randn({n}, DType::f64, Device::cpu(), &gen));
  // Stale values in every slot (padding stays 0, as the arena requires):
  // whatever is not overwritten this window must not reach the sum.
  for (size_t i = 0; i < arena.size(); ++i)
    arena.grad_view(i).fill_(std::numeric_limits<double>::quiet_NaN());
  const size_t base = comm.calls.size();
  for (int64_t k = 0; k < K; ++k) {
    Tensor s = sum(a * xs[k]) + sum(d * xs[k]);
    if (k == 0) s = s + sum(c * xs[k]);
    window.backward(Loss{s, full({}, 1.0, DType::f64)});
  }
  // Only d's bucket (0) could go: a's (3) waits for c's (1) and b's (2), in plan order.
  EXPECT_EQ(comm.calls.size(), base + 1);
  window.close();
  EXPECT_EQ(reducer.buckets_sent_in_backward(), 1);
  ASSERT_EQ(comm.calls.size(), base + 6);
  auto bucket_values = [&](size_t b) {
    const std::vector<double>& v = comm.calls[base + b].values;
    return std::vector<double>(v.begin(), v.begin() + n);  // the slot, without padding
  };
  EXPECT_EQ(bucket_values(2), std::vector<double>(n, 0.0)) << "b was never used: it must be 0";
  EXPECT_EQ(bucket_values(1), xs[0].to_vector<double>()) << "c keeps its first micro-step's";
  std::vector<double> a_sum(n, 0.0);
  for (int64_t k = 0; k < K; ++k) {
    const std::vector<double> x = xs[k].to_vector<double>();
    for (int64_t i = 0; i < n; ++i)
      a_sum[i] += x[i];
  }
  const std::vector<double> a_sent = bucket_values(3);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(a_sent[i], a_sum[i], 1e-12 * (1 + std::abs(a_sum[i])));
  // Padding went along as zeros, and nothing is NaN any more.
  for (size_t b = 0; b < 4; ++b)
    for (double v : comm.calls[base + b].values)
      EXPECT_FALSE(std::isnan(v)) << "bucket " << b;
}

TEST(Reducer, another_gradient_after_its_bucket_went_is_an_error) {
  RecordingCommunicator comm;
  DpRun run(1, &comm);
  const Batch global = batches(1)[0];
  run.arena->begin_window();
  run.reducer->before_backward(0, 1);
  backward(run.model->loss(global).sum);
  EXPECT_ERROR(backward(run.model->loss(global).sum), "Reducer", "received another gradient",
               "after its bucket");
}

TEST(Reducer, layout_mismatch_across_ranks_is_an_error) {
  RecordingCommunicator comm;
  comm.other_rank_disagrees = true;
  EXPECT_ERROR(DpRun(2, &comm), "Reducer: rank 0 of 1", "differs from another rank",
               "same parameters");
}

TEST(Reducer, bad_inputs_are_errors) {
  StubCommunicator on_gpu(Device::cuda(0));
  EXPECT_ERROR(DpRun(2, &on_gpu), "Reducer", "arena is on cpu", "cuda:0");
  RecordingCommunicator comm;
  DpRun run(2, &comm);
  EXPECT_ERROR(run.reducer->before_backward(2, 2), "Reducer::before_backward", "micro-step 2");
  EXPECT_ERROR(run.reducer->finish(full({}, 1.0, DType::f32)), "Reducer::finish", "f32");
  EXPECT_ERROR(run.reducer->last_timing(), "Reducer::last_timing", "timing = true");
}

// Note [Copy-engine all-reduce]: what the option refuses, and a communicator
// without copy engines (world size 1 here) leaves the buckets where they were.
TEST(Reducer, copy_engine_all_reduce_refusals_and_a_communicator_without_them) {
  RecordingCommunicator comm;
  ReducerOptions o = small_buckets();
  o.copy_engine_all_reduce = true;
  o.zero1 = true;
  EXPECT_ERROR(DpRun(2, &comm, o), "Reducer", "copy_engine_all_reduce", "zero1");
  o.zero1 = false;
  o.transport = DType::bf16;
  EXPECT_ERROR(DpRun(2, &comm, o), "Reducer", "copy_engine_all_reduce", "16-bit transport");
  o.transport.reset();
  ReducerOptions whole_alone = small_buckets();
  whole_alone.copy_engine_whole_buckets = true;
  EXPECT_ERROR(DpRun(2, &comm, whole_alone), "Reducer", "copy_engine_whole_buckets",
               "copy_engine_all_reduce, which is off");
  DpRun run(2, &comm, o);
  EXPECT_FALSE(run.reducer->copy_engine_all_reduce());
  EXPECT_FALSE(run.reducer->copy_engines_direct());
  std::string why;
  EXPECT_FALSE(comm.use_copy_engine_all_reduce(int64_t{1} << 20, 1, &why));
  EXPECT_NE(why.find("no copy-engine all-reduce"), std::string::npos) << why;
  EXPECT_FALSE(comm.share_with_copy_engines(run.arena->grads(), /*whole_buckets=*/true, &why));
  EXPECT_NE(why.find("no copy-engine all-reduce"), std::string::npos) << why;
  comm.join_pending();  // nothing is ever left: a no-op
  // Training goes on as without the option.
  DpRun plain(2, &comm, small_buckets());
  for (const Batch& b : batches(2)) {
    for (int64_t k = 0; k < 2; ++k) {
      run.backward(b.micro(k, 2));
      plain.backward(b.micro(k, 2));
    }
    run.window->close();
    plain.window->close();
  }
  EXPECT_TRUE(test::all_equal(run.arena->master(), plain.arena->master()));
}

// Note [GEMM SM margin]: a margin outside [0, 1024) is refused, naming it;
// on the CPU a valid one changes nothing (no cuBLASLt plans) and the process
// margin of device 0 stays untouched.
TEST(Reducer, gemm_sm_margin_is_checked_and_a_no_op_on_the_cpu) {
  RecordingCommunicator comm;
  ReducerOptions bad = small_buckets();
  bad.gemm_sm_margin = -1;
  EXPECT_ERROR(DpRun(2, &comm, bad), "Reducer", "gemm_sm_margin -1", "[0, 1024)");
  bad.gemm_sm_margin = 1024;
  EXPECT_ERROR(DpRun(2, &comm, bad), "Reducer", "gemm_sm_margin 1024");
  ReducerOptions o = small_buckets();
  o.gemm_sm_margin = 16;
  DpRun run(2, &comm, o);
  DpRun plain(2, &comm, small_buckets());
  for (const Batch& b : batches(2)) {
    for (int64_t k = 0; k < 2; ++k) {
      run.backward(b.micro(k, 2));
      plain.backward(b.micro(k, 2));
      EXPECT_EQ(kernels::gemm_sm_margin(0), 0);
    }
    run.window->close();
    plain.window->close();
  }
  EXPECT_TRUE(test::all_equal(run.arena->master(), plain.arena->master()));
}

TEST(Reducer, broadcast_parameters_refreshes_the_compute_copy) {
  Generator gen(9);
  std::vector<Tensor> params{requires_grad_(randn({10}, DType::f32, Device::cpu(), &gen)),
                             requires_grad_(randn({3, 4}, DType::f32, Device::cpu(), &gen))};
  optim::ParamStoreOptions ao;
  ao.master_dtype(DType::f32);
  ao.compute_dtype(DType::bf16);
  ao.moments(2);
  optim::ParamStore arena(params, ao);
  RecordingCommunicator comm;
  Reducer reducer(arena, comm);
  // As if rank 0's values had just arrived in the master arena.
  arena.master().copy_(randn({arena.padded_numel()}, DType::f32, Device::cpu(), &gen));
  const size_t base = comm.calls.size();
  reducer.broadcast_parameters(0);
  ASSERT_EQ(comm.calls.size(), base + 3);  // master weights and two moment arenas
  EXPECT_EQ(comm.calls[base].kind, "broadcast");
  EXPECT_EQ(comm.calls[base].data, arena.master().data_ptr());
  EXPECT_TRUE(test::all_equal(arena.compute(), arena.master().to(DType::bf16)));
}

}  // namespace
}  // namespace accrue::dist
