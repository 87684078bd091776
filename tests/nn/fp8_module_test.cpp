// nn::Linear in FP8 (Note [FP8 linear]): use_fp8 converts the layers whose
// sizes the FP8 GEMMs take, forward matches fp8_linear, and a batch of rows
// that is not a multiple of 16 (a decode step) runs plain.
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/nn/gpt2.h"
#include "accrue/nn/module.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(Fp8Module, use_fp8_converts_the_linears_the_fp8_gemms_take) {
  Generator gen(3);
  const nn::ParamOptions o{Device::cpu(), DType::f32, &gen};
  nn::MLP mlp({32, 48, 10}, o);  // 32 -> 48 converts; 48 -> 10 does not (10 % 16)
  const std::vector<Tensor> weights = nn::use_fp8(mlp);
  ASSERT_EQ(weights.size(), 1u);
  EXPECT_EQ(weights[0].shape(), (Shape{48, 32}));
  int converted = 0;
  for (nn::Module* m : mlp.modules())
    if (auto* l = dynamic_cast<nn::Linear*>(m)) converted += l->fp8() ? 1 : 0;
  EXPECT_EQ(converted, 1);
}

// GPT-2: the four projections of every block (c_fc's GELU then runs after
// its FP8 GEMM, not in a bf16 epilogue); the tied classifier stays as it is.
TEST(Fp8Module, gpt2_converts_four_projections_per_block) {
  Generator gen(5);
  nn::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 32;
  c.vocab_size = 64;
  nn::GPT2 model(c, {Device::cpu(), DType::f32, &gen});
  const Tensor idx = test::random_integers({2, 8}, 0, 63, DType::i64);
  const Tensor plain = model.logits(idx);
  const std::vector<Tensor> weights = model.use_fp8();
  ASSERT_EQ(weights.size(), 8u);
  EXPECT_EQ(weights[0].shape(), (Shape{96, 32}));   // c_attn
  EXPECT_EQ(weights[2].shape(), (Shape{128, 32}));  // c_fc
  const Tensor fp8 = model.logits(idx);
  EXPECT_EQ(fp8.dtype(), plain.dtype());
  EXPECT_FALSE(test::all_equal(detach(fp8), detach(plain))) << "the projections did not round";
  EXPECT_LT(test::relative_error(fp8, plain), 0.1);
}

TEST(Fp8Module, forward_is_fp8_linear_in_the_input_dtype_and_plain_for_odd_rows) {
  Generator gen(4);
  nn::Linear layer(32, 16, /*bias=*/true, {Device::cpu(), DType::f32, &gen});
  const Tensor x = test::random_normal({2, 8, 32}, DType::f32);
  const Tensor plain = layer.forward(x);
  layer.set_fp8(Fp8LinearOptions{});
  const Tensor y = layer.forward(x);
  EXPECT_EQ(y.dtype(), DType::f32);  // the input's, not the default bf16
  Fp8LinearOptions f32_out;
  f32_out.out_dtype = DType::f32;
  EXPECT_TRUE(
      test::all_equal(detach(y), detach(fp8_linear(x, layer.weight(), layer.bias(), f32_out))));
  EXPECT_FALSE(test::all_equal(detach(y), detach(plain))) << "FP8 rounds";
  // 3 rows: the FP8 GEMMs cannot take them, so the layer runs plain.
  const Tensor one = test::random_normal({3, 32}, DType::f32);
  layer.set_fp8(Fp8LinearOptions{});
  const Tensor odd = layer.forward(one);
  layer.set_fp8(std::nullopt);
  EXPECT_FALSE(layer.fp8());
  EXPECT_TRUE(test::all_equal(detach(odd), detach(layer.forward(one))));
}

// Note [FP8 shared input]: layers that would cast x alike share one cast
// (the same outputs as each casting it); any that would not (plain, another
// margin or recipe, rows the FP8 GEMMs cannot take) get none.
TEST(Fp8Module, shared_fp8_input_only_when_every_layer_casts_alike) {
  Generator gen(6);
  const nn::ParamOptions po{Device::cpu(), DType::f32, &gen};
  nn::Linear a(32, 16, false, po), b(32, 48, false, po);
  const Tensor x = test::random_normal({16, 32}, DType::f32);
  EXPECT_FALSE(nn::Linear::shared_fp8_input({&a, &b}, x)) << "neither is FP8";
  a.set_fp8(Fp8LinearOptions{});
  EXPECT_FALSE(nn::Linear::shared_fp8_input({&a, &b}, x)) << "b is plain";
  Fp8LinearOptions m2;
  m2.margin = 2;
  b.set_fp8(m2);
  EXPECT_FALSE(nn::Linear::shared_fp8_input({&a, &b}, x)) << "margins differ";
  Fp8LinearOptions block;
  block.recipe = Fp8Recipe::block;
  b.set_fp8(block);
  EXPECT_FALSE(nn::Linear::shared_fp8_input({&a, &b}, x)) << "recipes differ";
  a.set_fp8(block);
  const std::optional<Fp8Input> blocks = nn::Linear::shared_fp8_input({&a, &b}, x);
  ASSERT_TRUE(blocks) << "both block";
  EXPECT_EQ(blocks->recipe, Fp8Recipe::block);
  for (const nn::Linear* l : {&a, &b})
    EXPECT_TRUE(test::all_equal(detach(l->forward(x, &*blocks)), detach(l->forward(x))));
  a.set_fp8(Fp8LinearOptions{});
  b.set_fp8(Fp8LinearOptions{});
  EXPECT_FALSE(nn::Linear::shared_fp8_input({&a, &b}, test::random_normal({3, 32})))
      << "3 rows run plain";
  const std::optional<Fp8Input> x8 = nn::Linear::shared_fp8_input({&a, &b}, x);
  ASSERT_TRUE(x8);
  for (const nn::Linear* l : {&a, &b})
    EXPECT_TRUE(test::all_equal(detach(l->forward(x, &*x8)), detach(l->forward(x))));
  EXPECT_TRUE(test::all_equal(detach(a.forward(x, nullptr)), detach(a.forward(x))));
}

}  // namespace
}  // namespace accrue
