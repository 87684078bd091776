// Modules: parameter and buffer registration, the state dict, shapes,
// initialization, and learning.
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/core/tensor_io.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/sgd.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(Modules, mlp_lists_parameters_in_registration_order) {
  Generator g(1);
  nn::MLP mlp({4, 8, 3}, {Device::cpu(), DType::f32, &g});
  const auto params = mlp.named_parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].name, "fc0.weight");
  EXPECT_EQ(params[1].name, "fc0.bias");
  EXPECT_EQ(params[2].name, "fc1.weight");
  EXPECT_EQ(params[0].tensor.shape(), (Shape{8, 4}));
  EXPECT_EQ(params[3].tensor.shape(), (Shape{3}));
  EXPECT_EQ(mlp.parameter_count(), 8 * 4 + 8 + 3 * 8 + 3);
  for (const auto& p : params)
    EXPECT_TRUE(p.tensor.requires_grad()) << p.name;
}

// A layer with state that is not trained, as a BatchNorm's running statistics.
class Counting : public nn::Module {
 public:
  explicit Counting(Generator* g) {
    fc_ = &register_module("fc", std::make_unique<nn::Linear>(
                                     3, 2, true, nn::ParamOptions{Device::cpu(), DType::f64, g}));
    running_ = register_buffer("running", zeros({2}, DType::f64));
    steps_ = register_buffer("steps", zeros({}, DType::i64));
  }
  nn::Linear* fc_;
  Tensor running_, steps_;
};

class Outer : public nn::Module {
 public:
  explicit Outer(Generator* g) {
    inner_ = &register_module("inner", std::make_unique<Counting>(g));
    scale_ = register_parameter("scale", full({1}, 2.0, DType::f64));
  }
  Counting* inner_;
  Tensor scale_;
};

// Note [Module state dict].
TEST(Modules, buffers_are_state_but_not_parameters_and_the_state_dict_round_trips) {
  Generator g(3);
  Outer model(&g);
  const auto buffers = model.named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].name, "inner.running");
  EXPECT_EQ(buffers[1].name, "inner.steps");
  EXPECT_FALSE(buffers[0].tensor.requires_grad());
  EXPECT_EQ(model.named_parameters().size(), 3u);  // inner.fc.weight, inner.fc.bias, scale
  model.inner_->running_.copy_(from_vector<double>({0.25, -1.5}, {2}));
  model.inner_->steps_.fill_(7);
  const std::map<std::string, Tensor> state = model.state_dict();
  EXPECT_EQ(state.size(), 5u);

  // Through a safetensors file into a model with other weights and zero buffers.
  const std::string path =
      (std::filesystem::temp_directory_path() / "accrue_module_state.safetensors").string();
  save_safetensors(path, state);
  Generator other(99);
  Outer loaded(&other);
  loaded.load_state_dict(load_safetensors(path));
  std::filesystem::remove(path);
  for (const auto& [name, tensor] : loaded.state_dict())
    EXPECT_TRUE(test::all_equal(tensor, state.at(name))) << name;

  // Refusals name the entry and change nothing.
  Outer fresh(&other);
  const std::map<std::string, Tensor> before = [&] {
    std::map<std::string, Tensor> copy;
    for (const auto& [name, tensor] : fresh.state_dict())
      copy[name] = tensor.clone();
    return copy;
  }();
  std::map<std::string, Tensor> bad = state;
  bad["inner.running"] = zeros({3}, DType::f64);
  EXPECT_ERROR(fresh.load_state_dict(bad), "load_state_dict", "inner.running", "[3]", "[2]");
  bad = state;
  bad.erase("inner.steps");
  EXPECT_ERROR(fresh.load_state_dict(bad), "missing", "inner.steps");
  bad = state;
  bad["extra"] = zeros({1});
  EXPECT_ERROR(fresh.load_state_dict(bad), "unexpected", "extra");
  for (const auto& [name, tensor] : fresh.state_dict())
    EXPECT_TRUE(test::all_equal(tensor, before.at(name))) << name << " changed";
  fresh.load_state_dict(bad, /*strict=*/false);  // the extra entry is ignored
  EXPECT_TRUE(test::all_equal(fresh.inner_->running_, state.at("inner.running")));
  EXPECT_ERROR(Counting(&g).load_state_dict({}), "missing");
}

TEST(Modules, linear_init_is_bounded_and_reproducible) {
  Generator g1(9), g2(9);
  nn::Linear a(100, 10, true, {Device::cpu(), DType::f32, &g1});
  nn::Linear b(100, 10, true, {Device::cpu(), DType::f32, &g2});
  EXPECT_TRUE(test::all_equal(a.weight(), b.weight()));
  for (float v : a.weight().to_vector<float>())
    EXPECT_LE(std::fabs(v), 0.1f);
}

TEST(Modules, linear_forward_matches_matmul_plus_bias) {
  Generator g(2);
  nn::Linear lin(3, 2, true, {Device::cpu(), DType::f64, &g});
  Tensor x = test::random_normal({4, 3}, DType::f64);
  NoGradGuard no_grad;
  Tensor expected = kernels::binary(kernels::BinaryOp::Add,
                                    kernels::matmul(x, lin.weight().transpose(0, 1)), lin.bias());
  EXPECT_TRUE(test::all_close(lin.forward(x), expected));
}

TEST(Modules, embedding_and_layer_norm_shapes) {
  Generator g(3);
  nn::Embedding emb(10, 4, {Device::cpu(), DType::f32, &g});
  nn::LayerNorm ln(4, {Device::cpu(), DType::f32, &g});
  Tensor idx = from_vector<int64_t>({1, 2, 3, 9, 0, 0}, {2, 3});
  Tensor h = ln.forward(emb.forward(idx));
  EXPECT_EQ(h.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(ln.named_parameters()[0].name, "weight");
  EXPECT_THROW(emb.forward(from_vector<int64_t>({10}, {1})), Error);
}

TEST(Modules, sgd_training_reduces_the_loss) {
  Generator g(4);
  nn::MLP mlp({8, 32, 4}, {Device::cpu(), DType::f32, &g});
  optim::PlainSGD sgd(mlp.parameters(), 0.2);
  Tensor x = test::random_normal({128, 8});
  Tensor y = kernels::argmax(kernels::matmul(x, test::random_normal({8, 4})), 1);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = cross_entropy(mlp.forward(x), y).sum / 128.0;
    backward(loss);
    sgd.step();
    last = loss.item();
    if (step == 0) first = last;
  }
  EXPECT_LT(last, 0.5 * first);
  EXPECT_THROW(optim::PlainSGD(mlp.parameters(), -1.0), Error);
}

// Note [NVTX ranges]: each module's forward is one range when they are on
// (the MLP's own, then each Linear's; GELU has none), and none when off.
TEST(Modules, each_module_forward_is_one_nvtx_range_when_on) {
  constexpr int64_t kPushedWhenOn = test::kNvtxPushedWhenOn;
  Generator gen(1);
  nn::MLP mlp({4, 6, 3}, {Device::cpu(), DType::f64, &gen});
  const Tensor x = randn({2, 4}, DType::f64);
  set_nvtx(true);
  const int64_t before = nvtx_ranges_pushed();
  mlp.forward(x);
  EXPECT_EQ(nvtx_ranges_pushed(), before + 3 * kPushedWhenOn);
  set_nvtx(false);
  const int64_t off = nvtx_ranges_pushed();
  mlp.forward(x);
  EXPECT_EQ(nvtx_ranges_pushed(), off);
}

}  // namespace
}  // namespace accrue
