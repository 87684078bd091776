// nn::ResNet: torchvision's architecture (parameter counts and names), the
// small-input stem, zero_init_residual, gradients (float64 gradcheck), bad input.
#include "nn/resnet.h"

#include <algorithm>

#include "autograd/gradcheck.h"
#include "autograd/variable.h"
#include "core/grad_mode.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

int64_t parameter_count(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters())
    n += p.numel();
  return n;
}

bool has_name(const std::vector<nn::NamedParameter>& named, const std::string& name) {
  return std::any_of(named.begin(), named.end(),
                     [&](const nn::NamedParameter& p) { return p.name == name; });
}

// torchvision.models.resnet18() and resnet50() have 11,689,512 and 25,557,032
// parameters: the same blocks, widths, shortcuts and fc give the same counts.
TEST(ResNet, torchvision_parameter_counts_and_names) {
  Generator gen(0);
  const nn::ParamOptions options{Device::cpu(), DType::f32, &gen};
  const nn::ResNet r18(nn::ResNetConfig::resnet18(), options);
  EXPECT_EQ(parameter_count(r18), 11689512);
  const std::vector<nn::NamedParameter> named = r18.named_parameters();
  EXPECT_EQ(named.front().name, "conv1.weight");
  EXPECT_EQ(named.back().name, "fc.bias");
  for (const char* name : {"bn1.weight", "layer1.0.conv1.weight", "layer1.1.bn2.bias",
                           "layer2.0.downsample.0.weight", "layer4.1.conv2.weight"})
    EXPECT_TRUE(has_name(named, name)) << name;
  EXPECT_FALSE(has_name(named, "layer1.0.downsample.0.weight"));  // same shape: identity
  EXPECT_TRUE(has_name(r18.named_buffers(), "layer3.0.downsample.1.running_var"));
  const nn::ResNet r50(nn::ResNetConfig::resnet50(), options);
  EXPECT_EQ(parameter_count(r50), 25557032);
  EXPECT_TRUE(has_name(r50.named_parameters(), "layer1.0.downsample.0.weight"));  // 64 -> 256
  EXPECT_TRUE(has_name(r50.named_parameters(), "layer4.2.conv3.weight"));
}

nn::ResNetConfig tiny(bool bottleneck) {
  nn::ResNetConfig c;
  c.bottleneck = bottleneck;
  c.blocks = {1, 1};
  c.width = 2;
  c.num_classes = 3;
  c.small_input = true;
  return c;
}

TEST(ResNet, a_small_input_network_runs_and_passes_gradcheck) {
  for (bool bottleneck : {false, true}) {
    SCOPED_TRACE(bottleneck ? "bottleneck" : "basic");
    Generator gen(1);
    nn::ResNet model(tiny(bottleneck), {Device::cpu(), DType::f64, &gen});
    const Tensor x = requires_grad_(test::random_normal({2, 3, 4, 4}, DType::f64));
    EXPECT_EQ(model.forward(x).shape(), (Shape{2, 3}));
    const GradcheckResult train = gradcheck([&](auto& v) { return model.forward(v[0]); }, {x});
    EXPECT_TRUE(train.ok) << "training mode: " << train.message;
    model.eval();
    const GradcheckResult eval = gradcheck([&](auto& v) { return model.forward(v[0]); }, {x});
    EXPECT_TRUE(eval.ok) << "eval mode: " << eval.message;
  }
}

TEST(ResNet, zero_init_residual_zeroes_each_blocks_last_norm) {
  nn::ResNetConfig c = tiny(true);
  c.zero_init_residual = true;
  Generator gen(2);
  const nn::ResNet model(c, {Device::cpu(), DType::f32, &gen});
  int zeroed = 0;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    const bool last_norm = p.name.find(".bn3.weight") != std::string::npos;
    if (!last_norm) continue;
    ++zeroed;
    EXPECT_TRUE(test::all_equal(p.tensor, zeros(p.tensor.shape(), DType::f32))) << p.name;
  }
  EXPECT_EQ(zeroed, 2);
}

TEST(ResNet, bad_configs_and_inputs_are_errors) {
  Generator gen(3);
  const nn::ParamOptions options{Device::cpu(), DType::f64, &gen};
  nn::ResNetConfig c = tiny(false);
  c.blocks = {1, 0};
  EXPECT_ERROR(nn::ResNet(c, options), "ResNet", "at least one block", "got 0");
  nn::ResNet model(tiny(false), options);
  EXPECT_ERROR(model.forward(test::random_normal({2, 1, 4, 4}, DType::f64)), "ResNet",
               "[2, 1, 4, 4]", "expected [N, 3, H, W]");
}

}  // namespace
}  // namespace accrue
