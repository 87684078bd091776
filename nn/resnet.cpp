#include "accrue/nn/resnet.h"

#include <memory>
#include <string>
#include <utility>

#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"

namespace accrue::nn {

namespace {

// Module holding the children of one block under torchvision's names
// (layerS.B.conv1, .bn1, ..., .downsample.0 / .1).
class Holder : public Module {
 public:
  template <class M>
  M& add(std::string name, std::unique_ptr<M> child) {
    return register_module(std::move(name), std::move(child));
  }
};

Conv2dOptions conv_options(int64_t stride, int64_t pad) {
  Conv2dOptions o;
  o.stride_h = o.stride_w = stride;
  o.pad_h = o.pad_w = pad;
  return o;
}

}  // namespace

ResNetConfig ResNetConfig::resnet18(int64_t num_classes) {
  ResNetConfig c;
  c.num_classes = num_classes;
  return c;
}

ResNetConfig ResNetConfig::resnet50(int64_t num_classes) {
  ResNetConfig c;
  c.bottleneck = true;
  c.blocks = {3, 4, 6, 3};
  c.num_classes = num_classes;
  return c;
}

ResNet::ResNet(const ResNetConfig& config, const ParamOptions& options) : config_(config) {
  ACCRUE_CHECK(!config.blocks.empty() && config.width >= 1 && config.in_channels >= 1 &&
                   config.num_classes >= 1,
               "ResNet: invalid config (", config.blocks.size(), " stages, width ", config.width,
               ", ", config.in_channels, " input channels, ", config.num_classes, " classes)");
  for (int64_t b : config.blocks)
    ACCRUE_CHECK(b >= 1, "ResNet: every stage needs at least one block, got ", b);
  auto conv = [&](int64_t in, int64_t out, int64_t k, int64_t stride) {
    return std::make_unique<Conv2d>(in, out, k, /*bias=*/false, options,
                                    conv_options(stride, k / 2));
  };
  auto norm = [&](int64_t channels) {
    return std::make_unique<BatchNorm>(channels, options, config.batch_norm);
  };
  conv1_ =
      &register_module("conv1", config.small_input ? conv(config.in_channels, config.width, 3, 1)
                                                   : conv(config.in_channels, config.width, 7, 2));
  bn1_ = &register_module("bn1", norm(config.width));

  const int64_t expansion = config.bottleneck ? 4 : 1;
  int64_t in = config.width;
  for (size_t s = 0; s < config.blocks.size(); ++s) {
    const int64_t planes = config.width << s;
    Holder& stage = register_module("layer" + std::to_string(s + 1), std::make_unique<Holder>());
    for (int64_t b = 0; b < config.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      Holder& holder = stage.add(std::to_string(b), std::make_unique<Holder>());
      Block block;
      if (config.bottleneck) {
        block.convs = {&holder.add("conv1", conv(in, planes, 1, 1))};
        block.norms = {&holder.add("bn1", norm(planes))};
        block.convs.push_back(&holder.add("conv2", conv(planes, planes, 3, stride)));
        block.norms.push_back(&holder.add("bn2", norm(planes)));
        block.convs.push_back(&holder.add("conv3", conv(planes, planes * expansion, 1, 1)));
        block.norms.push_back(&holder.add("bn3", norm(planes * expansion)));
      } else {
        block.convs = {&holder.add("conv1", conv(in, planes, 3, stride))};
        block.norms = {&holder.add("bn1", norm(planes))};
        block.convs.push_back(&holder.add("conv2", conv(planes, planes, 3, 1)));
        block.norms.push_back(&holder.add("bn2", norm(planes)));
      }
      if (stride != 1 || in != planes * expansion) {
        Holder& down = holder.add("downsample", std::make_unique<Holder>());
        block.down_conv = &down.add("0", conv(in, planes * expansion, 1, stride));
        block.down_norm = &down.add("1", norm(planes * expansion));
      }
      if (config.zero_init_residual) {
        NoGradGuard no_grad;
        for (const NamedParameter& p : block.norms.back()->named_parameters())
          if (p.name == "weight") p.tensor.fill_(0.0);
      }
      blocks_.push_back(std::move(block));
      in = planes * expansion;
    }
  }
  fc_ = &register_module("fc", std::make_unique<Linear>(in, config.num_classes, true, options));
}

Tensor ResNet::forward(const Tensor& x) {
  const NvtxRange range("accrue ResNet forward");  // Note [NVTX ranges]
  ACCRUE_CHECK(x.dim() == 4 && x.size(1) == config_.in_channels, "ResNet: input has shape ",
               shape_str(x.shape()), "; expected [N, ", config_.in_channels, ", H, W]");
  // Note [Close under the forward]: each layer's weights, before it reads them.
  await_parameters(*conv1_);
  await_parameters(*bn1_);
  Tensor h = relu(bn1_->forward(conv1_->forward(x)));
  if (!config_.small_input) {
    Pool2dOptions pool;
    pool.kernel_h = pool.kernel_w = 3;
    pool.stride_h = pool.stride_w = 2;
    pool.pad_h = pool.pad_w = 1;
    h = max_pool2d(h, pool);
  }
  for (Block& b : blocks_) {
    Tensor y = h;
    for (size_t i = 0; i < b.convs.size(); ++i) {
      await_parameters(*b.convs[i]);
      await_parameters(*b.norms[i]);
      y = b.norms[i]->forward(b.convs[i]->forward(y));
      if (i + 1 < b.convs.size()) y = relu(y);
    }
    if (b.down_conv) {
      await_parameters(*b.down_conv);
      await_parameters(*b.down_norm);
    }
    const Tensor shortcut = b.down_conv ? b.down_norm->forward(b.down_conv->forward(h)) : h;
    h = relu(y + shortcut);
  }
  h = adaptive_avg_pool2d(h, 1, 1);
  await_parameters(*fc_);
  return fc_->forward(reshape(h, {h.size(0), h.size(1)}));
}

}  // namespace accrue::nn
