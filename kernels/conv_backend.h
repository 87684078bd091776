// The backend side of kernels/conv.h: what kernels/cpu/conv.cpp (every
// tensor contiguous f64) and kernels/cuda/pool.cu implement, listed in
// kernels/conv_functions.inc, and the paths of any device that
// kernels/conv.cpp chooses among: the composed convolution
// (kernels/conv_composed.cpp), the pointwise GEMMs (kernels/conv_pointwise.cpp)
// and cuDNN (kernels/cuda/conv_cudnn.cpp). Tensors are already validated;
// sizes are in the Conv2dGeometry. Private to kernels/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"
#include "accrue/kernels/conv.h"

namespace accrue::kernels {

// Sizes of one convolution or pooling: input [n, c, h, w], output [n, o, oh, ow],
// window kh x kw (a pooling has o = c and groups = c).
struct Conv2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t o = 0, oh = 0, ow = 0;
  int64_t kh = 0, kw = 0;
  Conv2dOptions options;
};

// The validated geometry of a convolution (x, weight) or a pooling of x; every
// error names `op` and the shapes (kernels/conv.cpp).
Conv2dGeometry conv_geometry(const Shape& x, const Shape& weight, const Conv2dOptions& o,
                             const char* op);
Conv2dGeometry pool_geometry(const Shape& x, const Pool2dOptions& p, const char* op);

}  // namespace accrue::kernels

// Note [Max pooling kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// max_pool2d on CUDA is two kernels of its own (kernels/cuda/pool.cu), any
// float dtype, operands read through their strides:
//   forward  one thread per output element, in the output's memory order
//            (channels-last: C fastest, so a warp reads consecutive channels
//            of one pixel); the window's taps in row-major order, the first
//            maximum kept and a NaN kept once seen (the CPU reference's
//            rule); the index is h W + w in the input plane, as PyTorch's;
//   backward one thread per input element gathers the gradient of every
//            output whose window can hold it and whose index names it, in
//            (oh, ow) order, summed in f32 (f64 for f64): no atomics, no
//            zero fill, the same bits on every run.
// The output, its indices and dx take the layout of the input (forward) or of
// the gradient (backward): channels-last stays channels-last (Note
// [Channels-last results]). The composed max pooling these replaced (windows
// copied out, max and argmax reductions, an f64 position table, a sorted
// scatter-add) took about 18 ms of a ResNet-50 micro-step of 64 images on an
// H100, where these two kernels take 1.3 ms (bench/RESULTS.md). The backward's
// indices are checked like any data-dependent index (kernels/index_checks.h);
// a bad one matches no position, so nothing is read or written out of bounds
// meanwhile.

namespace accrue::kernels::cpu {
#include "accrue/kernels/conv_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/conv_functions.inc"
}  // namespace accrue::kernels::cuda

namespace accrue::kernels {

// Note [Composed convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// conv2d on a CUDA tensor that cuDNN does not take (f32, f64, an odd layout,
// a build without the cuDNN frontend, a shape cuDNN refuses:
// Note [cuDNN convolution]) runs as im2col + GEMM
// (kernels/conv_composed.cpp), from ops every backend already has and tests:
//   forward  the padded input's windows as a strided view, copied to columns
//            [n oh ow, c kh kw] (one contiguous block per group), times W^T;
//   data     dcols = dy W per group, in f32 for 16-bit (f64 for f64), then
//            col2im: each of the kh kw taps adds its columns into the padded
//            input's positions through a strided axpy_ (positions are distinct
//            within a tap; taps run one after another), cropped and rounded once;
//   weight   dW (= or +=) dy^T cols per group, the GEMM writing straight into
//            the fp32 arena slot with beta 0 or 1 (Note [Fused weight-gradient
//            accumulation]).
// Every tensor has one device and the geometry is validated (kernels/conv.cpp);
// the same code runs on the CPU, where tests hold it to the CPU reference.
// It costs the columns' memory, c kh kw times the output's positions: a
// fallback, not the speed of cuDNN's convolutions. avg_pool2d and
// adaptive_avg_pool2d run composed too (one reduction per output cell);
// max_pool2d has kernels of its own (Note [Max pooling kernels]).
namespace composed {
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& g);
Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Conv2dGeometry& g);
void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dGeometry& g, double beta);
// Summed per output cell in f32 (f64 for f64), one sum and one strided add per cell.
Tensor adaptive_avg_pool2d(const Tensor& x, const Conv2dGeometry& g);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad, const Conv2dGeometry& g);
// Window sums over a divisor table; the backward adds each window's share per tap.
Tensor avg_pool2d(const Tensor& x, const Conv2dGeometry& g, bool count_include_pad);
Tensor avg_pool2d_backward(const Tensor& grad, const Conv2dGeometry& g, bool count_include_pad);
}  // namespace composed

// Note [Pointwise convolution as a GEMM]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A 1 x 1 convolution with stride 1, no padding, no dilation and one group
// over a channels-last input is a plain GEMM on views, with no copy: the
// input [N, C, H, W] over N, H, W, C memory is the row-major matrix
// X [N H W, C], the weight [O, C, 1, 1] is W [O, C], and
//   forward  Y [N H W, O] = X W^T, a channels-last output;
//   data     dX [N H W, C] = dY W, channels-last (dY copied to rows when it
//            is not channels-last);
//   weight   dW (= or +=) dY^T X, the GEMM writing straight into the fp32
//            arena slot with beta 0 or 1 (Note [Fused weight-gradient
//            accumulation]), deterministic as every cuBLASLt GEMM here.
// kernels/conv.cpp sends such bf16/f16 CUDA convolutions here ahead of cuDNN
// while set_pointwise_conv_gemm is on (the default): 36 of ResNet-50's 53
// convolutions. The functions (kernels/conv_pointwise.cpp) run on any
// device, and the CPU tests hold them to the reference. In ResNet-50 training
// on an H100 they are 1.21-1.26x faster than cuDNN's engines for the same
// convolutions (bench/RESULTS.md; accrue_resnet_bench --no-pointwise-gemm is
// the comparison).
namespace pointwise {
// Whether (x, g) is such a convolution (x channels-last, or [N, C, 1, 1]).
bool applies(const Tensor& x, const Conv2dGeometry& g);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& g);
Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Conv2dGeometry& g);
void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dGeometry& g, double beta);
}  // namespace pointwise

// Note [cuDNN convolution] (kernels/cuda/conv_cudnn.cpp; built only with the
// cuDNN frontend): bf16/f16 operands, each packed NCHW or packed NHWC and
// 16-byte aligned, passed with their real strides. Each call returns false,
// having written nothing, when cuDNN cannot build a graph for it.
namespace cudnn {
// The convolution handle of `stream` made now (kernels::prepare_stream).
void prepare_conv_stream(int device, StreamHandle stream);
bool conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& out,
                    const Conv2dGeometry& g);
bool conv2d_backward_data(const Tensor& grad, const Tensor& weight, const Tensor& dx,
                          const Conv2dGeometry& g);
// dw = the weight gradient (overwritten); f32 or the operands' dtype.
bool conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& dw,
                            const Conv2dGeometry& g);
}  // namespace cudnn

// The pieces of kernels/conv.cpp's fixed order of paths that the per-shape
// choice runs too.
namespace fixed_path {
// Note [Pointwise convolution as a GEMM]: whether this convolution goes to the GEMM on views.
bool use_pointwise_gemm(const Tensor& activation, const Conv2dGeometry& g);
// Note [cuDNN convolution]: whether cuDNN takes this operand.
bool cudnn_operand(const Tensor& t);
// The weight in the layout the convolution with `activation` wants (itself or a copy).
Tensor weight_for(const Tensor& weight, const Tensor& activation);
// Whether cuDNN may compute this weight gradient.
bool cudnn_weight_gradient_applies(const Tensor& grad, const Tensor& x, const Tensor& grad_weight);
// The weight gradient on cuDNN computed in `dtype` (the slot's or the operands'), written or
// (beta 1) added into the slot. False when cuDNN builds no graph (nothing written).
bool cudnn_weight_gradient_in(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                              const Conv2dGeometry& g, double beta, DType dtype);
}  // namespace fixed_path

// Note [Per-shape convolution paths] (kernels/conv_per_shape.cpp): each
// direction's path timed on its shape's first call and kept. Called while
// ConvAlgorithmPolicy::path_per_shape is on.
namespace per_shape {
// The output, or an undefined tensor when the fixed order is to run.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& g);
// The data gradient, or an undefined tensor when the fixed order is to run.
Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Shape& x_shape,
                             const Conv2dGeometry& g);
// True when the chosen path computed the weight gradient into grad_weight (beta 0 or 1);
// false, having written nothing, when the fixed order is to run.
bool conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dGeometry& g, double beta);
}  // namespace per_shape

}  // namespace accrue::kernels
