// ResNet (He et al. 2016) in torchvision's layout and parameter names:
// conv1/bn1 stem, layer1..layer4 of BasicBlock or Bottleneck (stride on the
// 3x3, "ResNet v1.5"), a 1x1 convolution + BatchNorm "downsample" shortcut
// where the shape changes, global average pooling and fc. A small-input stem
// (one 3x3 convolution, no max pooling) serves 8x8 to 32x32 images.
//
// The convolutions run where kernels/conv.h sends them (the CPU reference;
// on CUDA, cuDNN for bf16/f16 and the composed path otherwise). They are initialized as nn::Conv2d
// is, uniform(+-1/sqrt(fan_in)), where torchvision re-draws them kaiming_normal(fan_out): the
// architecture and the parameter count match torchvision's (resnet18: 11,689,512; resnet50:
// 25,557,032 at 1000 classes), the initial values do not.
#pragma once

#include <cstdint>
#include <vector>

#include "accrue/nn/batch_norm.h"
#include "accrue/nn/module.h"

namespace accrue::nn {

struct ResNetConfig {
  bool bottleneck = false;                     // Bottleneck blocks (x4 expansion), else BasicBlock
  std::vector<int64_t> blocks = {2, 2, 2, 2};  // per stage; stages after the first halve H, W
  int64_t width = 64;                          // the first stage's channels, doubled per stage
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  bool small_input = false;  // a 3x3 stride-1 stem and no max pooling
  // The last BatchNorm of each block starts at gamma = 0, so each block
  // starts as its shortcut (torchvision's zero_init_residual).
  bool zero_init_residual = false;
  BatchNormOptions batch_norm;

  static ResNetConfig resnet18(int64_t num_classes = 1000);
  static ResNetConfig resnet50(int64_t num_classes = 1000);
};

class ResNet : public Module {
 public:
  ResNet(const ResNetConfig& config, const ParamOptions& options);
  // x [N, in_channels, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& x);
  const ResNetConfig& config() const { return config_; }

 private:
  struct Block {
    std::vector<Conv2d*> convs;
    std::vector<BatchNorm*> norms;
    Conv2d* down_conv = nullptr;  // the shortcut, where the shape changes
    BatchNorm* down_norm = nullptr;
  };
  ResNetConfig config_;
  Conv2d* conv1_ = nullptr;
  BatchNorm* bn1_ = nullptr;
  std::vector<Block> blocks_;
  Linear* fc_ = nullptr;
};

}  // namespace accrue::nn
