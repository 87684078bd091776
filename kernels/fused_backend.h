// The backend side of the transformer fusions (kernels/fused.h): the functions
// kernels/cpu/fused.cpp, kernels/cuda/fused.cu and kernels/cuda/matmul.cu
// implement. kernels/fused.cpp has validated everything and allocated every
// output; all tensors are contiguous and on one device. Private to kernels/.
#pragma once

#include "core/tensor.h"

namespace accrue::kernels {

namespace cpu {
// x [N, in], weight [out, in], bias [out], pre and out [N, out], one dtype.
// pre = x @ weight^T + bias, the dot product accumulated in double and rounded
// once with the bias; out = gelu(pre) with UnaryOp::Gelu's formula.
void linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                 const Tensor& out);
// x, residual, sum, out [rows, D] of one dtype; weight/bias [D] (x's dtype or
// f32) or undefined; mean, rstd [rows] (f32, f64 for f64).
void residual_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                         const Tensor& bias, double eps, const Tensor& sum, const Tensor& out,
                         const Tensor& mean, const Tensor& rstd);
}  // namespace cpu

namespace cuda {
// The one-GEMM linear_gelu of Note [GELU epilogue] (kernels/cuda/matmul.cu),
// same arguments as cpu::linear_gelu. Returns false, having launched nothing,
// when cuBLASLt cannot run this problem with the epilogue (f64, an `out` that
// is not a multiple of 8, no algorithm); the caller then runs the GEMM and
// bias_gelu.
bool gemm_bias_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                    const Tensor& out);
// out = x @ weight^T + bias as one GEMM with the bias epilogue of Note [Bias
// epilogue] (kernels/cuda/matmul.cu); x [N, in], weight [out, in], bias [out],
// out [N, out], one dtype. Returns false, having launched nothing, when
// cuBLASLt cannot run it (f64, in = 0, no algorithm); the caller then runs
// matmul and add.
bool gemm_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
// The fallback epilogue: acc [N, out] is x @ weight^T (f32 for 16-bit pre, else
// pre's dtype; it may be pre itself); pre = acc + bias and out = gelu(acc + bias),
// GELU applied before rounding to pre's dtype, as the cuBLASLt epilogue does.
void bias_gelu(const Tensor& acc, const Tensor& bias, const Tensor& pre, const Tensor& out);
void residual_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                         const Tensor& bias, double eps, const Tensor& sum, const Tensor& out,
                         const Tensor& mean, const Tensor& rstd);
}  // namespace cuda

}  // namespace accrue::kernels
