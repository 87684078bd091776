// Note [Module device and dtype]: Module::to moves parameters and buffers
// together, buffers with keep_dtype keep theirs, and a parameter a store holds
// is the store's.
#include <gmock/gmock.h>

#include <memory>
#include <string>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/nn/batch_norm.h"
#include "accrue/nn/module.h"
#include "accrue/optim/param_store.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// The case: a model-held table (rotary embeddings' cos) multiplies the
// activations; as a buffer it follows the model.
class WithTable : public nn::Module {
 public:
  explicit WithTable(Generator* g) {
    fc_ = &register_module("fc", std::make_unique<nn::Linear>(
                                     4, 4, true, nn::ParamOptions{Device::cpu(), DType::f64, g}));
    table_ = register_buffer("cos", test::random_uniform({4}, -1.0, 1.0, DType::f64),
                             nn::BufferOptions().persistent(false));
    fixed_ =
        register_buffer("stat", full({4}, 0.25, DType::f64), nn::BufferOptions().keep_dtype(true));
    steps_ = register_buffer("steps", zeros({}, DType::i64));
  }
  Tensor forward(const Tensor& x) const { return fc_->forward(x) * table_; }
  nn::Linear* fc_;
  Tensor table_, fixed_, steps_;
};

TEST(ModuleTo, to_dtype_moves_parameters_and_buffers_keeping_their_identity) {
  Generator g(1);
  WithTable m(&g);
  const Tensor weight = m.fc_->weight();  // a handle the caller holds
  const std::vector<double> w64 = weight.to_vector<double>();
  const std::vector<double> cos64 = m.table_.to_vector<double>();
  m.to(DType::f32);
  EXPECT_EQ(weight.dtype(), DType::f32);  // the same tensor, converted
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_TRUE(is_leaf(weight));
  EXPECT_EQ(m.fc_->bias().dtype(), DType::f32);
  EXPECT_EQ(m.table_.dtype(), DType::f32);
  EXPECT_EQ(m.fixed_.dtype(), DType::f64);  // keep_dtype
  EXPECT_EQ(m.steps_.dtype(), DType::i64);  // not floating
  const std::vector<float> w32 = weight.to_vector<float>();
  for (size_t i = 0; i < w64.size(); ++i)
    EXPECT_EQ(w32[i], static_cast<float>(w64[i]));
  const std::vector<float> cos32 = m.table_.to_vector<float>();
  for (size_t i = 0; i < cos64.size(); ++i)
    EXPECT_EQ(cos32[i], static_cast<float>(cos64[i]));
  // It trains in f32: the table no longer stands in another dtype.
  const Tensor x = test::random_normal({2, 4}, DType::f32);
  backward(sum(m.forward(x)));
  ASSERT_TRUE(grad(weight).defined());
  EXPECT_EQ(grad(weight).dtype(), DType::f32);
  // A .grad moves with its parameter.
  m.to(DType::f64);
  EXPECT_EQ(grad(weight).dtype(), DType::f64);
  EXPECT_EQ(m.fc_->forward(test::random_normal({1, 4}, DType::f64)).dtype(), DType::f64);
  m.to(Device::cpu());  // already there: nothing moves
  EXPECT_EQ(weight.device(), Device::cpu());
  EXPECT_ERROR(m.to(DType::i64), "Module::to", "i64", "not a floating dtype");
}

TEST(ModuleTo, a_table_left_outside_the_buffers_is_the_failure_the_buffer_prevents) {
  Generator g(2);
  WithTable m(&g);
  const Tensor outside = test::random_uniform({4}, -1.0, 1.0, DType::f64);  // not registered
  m.to(DType::f32);
  const Tensor x = test::random_normal({2, 4}, DType::f32);
  EXPECT_ERROR(m.fc_->forward(x) * outside, "dtypes");
  EXPECT_EQ(m.forward(x).dtype(), DType::f32);
}

TEST(ModuleTo, non_persistent_buffers_follow_but_stay_out_of_the_state_dict) {
  Generator g(3);
  WithTable m(&g);
  const auto buffers = m.named_buffers();
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0].name, "cos");
  const auto state = m.state_dict();
  EXPECT_EQ(state.count("cos"), 0u);
  EXPECT_EQ(state.count("stat"), 1u);
  EXPECT_EQ(state.count("fc.weight"), 1u);
  m.load_state_dict(state);  // strict: the missing table is not expected
}

// Note [BatchNorm in f32]: the running statistics stay f64 when the model converts.
TEST(ModuleTo, batch_norm_statistics_keep_their_f64) {
  nn::BatchNorm bn(3, {Device::cpu(), DType::f64, nullptr});
  bn.to(DType::f32);
  for (const auto& p : bn.named_parameters())
    EXPECT_EQ(p.tensor.dtype(), DType::f32) << p.name;
  for (const auto& b : bn.named_buffers())
    EXPECT_EQ(b.tensor.dtype(), DType::f64) << b.name;
  const Tensor x = test::random_normal({4, 3, 2, 2}, DType::f32);
  EXPECT_EQ(bn.forward(x).dtype(), DType::f32);
}

// Note [Module device and dtype]: after a store exists, to() brings the
// buffers to the store's compute dtype; a held parameter elsewhere is refused.
TEST(ModuleTo, after_a_store_buffers_follow_and_held_parameters_are_the_stores) {
  Generator g(4);
  WithTable m(&g);
  optim::ParamStore store(
      m.named_parameters(),
      optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(0).name("main"));
  EXPECT_EQ(m.fc_->weight().dtype(), DType::bf16);
  EXPECT_EQ(m.table_.dtype(), DType::f64);  // what the issue saw
  const std::vector<double> cos = m.table_.to_vector<double>();
  EXPECT_ERROR(m.to(DType::f32), "Module::to(DType)", "'fc.weight' is held by the gradient arena",
               "'main'", "fixed its dtype", ".compute_dtype(f32)", "Nothing was moved");
  EXPECT_EQ(m.table_.dtype(), DType::f64);  // nothing moved
  EXPECT_EQ(m.table_.to_vector<double>(), cos);
  m.to(DType::bf16);  // the parameters are there already: the buffers follow
  EXPECT_EQ(m.table_.dtype(), DType::bf16);
  EXPECT_EQ(m.fixed_.dtype(), DType::f64);
  EXPECT_EQ(m.fc_->weight().storage(), store.compute().storage());  // still the store's
  const Tensor x = test::random_normal({2, 4}, DType::bf16);
  EXPECT_EQ(m.forward(x).dtype(), DType::bf16);
  EXPECT_ERROR(m.to(Device::cuda(0)), "Module::to(Device)", "'fc.weight'", "fixed its device",
               ".device(cuda:0)");
}

}  // namespace
}  // namespace accrue
