// Note [Window FP8 weights]: the store keeps each FP8 copy as fp8_weight()
// would make it, the close recasts it after the step, loaders and resumes
// recast it, fp8_linear reads it instead of casting, and the misuses are
// errors.
#include "accrue/optim/fp8_weights.h"

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/kernels/fp8.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using optim::ParamStore;
using optim::ParamStoreOptions;

void expect_same_copy(const Fp8Weight& a, const Fp8Weight& b) {
  EXPECT_TRUE(test::all_equal(a.q, b.q)) << "codes";
  EXPECT_TRUE(test::all_equal(a.q_t, b.q_t)) << "transposed codes";
  EXPECT_TRUE(test::all_equal(a.scale_inv, b.scale_inv)) << "scale_inv";
}

struct Layer {
  Tensor w = requires_grad_(test::random_normal({32, 48}, DType::f32, Device::cpu(), 0.1));
  Tensor b = requires_grad_(test::random_normal({32}, DType::f32));
};

Loss loss_of(const Layer& l, const Tensor& x, const Tensor& r) {
  return Loss{sum(fp8_linear(x, l.w, l.b, Fp8LinearOptions{}) * to_dtype(r, DType::bf16)),
              full({}, static_cast<double>(x.size(0)), DType::f64)};
}

TEST(WindowFp8Weights, the_store_keeps_the_copy_fp8_weight_makes_and_counts_it) {
  Layer l;
  ParamStore store(std::vector<Tensor>{l.w, l.b}, ParamStoreOptions().moments(0));
  EXPECT_EQ(kept_fp8_weight(l.w), nullptr);
  const int64_t before = store.memory().total();
  store.keep_fp8_copies({l.w});
  ASSERT_NE(kept_fp8_weight(l.w), nullptr);
  EXPECT_EQ(kept_fp8_weight(l.b), nullptr);
  expect_same_copy(*kept_fp8_weight(l.w), fp8_weight(l.w));
  EXPECT_EQ(kept_fp8_weight(l.w)->q.dtype(), DType::f8e4m3);
  EXPECT_EQ(store.memory().fp8, 2 * 32 * 48 + 8);  // codes, their transpose, amax, scale_inv
  EXPECT_EQ(store.memory().total(), before + store.memory().fp8);
  EXPECT_THAT(store.memory().describe(), ::testing::HasSubstr("fp8 copies"));
}

TEST(WindowFp8Weights, the_close_recasts_after_the_step_and_micro_batches_read_the_copy) {
  Layer l;
  optim::Optimizer opt(optim::AdamWOptions(1e-2));
  ParamStore store(std::vector<Tensor>{l.w, l.b},
                   ParamStoreOptions().moments(opt.moments_needed()));
  store.keep_fp8_copies({l.w});
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(2));
  EXPECT_THAT(window.describe_close(), ::testing::HasSubstr("optimizer step, fp8 weights, report"));
  for (int w = 0; w < 3; ++w) {
    for (int k = 0; k < 2; ++k)
      window.backward(loss_of(l, test::random_normal({16, 48}, DType::bf16),
                              test::random_normal({16, 32}, DType::f32)));
    window.close();
    // The weights moved; the copy is theirs again.
    expect_same_copy(*kept_fp8_weight(l.w), fp8_weight(l.w));
  }
  // Within a window fp8_linear reads the kept copy, not a new cast: a weight
  // written behind the store's back (no loader) leaves the copy as it was.
  const Tensor x = test::random_normal({16, 48}, DType::bf16);
  const Tensor kept_y = fp8_linear(x, l.w, *kept_fp8_weight(l.w));
  store.master_view(0).copy_(test::random_normal({32, 48}, DType::f32));
  EXPECT_TRUE(test::all_equal(detach(fp8_linear(x, l.w)), detach(kept_y)));
  EXPECT_FALSE(test::all_equal(detach(fp8_linear(x, l.w, fp8_weight(l.w))), detach(kept_y)));
}

TEST(WindowFp8Weights, micro_batches_with_the_kept_copy_equal_casting_each_time) {
  const Tensor w0 = test::random_normal({32, 48}, DType::f32, Device::cpu(), 0.1);
  const Tensor b0 = test::random_normal({32}, DType::f32);
  std::vector<Tensor> xs, rs;
  for (int k = 0; k < 3; ++k) {
    xs.push_back(test::random_normal({16, 48}, DType::bf16));
    rs.push_back(test::random_normal({16, 32}, DType::f32));
  }
  auto run = [&](bool keep) {
    Layer l;
    l.w = requires_grad_(w0.clone());
    l.b = requires_grad_(b0.clone());
    optim::Optimizer opt(optim::AdamWOptions(1e-2));
    ParamStore store(std::vector<Tensor>{l.w, l.b},
                     ParamStoreOptions().moments(opt.moments_needed()));
    if (keep) store.keep_fp8_copies({l.w});
    optim::Window window(store, opt, optim::WindowOptions().micro_steps(3));
    for (int w = 0; w < 2; ++w) {
      for (int k = 0; k < 3; ++k)
        window.backward(loss_of(l, xs[k], rs[k]));
      window.close();
    }
    return store.master().clone();
  };
  // One cast per window or one per micro-batch: the same codes, the same training.
  EXPECT_TRUE(test::all_equal(run(true), run(false)));
}

TEST(WindowFp8Weights, loaders_and_resumes_recast_the_copy) {
  Layer l;
  optim::Optimizer opt(optim::AdamWOptions(1e-2));
  ParamStore store(std::vector<Tensor>{l.w, l.b},
                   ParamStoreOptions().moments(opt.moments_needed()));
  store.keep_fp8_copies({l.w});
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(1));
  window.backward(loss_of(l, test::random_normal({16, 48}, DType::bf16),
                          test::random_normal({16, 32}, DType::f32)));
  window.close();
  std::map<std::string, Tensor> saved;  // copies: state_dict's tensors may be views
  for (const auto& [key, t] : window.state_dict())
    saved.emplace(key, t.clone());
  Fp8Weight after_one;
  after_one.q = kept_fp8_weight(l.w)->q.clone();
  after_one.q_t = kept_fp8_weight(l.w)->q_t.clone();
  after_one.scale_inv = kept_fp8_weight(l.w)->scale_inv.clone();
  // Note [One load path]: a loaded value's copy is its own.
  store.load("param0", test::random_normal({32, 48}, DType::f32));
  expect_same_copy(*kept_fp8_weight(l.w), fp8_weight(l.w));
  // A resume restores the weights and, from them, the copy, bit for bit.
  window.load_state_dict(saved);
  expect_same_copy(*kept_fp8_weight(l.w), after_one);
}

// The block recipe's copies (Note [FP8 block recipe]): W's 128 x 128 blocks
// and W^T's, as the per-call casts make them, counted with their scales;
// recast by the close; and K micro-batches of the block recipe reading them
// train bit for bit as casting at every call. 272 x 400 has partial blocks
// at both edges.
TEST(WindowFp8Weights, block_copies_are_the_per_call_casts_and_train_the_same) {
  const Tensor w0 = test::random_normal({272, 400}, DType::f32, Device::cpu(), 0.05);
  Fp8LinearOptions block;
  block.recipe = Fp8Recipe::block;
  std::vector<Tensor> xs, rs;
  for (int k = 0; k < 3; ++k) {
    xs.push_back(test::random_normal({128, 400}, DType::bf16));
    rs.push_back(test::random_normal({128, 272}, DType::f32));
  }
  auto expect_block_copy = [](const Tensor& w) {
    const Fp8Weight* kept = kept_fp8_weight(w);
    ASSERT_NE(kept, nullptr);
    ASSERT_TRUE(kept->blocks());
    const auto cw = kernels::cast_to_fp8_blockwise(detach(w), 128, 128, DType::f8e4m3);
    const auto cwt =
        kernels::cast_to_fp8_blockwise(detach(w).transpose(0, 1), 128, 128, DType::f8e4m3);
    EXPECT_TRUE(test::all_equal(kept->q, cw.q)) << "codes";
    EXPECT_TRUE(test::all_equal(kept->scale_inv, cw.scale_inv)) << "scales";
    EXPECT_TRUE(test::all_equal(kept->q_t, cwt.q)) << "W^T's codes";
    EXPECT_TRUE(test::all_equal(kept->scale_inv_t, cwt.scale_inv)) << "W^T's scales";
    EXPECT_TRUE(test::all_equal(kept->amax, cw.amax)) << "amax";
    // W^T's blocks are W's transposed: the same codes and scales.
    EXPECT_TRUE(test::all_equal(kept->q_t, cw.q.transpose(0, 1).contiguous()));
    EXPECT_TRUE(test::all_equal(kept->scale_inv_t, cw.scale_inv.transpose(0, 1).contiguous()));
  };
  auto run = [&](bool keep) {
    Tensor w = requires_grad_(w0.clone());
    optim::Optimizer opt(optim::AdamWOptions(1e-2));
    ParamStore store(std::vector<Tensor>{w}, ParamStoreOptions().moments(opt.moments_needed()));
    if (keep) {
      store.keep_fp8_copies({w}, DType::f8e4m3, 0, Fp8Recipe::block);
      expect_block_copy(w);
      // Codes and their transpose, a scale for each of 3 x 4 blocks twice, the amax.
      EXPECT_EQ(store.memory().fp8, 2 * 272 * 400 + 4 * (12 + 12 + 1));
    }
    optim::Window window(store, opt, optim::WindowOptions().micro_steps(3));
    for (int step = 0; step < 2; ++step) {
      for (int k = 0; k < 3; ++k) {
        const Tensor x = requires_grad_(xs[k].clone());
        window.backward(Loss{sum(to_dtype(fp8_linear(x, w, Tensor(), block), DType::f32) * rs[k]),
                             full({}, 128.0, DType::f64)});
      }
      window.close();
      if (keep) expect_block_copy(w);  // the weights moved; the copy is theirs again
    }
    return store.master().clone();
  };
  EXPECT_TRUE(test::all_equal(run(true), run(false)));
  // The block recipe reads the kept copy, not a new cast: a weight written
  // behind the store's back (no loader) leaves the copy, and so y, as it was.
  Tensor w = requires_grad_(w0.clone());
  ParamStore store(std::vector<Tensor>{w}, ParamStoreOptions().moments(0));
  store.keep_fp8_copies({w}, DType::f8e4m3, 0, Fp8Recipe::block);
  const Tensor kept_y = detach(fp8_linear(xs[0], w, Tensor(), block));
  store.master_view(0).copy_(test::random_normal({272, 400}, DType::f32));
  EXPECT_TRUE(test::all_equal(detach(fp8_linear(xs[0], w, Tensor(), block)), kept_y));
  // (A weight the store does not own, with the new values, is cast anew.)
  const Tensor fresh = store.master_view(0).clone();
  EXPECT_FALSE(test::all_equal(detach(fp8_linear(xs[0], fresh, Tensor(), block)), kept_y));
}

TEST(WindowFp8Weights, misuses_are_errors) {
  Layer l;
  Tensor odd = requires_grad_(test::random_normal({10, 48}, DType::f32));
  optim::Optimizer opt(optim::SGDOptions(0.1));
  ParamStore store(std::vector<Tensor>{l.w, l.b, odd}, ParamStoreOptions().moments(0));
  EXPECT_ERROR(store.keep_fp8_copies({odd}), "keep_fp8_copies", "'param2'", "[10, 48]",
               "multiples of 16");
  EXPECT_ERROR(store.keep_fp8_copies({l.b}), "keep_fp8_copies", "[32]");
  EXPECT_ERROR(store.keep_fp8_copies({test::random_normal({32, 48}, DType::f32)}),
               "keep_fp8_copies", "not a parameter of this store");
  EXPECT_ERROR(store.keep_fp8_copies({l.w}, DType::bf16), "keep_fp8_copies", "bf16",
               "not an FP8 dtype");
  // Asked after the Window was built: its close has no recast stage.
  optim::Window window(store, opt, optim::WindowOptions().micro_steps(1));
  store.keep_fp8_copies({l.w});
  EXPECT_ERROR(store.keep_fp8_copies({l.w}), "keep_fp8_copies", "'param0'",
               "already has an FP8 copy");
  EXPECT_ERROR(store.keep_fp8_copies({l.w}, DType::f8e4m3, 2), "keep_fp8_copies", "margin 0",
               "margin 2");
  EXPECT_ERROR(store.keep_fp8_copies({l.w}, DType::f8e5m2), "keep_fp8_copies", "f8e4m3", "f8e5m2");
  EXPECT_ERROR(store.keep_fp8_copies({l.w}, DType::f8e4m3, 0, Fp8Recipe::block), "keep_fp8_copies",
               "recipe tensor", "recipe block");
  ParamStore other(std::vector<Tensor>{requires_grad_(test::random_normal({32, 48}))},
                   ParamStoreOptions().moments(0));
  EXPECT_ERROR(other.keep_fp8_copies(other.params(), DType::f8e4m3, 1, Fp8Recipe::block),
               "keep_fp8_copies", "block recipe", "margin 1");
  window.backward(Loss{sum(fp8_linear(test::random_normal({16, 48}, DType::bf16), l.w)),
                       full({}, 16.0, DType::f64)});
  EXPECT_ERROR(window.close(), "Window::close", "keep_fp8_copies", "before building the Window");
}

}  // namespace
}  // namespace accrue
