// Convolution, pooling, GroupNorm and BatchNorm's running statistics against
// PyTorch (fixtures/conv.safetensors from make_conv_golden.py), in f64 on the
// CPU: outputs and input gradients within 1e-10 relative.
#include <filesystem>
#include <map>
#include <string>

#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/tensor_io.h"
#include "accrue/nn/batch_norm.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

constexpr double kTolerance = 1e-10;

class ConvGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(ACCRUE_GOLDEN_DIR) + "/conv.safetensors";
    if (!std::filesystem::is_regular_file(path))
      GTEST_SKIP() << "no golden fixtures at " << path
                   << "; generate them with PyTorch: python3 tests/golden/make_conv_golden.py "
                      "--out tests/golden/fixtures";
    tensors_ = load_safetensors(path, &meta_);
  }
  const Tensor& t(const std::string& key) const {
    auto it = tensors_.find(key);
    ACCRUE_CHECK(it != tensors_.end(), "conv.safetensors: no tensor '", key, "'");
    return it->second;
  }
  // "a,b" in the metadata.
  std::pair<int64_t, int64_t> pair(const std::string& key) const {
    const std::string v = meta_.at(key);
    const size_t comma = v.find(',');
    return {std::stoll(v.substr(0, comma)), std::stoll(v.substr(comma + 1))};
  }
  Tensor leaf(const std::string& key) const { return requires_grad_(t(key).clone()); }
  // out, then the gradient of every leaf, each against PyTorch's.
  void expect_case(const std::string& c, const Tensor& out, const std::vector<Tensor>& leaves,
                   const std::vector<std::string>& names) const {
    SCOPED_TRACE(c);
    EXPECT_LE(test::relative_error(detach(out), t(c + ".out")), kTolerance);
    backward(out, t(c + ".grad"));
    for (size_t i = 0; i < leaves.size(); ++i)
      EXPECT_LE(test::relative_error(grad(leaves[i]), t(c + ".d" + names[i])), kTolerance)
          << "d" << names[i];
  }

  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> meta_;
};

TEST_F(ConvGolden, conv2d_matches_pytorch_forward_and_backward) {
  for (const char* name : {"conv_plain", "conv_strided", "conv_dilated", "conv_grouped"}) {
    const std::string c = name;
    Conv2dOptions o;
    std::tie(o.stride_h, o.stride_w) = pair(c + ".stride");
    std::tie(o.pad_h, o.pad_w) = pair(c + ".padding");
    std::tie(o.dilation_h, o.dilation_w) = pair(c + ".dilation");
    o.groups = std::stoll(meta_.at(c + ".groups"));
    const Tensor x = leaf(c + ".x"), w = leaf(c + ".w"), b = leaf(c + ".b");
    expect_case(c, conv2d(x, w, b, o), {x, w, b}, {"x", "w", "b"});
  }
}

TEST_F(ConvGolden, pooling_matches_pytorch) {
  Pool2dOptions p;
  std::tie(p.kernel_h, p.kernel_w) = pair("pool.kernel");
  std::tie(p.stride_h, p.stride_w) = pair("pool.stride");
  std::tie(p.pad_h, p.pad_w) = pair("pool.padding");
  Tensor x = leaf("maxpool.x");
  expect_case("maxpool", max_pool2d(x, p), {x}, {"x"});
  x = leaf("avgpool.x");
  expect_case("avgpool", avg_pool2d(x, p), {x}, {"x"});
  p.count_include_pad = false;
  x = leaf("avgpool_nopad.x");
  expect_case("avgpool_nopad", avg_pool2d(x, p), {x}, {"x"});
  x = leaf("adaptive.x");
  expect_case("adaptive", adaptive_avg_pool2d(x, 4, 3), {x}, {"x"});
}

TEST_F(ConvGolden, group_norm_matches_pytorch) {
  const Tensor x = leaf("groupnorm.x"), w = leaf("groupnorm.w"), b = leaf("groupnorm.b");
  expect_case("groupnorm", group_norm(x, std::stoll(meta_.at("groupnorm.groups")), w, b), {x, w, b},
              {"x", "w", "b"});
}

// Note [Window statistics]: PerMicroBatch is torch.nn.BatchNorm2d over K
// forwards; Window, over the same K, is BatchNorm2d over their concatenation.
TEST_F(ConvGolden, batch_norm_running_statistics_match_pytorch) {
  const int64_t k = std::stoll(meta_.at("bn.micro_batches"));
  const int64_t channels = t("bn.x0").size(1);
  const nn::ParamOptions f64{Device::cpu(), DType::f64, nullptr};
  nn::BatchNormOptions per_options;
  per_options.statistics = nn::BatchNormStatistics::PerMicroBatch;
  nn::BatchNorm per(channels, f64, per_options), window(channels, f64);
  for (int64_t i = 0; i < k; ++i) {
    per.forward(t("bn.x" + std::to_string(i)));
    window.forward(t("bn.x" + std::to_string(i)));
  }
  window.on_window_close();
  EXPECT_LE(test::relative_error(per.running_mean(), t("bn_per_micro_batch.running_mean")), 1e-12);
  EXPECT_LE(test::relative_error(per.running_var(), t("bn_per_micro_batch.running_var")), 1e-12);
  EXPECT_LE(test::relative_error(window.running_mean(), t("bn_whole.running_mean")), 1e-12);
  EXPECT_LE(test::relative_error(window.running_var(), t("bn_whole.running_var")), 1e-12);
  // The two differ measurably: the mode matters.
  EXPECT_GT(test::relative_error(per.running_var(), window.running_var()), 1e-3);
}

}  // namespace
}  // namespace accrue
