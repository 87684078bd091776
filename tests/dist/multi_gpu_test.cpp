// Data parallelism on real GPUs, two ranks (started by multi_gpu_launch.sh):
// the NCCL collectives are exact, the reducer communicates only in the last
// micro-step and overlaps the backward, and 2 ranks x K equal 1 GPU x 2K at
// the same global batch. Every rank checks the properties on its own data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/core/allocator.h"
#include "accrue/dist/reducer.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/module.h"
#include "tests/dist/multi_gpu_world.h"
#include "tests/dist/norm_rows_dist_cases.h"
#include "tests/dist/unused_parameters_util.h"
#include "tests/equivalence/equivalence_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using equivalence::Batch;
using equivalence::ModelKind;
using multi_gpu::device;
using multi_gpu::info;
using multi_gpu::world;

// ---- collectives --------------------------------------------------------------------------

// Rank r's small integers for test `seed`: every rank can rebuild every
// other rank's input, so the expected results are computed exactly on the host.
std::vector<double> integers(int64_t n, int r, uint64_t seed) {
  Generator gen(seed * 1000 + static_cast<uint64_t>(r));
  return randint(-8, 9, {n}, DType::i64, Device::cpu(), &gen).to_vector<double>();
}

Tensor on_device(const std::vector<double>& v, DType dtype) {
  return from_vector(v, {static_cast<int64_t>(v.size())}, dtype, device());
}

const std::vector<DType> kDtypes{DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64};
const std::vector<int64_t> kSizes{1, 1000, (int64_t{1} << 20) + 3};

TEST(MultiGpu, all_reduce_of_small_integers_is_exact) {
  const int W = info().world_size;
  uint64_t seed = 1;
  for (DType dtype : kDtypes) {
    for (int64_t n : kSizes) {
      ++seed;
      std::vector<double> sum(n, 0.0), max(n, -1e9);
      for (int r = 0; r < W; ++r) {
        const std::vector<double> v = integers(n, r, seed);
        for (int64_t i = 0; i < n; ++i) {
          sum[i] += v[i];
          max[i] = std::max(max[i], v[i]);
        }
      }
      Tensor a = on_device(integers(n, info().rank, seed), dtype);
      Tensor b = a.clone();
      world().all_reduce(a, ReduceOp::sum);
      world().all_reduce(b, ReduceOp::max);
      world().synchronize();
      EXPECT_TRUE(test::all_equal(a, on_device(sum, dtype))) << dtype_name(dtype) << " n=" << n;
      EXPECT_TRUE(test::all_equal(b, on_device(max, dtype))) << dtype_name(dtype) << " n=" << n;
    }
  }
}

// Note [Deferred launch]: a collective returns while NCCL may still be
// launching it; work that the caller orders after it through stream() (an
// event recorded there, which the compute stream waits for) must still see
// its result. The copy is read before any synchronize(), as the reducer's
// close reads the sums.
TEST(MultiGpu, work_ordered_after_a_collective_through_its_stream_sees_the_result) {
  const int W = info().world_size;
  const int64_t n = int64_t{8} << 20;  // 32 MiB of f32: the sum takes a while
  for (uint64_t seed = 100; seed < 104; ++seed) {
    std::vector<double> sum(n, 0.0);
    for (int r = 0; r < W; ++r) {
      const std::vector<double> v = integers(n, r, seed);
      for (int64_t i = 0; i < n; ++i)
        sum[i] += v[i];
    }
    Tensor a = on_device(integers(n, info().rank, seed), DType::f32);
    world().all_reduce(a, ReduceOp::sum);
    Event after;
    after.record(world().stream());
    after.block(current_stream(device().index));
    const Tensor copy = a.clone();  // on the compute stream, after the event
    // Read back through the compute stream alone, before synchronize().
    const ::testing::AssertionResult same = test::all_equal(copy, on_device(sum, DType::f32));
    world().synchronize();
    EXPECT_TRUE(same) << "seed " << seed;
  }
}

TEST(MultiGpu, reduce_scatter_all_gather_and_broadcast_are_exact) {
  const int W = info().world_size, rank = info().rank;
  uint64_t seed = 100;
  for (DType dtype : kDtypes) {
    for (int64_t n : kSizes) {
      ++seed;
      // reduce_scatter: chunk `rank` of the sum of every rank's [W * n].
      std::vector<double> sum(W * n, 0.0);
      for (int r = 0; r < W; ++r) {
        const std::vector<double> v = integers(W * n, r, seed);
        for (int64_t i = 0; i < W * n; ++i)
          sum[i] += v[i];
      }
      const std::vector<double> chunk(sum.begin() + rank * n, sum.begin() + (rank + 1) * n);
      Tensor input = on_device(integers(W * n, rank, seed), dtype);
      Tensor output = empty({n}, dtype, device());
      test::poison(output);
      world().reduce_scatter(input, output);
      Tensor in_place = on_device(integers(W * n, rank, seed), dtype);
      world().reduce_scatter(in_place, in_place.narrow(0, rank * n, n));
      // all_gather: every rank's [n], in rank order.
      std::vector<double> gathered;
      for (int r = 0; r < W; ++r) {
        const std::vector<double> v = integers(n, r, seed + 7);
        gathered.insert(gathered.end(), v.begin(), v.end());
      }
      Tensor gather_out = empty({W * n}, dtype, device());
      test::poison(gather_out);
      // Named: a collective's tensors must live until it completes (Note [Collective ordering]).
      Tensor gather_in = on_device(integers(n, rank, seed + 7), dtype);
      world().all_gather(gather_in, gather_out);
      Tensor gather_in_place = empty({W * n}, dtype, device());
      test::poison(gather_in_place);
      gather_in_place.narrow(0, rank * n, n).copy_(on_device(integers(n, rank, seed + 7), dtype));
      world().all_gather(gather_in_place.narrow(0, rank * n, n), gather_in_place);
      // broadcast from the last rank.
      Tensor bcast = on_device(integers(n, rank, seed + 13), dtype);
      world().broadcast(bcast, W - 1);
      world().synchronize();
      const std::string what = std::string(dtype_name(dtype)) + " n=" + std::to_string(n);
      EXPECT_TRUE(test::all_equal(output, on_device(chunk, dtype))) << "reduce_scatter " << what;
      EXPECT_TRUE(test::all_equal(in_place.narrow(0, rank * n, n), on_device(chunk, dtype)))
          << "in-place reduce_scatter " << what;
      EXPECT_TRUE(test::all_equal(gather_out, on_device(gathered, dtype))) << "all_gather " << what;
      EXPECT_TRUE(test::all_equal(gather_in_place, on_device(gathered, dtype)))
          << "in-place all_gather " << what;
      EXPECT_TRUE(test::all_equal(bcast, on_device(integers(n, W - 1, seed + 13), dtype)))
          << "broadcast " << what;
    }
  }
}

TEST(MultiGpu, bad_collective_arguments_are_errors_before_anything_is_enqueued) {
  const int64_t before = world().collectives_issued();
  EXPECT_ERROR(world().all_reduce(zeros({4}, DType::f32, Device::cpu())), "all_reduce", "cpu");
  EXPECT_ERROR(world().all_reduce(zeros({4, 4}, DType::f32, device()).transpose(0, 1)),
               "all_reduce", "contiguous");
  EXPECT_ERROR(
      world().reduce_scatter(zeros({6}, DType::f32, device()), zeros({4}, DType::f32, device())),
      "reduce_scatter", "6", "4");
  EXPECT_ERROR(world().broadcast(zeros({4}, DType::f32, device()), 5), "broadcast", "root 5");
  EXPECT_EQ(world().collectives_issued(), before);
  EXPECT_FALSE(world().aborted());
}

// ---- the reducer ----------------------------------------------------------------------------

equivalence::Precision gpu_f32() {
  equivalence::Precision p = equivalence::cuda_f32();
  p.device = device();
  return p;
}

// A model in its arena, optionally a reducer over the world, an optimizer
// and a window (members in reverse order of destruction).
struct Trainer {
  std::unique_ptr<equivalence::Model> model;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::Window> window;

  Trainer(std::unique_ptr<equivalence::Model> m, int64_t K, bool data_parallel,
          const ReducerOptions& options = {}, DType compute = DType::f32,
          Communicator& comm = world(), bool shareable_gradients = false)
      : model(std::move(m)) {
    optim::ParamStoreOptions ao;
    ao.device(device());
    ao.compute_dtype(compute);
    ao.moments(2);
    ao.shareable_gradients(shareable_gradients);
    arena = equivalence::make_arena(*model, ao);
    if (data_parallel) {
      reducer = std::make_unique<Reducer>(*arena, comm, options);
      reducer->broadcast_parameters(0);
    }
    optimizer = std::make_unique<optim::Optimizer>(equivalence::adamw());
    window = std::make_unique<optim::Window>(*arena, *optimizer, equivalence::clipped_window(K),
                                             reducer.get());
  }
  void backward(const Batch& micro) { window->backward(model->loss(micro)); }
  std::vector<double> grads() const { return arena->grads().to_vector<double>(); }
  std::vector<double> master() const { return arena->master().to_vector<double>(); }
};

Trainer make_trainer(ModelKind kind, int64_t K, bool data_parallel) {
  return Trainer(equivalence::make_model(kind, gpu_f32(), 21), K, data_parallel);
}

// One window of the global batch: the reference takes all W*K micro-batches,
// rank r the K micro-batches r*K .. r*K + K-1 of them.
void window_step(Trainer& dp, Trainer& reference, const Batch& global, int64_t K) {
  const int64_t W = info().world_size, rank = info().rank;
  for (int64_t k = 0; k < W * K; ++k)
    reference.backward(global.micro(k, W * K));
  for (int64_t k = 0; k < K; ++k)
    dp.backward(global.micro(rank * K + k, W * K));
  reference.window->close();
  dp.window->close();
}

// ---- the copy-engine all-reduce (Note [Copy-engine all-reduce]) ------------------------------

bool same_on_every_rank(const Tensor& t);

// A second communicator over the same ranks: rank 0's NCCL id reaches the
// others through the world.
std::unique_ptr<NcclCommunicator> second_communicator() {
  Blob id{};
  if (info().rank == 0) id = NcclCommunicator::make_unique_id();
  std::vector<int64_t> words(id.begin(), id.end());
  Tensor t = from_vector(words, {static_cast<int64_t>(words.size())}, DType::i64, device());
  world().broadcast(t, 0);
  world().synchronize();
  const std::vector<int64_t> got = t.to_vector<int64_t>();
  for (size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<uint8_t>(got[i]);
  NcclOptions options;
  options.timeout_s = multi_gpu::kTimeoutSeconds;
  return std::make_unique<NcclCommunicator>(id, info().rank, info().world_size, device().index,
                                            options);
}

TEST(MultiGpu, copy_engine_all_reduce_gives_nccls_bits) {
  if (info().world_size != 2) GTEST_SKIP() << "the copy engines sum between two GPUs";
  std::unique_ptr<NcclCommunicator> ce = second_communicator();
  std::string why;
  const int64_t capacity = int64_t{24} << 20;
  ASSERT_TRUE(ce->use_copy_engine_all_reduce(capacity, Communicator::kCopyEngineMinBytes, &why))
      << why;
  // Note [Copy-engine all-reduce]: the flags' shared page is mapped, its name
  // already gone (no /dev/shm entry outlives the processes).
  std::error_code listing;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", listing))
    EXPECT_NE(entry.path().filename().string().rfind("accrue-ce-", 0), 0u)
        << "left behind: " << entry.path();
  // Below the minimum, a chunk and an odd tail, several chunks, the capacity;
  // twice, so that the flags count on and the staging is reused.
  const std::vector<int64_t> sizes{1000, (int64_t{1} << 20) + 3, 5 * (int64_t{1} << 20) + 17,
                                   capacity / 4};
  for (int round = 0; round < 2; ++round) {
    for (int64_t n : sizes) {
      Generator gen(static_cast<uint64_t>(1000 * round + n % 997) * 7 +
                    static_cast<uint64_t>(info().rank));
      const Tensor values = randn({n}, DType::f32, device(), &gen);
      Tensor by_ce = values.clone(), by_nccl = values.clone();
      const int64_t before = ce->copy_engine_all_reduces();
      ce->all_reduce(by_ce, ReduceOp::sum);
      world().all_reduce(by_nccl, ReduceOp::sum);
      ce->synchronize();
      world().synchronize();
      const bool carried = ce->copy_engine_all_reduces() > before;
      EXPECT_EQ(carried, n * 4 >= Communicator::kCopyEngineMinBytes) << "n=" << n;
      EXPECT_TRUE(test::all_equal(by_ce, by_nccl)) << "n=" << n << " round " << round;
    }
  }
  // Not 16-byte aligned, or larger than the staging: NCCL carries them, exactly.
  Generator gen(77 + static_cast<uint64_t>(info().rank));
  const Tensor values = randn({capacity / 4 + 8}, DType::f32, device(), &gen);
  for (const auto& [offset, n] :
       std::vector<std::pair<int64_t, int64_t>>{{1, int64_t{1} << 20}, {0, capacity / 4 + 8}}) {
    Tensor by_ce = values.clone(), by_nccl = values.clone();
    const int64_t before = ce->copy_engine_all_reduces();
    ce->all_reduce(by_ce.narrow(0, offset, n), ReduceOp::sum);
    world().all_reduce(by_nccl.narrow(0, offset, n), ReduceOp::sum);
    ce->synchronize();
    world().synchronize();
    EXPECT_EQ(ce->copy_engine_all_reduces(), before) << "offset " << offset << ", n=" << n;
    EXPECT_TRUE(test::all_equal(by_ce, by_nccl)) << "offset " << offset << ", n=" << n;
  }
}

// Trains `on_ce` (its reducer over `ce`) and a reducer over NCCL side by
// side: every bucket of every window on the copy engines, the same weights
// bit for bit, on every rank.
void train_beside_nccl(Trainer& on_ce, NcclCommunicator& ce, ModelKind kind, int64_t K,
                       int64_t windows) {
  Trainer on_nccl = make_trainer(kind, K, true);
  const auto data = equivalence::make_batches(kind, windows, 4 * 2 * K, gpu_f32(), 33);
  const int64_t before = ce.copy_engine_all_reduces();
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      on_ce.backward(data[w].micro(info().rank * K + k, 2 * K));
      on_nccl.backward(data[w].micro(info().rank * K + k, 2 * K));
    }
    on_ce.window->close();
    on_nccl.window->close();
  }
  EXPECT_GE(ce.copy_engine_all_reduces() - before,
            windows * static_cast<int64_t>(on_ce.reducer->plan().size()))
      << "every bucket of every window on the copy engines";
  EXPECT_TRUE(test::all_equal(on_ce.arena->master(), on_nccl.arena->master()));
  EXPECT_TRUE(same_on_every_rank(on_ce.arena->master()));
}

// The reducer over a communicator whose f32 sums all run on the copy engines
// trains the same weights as over NCCL, bit for bit, on every rank.
TEST(MultiGpu, copy_engine_buckets_train_nccls_weights) {
  if (info().world_size != 2) GTEST_SKIP() << "the copy engines sum between two GPUs";
  equivalence::TF32Off tf32_off;
  constexpr int64_t K = 3, kWindows = 4;
  std::unique_ptr<NcclCommunicator> ce = second_communicator();
  std::string why;
  ASSERT_TRUE(ce->use_copy_engine_all_reduce(int64_t{64} << 20, /*min_bytes=*/1, &why)) << why;
  for (ModelKind kind : {ModelKind::Classifier, ModelKind::LM}) {
    SCOPED_TRACE(equivalence::model_name(kind));
    Trainer on_ce(equivalence::make_model(kind, gpu_f32(), 21), K, true, {}, DType::f32, *ce);
    train_beside_nccl(on_ce, *ce, kind, K, kWindows);
  }
}

// The direct form: sums inside a shared arena pull from and push to the
// peer's copy, several calls in flight before one join, the same bits as
// NCCL's; sums outside it stay staged or on NCCL, exactly too.
void expect_direct_sums_equal_nccls(bool whole_buckets);

TEST(MultiGpu, copy_engines_between_arenas_give_nccls_bits) {
  if (info().world_size != 2) GTEST_SKIP() << "the copy engines sum between two GPUs";
  for (bool whole_buckets : {false, true}) {
    SCOPED_TRACE(whole_buckets ? "whole buckets" : "halves");
    expect_direct_sums_equal_nccls(whole_buckets);
  }
}

void expect_direct_sums_equal_nccls(bool whole_buckets) {
  std::unique_ptr<NcclCommunicator> ce = second_communicator();
  std::string why;
  ASSERT_TRUE(
      ce->use_copy_engine_all_reduce(int64_t{4} << 20, Communicator::kCopyEngineMinBytes, &why))
      << why;
  const int64_t total = 7 * (int64_t{1} << 20) + 64;
  Generator gen(500 + static_cast<uint64_t>(info().rank));
  Tensor arena;
  {
    CudaAllocatorModeScope own_allocation(CudaAllocatorMode::Plain);
    arena = randn({total}, DType::f32, device(), &gen);
  }
  ASSERT_TRUE(ce->share_with_copy_engines(arena, whole_buckets, &why)) << why;
  // A pool-allocated tensor cannot be shared: both ranks refuse, saying why.
  {
    std::unique_ptr<NcclCommunicator> other = second_communicator();
    ASSERT_TRUE(other->use_copy_engine_all_reduce(int64_t{1} << 20, 1 << 20, &why)) << why;
    const Tensor pooled = randn({1 << 20}, DType::f32, device(), &gen);
    EXPECT_FALSE(other->share_with_copy_engines(pooled, whole_buckets, &why));
    EXPECT_NE(why.find("cannot be exported"), std::string::npos) << why;
  }
  const Tensor start = arena.clone();
  Tensor by_nccl = start.clone();
  // Ranges as a reducer's buckets: back to back, of several chunks and of
  // less than one, with odd tails; all enqueued before one synchronize.
  const std::vector<std::pair<int64_t, int64_t>> ranges{{0, (int64_t{1} << 20) + 3},
                                                        {(int64_t{1} << 20) + 4, 5 << 20},
                                                        {(int64_t{6} << 20) + 4, 200000},
                                                        {(int64_t{6} << 20) + 200004, 700000}};
  for (int round = 0; round < 3; ++round) {
    const int64_t before = ce->copy_engine_all_reduces();
    for (const auto& [offset, n] : ranges) {
      ce->all_reduce(arena.narrow(0, offset, n), ReduceOp::sum);
      world().all_reduce(by_nccl.narrow(0, offset, n), ReduceOp::sum);
    }
    ce->synchronize();
    world().synchronize();
    EXPECT_EQ(ce->copy_engine_all_reduces() - before, 3) << "the 200,000 floats stay on NCCL";
    EXPECT_TRUE(test::all_equal(arena, by_nccl)) << "round " << round;
  }
  // Outside the arena the staged form sums, after the direct calls before it.
  ce->all_reduce(arena.narrow(0, 0, int64_t{1} << 20), ReduceOp::sum);
  world().all_reduce(by_nccl.narrow(0, 0, int64_t{1} << 20), ReduceOp::sum);
  Tensor outside = randn({int64_t{1} << 20}, DType::f32, device(), &gen);
  Tensor outside_by_nccl = outside.clone();
  ce->all_reduce(outside, ReduceOp::sum);
  world().all_reduce(outside_by_nccl, ReduceOp::sum);
  ce->synchronize();
  world().synchronize();
  EXPECT_TRUE(test::all_equal(arena, by_nccl));
  EXPECT_TRUE(test::all_equal(outside, outside_by_nccl));
}

// A reducer over stores with shareable gradients sums every bucket straight
// between the arenas and trains NCCL's weights, bit for bit, on every rank.
TEST(MultiGpu, copy_engines_between_arenas_train_nccls_weights) {
  if (info().world_size != 2) GTEST_SKIP() << "the copy engines sum between two GPUs";
  equivalence::TF32Off tf32_off;
  constexpr int64_t K = 3, kWindows = 4;
  std::unique_ptr<NcclCommunicator> ce = second_communicator();
  for (bool whole_buckets : {false, true}) {
    ReducerOptions options;
    options.copy_engine_all_reduce = true;
    options.copy_engine_whole_buckets = whole_buckets;
    for (ModelKind kind : {ModelKind::Classifier, ModelKind::LM}) {
      SCOPED_TRACE(std::string(equivalence::model_name(kind)) +
                   (whole_buckets ? ", whole buckets" : ", halves"));
      Trainer on_ce(equivalence::make_model(kind, gpu_f32(), 21), K, true, options, DType::f32, *ce,
                    /*shareable_gradients=*/true);
      ASSERT_TRUE(on_ce.reducer->copy_engines_direct());
      // The tiny models' buckets are below the reducer's 1 MiB: every one of
      // them on the copy engines all the same.
      std::string why;
      ASSERT_TRUE(ce->use_copy_engine_all_reduce(Communicator::kCopyEngineMinBytes, 1, &why))
          << why;
      train_beside_nccl(on_ce, *ce, kind, K, kWindows);
    }
  }
}

TEST(MultiGpu, no_collective_in_non_final_micro_steps) {
  constexpr int64_t K = 4;
  Trainer dp = make_trainer(ModelKind::LM, K, true);
  const int64_t buckets = static_cast<int64_t>(dp.reducer->plan().size());
  const auto data = equivalence::make_batches(ModelKind::LM, 3, 8, gpu_f32(), 5);
  for (const Batch& micro_batches : data) {
    const int64_t window_start = world().collectives_issued();
    for (int64_t k = 0; k < K; ++k) {
      const int64_t before = world().collectives_issued();
      dp.backward(micro_batches.micro(k, K));
      if (k < K - 1) {
        EXPECT_EQ(world().collectives_issued(), before) << "micro-step " << k;
      } else {
        EXPECT_GT(world().collectives_issued(), before) << "the last micro-step's backward";
      }
    }
    dp.window->close();
    // The close adds three small ones: N summed, the loss sum summed (the
    // report's world loss), and the used flags' maximum for the default
    // unused-parameter check (Note [Unused parameters]).
    EXPECT_EQ(world().collectives_issued() - window_start, buckets + 3);
  }
  world().synchronize();
}

TEST(MultiGpu, two_ranks_k4_equal_one_gpu_k8_at_the_same_global_batch) {
  equivalence::TF32Off tf32_off;
  constexpr int64_t K = 4, kWindows = 10;
  const int64_t W = info().world_size;
  for (ModelKind kind : {ModelKind::Classifier, ModelKind::LM}) {
    SCOPED_TRACE(equivalence::model_name(kind));
    Trainer dp = make_trainer(kind, K, true);
    Trainer reference = make_trainer(kind, W * K, false);
    const auto data = equivalence::make_batches(kind, kWindows, 4 * W * K, gpu_f32(), 33);
    for (int64_t w = 0; w < kWindows; ++w) {
      window_step(dp, reference, data[w], K);
      if (w == 0) {
        // The reduced gradient (a sum over ranks) against the 1-GPU sum.
        const double err = equivalence::l2_relative(dp.grads(), reference.grads());
        EXPECT_LE(err, 1e-6) << "gradients after one window";
        std::printf("[rank %d] %s: gradient ||dp - 1gpu|| / ||1gpu|| = %.3g\n", info().rank,
                    equivalence::model_name(kind), err);
      }
      EXPECT_EQ(dp.window->report().items, reference.window->report().items) << "window " << w;
    }
    const double err = equivalence::l2_relative(dp.master(), reference.master());
    EXPECT_LE(err, 1e-5) << "parameters after " << kWindows << " windows";
    std::printf("[rank %d] %s: parameters after %lld windows: rel err %.3g\n", info().rank,
                equivalence::model_name(kind), static_cast<long long>(kWindows), err);
  }
}

// The elements of `flat` in `ranges`, in order.
std::vector<double> owned_part(const std::vector<double>& flat,
                               const std::vector<ArenaRange>& ranges) {
  std::vector<double> out;
  for (const ArenaRange& r : ranges)
    out.insert(out.end(), flat.begin() + r.offset, flat.begin() + r.offset + r.numel);
  return out;
}

// True when every rank holds the same bytes in `t` (max and min over ranks equal it).
bool same_on_every_rank(const Tensor& t) {
  const Tensor f = t.to(DType::f64);
  Tensor hi = f.clone(), neg_lo = kernels::unary(kernels::UnaryOp::Neg, f);
  world().all_reduce(hi, ReduceOp::max);
  world().all_reduce(neg_lo, ReduceOp::max);
  // Note [Collective ordering]: the reads below, and the allocator's reuse of
  // hi and neg_lo once this returns, must come after the collectives end.
  // Without this wait a later call's tensors could take their memory while
  // NCCL still wrote it (a failure seen once, on 2 x H200).
  world().synchronize();
  return test::all_equal(hi, f) &&
         test::all_equal(kernels::unary(kernels::UnaryOp::Neg, neg_lo), f);
}

TEST(MultiGpu, zero1_equals_plain_data_parallelism_and_one_gpu) {
  equivalence::TF32Off tf32_off;
  constexpr int64_t K = 4, kWindows = 10;
  const int64_t W = info().world_size;
  ReducerOptions zero1;
  zero1.zero1 = true;
  for (ModelKind kind : {ModelKind::Classifier, ModelKind::LM}) {
    SCOPED_TRACE(equivalence::model_name(kind));
    Trainer sharded(equivalence::make_model(kind, gpu_f32(), 21), K, true, zero1);
    Trainer plain = make_trainer(kind, K, true);
    Trainer reference = make_trainer(kind, W * K, false);
    const auto data = equivalence::make_batches(kind, kWindows, 4 * W * K, gpu_f32(), 33);
    const std::vector<ArenaRange>& owned = sharded.reducer->owned_ranges();
    for (int64_t w = 0; w < kWindows; ++w) {
      for (int64_t k = 0; k < K; ++k)
        sharded.backward(data[w].micro(info().rank * K + k, W * K));
      sharded.window->close();
      window_step(plain, reference, data[w], K);
      if (w == 0) {
        const double vs_plain = equivalence::l2_relative(owned_part(sharded.grads(), owned),
                                                         owned_part(plain.grads(), owned));
        const double vs_one = equivalence::l2_relative(owned_part(sharded.grads(), owned),
                                                       owned_part(reference.grads(), owned));
        EXPECT_LE(vs_plain, 1e-6);
        EXPECT_LE(vs_one, 1e-6);
        std::printf("[rank %d] %s zero1: owned gradient vs plain DP %.3g, vs 1 GPU %.3g\n",
                    info().rank, equivalence::model_name(kind), vs_plain, vs_one);
      }
      EXPECT_EQ(sharded.window->report().items, reference.window->report().items);
      EXPECT_NEAR(sharded.window->report().grad_norm, plain.window->report().grad_norm,
                  1e-6 * plain.window->report().grad_norm);
    }
    const double vs_plain = equivalence::l2_relative(sharded.master(), plain.master());
    const double vs_one = equivalence::l2_relative(sharded.master(), reference.master());
    EXPECT_LE(vs_plain, 1e-5);
    EXPECT_LE(vs_one, 1e-5);
    std::printf(
        "[rank %d] %s zero1: parameters after %lld windows vs plain DP %.3g, vs 1 GPU %.3g\n",
        info().rank, equivalence::model_name(kind), static_cast<long long>(kWindows), vs_plain,
        vs_one);
    EXPECT_TRUE(same_on_every_rank(sharded.arena->master())) << "gathered parameters differ";
    EXPECT_EQ(sharded.arena->memory().moments * W, plain.arena->memory().moments);
    std::printf("[rank %d] memory per rank: plain DP %s; zero1 %s\n", info().rank,
                plain.arena->memory().describe().c_str(),
                sharded.arena->memory().describe().c_str());
  }
}

// Note [Norm under the backward]: the rows run on a side stream ordered after
// each bucket's NCCL reduction, and still equal the close-time pass bit for bit.
TEST(MultiGpu, norm_rows_under_the_backward_match_a_close_time_pass) {
  for (const bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "zero1" : "plain");
    test::dist_norm_rows_under_the_backward_match_a_close_time_pass(device(), world(), zero1,
                                                                    std::nullopt);
  }
  test::dist_norm_rows_under_the_backward_match_a_close_time_pass(device(), world(), false,
                                                                  DType::bf16);
}

TEST(MultiGpu, zero1_with_a_bf16_compute_copy_gathers_the_copy) {
  constexpr int64_t K = 2, kWindows = 4;
  const int64_t W = info().world_size;
  ReducerOptions zero1;
  zero1.zero1 = true;
  Trainer sharded(equivalence::make_model(ModelKind::LM, gpu_f32(), 21), K, true, zero1,
                  DType::bf16);
  Trainer plain(equivalence::make_model(ModelKind::LM, gpu_f32(), 21), K, true, {}, DType::bf16);
  const auto data = equivalence::make_batches(ModelKind::LM, kWindows, 4 * W * K, gpu_f32(), 35);
  for (const Batch& global : data) {
    for (int64_t k = 0; k < K; ++k) {
      sharded.backward(global.micro(info().rank * K + k, W * K));
      plain.backward(global.micro(info().rank * K + k, W * K));
    }
    sharded.window->close();
    plain.window->close();
  }
  // Every rank forwards with the same bf16 parameters: its own shard's, stepped
  // here, and the others', gathered.
  EXPECT_TRUE(same_on_every_rank(sharded.arena->compute()));
  const std::vector<double> a = sharded.arena->compute().to_vector<double>(),
                            b = plain.arena->compute().to_vector<double>();
  EXPECT_LE(equivalence::l2_relative(a, b), 1e-3);
  // The master is sharded (Note [ZeRO-1]): this rank's owned ranges, packed,
  // equal plain data parallelism's there; it holds 1/W of the master bytes.
  const std::vector<ArenaRange>& owned = sharded.reducer->owned_ranges();
  ASSERT_TRUE(sharded.arena->master_sharded());
  EXPECT_LE(equivalence::l2_relative(sharded.master(), owned_part(plain.master(), owned)), 1e-5);
  EXPECT_EQ(sharded.arena->memory().master * W, plain.arena->memory().master);
}

TEST(MultiGpu, item_count_normalization_is_exact_with_different_counts_per_rank) {
  equivalence::TF32Off tf32_off;
  constexpr int64_t K = 2, kWindows = 3;
  const int64_t W = info().world_size;
  Trainer dp = make_trainer(ModelKind::LM, K, true);
  Trainer reference = make_trainer(ModelKind::LM, W * K, false);
  // Sequences grow with their index: the last rank's half holds far more tokens.
  const auto data = equivalence::make_batches(ModelKind::LM, kWindows, 4 * W * K, gpu_f32(), 44,
                                              /*variable_length=*/true);
  for (int64_t w = 0; w < kWindows; ++w) {
    const Batch& global = data[w];
    std::vector<double> tokens(W, 0.0);
    const std::vector<int64_t> targets = global.targets.to_vector<int64_t>();
    const int64_t per_rank = static_cast<int64_t>(targets.size()) / W;
    for (int64_t i = 0; i < static_cast<int64_t>(targets.size()); ++i)
      if (targets[i] != equivalence::kIgnoreIndex) tokens[i / per_rank] += 1;
    ASSERT_NE(tokens.front(), tokens.back()) << "the ranks must see different item counts";
    window_step(dp, reference, global, K);
    const optim::WindowReport mine = dp.window->report(), ref = reference.window->report();
    double total = 0;
    for (double t : tokens)
      total += t;
    // N is the global count, exactly, on every rank.
    EXPECT_EQ(mine.items, total) << "window " << w;
    EXPECT_EQ(ref.items, total) << "window " << w;
    EXPECT_NEAR(mine.grad_norm, ref.grad_norm, 1e-6 * ref.grad_norm) << "window " << w;
    // The loss is the world's mean, as one process of the whole batch reports
    // it; local_loss is this rank's own, over its own (different) count.
    EXPECT_NEAR(mine.loss, ref.loss, 1e-6 * std::abs(ref.loss)) << "window " << w;
    EXPECT_EQ(ref.local_loss, ref.loss) << "window " << w;
    EXPECT_NE(mine.local_loss, mine.loss) << "window " << w;
  }
  EXPECT_LE(equivalence::l2_relative(dp.master(), reference.master()), 1e-5);
}

// Wide enough that the backward takes milliseconds and the arena (~42M
// parameters, 168 MB) makes several buckets.
class WideMlp : public equivalence::Model {
 public:
  explicit WideMlp(const nn::ParamOptions& o) {
    mlp_ = &register_module(
        "mlp", std::make_unique<nn::MLP>(std::vector<int64_t>{1024, 4096, 4096, 4096, 1024}, o));
  }
  Loss loss(const Batch& b) const override {
    return cross_entropy(mlp_->forward(b.inputs), b.targets);
  }

 private:
  nn::MLP* mlp_;
};

TEST(MultiGpu, first_bucket_all_reduce_starts_before_the_backward_ends) {
  constexpr int64_t K = 2, kWindows = 4, kBatch = 1024;
  Generator gen(77 + static_cast<uint64_t>(info().rank));
  ReducerOptions options;
  options.timing = true;
  Trainer dp(std::make_unique<WideMlp>(nn::ParamOptions{device(), DType::f32, &gen}), K, true,
             options);
  const BucketPlan& plan = dp.reducer->plan();
  ASSERT_GE(plan.size(), 3u) << plan.describe();
  ReducerTiming t;
  for (int64_t w = 0; w < kWindows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      Batch micro{randn({kBatch, 1024}, DType::f32, device(), &gen),
                  randint(0, 1024, {kBatch}, DType::i64, device(), &gen)};
      dp.backward(micro);
    }
    dp.window->close();
    t = dp.reducer->last_timing();  // the first windows warm up (connections, allocator)
  }
  EXPECT_GT(dp.reducer->buckets_sent_in_backward(), 0);
  EXPECT_LT(t.bucket_start_ms[0], 0.0) << "bucket 0's all-reduce started " << t.bucket_start_ms[0]
                                       << " ms after the last micro-step's backward ended";
  double busy = 0;
  ASSERT_EQ(t.bucket_ready_ms.size(), plan.size());
  ASSERT_EQ(t.host_issue_ms.size(), plan.size());
  ASSERT_EQ(t.host_call_ms.size(), plan.size());
  for (size_t b = 0; b < plan.size(); ++b) {
    busy += t.bucket_end_ms[b] - t.bucket_start_ms[b];
    // A collective starts after the compute stream produced its gradients.
    EXPECT_LE(t.bucket_ready_ms[b], t.bucket_start_ms[b] + 1e-3) << "bucket " << b;
    EXPECT_GE(t.host_call_ms[b], 0.0) << "bucket " << b;
    if (b > 0) {
      EXPECT_GE(t.host_issue_ms[b], t.host_issue_ms[b - 1]) << "bucket " << b;
    }
  }
  std::printf("[rank %d] %zu buckets, %.1f MB; last micro-step's backward %.3f ms\n", info().rank,
              plan.size(), plan.padded_numel() * 4.0 / 1e6, t.last_backward_ms);
  for (size_t b = 0; b < plan.size(); ++b)
    std::printf(
        "[rank %d]   bucket %zu (%.2f MB): start %+.3f ms, end %+.3f ms (relative to the "
        "backward's end)\n",
        info().rank, b, plan[b].numel * 4.0 / 1e6, t.bucket_start_ms[b], t.bucket_end_ms[b]);
  std::printf(
      "[rank %d] communication exposed at the close: %.3f ms (of %.3f ms on the "
      "communication stream)\n",
      info().rank, t.exposed_ms, busy);
  ::testing::Test::RecordProperty("exposed_ms", std::to_string(t.exposed_ms));
}

// Note [Unused parameters] over NCCL: under UnusedParameters::skip a
// parameter counts as used when any rank wrote it (Reducer::all_reduce_max, one
// max all-reduce of the flags). rank1_only is written on rank 1 only, yet it
// steps identically on every rank, as one GPU with both ranks' micro-batches
// steps it; "never" stays bitwise unchanged; the step counts agree.
TEST(MultiGpu, a_parameter_used_on_one_rank_only_is_stepped_under_skip_on_every_rank) {
  ASSERT_EQ(info().world_size, 2) << "the test's data assume two ranks";
  const unused::Result single = unused::train(1, false, 0, nullptr, device(), DType::f32);
  const std::vector<int64_t> counts{unused::kWindows, unused::kWindows, 0};
  EXPECT_EQ(single.steps, counts);
  for (bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "zero1" : "plain");
    const unused::Result dp = unused::train(2, zero1, info().rank, &world(), device(), DType::f32);
    EXPECT_EQ(dp.steps, counts);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(equivalence::l2_relative(dp.params[i], single.params[i]), 1e-6) << "param " << i;
      const std::vector<double>& v = dp.params[i];
      EXPECT_TRUE(same_on_every_rank(
          from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64, device())))
          << "param " << i;
    }
    // rank1_only moved on rank 0 too, though rank 0 never wrote its slot.
    EXPECT_NE(dp.params[1],
              unused::host_values(unused::input(100, 0, 1, Device::cpu(), DType::f32)));
  }
  world().synchronize();
}

TEST(MultiGpu, different_parameter_layouts_are_an_error_on_every_rank) {
  // Rank 0 registers the classifier, the others the language model.
  const ModelKind kind = info().rank == 0 ? ModelKind::Classifier : ModelKind::LM;
  auto model = equivalence::make_model(kind, gpu_f32(), 3);
  optim::ParamStoreOptions ao;
  ao.device(device());
  optim::ParamStore arena(model->named_parameters(), ao);
  EXPECT_ERROR(Reducer reducer(arena, world()), "Reducer: rank", "differs from another rank");
  // The check is an ordinary collective: the world is still healthy.
  world().check();
  EXPECT_FALSE(world().aborted());
}

// ---- FP8 -------------------------------------------------------------------------------

// FP8 layers (Note [Window FP8 weights]) with a bf16 compute copy, each rank
// on its own data: the weights stay equal on every rank, bit for bit. With
// delayed scaling (Note [FP8 delayed scaling]) the ranks' window amaxes
// differ, and the close max-reduces them over NCCL before the update, so
// the scales and histories are equal on every rank too. Without that
// reduce they would drift apart, and the weights with them.
TEST(MultiGpu, fp8_ranks_keep_equal_weights_and_delayed_scales) {
  constexpr int64_t kRows = 32, K = 2, kWindows = 3;
  for (bool delayed : {false, true}) {
    SCOPED_TRACE(delayed ? "delayed scaling" : "current scaling");
    Generator init(3 + static_cast<uint64_t>(info().rank));  // apart: the broadcast fixes it
    nn::MLP model({64, 128, 32}, {device(), DType::f32, &init});
    const std::vector<Tensor> fp8 = nn::use_fp8(model);
    optim::Optimizer opt(optim::AdamWOptions(1e-2).weight_decay(0.1));
    optim::ParamStore store(model.named_parameters(), optim::ParamStoreOptions()
                                                          .device(device())
                                                          .compute_dtype(DType::bf16)
                                                          .moments(opt.moments_needed()));
    store.keep_fp8_copies(fp8);
    if (delayed) store.keep_fp8_delayed_scaling(fp8, optim::Fp8DelayedOptions().history(2));
    Reducer reducer(store, world(), ReducerOptions());
    reducer.broadcast_parameters(0);
    optim::Window window(store, opt, optim::WindowOptions().micro_steps(K).max_grad_norm(1.0),
                         &reducer);
    for (int64_t w = 0; w < kWindows; ++w) {
      for (int64_t k = 0; k < K; ++k) {
        // Each rank its own inputs, of a scale of its own: the amaxes differ.
        Generator gen(static_cast<uint64_t>(100 + 10 * w + k + 1000 * info().rank));
        const Tensor x = (randn({kRows, 64}, DType::f32, Device::cpu(), &gen) * (1.0 + info().rank))
                             .to(DType::bf16)
                             .to(device());
        std::vector<int64_t> y(kRows);
        for (int64_t i = 0; i < kRows; ++i)
          y[static_cast<size_t>(i)] = (w * 7 + k * 3 + i * 5 + info().rank) % 32;
        window.backward(
            cross_entropy(model.forward(x), from_vector<int64_t>(y, {kRows}).to(device())));
      }
      window.close();
      EXPECT_FALSE(window.report().skipped) << "window " << w;
    }
    EXPECT_TRUE(same_on_every_rank(store.master()));
    EXPECT_TRUE(same_on_every_rank(store.compute()));
    if (delayed) {
      const optim::Fp8DelayedScaling* s = store.fp8_delayed_scaling();
      ASSERT_NE(s, nullptr);
      EXPECT_TRUE(same_on_every_rank(s->x_state()));
      EXPECT_TRUE(same_on_every_rank(s->dy_state()));
    }
  }
}

}  // namespace
}  // namespace accrue::dist
