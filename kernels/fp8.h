// FP8: scaled casts with their amax, the scale of current scaling, and the
// scaled FP8 GEMM (Note [FP8 dtypes] for the formats). An FP8 tensor is
// storage for these GEMMs, never a compute dtype: every other op refuses it.
//
// Note [FP8 scaling]
// ~~~~~~~~~~~~~~~~~~
// A tensor x is stored as q = fp8(x * scale) (cast_to_fp8), and a GEMM of
// two stored tensors multiplies by the inverses: out = (q_a q_b) * scale_inv_a
// * scale_inv_b (fp8_matmul), so the scales only move x into the format's
// range. Both scales live on the device as f32 [1] tensors, so that a cast, a
// scale update and a GEMM chain on the stream without a host round trip and
// replay under CUDA graphs.
//  - The cast computes p = x * scale as one f32 multiply (x widened exactly
//    from bf16 / f16 / f32), then rounds p to the FP8 dtype to nearest even,
//    saturating at +-max (Note [FP8 dtypes]): two roundings, the same on the
//    CPU and on CUDA, so both give the same bytes. A power-of-two scale
//    (fp8_scale_from_amax's power_of_two) makes the multiply exact.
//  - amax = max |x| over the whole tensor, in f32, taken in the same pass as
//    the cast (the data is read once). It is NaN when any element is NaN and
//    +inf when any is infinite: a cast that saturated an infinity or kept a NaN
//    says so in its amax, which is how an overflow is detected (the codes of
//    a saturating cast never hold an infinity). A max is exact and its order
//    does not change it, so amax is the same bits on every run and backend
//    (Note [Determinism]). A cast's own amax is for delayed scaling (the
//    next step's scale) and for overflow detection; current scaling needs
//    the amax before the cast, from the kernel that produced x.
//  - Current scaling (fp8_scale_from_amax): scale = fp8_max / amax / 2^margin
//    in f32, and scale_inv = 1 / scale. The guards: amax == 0 (an all-zero
//    tensor: any scale is exact) and a non-finite amax (the tensor overflowed:
//    the caller must skip and report the step, as for a loss-scale overflow,
//    from the amax it holds) give scale 1; a scale that overflows f32 (amax below fp8_max /
//    FLT_MAX) is FLT_MAX. With power_of_two the scale is rounded down to a
//    power of two (2^floor(log2 scale)), so x * scale and the GEMM's
//    dequantization are exact and only the FP8 rounding remains; this loses
//    at most one binade of range (DeepSeek-V3 and Transformer Engine's
//    block recipes round scales the same way).
#pragma once

#include "accrue/core/tensor.h"

namespace accrue::kernels {

// The result of cast_to_fp8: q in the FP8 dtype, x's shape (contiguous), and
// amax, f32 [1] on x's device.
struct Fp8Cast {
  Tensor q;
  Tensor amax;
};

// q = fp8(x * scale), amax = max |x| in one pass (Note [FP8 scaling]). x is
// f32, bf16 or f16 (any strides), scale an f32 [1] tensor on x's device,
// out_dtype f8e4m3 or f8e5m2.
Fp8Cast cast_to_fp8(const Tensor& x, const Tensor& scale, DType out_dtype);
// The same into the caller's buffers: q contiguous, x's shape, an FP8 dtype;
// amax f32 [1]; both on x's device.
void cast_to_fp8_into(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& amax);

// max |x| as f32 [1] on x's device (NaN when any element is NaN, 0 for an
// empty x): the amax of cast_to_fp8 from one read of x and no codes, what
// current scaling takes before the cast (Note [FP8 scaling]).
Tensor fp8_amax(const Tensor& x);
// The same into the caller's amax (f32 [1] on x's device).
void fp8_amax_into(const Tensor& x, const Tensor& amax);

// cast_to_fp8 of a 2-D x [M, K] with q^T as well: q [M, K] and q_t [K, M],
// both contiguous, from one read of x (Note [FP8 cast-transpose]), the
// K-contiguous copies that the data and weight gradients' GEMMs take (Note
// [FP8 GEMM]).
struct Fp8CastTranspose {
  Tensor q;
  Tensor q_t;
  Tensor amax;
};
Fp8CastTranspose cast_to_fp8_transpose(const Tensor& x, const Tensor& scale, DType out_dtype);
// The same into the caller's buffers (persistent ones, which a CUDA graph
// replays into): q [M, K] and q_t [K, M] contiguous, of one FP8 dtype, amax
// f32 [1], all on x's device. With merge_amax, amax becomes the max of its
// value and x's (Note [FP8 delayed scaling]) instead of x's alone.
void cast_to_fp8_transpose_into(const Tensor& x, const Tensor& scale, const Tensor& q,
                                const Tensor& q_t, const Tensor& amax, bool merge_amax = false);

// cast_to_fp8_transpose_into that also writes (or, with accumulate, adds)
// x's column sums into dbias (f32 contiguous [K] on x's device), from the same
// read of x (Note [FP8 bias gradient in the cast] in kernels/cuda/fp8.cu); on
// the CPU the cast and then sum_rows_into.
void cast_to_fp8_transpose_with_column_sums_into(const Tensor& x, const Tensor& scale,
                                                 const Tensor& q, const Tensor& q_t,
                                                 const Tensor& amax, bool merge_amax,
                                                 const Tensor& dbias, bool accumulate);

// Note [FP8 delayed scaling]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Current scaling reads x twice, once for its amax and once to cast it.
// Delayed scaling (Transformer Engine's default recipe) casts with a scale
// made from earlier amaxes and takes this x's amax in the same read, for
// later scales. Here the unit is the window: within a window every
// micro-batch's cast of a tensor uses one scale (as the weights are one),
// each merging its amax into the window's running amax
// (cast_to_fp8_transpose_into with merge_amax, or fp8_amax_merge_ after a
// cast that took its own; both an atomic max on the device, so micro-steps
// in flight on several streams merge in any order to the same value, Note
// [Concurrent micro-batches]); at the close fp8_delayed_scale_update pushes the
// window's amax onto a short history and makes the next window's scale from
// the history's max. A value past the scale's range saturates, as in
// Transformer Engine; an infinity or NaN makes the running amax NaN, which
// the reader's guarded scale_inv turns into a skipped window (Note [FP8
// overflow]), and a skipped window leaves the scale as it was. The state is
// a row of f32 per tensor, on the device, so it replays under CUDA graphs
// and can be checkpointed and max-reduced over data-parallel ranks. Who
// holds the rows and when they update: optim/fp8_scaling.h; the layers that
// cast with them: fp8_linear (autograd/ops_fp8.cpp).

// running = max(running, |amax|), NaN when either is NaN; both f32 [1] on one
// device (Note [FP8 delayed scaling]).
void fp8_amax_merge_(const Tensor& running, const Tensor& amax);
// Note [FP8 delayed scaling]'s close: state f32 contiguous [n, 3 + H], H >= 1,
// each row scale, scale_inv, the window's amax, then the history newest first.
// A finite window amax is pushed onto the history and scale / scale_inv made
// from the history's max by the rule of Note [FP8 scaling] for fp8_dtype and
// margin; a non-finite one leaves them; the window amax is reset to 0.
void fp8_delayed_scale_update(const Tensor& state, DType fp8_dtype, int margin = 0);

// cast_to_fp8_transpose for current scaling once amax is known (fp8_amax):
// the cast kernel makes its scale from amax by the rule of Note [FP8
// scaling] itself, in the same f32 operations as fp8_scale_from_amax (so the
// same codes and the same scale_inv bits, NaN on overflow when asked), and
// writes scale_inv for the GEMMs; it takes no amax of its own. One launch
// where fp8_scale_from_amax then cast_to_fp8_transpose take a scale kernel,
// an amax reset and the cast: at d = 768 each FP8 cast's small kernels cost
// about as much GPU time as its pass over x. x 2-D f32/bf16/f16 (any
// strides), amax f32 [1] on x's device, margin in [0, 6].
struct Fp8ScaledCastTranspose {
  Tensor q;
  Tensor q_t;
  Tensor scale_inv;
};
Fp8ScaledCastTranspose cast_to_fp8_transpose_scaled(const Tensor& x, const Tensor& amax,
                                                    DType out_dtype, int margin = 0,
                                                    bool power_of_two = false,
                                                    bool nan_on_overflow = false);
// The same into the caller's buffers (the store's kept weight copies, which
// a CUDA graph of the close replays into): q [M, K] and q_t [K, M]
// contiguous, of one FP8 dtype, scale_inv f32 [1], all on x's device.
void cast_to_fp8_transpose_scaled_into(const Tensor& x, const Tensor& amax, int margin,
                                       bool power_of_two, bool nan_on_overflow, const Tensor& q,
                                       const Tensor& q_t, const Tensor& scale_inv);

// cast_to_fp8_transpose_scaled that also writes dbias (f32 contiguous [K] on
// x's device) = x's column sums in f32, or adds them to it with accumulate:
// a linear layer's bias gradient from the read of dy its cast makes (Note
// [FP8 bias gradient in the cast] in kernels/cuda/fp8.cu). On the CPU, the
// cast and then sum_rows_into: the same bits as the two calls.
Fp8ScaledCastTranspose cast_to_fp8_transpose_scaled_with_column_sums(
    const Tensor& x, const Tensor& amax, DType out_dtype, int margin, bool power_of_two,
    bool nan_on_overflow, const Tensor& dbias, bool accumulate);

// The scale of current scaling and its inverse, both f32 [1] on amax's device.
struct Fp8Scale {
  Tensor scale;
  Tensor scale_inv;
};

// scale = fp8_max(fp8_dtype) / amax / 2^margin with the guards of Note [FP8
// scaling]; amax is f32 [1] (cast_to_fp8's), margin >= 0. With
// nan_on_overflow, scale_inv is NaN when amax is not finite (and 1 / scale
// otherwise), so every GEMM that multiplies by it says the tensor overflowed
// (Note [FP8 overflow] in autograd/ops_fp8.cpp) with no kernel of its own.
Fp8Scale fp8_scale_from_amax(const Tensor& amax, DType fp8_dtype, int margin = 0,
                             bool power_of_two = false, bool nan_on_overflow = false);
// The same into the caller's scale and scale_inv (f32 [1] on amax's device).
void fp8_scale_from_amax_into(const Tensor& amax, DType fp8_dtype, int margin, bool power_of_two,
                              const Tensor& scale, const Tensor& scale_inv,
                              bool nan_on_overflow = false);

// Note [FP8 block scaling]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Block scaling gives each tile of a 2-D x [M, K] its own scale: 1 x 128
// tiles for activations, 128 x 128 blocks for weights, as DeepSeek-V3, so an
// outlier costs precision in its tile only. Each tile's amax is taken, its
// scale made by the current-scaling rule of Note [FP8 scaling] (margin 0;
// power_of_two by default, Transformer Engine's default for block scales:
// the scaling is then exact), and the tile cast with it, all in one kernel,
// one block per tile. Tiles at the right and bottom edges may be partial.
// The result holds scale_inv per tile, [ceil(M / tile_rows), ceil(K /
// tile_cols)] f32, what a block-scaled GEMM multiplies by, and amax, the
// largest |x| of all tiles (NaN when any is NaN): a tile that overflowed gets
// scale 1 and shows in amax, as for a per-tensor cast. fp8_block_matmul
// (Note [FP8 block GEMM]) multiplies the codes with these scales.
struct Fp8BlockCast {
  Tensor q;
  Tensor scale_inv;
  Tensor amax;
};

// x 2-D f32/bf16/f16 (any strides); tile_rows >= 1, tile_cols in [1, 1024].
Fp8BlockCast cast_to_fp8_blockwise(const Tensor& x, int64_t tile_rows, int64_t tile_cols,
                                   DType out_dtype, bool power_of_two = true);
// The same into given buffers (the kept copies of Note [Window FP8 weights]):
// q contiguous, x's shape, its FP8 dtype the cast's; scale_inv contiguous f32
// [ceil(M / tile_rows), ceil(K / tile_cols)]; amax f32 [1]; all on x's device.
void cast_to_fp8_blockwise_into(const Tensor& x, int64_t tile_rows, int64_t tile_cols,
                                bool power_of_two, const Tensor& q, const Tensor& scale_inv,
                                const Tensor& amax);

// Note [FP8 GEMM]
// ~~~~~~~~~~~~~~~
// fp8_matmul(a, b) = (a @ b^T) * scale_inv_a * scale_inv_b with a [M, K] and
// b [N, K] FP8, both row-major with K contiguous. Read column-major (Note
// [Row-major GEMM through column-major cuBLASLt]) that is cuBLASLt's only FP8
// form on Hopper, "TN": its A is our b, transposed, its B our a, not. The
// three GEMMs of a linear layer take that form with K-contiguous FP8 copies:
// y = x W^T is (x, W); dx = dy W is (dy, W^T); dW += dy^T x is (dy^T, x^T),
// the transposed copies made when the tensors are cast. cuBLASLt's other
// requirements are checked here on every device, so a model that runs on the
// CPU reference runs on the GPU: M, N and K multiples of 16, data 16-byte
// aligned, not both operands e5m2; the output bf16, f16 or f32; the scales
// f32 [1] on the device (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER), so no host
// round trip and the GEMM replays under CUDA graphs.
// The weight gradient: accumulate = true adds into an f32 out, cuBLASLt
// computing out = scaled (a @ b^T) + 1 * out with the f32 out as C and D, so
// a micro-batch's contribution lands in the fp32 gradient slot in one GEMM,
// rounded once to f32 (Transformer Engine's fused weight-gradient
// accumulation makes the same choice). The alternative, a bf16 partial added
// by a second kernel, rounds every micro-batch's contribution to 8 bits,
// costs a buffer and a pass, and saves only the GEMM's f32 output traffic,
// which is small beside its M N K work. fast_accumulation sets
// CUBLASLT_MATMUL_DESC_FAST_ACCUM: off (the default), cuBLASLt promotes the
// tensor cores' partial sums to f32 (Hopper's FP8 accumulator keeps about 14
// bits, DeepSeek-V3's reason to promote every 128 elements); Transformer
// Engine turns it on for the forward only. The CPU reference sums exact
// products in double, in k order, and rounds once.
//
//
// A bias [N] in the output's dtype (a linear layer's) is added in cuBLASLt's
// epilogue (CUBLASLT_EPILOGUE_BIAS) to the f32 result before its one
// rounding, as Note [Bias epilogue]'s 16-bit linear does: no pass of its own
// over out. (Added after the GEMM, it cost GPT-2's FP8 model a read and a
// write of every projection's output.) Where cuBLASLt offers no algorithm
// with the epilogue, or the bias is not 16-byte aligned, the GEMM runs
// without it and the bias is added after.
//
// The output: f32 (accumulate or not), bf16 or f16 (accumulate false).
Tensor fp8_matmul(const Tensor& a, const Tensor& b, const Tensor& scale_inv_a,
                  const Tensor& scale_inv_b, DType out_dtype, bool fast_accumulation = false,
                  const Tensor& bias = Tensor());
// fp8_matmul with the bias and then GELU (tanh) in cuBLASLt's epilogue
// (CUBLASLT_EPILOGUE_GELU_AUX_BIAS): pre = the biased product in out's dtype
// (what GELU's backward reads) and out = gelu of it, in one GEMM, as Note
// [GELU epilogue]'s 16-bit linear_gelu: the CPU reference rounds pre, then
// applies UnaryOp::Gelu's kernel; the epilogue applies GELU to the f32 value
// (the last bit may differ). pre and out [M, N] bf16 or f16, bias [N] of
// that dtype. Where cuBLASLt offers no algorithm, or a pointer is not
// 16-byte aligned, the bias epilogue, then the GELU kernel.
void fp8_matmul_gelu_into(const Tensor& a, const Tensor& b, const Tensor& scale_inv_a,
                          const Tensor& scale_inv_b, const Tensor& bias, const Tensor& pre,
                          const Tensor& out, bool fast_accumulation = false);
// The same into a caller's contiguous out [M, N]; accumulate adds (f32 out
// only, no bias).
void fp8_matmul_into(const Tensor& a, const Tensor& b, const Tensor& scale_inv_a,
                     const Tensor& scale_inv_b, const Tensor& out, bool accumulate,
                     bool fast_accumulation = false, const Tensor& bias = Tensor());

// Note [FP8 block GEMM]
// ~~~~~~~~~~~~~~~~~~~~~
// fp8_block_matmul(a, b) = sum over k of a[m, k] s_a(m, k) b[n, k] s_b(n, k)
// with a [M, K] and b [N, K] FP8 as in Note [FP8 GEMM], each scaled per tile
// of 128 along K (Note [FP8 block scaling]): Fp8Tiles::row, tiles of 1 x 128
// (scale_inv [M, ceil(K / 128)], cast_to_fp8_blockwise's with tile 1 x 128),
// or Fp8Tiles::block, 128 x 128 blocks (scale_inv [ceil(M / 128), ceil(K /
// 128)], tile 128 x 128); not both operands block. On the GPU it is cuBLASLt's
// block-scaled FP8 GEMM (Hopper: the VEC128_32F and BLK128x128_32F scale
// modes, compute capability 9.0 only), which applies the scales to the f32
// partial sum of each 128-long slice of K on the tensor cores, so no
// dequantized copy of either operand exists; the scale tensors are rearranged
// into cuBLASLt's layouts there (a row-tiled operand's scales K-block-major,
// a block-tiled one's rows padded to a multiple of 4). The CPU reference
// sums the exact products of the scaled codes in double, in k order, and
// rounds once. The other rules are fp8_matmul's: M, N and K multiples of 16,
// contiguous 16-byte aligned data, not both operands e5m2, out f32 (which
// accumulate adds into: the weight gradient's slot) or bf16 / f16. A NaN
// scale_inv (an overflowed tile, Note [FP8 overflow]) makes the outputs it
// touches NaN.
enum class Fp8Tiles { row, block };

Tensor fp8_block_matmul(const Tensor& a, const Tensor& scale_inv_a, Fp8Tiles tiles_a,
                        const Tensor& b, const Tensor& scale_inv_b, Fp8Tiles tiles_b,
                        DType out_dtype);
void fp8_block_matmul_into(const Tensor& a, const Tensor& scale_inv_a, Fp8Tiles tiles_a,
                           const Tensor& b, const Tensor& scale_inv_b, Fp8Tiles tiles_b,
                           const Tensor& out, bool accumulate);

}  // namespace accrue::kernels
