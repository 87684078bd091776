// The interface that both backends implement for the elementwise, reduction,
// matmul and nn ops: kernels/cpu/ (namespace accrue::kernels::cpu, the
// reference) and kernels/cuda/ (accrue::kernels::cuda), listed once in
// kernels/backend_functions.inc (Note [Backend function lists]).
//
// Dispatch (kernels/dispatch_*.cpp) has already validated everything and
// allocated every output, so a backend function only computes. Conventions:
//  - "any strides": the tensor may be a strided view, including 0 strides from
//    broadcasting (expand); its shape equals the output's shape.
//  - "contiguous": row-major with no gaps, offset applied by data_ptr().
//  - floating tensors are f32, f64, bf16 or f16; 16-bit ones compute in fp32;
//    sums accumulate in fp32 (f64 for f64), in a fixed order (Note [Determinism]).
//  - index tensors are i32 or i64.
//
// Note [Determinism]
// ~~~~~~~~~~~~~~~~~~
// The same inputs on the same device give bitwise the same outputs on every
// run: the accumulation tests compare runs exactly, a resumed checkpoint must
// continue bit for bit, and data-parallel ranks must agree on the norm, the
// clip and found_inf. So every floating-point sum has an order fixed by the
// shapes and the launch configuration alone:
//  - no floating-point atomics (integer counts may use them: exact in any
//    order); CUDA reductions fold fixed trees and per-block partials in block
//    order (Note [Fixed reduction order], Note [Deterministic column sums],
//    Note [Norm partials]);
//  - scatter-adds sort first and sum each destination in position order (Note
//    [Deterministic embedding backward]);
//  - cuBLASLt gets one workspace per stream and one cached algorithm per
//    problem (Note [cuBLASLt state]);
//  - the CPU reference loops in index order.
// The guarantee is per GPU model and build (chunk counts follow the SM
// count), not across them, nor between the CPU and CUDA backends. One
// exception: where a cuDNN has no deterministic attention backward for a
// shape, kernels/cuda/attention_cudnn.cpp falls back to its default engine,
// which accumulates dQ with atomics.
#pragma once

#include "accrue/core/cuda_runtime.h"
#include "accrue/kernels/backend_fn.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::cpu {
#include "accrue/kernels/backend_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/backend_functions.inc"
}  // namespace accrue::kernels::cuda
