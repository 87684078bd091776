// 2-D convolution and pooling over NCHW tensors.
//
// The CPU reference is here (kernels/cpu/conv.cpp: loops accumulating in
// double). On CUDA, bf16/f16 convolutions run on cuDNN
// (Note [cuDNN convolution] in kernels/cuda/conv_cudnn.cpp), in NCHW or channels-last
// (NHWC-packed strides); everything else runs composed from GEMMs, strided
// copies and scatter-adds (Note [Composed convolution] in
// kernels/conv_backend.h), the poolings included.
//
// Shapes: x [N, C, H, W]; weight [O, C / groups, KH, KW]; the output
// [N, O, OH, OW] with OH = (H + 2 pad_h - dilation_h (KH - 1) - 1) / stride_h + 1
// (floor), and OW likewise: PyTorch's conv2d and pooling without ceil_mode.
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"

namespace accrue {

// The options live in namespace accrue, beside the differentiable functions
// (autograd/conv_ops.h) that take them: an unqualified call then finds those
// by argument-dependent lookup, not these kernels of the same name.
struct Conv2dOptions {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

struct Pool2dOptions {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;  // PyTorch's default stride is the kernel: set it
  int64_t pad_h = 0, pad_w = 0;        // at most half the kernel, as PyTorch requires
  bool count_include_pad = true;       // avg_pool2d: divide by the whole window
};

}  // namespace accrue

namespace accrue::kernels {

using ::accrue::Conv2dOptions;
using ::accrue::Pool2dOptions;

// [N, O, OH, OW]; x and weight of one floating dtype, the result too.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dOptions& options);
// dx [x_shape] for the output gradient grad [N, O, OH, OW].
Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Shape& x_shape,
                             const Conv2dOptions& options);
// grad_weight = dW + beta * grad_weight, dW = the weight gradient of grad and
// the forward input x: beta 0 writes the slot without reading it, beta 1 adds
// (Note [Fused weight-gradient accumulation]). grad_weight may be f32 while x
// is bf16/f16 (the arena's fp32 slot).
void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dOptions& options, double beta);

struct MaxPoolOutput {
  Tensor out;  // [N, C, OH, OW]
  Tensor
      indices;  // i64 [N, C, OH, OW]: the argmax's h * W + w in its plane (first maximum; NaN wins)
};
MaxPoolOutput max_pool2d(const Tensor& x, const Pool2dOptions& options);
// Routes each output gradient to its argmax: dx [x_shape].
Tensor max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Shape& x_shape,
                           const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d_backward(const Tensor& grad, const Shape& x_shape, const Pool2dOptions& options);
// Output cell (i, j) averages rows [floor(i H / OH), ceil((i + 1) H / OH)) and
// the same columns over W / OW, as torch.nn.functional.adaptive_avg_pool2d.
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad, const Shape& x_shape);

// Whether this build has the cuDNN path of bf16/f16 convolutions
// (Note [cuDNN convolution] in kernels/cuda/conv_cudnn.cpp); without it they
// run composed.
bool cudnn_convolution_available();

// Note [Pointwise convolution as a GEMM] (kernels/conv_backend.h): whether
// bf16/f16 CUDA 1 x 1 convolutions over channels-last inputs run as cuBLASLt
// GEMMs on views (on, the default) or go to cuDNN. Process-wide.
void set_pointwise_conv_gemm(bool on);
bool pointwise_conv_gemm();

// How the cuDNN path picks an engine for each convolution it builds (Note
// [cuDNN convolution] in kernels/cuda/conv_cudnn.cpp). Process-wide; a
// convolution built under one policy keeps its engine.
struct ConvAlgorithmPolicy {
  // false (default): cuDNN's heuristic order, the first plan that builds.
  // true: every candidate plan timed on the convolution's first call, the
  // fastest kept. The host waits for the timing runs, so that first call
  // must not be under stream capture (make it in a warm-up step).
  bool timed = false;
  // false (default): engines cuDNN marks non-deterministic (atomics) are left
  // out, so every run gives the same bits. true admits them, as PyTorch does
  // unless torch.backends.cudnn.deterministic is set.
  bool allow_nondeterministic = false;
  // false (default): a bf16/f16 weight gradient lands in its fp32 slot from
  // an fp32 cuDNN output. true: cuDNN writes it in the operands' dtype and it
  // is then added into the slot, as PyTorch's autocast does. cuDNN's fast
  // weight-gradient engines write 16-bit outputs only, so this is faster, at
  // the price of rounding each micro-step's weight gradient to 16 bits.
  bool weight_gradient_in_operand_dtype = false;
  // true: each 16-bit convolution's path is timed on its shape's first call
  // and the fastest kept: for a 1 x 1 convolution of a channels-last
  // activation the GEMM on views or cuDNN, in every direction; for a weight
  // gradient into an fp32 slot also cuDNN's fp32 output or its 16-bit output
  // added. The choice goes into the tuning file when one is set
  // (set_gemm_tuning_file), so a rerun computes the same bits (Note
  // [Per-shape convolution paths] in kernels/conv_per_shape.cpp). It overrides
  // weight_gradient_in_operand_dtype and set_pointwise_conv_gemm(true) where
  // it chooses; a shape's first call must not be under stream capture to be
  // timed (there the fixed order runs).
  bool path_per_shape = false;
};
void set_conv_algorithm_policy(const ConvAlgorithmPolicy& policy);
ConvAlgorithmPolicy conv_algorithm_policy();

}  // namespace accrue::kernels
