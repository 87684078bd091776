// nn::ResNet: torchvision's architecture (parameter counts and names), the
// small-input stem, zero_init_residual, gradients (float64 gradcheck), bad input.
#include "accrue/nn/resnet.h"

#include <algorithm>

#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/sgd.h"
#include "accrue/optim/window.h"
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

// Note [Parameter layouts]: to_channels_last lays the k x k convolution
// weights out channels-last (1 x 1 ones and the 1-D BatchNorm tensors are
// already in that order) with their values and identity; the arena keeps the
// layout; a window trains it as the row-major model; the window checkpoint
// refuses the other layout; after the arena is built it is an error.
TEST(ResNet, a_channels_last_model_trains_as_the_row_major_one) {
  nn::ResNetConfig c = tiny(true);
  c.small_input = false;  // the 7 x 7 stem
  Generator gen_row(4), gen_last(4);
  const nn::ParamOptions row_options{Device::cpu(), DType::f64, &gen_row};
  const nn::ParamOptions last_options{Device::cpu(), DType::f64, &gen_last};
  nn::ResNet row(c, row_options), last(c, last_options);
  const std::vector<Tensor> held = last.parameters();  // handles taken before
  last.to_channels_last();
  const std::vector<nn::NamedParameter> row_named = row.named_parameters();
  const std::vector<nn::NamedParameter> last_named = last.named_parameters();
  int relaid = 0;
  for (size_t i = 0; i < last_named.size(); ++i) {
    const Tensor& p = last_named[i].tensor;
    const bool square = p.dim() == 4 && p.size(2) * p.size(3) > 1;
    EXPECT_EQ(p.is_channels_last(), square) << last_named[i].name;
    EXPECT_EQ(held[i].strides(), p.strides()) << last_named[i].name << ": the same tensor";
    EXPECT_TRUE(test::all_equal(p, row_named[i].tensor)) << last_named[i].name;
    relaid += square ? 1 : 0;
  }
  EXPECT_EQ(relaid, 3);  // the stem and each block's 3 x 3

  auto train = [&](nn::ResNet& model, std::map<std::string, Tensor>* checkpoint) {
    optim::Optimizer sgd(optim::SGDOptions(0.1).momentum(0.9));
    optim::ParamStore arena(
        model.named_parameters(),
        optim::ParamStoreOptions().master_dtype(DType::f64).moments(sgd.moments_needed()));
    optim::Window window(arena, sgd, optim::WindowOptions().micro_steps(2));
    Generator data(7);
    for (int m = 0; m < 2; ++m) {
      const Tensor x = randn({2, 3, 16, 16}, DType::f64, Device::cpu(), &data);
      const Tensor y = randint(0, 3, {2}, DType::i64, Device::cpu(), &data);
      window.backward(cross_entropy(model.forward(x), y));
    }
    window.close();
    EXPECT_ERROR(model.to_channels_last(), "to_channels_last", "conv1.weight", "gradient arena",
                 "before building it");
    if (checkpoint->empty()) {
      *checkpoint = window.state_dict();
    } else {
      EXPECT_ERROR(window.load_state_dict(*checkpoint), "load_state_dict", "channels-last",
                   "to_channels_last");
    }
  };
  std::map<std::string, Tensor> checkpoint;
  train(last, &checkpoint);
  EXPECT_EQ(checkpoint.count("channels_last_slots"), 1u);
  train(row, &checkpoint);  // the channels-last checkpoint is refused here
  for (size_t i = 0; i < last_named.size(); ++i)
    EXPECT_LE(test::relative_error(last_named[i].tensor, row_named[i].tensor), 1e-12)
        << last_named[i].name;
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
