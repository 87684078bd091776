// Every convolution shape of ResNet-50 (torchvision's layout, 224 x 224
// images) at micro-batch 64, bf16, channels-last activations, as the model
// issues them (the target: conv2d forward and backward per shape within 5% of
// PyTorch):
//   fwd         y = conv2d(x, W)
//   dgrad       dx from dy and W
//   wgrad       dW added into an fp32 slot (beta 1), cuDNN writing fp32
//               (kernels::ConvAlgorithmPolicy's default)
//   wgrad_bf16  the same with weight_gradient_in_operand_dtype: cuDNN writes
//               bf16, then it is added into the slot
//   wgrad_bf16_timed   and with ConvAlgorithmPolicy::timed (every candidate
//               plan timed on the first call, the fastest kept)
//   wgrad_bf16_nondet  and with allow_nondeterministic (cuDNN's engines that
//               accumulate with atomics admitted, as PyTorch admits them)
//   fwd_cudnn, dgrad_cudnn  (1 x 1, stride 1 only) fwd and dgrad on cuDNN with
//               kernels::set_pointwise_conv_gemm(false), not as GEMMs
// The weights are channels-last, as a channels-last model's compute copy holds
// them (nn::Module::to_channels_last, Note [Parameter layouts]), and so is the
// fp32 slot the weight gradient lands in. 1 x 1
// convolutions with stride 1 run as GEMMs (Note [Pointwise convolution as a
// GEMM]), the rest on cuDNN. FLOP = 2 N OH OW O C kh kw.
// bench/torch_bench.py times PyTorch under the same names: F.conv2d and
// aten.convolution_backward on channels-last tensors (a channels-last model's
// weights are channels-last too), the weight gradient in bf16 then added to an
// fp32 slot, which is what autograd does under autocast.
#include <string>

#include "accrue/kernels/conv.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

constexpr int64_t kBatch = 64;

struct ConvShape {
  int64_t c, o, size, kernel, stride;  // input [kBatch, c, size, size]
};
// ResNet-50's distinct convolutions: the stem, then each stage's 1 x 1
// reductions and expansions, its 3 x 3 (strided in the first block of
// stages 2-4) and its strided 1 x 1 shortcut.
constexpr ConvShape kShapes[] = {
    {3, 64, 224, 7, 2},  // the stem
    // stage 1
    {64, 64, 56, 1, 1},
    {64, 64, 56, 3, 1},
    {64, 256, 56, 1, 1},
    {256, 64, 56, 1, 1},
    // stage 2
    {256, 128, 56, 1, 1},
    {128, 128, 56, 3, 2},
    {128, 512, 28, 1, 1},
    {256, 512, 56, 1, 2},
    {512, 128, 28, 1, 1},
    {128, 128, 28, 3, 1},
    // stage 3
    {512, 256, 28, 1, 1},
    {256, 256, 28, 3, 2},
    {256, 1024, 14, 1, 1},
    {512, 1024, 28, 1, 2},
    {1024, 256, 14, 1, 1},
    {256, 256, 14, 3, 1},
    // stage 4
    {1024, 512, 14, 1, 1},
    {512, 512, 14, 3, 2},
    {512, 2048, 7, 1, 1},
    {1024, 2048, 14, 1, 2},
    {2048, 512, 7, 1, 1},
    {512, 512, 7, 3, 1},
};

enum class Pass {
  Fwd,
  Dgrad,
  Wgrad,
  WgradBf16,
  WgradBf16Timed,
  WgradBf16Nondet,
  FwdCudnn,
  DgradCudnn
};
constexpr Pass kPasses[] = {Pass::Fwd,       Pass::Dgrad,          Pass::Wgrad,
                            Pass::WgradBf16, Pass::WgradBf16Timed, Pass::WgradBf16Nondet,
                            Pass::FwdCudnn,  Pass::DgradCudnn};

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::Fwd:
      return "fwd";
    case Pass::Dgrad:
      return "dgrad";
    case Pass::Wgrad:
      return "wgrad";
    case Pass::WgradBf16:
      return "wgrad_bf16";
    case Pass::WgradBf16Timed:
      return "wgrad_bf16_timed";
    case Pass::WgradBf16Nondet:
      return "wgrad_bf16_nondet";
    case Pass::FwdCudnn:
      return "fwd_cudnn";
    case Pass::DgradCudnn:
      return "dgrad_cudnn";
  }
  return "?";
}

// [N, C, H, W] values over N, H, W, C memory (a channels-last model's
// activations and weights).
Tensor channels_last_input(int64_t n, int64_t c, int64_t h, int64_t w) {
  return random_input({n, h, w, c}, DType::bf16).permute({0, 3, 1, 2});
}

void conv(benchmark::State& state, ConvShape s, Pass pass) {
  Conv2dOptions o;
  o.stride_h = o.stride_w = s.stride;
  o.pad_h = o.pad_w = s.kernel / 2;
  const int64_t out = (s.size + 2 * o.pad_h - s.kernel) / s.stride + 1;
  const Shape x_shape{kBatch, s.c, s.size, s.size};
  const Tensor x = channels_last_input(kBatch, s.c, s.size, s.size);
  const Tensor w = channels_last_input(s.o, s.c, s.kernel, s.kernel);
  const Tensor dy = channels_last_input(kBatch, s.o, out, out);
  const Tensor slot =
      random_input({s.o, s.kernel, s.kernel, s.c}, DType::f32).permute({0, 3, 1, 2});
  const kernels::ConvAlgorithmPolicy saved = kernels::conv_algorithm_policy();
  kernels::ConvAlgorithmPolicy policy = saved;
  policy.weight_gradient_in_operand_dtype =
      pass == Pass::WgradBf16 || pass == Pass::WgradBf16Timed || pass == Pass::WgradBf16Nondet;
  policy.timed = pass == Pass::WgradBf16Timed;
  policy.allow_nondeterministic = pass == Pass::WgradBf16Nondet;
  kernels::set_conv_algorithm_policy(policy);
  const bool gemm = kernels::pointwise_conv_gemm();
  kernels::set_pointwise_conv_gemm(pass != Pass::FwdCudnn && pass != Pass::DgradCudnn);
  GpuTime t = time_gpu(state, [&] {
    switch (pass) {
      case Pass::Fwd:
      case Pass::FwdCudnn:
        benchmark::DoNotOptimize(kernels::conv2d(x, w, o));
        break;
      case Pass::Dgrad:
      case Pass::DgradCudnn:
        benchmark::DoNotOptimize(kernels::conv2d_backward_input(dy, w, x_shape, o));
        break;
      case Pass::Wgrad:
      case Pass::WgradBf16:
      case Pass::WgradBf16Timed:
      case Pass::WgradBf16Nondet:
        kernels::conv2d_backward_weight(dy, x, slot, o, /*beta=*/1.0);
        break;
    }
  });
  kernels::set_conv_algorithm_policy(saved);
  kernels::set_pointwise_conv_gemm(gemm);
  report_flops(state, 2.0 * kBatch * out * out * s.o * s.c * s.kernel * s.kernel, t);
}

// Names read conv/bf16/<c>to<o>_<kernel>x<kernel>_s<stride>_<size>/B=64/<pass>.
void register_conv_benchmarks() {
  for (const ConvShape& s : kShapes) {
    for (Pass p : kPasses) {
      const bool pointwise = s.kernel == 1 && s.stride == 1;
      if (!pointwise && (p == Pass::FwdCudnn || p == Pass::DgradCudnn)) continue;
      const std::string name = "conv/bf16/" + std::to_string(s.c) + "to" + std::to_string(s.o) +
                               "_" + std::to_string(s.kernel) + "x" + std::to_string(s.kernel) +
                               "_s" + std::to_string(s.stride) + "_" + std::to_string(s.size) +
                               "/B=" + std::to_string(kBatch) + "/" + pass_name(p);
      register_gpu_benchmark(name, [s, p](benchmark::State& state) { conv(state, s, p); });
    }
  }
}

// Registered at static initialization, as bench_window_close.cpp explains.
[[maybe_unused]] const bool registered = [] {
  register_conv_benchmarks();
  return true;
}();

}  // namespace
}  // namespace accrue::bench
