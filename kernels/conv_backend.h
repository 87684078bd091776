// The backend side of kernels/conv.h: what kernels/cpu/conv.cpp implements.
// Every tensor is contiguous f64 on the CPU and already validated; sizes are
// in the Conv2dGeometry. Private to kernels/.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/conv.h"

namespace accrue::kernels {

// Sizes of one convolution or pooling: input [n, c, h, w], output [n, o, oh, ow],
// window kh x kw (a pooling has o = c and groups = c).
struct Conv2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t o = 0, oh = 0, ow = 0;
  int64_t kh = 0, kw = 0;
  Conv2dOptions options;
};

namespace cpu {
void conv2d(const Tensor& x, const Tensor& weight, const Tensor& out, const Conv2dGeometry& g);
void conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Tensor& dx,
                           const Conv2dGeometry& g);
// dw = the weight gradient (overwritten).
void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& dw,
                            const Conv2dGeometry& g);
void max_pool2d(const Tensor& x, const Tensor& out, const Tensor& indices, const Conv2dGeometry& g);
void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx,
                         const Conv2dGeometry& g);
void avg_pool2d(const Tensor& x, const Tensor& out, const Conv2dGeometry& g,
                bool count_include_pad);
void avg_pool2d_backward(const Tensor& grad, const Tensor& dx, const Conv2dGeometry& g,
                         bool count_include_pad);
void adaptive_avg_pool2d(const Tensor& x, const Tensor& out, const Conv2dGeometry& g);
void adaptive_avg_pool2d_backward(const Tensor& grad, const Tensor& dx, const Conv2dGeometry& g);
}  // namespace cpu

}  // namespace accrue::kernels
