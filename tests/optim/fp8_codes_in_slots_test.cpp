// Note [FP8 codes in the compute slots] (optim/fp8_weights.h): with a bf16
// compute copy the store keeps the FP8 codes in the weights' compute slots
// and the weights in their master slots. Training, skipped windows, loads
// and resumes give the bits of codes kept apart; the copies cost only the
// staging buffer; ZeRO-1's shard_master moves the codes out; nn::Linear's
// plain path reads the weight rounded as the compute copy held it; the
// misuses are errors.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/fp8_weights.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using optim::ParamStore;
using optim::ParamStoreOptions;

// Two FP8 layers of different sizes (so the staging buffer is the larger one's).
struct Net {
  Tensor w1, b1, w2;  // [32, 48], [32], [64, 32]
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

struct Data {
  Tensor w1 = test::random_normal({32, 48}, DType::f32, Device::cpu(), 0.1);
  Tensor b1 = test::random_normal({32}, DType::f32);
  Tensor w2 = test::random_normal({64, 32}, DType::f32, Device::cpu(), 0.1);
  std::vector<Tensor> xs, rs;
  Data() {
    for (int k = 0; k < 2; ++k) {
      xs.push_back(test::random_normal({16, 48}, DType::bf16));
      rs.push_back(test::random_normal({16, 64}, DType::f32));
    }
  }
  Net net() const {
    return {requires_grad_(w1.clone()), requires_grad_(b1.clone()), requires_grad_(w2.clone())};
  }
};

Loss loss_of(const Net& n, const Tensor& x, const Tensor& r, double factor = 1.0) {
  const Tensor h = fp8_linear(x, n.w1, n.b1, Fp8LinearOptions{});
  const Tensor y = fp8_linear(h, n.w2, Tensor(), Fp8LinearOptions{});
  return Loss{sum(to_dtype(y, DType::f32) * r) * factor, full({}, 16.0, DType::f64)};
}

ParamStoreOptions bf16_store(bool in_slots, int moments) {
  return ParamStoreOptions()
      .compute_dtype(DType::bf16)
      .moments(moments)
      .fp8_codes_in_compute_slots(in_slots);
}

Fp8Weight clone_of(const Fp8Weight& w) {
  return {w.q.clone(), w.q_t.clone(), w.scale_inv.clone(), Tensor(), Tensor()};
}

void expect_same_copy(const Fp8Weight& a, const Fp8Weight& b) {
  EXPECT_TRUE(test::all_equal(a.q, b.q)) << "codes";
  EXPECT_TRUE(test::all_equal(a.q_t, b.q_t)) << "transposed codes";
  EXPECT_TRUE(test::all_equal(a.scale_inv, b.scale_inv)) << "scale_inv";
}

// The copy a bf16 compute copy of the weight's value would give.
Fp8Weight cast_of_bf16(const Tensor& w) {
  return fp8_weight(to_dtype(detach(w), DType::bf16));
}

struct Trained {
  Tensor master;
  Fp8Weight c1, c2;
  optim::StoreMemory memory;
};

// Three windows of two micro-batches, the second window overflowing (skipped).
Trained train(const Data& d, bool in_slots) {
  const Net n = d.net();
  optim::Optimizer opt(optim::AdamWOptions(1e-2));
  ParamStore store(n.params(), bf16_store(in_slots, opt.moments_needed()));
  store.keep_fp8_copies({n.w1, n.w2});
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(2));
  for (int w = 0; w < 3; ++w) {
    for (int k = 0; k < 2; ++k)
      window.backward(loss_of(n, d.xs[k], d.rs[k], w == 1 && k == 1 ? INFINITY : 1.0));
    window.close();
    EXPECT_EQ(window.report().skipped, w == 1) << "window " << w;
    // The codes are the weights' own again (a skipped window: the same weights).
    expect_same_copy(*kept_fp8_weight(n.w1), cast_of_bf16(n.w1));
    expect_same_copy(*kept_fp8_weight(n.w2), cast_of_bf16(n.w2));
  }
  return {store.master().clone(), clone_of(*kept_fp8_weight(n.w1)),
          clone_of(*kept_fp8_weight(n.w2)), store.memory()};
}

TEST(Fp8CodesInSlots, train_skip_and_recast_bit_for_bit_as_codes_kept_apart) {
  const Data d;
  const Trained in = train(d, true), apart = train(d, false);
  EXPECT_TRUE(test::all_equal(in.master, apart.master));
  expect_same_copy(in.c1, apart.c1);
  expect_same_copy(in.c2, apart.c2);
  // Apart: both weights' codes twice. In the slots: the larger weight's
  // staging buffer, 2 bytes an element.
  EXPECT_EQ(apart.memory.fp8 - in.memory.fp8, 2 * (32 * 48 + 64 * 32) - 2 * (64 * 32));
  EXPECT_EQ(apart.memory.compute, in.memory.compute);
  EXPECT_TRUE(in.memory.fp8_in_compute);
  EXPECT_FALSE(apart.memory.fp8_in_compute);
  EXPECT_THAT(in.memory.describe(), ::testing::HasSubstr("(codes in the compute slots)"));
  EXPECT_THAT(apart.memory.describe(), ::testing::Not(::testing::HasSubstr("codes in the")));
}

// The block recipe (W's and W^T's 128 x 128 blocks, their scales apart from
// the codes; 144 x 160 has partial blocks at both edges) and an f16 compute
// copy (the staging buffer in f16): the same bits as codes kept apart.
TEST(Fp8CodesInSlots, the_block_recipe_and_an_f16_copy_train_as_codes_apart) {
  const Tensor w0 = test::random_normal({144, 160}, DType::f32, Device::cpu(), 0.05);
  std::vector<Tensor> xs, rs;
  for (int k = 0; k < 2; ++k) {
    xs.push_back(test::random_normal({32, 160}, DType::bf16));
    rs.push_back(test::random_normal({32, 144}, DType::f32));
  }
  for (DType compute : {DType::bf16, DType::f16}) {
    for (Fp8Recipe recipe : {Fp8Recipe::tensor, Fp8Recipe::block}) {
      SCOPED_TRACE(std::string(dtype_name(compute)) +
                   (recipe == Fp8Recipe::block ? " block" : " tensor"));
      Fp8LinearOptions o;
      o.recipe = recipe;
      auto run = [&](bool in_slots) {
        Tensor w = requires_grad_(w0.clone());
        optim::Optimizer opt(optim::AdamWOptions(1e-2));
        ParamStore store(std::vector<Tensor>{w}, ParamStoreOptions()
                                                     .compute_dtype(compute)
                                                     .moments(opt.moments_needed())
                                                     .fp8_codes_in_compute_slots(in_slots));
        store.keep_fp8_copies({w}, DType::f8e4m3, 0, recipe);
        EXPECT_EQ(store.memory().fp8_in_compute, in_slots);
        optim::Window window(store, opt, optim::WindowOptions().micro_steps(2));
        for (int step = 0; step < 2; ++step) {
          for (int k = 0; k < 2; ++k)
            window.backward(
                Loss{sum(to_dtype(fp8_linear(xs[k], w, Tensor(), o), DType::f32) * rs[k]),
                     full({}, 32.0, DType::f64)});
          window.close();
        }
        const Fp8Weight& c = *kept_fp8_weight(w);
        std::vector<Tensor> out = {store.master().clone(), c.q.clone(), c.q_t.clone(),
                                   c.scale_inv.clone()};
        if (c.blocks()) out.push_back(c.scale_inv_t.clone());
        return out;
      };
      const std::vector<Tensor> in = run(true), apart = run(false);
      ASSERT_EQ(in.size(), apart.size());
      for (size_t i = 0; i < in.size(); ++i)
        EXPECT_TRUE(test::all_equal(in[i], apart[i])) << "tensor " << i;
    }
  }
}

TEST(Fp8CodesInSlots, the_weights_are_their_masters_and_the_codes_their_compute_slots) {
  const Data d;
  const Net n = d.net();
  ParamStore store(n.params(), bf16_store(true, 0));
  EXPECT_EQ(n.w1.dtype(), DType::bf16);
  store.keep_fp8_copies({n.w1, n.w2});
  // Whoever reads a weight reads its value, in the master dtype.
  EXPECT_EQ(n.w1.dtype(), DType::f32);
  EXPECT_EQ(n.w2.dtype(), DType::f32);
  EXPECT_EQ(n.b1.dtype(), DType::bf16);  // not an FP8 weight: the compute copy
  EXPECT_TRUE(test::all_equal(detach(n.w1), d.w1));
  EXPECT_TRUE(test::all_equal(store.value(n.w2), d.w2));
  // The codes are the compute slot's bytes: W's, then W^T's.
  const Fp8Weight& c = *kept_fp8_weight(n.w1);
  EXPECT_EQ(c.q.storage(), store.compute().storage());
  const auto* slot =
      static_cast<const unsigned char*>(store.compute().data_ptr()) + 2 * store.slots()[0].offset;
  EXPECT_EQ(c.q.data_ptr(), slot);
  EXPECT_EQ(c.q_t.data_ptr(), slot + 32 * 48);
  expect_same_copy(c, cast_of_bf16(d.w1));
  // Off: the codes apart and the weights in the compute copy, as before.
  const Net m = d.net();
  ParamStore apart(m.params(), bf16_store(false, 0));
  apart.keep_fp8_copies({m.w1});
  EXPECT_EQ(m.w1.dtype(), DType::bf16);
  EXPECT_NE(kept_fp8_weight(m.w1)->q.storage(), apart.compute().storage());
  // Without a 16-bit compute copy there is no slot to hold them.
  const Net f = d.net();
  ParamStore f32_store(f.params(), ParamStoreOptions().moments(0));
  f32_store.keep_fp8_copies({f.w1});
  EXPECT_FALSE(f32_store.memory().fp8_in_compute);
  EXPECT_EQ(f32_store.memory().fp8, 2 * 32 * 48 + 8);
}

TEST(Fp8CodesInSlots, loads_and_resumes_recast_from_the_master) {
  const Data d;
  const Net n = d.net();
  optim::Optimizer opt(optim::AdamWOptions(1e-2));
  ParamStore store(n.params(), bf16_store(true, opt.moments_needed()));
  store.keep_fp8_copies({n.w1, n.w2});
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(1));
  window.backward(loss_of(n, d.xs[0], d.rs[0]));
  window.close();
  std::map<std::string, Tensor> saved;
  for (const auto& [key, t] : window.state_dict())
    saved.emplace(key, t.clone());
  const Fp8Weight after_one = clone_of(*kept_fp8_weight(n.w1));
  // Note [One load path]: the weight reads the loaded value, its codes are the value's.
  const Tensor value = test::random_normal({32, 48}, DType::f32);
  store.load("param0", value);
  EXPECT_TRUE(test::all_equal(detach(n.w1), value));
  expect_same_copy(*kept_fp8_weight(n.w1), cast_of_bf16(value));
  // A resume: the codes of the restored weights, bit for bit.
  window.load_state_dict(saved);
  expect_same_copy(*kept_fp8_weight(n.w1), after_one);
  // The whole compute copy cast again (a broadcast's refresh) leaves the codes.
  store.refresh_compute();
  expect_same_copy(*kept_fp8_weight(n.w1), after_one);
}

TEST(Fp8CodesInSlots, sharding_the_master_moves_the_codes_out) {
  const Data d;
  const Net n = d.net();
  ParamStore store(n.params(), bf16_store(true, 0));
  store.keep_fp8_copies({n.w1, n.w2});
  const Fp8Weight before = clone_of(*kept_fp8_weight(n.w1));
  const int64_t fp8_in_slots = store.memory().fp8;
  store.shard_master({{0, store.padded_numel()}});
  // The weights read the compute copy again, which holds them, not codes.
  EXPECT_EQ(n.w1.dtype(), DType::bf16);
  EXPECT_TRUE(test::all_equal(detach(n.w1), to_dtype(d.w1, DType::bf16)));
  EXPECT_TRUE(test::all_equal(detach(n.w2), to_dtype(d.w2, DType::bf16)));
  const Fp8Weight& moved = *kept_fp8_weight(n.w1);
  EXPECT_NE(moved.q.storage(), store.compute().storage());
  expect_same_copy(moved, before);
  EXPECT_FALSE(store.memory().fp8_in_compute);
  EXPECT_EQ(store.memory().fp8 - fp8_in_slots, 2 * (32 * 48 + 64 * 32) - 2 * (64 * 32));
  // The close's recast now casts from the compute copy: the same codes.
  store.refresh_fp8_copies();
  expect_same_copy(*kept_fp8_weight(n.w1), before);
}

// A batch whose rows the FP8 GEMMs do not take runs nn::Linear's plain path:
// the weight rounded to bf16, the gradient back to its slot.
TEST(Fp8CodesInSlots, linear_plain_path_reads_the_rounded_master) {
  const Tensor w0 = test::random_normal({32, 48}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({32}, DType::f32);
  const Tensor x = test::random_normal({5, 48}, DType::bf16);  // 5 rows: not FP8
  const Tensor r = test::random_normal({5, 32}, DType::f32);
  auto run = [&](bool in_slots) {
    nn::Linear layer(requires_grad_(w0.clone()), requires_grad_(b0.clone()));
    layer.set_fp8(Fp8LinearOptions{});
    ParamStore store(layer.named_parameters(), bf16_store(in_slots, 0));
    store.keep_fp8_copies({layer.weight()});
    EXPECT_EQ(layer.weight().dtype(), in_slots ? DType::f32 : DType::bf16);
    const Tensor y = layer.forward(x);
    EXPECT_EQ(y.dtype(), DType::bf16);
    optim::Optimizer opt(optim::SGDOptions(0.1));
    optim::Window window(store, opt, optim::WindowOptions().micro_steps(1));
    window.backward(Loss{sum(to_dtype(y, DType::f32) * r), full({}, 5.0, DType::f64)});
    return std::make_pair(detach(y).clone(), store.grad_view(0).clone());
  };
  const auto [y_in, g_in] = run(true);
  const auto [y_apart, g_apart] = run(false);
  EXPECT_TRUE(test::all_equal(y_in, y_apart));
  // The gradient reaches the slot; it went through bf16 (to_dtype's
  // backward) where the compute copy's GEMM wrote it in f32.
  EXPECT_GT(max(abs(g_in)).item(), 0.0);
  EXPECT_TRUE(test::all_close(g_in, g_apart, 1e-2, 1e-2));
}

TEST(Fp8CodesInSlots, misuses_are_errors) {
  const Data d;
  const Net n = d.net();
  ParamStore store(n.params(), bf16_store(true, 0));
  store.keep_fp8_copies({n.w1});
  // Owned ranges of a whole master would write some slots' codes over as bf16.
  EXPECT_ERROR(store.load_master(store.master().narrow(0, 0, 64), {{0, 64}}),
               "ParamStore::load_master", "owned ranges", "FP8 codes", "compute slots");
  EXPECT_ERROR(store.keep_fp8_copies({n.w1}), "keep_fp8_copies", "'param0'",
               "already has an FP8 copy");
  EXPECT_EQ(n.w1.dtype(), DType::f32);  // the refused call moved nothing
}

}  // namespace
}  // namespace accrue
