// Data parallelism with more than one rank, without a GPU: a world of W ranks
// as W threads of this process, whose communicator does every collective on
// the host (exact f64 arithmetic, sums in rank order). On the f64 CPU
// reference backend this proves, tightly, what tests/dist/multi_gpu_test.cpp
// proves on GPUs with NCCL in f32:
//   - W ranks x K micro-batches equal 1 rank x W K at the same global batch;
//   - Note [ZeRO-1] equals plain data parallelism: same gradients where owned,
//     same parameters on every rank, the moments 1/W as large;
//   - every rank agrees on found_inf when only one rank sees a non-finite
//     gradient;
//   - a ZeRO-1 checkpoint (each rank its shard) resumes bit-exactly.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "accrue/dist/process_group.h"
#include "accrue/dist/reducer.h"
#include "tests/dist/host_world.h"
#include "tests/equivalence/equivalence_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using equivalence::Batch;
using equivalence::ModelKind;
using host::HostCommunicator;
using host::HostWorld;

// Small buckets (the tiny LM's parameters spread over several), any world size
// that is a power of two divides them (Note [Buckets]).
ReducerOptions small_buckets(bool zero1) {
  ReducerOptions o;
  o.buckets.first_bucket_bytes = 512;
  o.buckets.bucket_bytes = 2048;
  o.zero1 = zero1;
  return o;
}

// One rank's model, arena, optional reducer, optimizer and window.
struct RankRun {
  std::unique_ptr<equivalence::Model> model;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::Window> window;

  RankRun(int64_t K, Communicator* comm, bool zero1, uint64_t seed, DType master = DType::f64,
          DType compute = DType::f64, int shard_ranks = 1,
          std::optional<DType> transport = std::nullopt) {
    equivalence::Precision p = equivalence::cpu_f64();
    p.dtype = master;
    model = equivalence::make_model(ModelKind::LM, p, seed);
    optim::ParamStoreOptions ao;
    ao.master_dtype(master);
    ao.compute_dtype(compute);
    ao.moments(2);
    ao.shard_ranks(shard_ranks);
    arena = equivalence::make_arena(*model, ao);
    if (comm) {
      ReducerOptions options = small_buckets(zero1);
      options.transport = transport;
      reducer = std::make_unique<Reducer>(*arena, *comm, options);
      reducer->broadcast_parameters(0);
    }
    optimizer = std::make_unique<optim::Optimizer>(equivalence::adamw());
    window = std::make_unique<optim::Window>(*arena, *optimizer, equivalence::clipped_window(K),
                                             reducer.get());
  }
};

// Runs fn(rank) on `world` threads and rethrows the first failure.
using host::on_ranks;

// What a rank ends a run with.
struct RankResult {
  std::vector<std::vector<double>> grads;  // after each window (owned ranges only under ZeRO-1)
  std::vector<double> params;              // after the last window
  std::vector<optim::WindowReport> reports;
  optim::StoreMemory memory;
  std::vector<ArenaRange> owned;
  std::map<std::string, int64_t> counts;
};

constexpr int64_t kWindows = 6, kBatch = 16;

std::vector<Batch> lm_batches() {
  // Variable-length sequences: the ranks see different token counts, and only
  // a global 1/N makes the sum exact (Note [Normalization]).
  return equivalence::make_batches(ModelKind::LM, kWindows, kBatch, equivalence::cpu_f64(), 21,
                                   /*variable_length=*/true);
}

// `world` ranks x K micro-batches per window; rank r takes micro-batches
// r K .. r K + K - 1 of the global batch cut into world K.
std::vector<RankResult> train(int world, int64_t K, bool zero1,
                              const std::vector<Batch>& global_batches, int shard_ranks = 1,
                              std::optional<DType> transport = std::nullopt) {
  HostWorld host(world);
  std::vector<RankResult> results(world);
  on_ranks(world, [&](int rank) {
    HostCommunicator comm(host, rank);
    // Different initial values per rank: broadcast_parameters must make them rank 0's.
    RankRun run(K, world > 1 ? &comm : nullptr, zero1, 7 + rank, DType::f64, DType::f64,
                shard_ranks, transport);
    RankResult& out = results[rank];
    for (const Batch& global : global_batches) {
      for (int64_t k = 0; k < K; ++k)
        run.window->backward(run.model->loss(global.micro(rank * K + k, world * K)));
      run.window->close();
      out.reports.push_back(run.window->report());
      out.grads.push_back(equivalence::host(run.arena->grads()));
    }
    out.params = equivalence::host(run.arena->master());
    out.memory = run.arena->memory();
    if (run.reducer) out.owned = run.reducer->owned_ranges();
    out.counts = comm.counts;
  });
  return results;
}

std::vector<double> owned_part(const std::vector<double>& flat, const std::vector<ArenaRange>& r) {
  std::vector<double> out;
  for (const ArenaRange& range : r)
    out.insert(out.begin() + static_cast<int64_t>(out.size()), flat.begin() + range.offset,
               flat.begin() + range.offset + range.numel);
  return out;
}

TEST(HostWorld, two_ranks_k2_equal_one_rank_k4_plain_and_zero1) {
  const std::vector<Batch> data = lm_batches();
  const std::vector<RankResult> single = train(1, 4, false, data);
  const std::vector<RankResult> plain = train(2, 2, false, data);
  const std::vector<RankResult> zero1 = train(2, 2, true, data);
  const RankResult& ref = single[0];
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    for (int64_t w = 0; w < kWindows; ++w) {
      // The reduced sum (plain: the whole arena; ZeRO-1: the owned ranges).
      EXPECT_LE(equivalence::max_relative(plain[rank].grads[w], ref.grads[w]), 1e-12) << w;
      const std::vector<ArenaRange>& owned = zero1[rank].owned;
      EXPECT_LE(equivalence::max_relative(owned_part(zero1[rank].grads[w], owned),
                                          owned_part(ref.grads[w], owned)),
                1e-12)
          << w;
      // N is global: every rank reports the whole window's items and norm.
      EXPECT_EQ(plain[rank].reports[w].items, ref.reports[w].items);
      EXPECT_EQ(zero1[rank].reports[w].items, ref.reports[w].items);
      EXPECT_NEAR(zero1[rank].reports[w].grad_norm, ref.reports[w].grad_norm,
                  1e-12 * ref.reports[w].grad_norm);
      EXPECT_NEAR(plain[rank].reports[w].grad_norm, ref.reports[w].grad_norm,
                  1e-12 * ref.reports[w].grad_norm);
      // The loss too is the world's mean, what one process of the whole batch
      // reports; local_loss is this rank's own tokens' mean, which differs.
      EXPECT_NEAR(plain[rank].reports[w].loss, ref.reports[w].loss, 1e-12 * ref.reports[w].loss);
      EXPECT_NEAR(zero1[rank].reports[w].loss, ref.reports[w].loss, 1e-12 * ref.reports[w].loss);
      EXPECT_EQ(ref.reports[w].local_loss, ref.reports[w].loss);
      EXPECT_NE(plain[rank].reports[w].local_loss, plain[rank].reports[w].loss);
    }
    EXPECT_LE(equivalence::max_relative(plain[rank].params, ref.params), 1e-10);
    EXPECT_LE(equivalence::max_relative(zero1[rank].params, ref.params), 1e-10);
    EXPECT_LE(equivalence::max_relative(zero1[rank].params, plain[rank].params), 1e-10);
  }
  // Every rank ends with the same parameters (ZeRO-1: gathered from their owners).
  EXPECT_EQ(zero1[0].params, zero1[1].params);
  EXPECT_EQ(plain[0].params, plain[1].params);
}

// Three ranks (not a power of two): buckets of 32-element-aligned f64 slots do
// not split in three, and the Reducer says how to fix it; with the slots
// padded for three (optim::ParamStoreOptions::shard_ranks), ZeRO-1 owns a third of every
// bucket and 3 ranks x K 2 equal 1 rank x K 6 on the same layout.
TEST(HostWorld, zero1_on_three_ranks_pads_the_slots) {
  const std::vector<Batch> data = equivalence::make_batches(
      ModelKind::LM, 3, 12, equivalence::cpu_f64(), 23, /*variable_length=*/true);
  EXPECT_ERROR(train(3, 2, true, data), "not divisible by the world size 3",
               "optim::ParamStoreOptions().shard_ranks(3)");
  const std::vector<RankResult> single = train(1, 6, false, data, /*shard_ranks=*/3);
  const std::vector<RankResult> zero1 = train(3, 2, true, data, /*shard_ranks=*/3);
  const RankResult& ref = single[0];
  int64_t owned_total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::vector<ArenaRange>& owned = zero1[rank].owned;
    for (const ArenaRange& r : owned)
      owned_total += r.numel;
    for (size_t w = 0; w < ref.reports.size(); ++w) {
      EXPECT_LE(equivalence::max_relative(owned_part(zero1[rank].grads[w], owned),
                                          owned_part(ref.grads[w], owned)),
                1e-12)
          << w;
      EXPECT_EQ(zero1[rank].reports[w].items, ref.reports[w].items);
      EXPECT_NEAR(zero1[rank].reports[w].grad_norm, ref.reports[w].grad_norm,
                  1e-12 * ref.reports[w].grad_norm);
    }
    EXPECT_LE(equivalence::max_relative(zero1[rank].params, ref.params), 1e-10);
    EXPECT_EQ(zero1[rank].memory.moments * 3, ref.memory.moments);
  }
  EXPECT_EQ(owned_total, static_cast<int64_t>(ref.params.size()));  // the thirds tile the arena
  EXPECT_EQ(zero1[0].params, zero1[1].params);
  EXPECT_EQ(zero1[0].params, zero1[2].params);
}

// Note [Gradient transport]: bf16 buckets (plain and ZeRO-1) cost a rounding
// error against the exact transport, measured and printed here; f16 too; a
// transport that is neither the arena's dtype nor 16-bit is refused.
TEST(HostWorld, a_16_bit_gradient_transport_costs_a_measured_rounding_error) {
  const std::vector<Batch> data = lm_batches();
  const RankResult ref = train(1, 4, false, data)[0];
  for (bool zero1 : {false, true}) {
    // Max relative error of the reduced gradients (this rank's part) and of the parameters.
    auto errors = [&](const std::vector<RankResult>& run) {
      double grads = 0.0;
      for (int rank = 0; rank < 2; ++rank) {
        const std::vector<ArenaRange> all{{0, static_cast<int64_t>(ref.params.size())}};
        const std::vector<ArenaRange>& owned = zero1 ? run[rank].owned : all;
        for (size_t w = 0; w < ref.grads.size(); ++w)
          grads = std::max(grads, equivalence::max_relative(owned_part(run[rank].grads[w], owned),
                                                            owned_part(ref.grads[w], owned)));
      }
      return std::make_pair(grads, equivalence::max_relative(run[0].params, ref.params));
    };
    const auto exact = errors(train(2, 2, zero1, data));
    for (DType t : {DType::bf16, DType::f16}) {
      const std::vector<RankResult> run = train(2, 2, zero1, data, 1, t);
      const auto [grads, params] = errors(run);
      std::printf(
          "[transport] %s%s: reduced gradients %.3g, parameters after %lld windows %.3g "
          "(max relative, against one rank; the arena's own dtype: %.3g, %.3g)\n",
          dtype_name(t), zero1 ? " zero1" : "", grads, static_cast<long long>(kWindows), params,
          exact.first, exact.second);
      EXPECT_LT(exact.first, 1e-12);
      EXPECT_GT(grads, 1e-6) << "a 16-bit transport cannot be exact";
      EXPECT_LT(grads, 2e-2);
      EXPECT_LT(params, 2e-2);
      EXPECT_EQ(run[0].params, run[1].params) << "the ranks disagree";
    }
  }
  HostWorld host(1);
  HostCommunicator comm(host, 0);
  EXPECT_ERROR(RankRun(1, &comm, false, 7, DType::f64, DType::f64, 1, DType::f32), "Reducer",
               "transport dtype f32", "bf16, f16");
}

TEST(HostWorld, zero1_owns_half_of_every_bucket_and_keeps_half_the_moments) {
  const std::vector<Batch> data = lm_batches();
  const std::vector<RankResult> plain = train(2, 2, false, data);
  const std::vector<RankResult> zero1 = train(2, 2, true, data);
  // The same plan on a rank of its own, to read the buckets.
  StubCommunicator stub;
  RankRun probe(1, &stub, false, 7);
  const BucketPlan& plan = probe.reducer->plan();
  ASSERT_GE(plan.size(), 3u) << plan.describe();
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<ArenaRange>& owned = zero1[rank].owned;
    ASSERT_EQ(owned.size(), plan.size());
    for (size_t b = 0; b < plan.size(); ++b) {
      EXPECT_EQ(owned[b].numel, plan[b].numel / 2) << "bucket " << b;
      EXPECT_EQ(owned[b].offset, plan[b].offset + rank * plan[b].numel / 2) << "bucket " << b;
    }
    EXPECT_EQ(zero1[rank].memory.moments * 2, plain[rank].memory.moments);
    EXPECT_EQ(zero1[rank].memory.grads, plain[rank].memory.grads);
    EXPECT_EQ(zero1[rank].memory.master, plain[rank].memory.master);
    // Per window: every bucket reduce-scattered, N, the loss sum and the used
    // flags of the unused-parameter check (Note [Unused parameters]) all-reduced, the norm
    // partials gathered, every bucket's parameters gathered. Plus the layout
    // check (an all-reduce) and one broadcast of the master at the start.
    const int64_t buckets = static_cast<int64_t>(plan.size());
    EXPECT_EQ(zero1[rank].counts.at("reduce_scatter"), kWindows * buckets);
    EXPECT_EQ(zero1[rank].counts.at("all_reduce"), 3 * kWindows + 1);
    EXPECT_EQ(zero1[rank].counts.at("all_gather"), kWindows * (1 + buckets));
    EXPECT_EQ(zero1[rank].counts.at("broadcast"), 1);
    EXPECT_EQ(plain[rank].counts.at("all_reduce"), kWindows * (buckets + 3) + 1);
    EXPECT_EQ(plain[rank].counts.count("all_gather"), 0u);
    EXPECT_EQ(plain[rank].counts.at("broadcast"), 3);  // master and both moments
  }
}

TEST(HostWorld, zero1_every_rank_skips_when_one_rank_sees_a_non_finite_gradient) {
  std::vector<Batch> data = lm_batches();
  data.resize(3);
  HostWorld host(2);
  std::vector<std::vector<double>> before(2), after(2);
  std::vector<optim::WindowReport> reports(2);
  on_ranks(2, [&](int rank) {
    HostCommunicator comm(host, rank);
    RankRun run(1, &comm, true, 7);
    for (size_t w = 0; w < data.size(); ++w) {
      const Batch micro = data[w].micro(rank, 2);
      if (w == 2) before[rank] = equivalence::host(run.arena->master());
      Loss loss = run.model->loss(micro);
      // Window 2: rank 1's loss is NaN, so are all its gradients.
      if (w == 2 && rank == 1)
        loss.sum = loss.sum * full({}, std::numeric_limits<double>::quiet_NaN(), DType::f64);
      run.window->backward(loss);
      run.window->close();
    }
    after[rank] = equivalence::host(run.arena->master());
    reports[rank] = run.window->report();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(reports[rank].skipped) << "rank " << rank;
    EXPECT_EQ(reports[rank].optimizer_steps, 2) << "rank " << rank;
    EXPECT_EQ(after[rank], before[rank]) << "rank " << rank << " stepped a skipped window";
  }
}

// Note [Deferred index checks] under data parallelism: a bad token on one rank
// poisons that rank's N, N is summed over ranks at close, so every rank skips
// the window (plain and ZeRO-1); only the rank that saw it raises the error.
TEST(HostWorld, a_bad_index_on_one_rank_skips_the_window_on_every_rank) {
  std::vector<Batch> data = lm_batches();
  data.resize(3);
  for (bool zero1 : {false, true}) {
    HostWorld host(2);
    std::vector<std::vector<double>> before(2), after(2);
    std::vector<optim::WindowReport> reports(2);
    std::vector<std::string> errors(2);
    on_ranks(2, [&](int rank) {
      HostCommunicator comm(host, rank);
      RankRun run(1, &comm, zero1, 7);
      for (size_t w = 0; w < data.size(); ++w) {
        Batch micro = data[w].micro(rank, 2);
        if (w == 2) {
          before[rank] = equivalence::host(run.arena->master());
          if (rank == 1) {  // one token past the vocabulary
            std::vector<int64_t> tokens = micro.inputs.to_vector<int64_t>();
            tokens[5] = equivalence::kVocab + 3;
            micro.inputs = from_vector<int64_t>(tokens, micro.inputs.shape());
          }
        }
        run.window->backward(run.model->loss(micro));
        run.window->close();
      }
      after[rank] = equivalence::host(run.arena->master());
      try {
        run.window->check();
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
      reports[rank] = run.window->report();
    });
    SCOPED_TRACE(zero1 ? "zero1" : "plain");
    EXPECT_EQ(errors[0], "");
    EXPECT_THAT(errors[1], ::testing::HasSubstr("embedding: index 19 (at flat position 5"));
    EXPECT_THAT(errors[1], ::testing::HasSubstr("window 2"));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(reports[rank].skipped) << "rank " << rank;
      EXPECT_EQ(reports[rank].optimizer_steps, 2) << "rank " << rank;
      EXPECT_EQ(after[rank], before[rank]) << "rank " << rank << " stepped a skipped window";
    }
  }
}

// Without a compute copy (f64 here) and with one (f32 master, bf16 copy: the
// master itself sharded).
void checkpoint_of_each_shard_resumes_bit_exactly(DType master, DType compute) {
  const std::vector<Batch> data = lm_batches();
  HostWorld host(2);
  std::vector<std::vector<double>> straight(2), resumed(2);
  on_ranks(2, [&](int rank) {
    HostCommunicator comm(host, rank);
    RankRun run(2, &comm, true, 7, master, compute);
    // What the forward reads: the compute copy when there is one.
    const Tensor& forward = compute == master ? run.arena->master() : run.arena->compute();
    auto window = [&](const Batch& global) {
      for (int64_t k = 0; k < 2; ++k)
        run.window->backward(run.model->loss(global.micro(rank * 2 + k, 4)));
      run.window->close();
    };
    for (int w = 0; w < 3; ++w)
      window(data[w]);
    std::map<std::string, Tensor> saved;
    for (const auto& [key, value] : run.window->state_dict())
      saved[key] = value.clone();
    // The shard: the master and the moments over the owned ranges only.
    int64_t owned = 0;
    for (const ArenaRange& r : run.reducer->owned_ranges())
      owned += r.numel;
    EXPECT_EQ(saved.at("master").numel(), owned);
    EXPECT_EQ(saved.at("moment0").numel(), owned);
    for (int w = 3; w < 6; ++w)
      window(data[w]);
    straight[rank] = equivalence::host(forward);
    // Scribble over the parameters, then resume from the checkpoint (collective).
    run.arena->master().fill_(0.5);
    forward.fill_(0.5);
    run.window->load_state_dict(saved);
    for (int w = 3; w < 6; ++w)
      window(data[w]);
    resumed[rank] = equivalence::host(forward);
  });
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(resumed[rank], straight[rank]) << "rank " << rank;
  EXPECT_EQ(straight[0], straight[1]);
}

// A shard loads only on the rank and world size that saved it, and only
// under ZeRO-1: anything else is refused before anything changes (same
// sizes would otherwise put one rank's numbers in another's ranges).
TEST(HostWorld, zero1_shard_of_another_rank_or_world_is_refused) {
  HostWorld host(2);
  std::vector<std::map<std::string, Tensor>> saved(2);
  on_ranks(2, [&](int rank) {
    HostCommunicator comm(host, rank);
    RankRun run(2, &comm, true, 7, DType::f64, DType::f64);
    saved[static_cast<size_t>(rank)] = run.window->state_dict();
  });
  on_ranks(2, [&](int rank) {
    HostCommunicator comm(host, rank);
    RankRun run(2, &comm, true, 7, DType::f64, DType::f64);
    const Tensor before = run.arena->master().clone();
    EXPECT_ERROR(run.window->load_state_dict(saved[static_cast<size_t>(1 - rank)]),
                 "ZeRO-1 shard covers", "this rank owns", "re-sharding is not supported");
    EXPECT_TRUE(test::all_equal(run.arena->master(), before));
  });
  RankRun plain(1, nullptr, false, 7, DType::f64, DType::f64);
  EXPECT_ERROR(plain.window->load_state_dict(saved[0]), "is one rank's ZeRO-1 shard",
               "steps the whole arena");
}

TEST(HostWorld, zero1_checkpoint_of_each_shard_resumes_bit_exactly) {
  checkpoint_of_each_shard_resumes_bit_exactly(DType::f64, DType::f64);
}

TEST(HostWorld, zero1_checkpoint_with_a_sharded_master_resumes_bit_exactly) {
  checkpoint_of_each_shard_resumes_bit_exactly(DType::f32, DType::bf16);
}

// With a bf16 compute copy the forward reads the copy: ZeRO-1 gathers the
// copy (in bf16), and every rank forwards with the same parameters as plain
// data parallelism does, while keeping half of the master and of the moments.
TEST(HostWorld, zero1_with_a_bf16_compute_copy_gathers_the_copy) {
  const std::vector<Batch> data = lm_batches();
  std::map<bool, std::vector<std::vector<double>>> copies;
  for (bool zero1 : {false, true}) {
    HostWorld host(2);
    copies[zero1].resize(2);
    on_ranks(2, [&](int rank) {
      HostCommunicator comm(host, rank);
      RankRun run(2, &comm, zero1, 7 + rank, DType::f32, DType::bf16);
      for (int w = 0; w < 3; ++w) {
        const Batch global = data[w].to(Device::cpu());
        for (int64_t k = 0; k < 2; ++k) {
          Batch micro = global.micro(rank * 2 + k, 4);
          run.window->backward(run.model->loss(micro));
        }
        run.window->close();
      }
      copies[zero1][rank] = equivalence::host(run.arena->compute());
      const optim::StoreMemory m = run.arena->memory();
      EXPECT_EQ(m.master_sharded, zero1);
      EXPECT_EQ(m.moments_sharded, zero1);
      const int64_t whole = run.arena->padded_numel() * 4;  // f32
      EXPECT_EQ(m.master, zero1 ? whole / 2 : whole);
      EXPECT_EQ(m.moments, zero1 ? whole : 2 * whole);  // two moments
      EXPECT_EQ(m.grads, whole);
      if (zero1) {
        EXPECT_ERROR(run.arena->master_view(0), "master_view", "sharded");
        EXPECT_ERROR(run.arena->shard_master({}), "shard_master", "already sharded");
      }
    });
  }
  EXPECT_EQ(copies[true][0], copies[true][1]) << "the ranks forward with different parameters";
  EXPECT_LE(equivalence::l2_relative(copies[true][0], copies[false][0]), 1e-2);
}

TEST(HostWorld, zero1_errors) {
  // A sync without owned ranges is never asked to gather.
  StubCommunicator stub;
  RankRun plain(1, &stub, false, 7);
  EXPECT_ERROR(plain.reducer->all_gather_owned(plain.arena->master()), "all_gather_owned", "zero1");
  RankRun sharded(1, &stub, true, 7);
  EXPECT_ERROR(sharded.reducer->all_gather_owned(sharded.arena->master().narrow(0, 0, 8)),
               "all_gather_owned", "flat arena");
  // A Window whose arena's moments do not match the sync's shard.
  optim::Optimizer adamw = equivalence::adamw();
  sharded.arena->shard_moments(8);
  EXPECT_ERROR(optim::Window(*sharded.arena, adamw, optim::WindowOptions(), sharded.reducer.get()),
               "Window", "moments hold 8");
  EXPECT_ERROR(sharded.arena->shard_moments(-1), "shard_moments", "-1");
}

}  // namespace
}  // namespace accrue::dist
