// Fusions for transformer blocks, without autograd: the bias (+ GELU) in the
// GEMM's epilogue, and the residual add fused with the LayerNorm that follows it.
#pragma once

#include "accrue/core/tensor.h"

namespace accrue::kernels {

// y = x @ weight^T + bias for x [N, in], weight [out, in], bias [out], one
// dtype. On the CPU it is kernels::matmul then kernels::binary(Add), bit for
// bit. On CUDA bf16/f16/f32 it is one cuBLASLt GEMM with the BIAS epilogue,
// which rounds once instead of twice (Note [Bias epilogue] in
// kernels/cuda/gemm_epilogue.cu); elsewhere matmul then add.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// y = gelu(x @ weight^T + bias) for x [N, in], weight [out, in], bias [out]
// (GELU's tanh approximation). On CUDA bf16/f16/f32 it is one cuBLASLt GEMM
// with the GELU_AUX_BIAS epilogue; pre_activation (x @ weight^T + bias, [N,
// out], x's dtype) is what backward needs and is returned through the pointer.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   Tensor* pre_activation);
// grad * gelu'(pre_activation), same shape and dtype.
Tensor gelu_backward(const Tensor& grad, const Tensor& pre_activation);

struct ResidualLayerNormOutput {
  Tensor sum;   // x + residual
  Tensor out;   // layer_norm(sum) over the last dim
  Tensor mean;  // f32 (f64 for f64), one per row
  Tensor rstd;
};
// One pass: sum = x + residual (same shape, contiguous result), out = LayerNorm(sum).
ResidualLayerNormOutput residual_layer_norm(const Tensor& x, const Tensor& residual,
                                            const Tensor& weight, const Tensor& bias, double eps);

}  // namespace accrue::kernels
