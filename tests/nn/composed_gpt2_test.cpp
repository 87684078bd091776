// The GPT-2 of examples/composed_gpt2 (public primitives only) against
// nn::GPT2 (fused ops) on the same weights, in f64 on the CPU: the loss and
// every parameter's gradient.
#include "examples/composed_gpt2/composed_gpt2.h"

#include <memory>

#include "tests/test_util.h"

namespace accrue {
namespace {

std::unique_ptr<nn::GPT2> tiny(uint64_t seed) {
  nn::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 120;  // padded to 128 rows of wte, which the loss never sees
  Generator gen(seed);
  return std::make_unique<nn::GPT2>(c, nn::ParamOptions{Device::cpu(), DType::f64, &gen});
}

TEST(ComposedGpt2, equals_the_fused_model_in_loss_and_every_gradient) {
  const std::unique_ptr<nn::GPT2> fused = tiny(9), composed = tiny(9);  // same weights
  Generator data(4);
  const Tensor idx = randint(0, 120, {2, 16}, DType::i64, Device::cpu(), &data);
  const Tensor targets = randint(0, 120, {2, 16}, DType::i64, Device::cpu(), &data);
  const Loss a = fused->loss(idx, targets);
  examples::ComposedGPT2 composed_model(*composed);
  const Loss b = composed_model.loss(idx, targets);
  EXPECT_EQ(b.count.item(), a.count.item());
  EXPECT_NEAR(b.sum.item(), a.sum.item(), 1e-12 * std::abs(a.sum.item()));
  backward(a.sum);
  backward(b.sum);
  const std::vector<nn::NamedParameter> pa = fused->named_parameters(),
                                        pb = composed->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_LE(test::relative_error(grad(pb[i].tensor), grad(pa[i].tensor)), 1e-10) << pa[i].name;
  }
}

}  // namespace
}  // namespace accrue
