// The differentiable FP8 linear layer (Note [FP8 linear]) over the FP8 family
// of kernels/fp8.h: casts with per-tensor current scaling, the three GEMMs of
// a linear layer in FP8, the weight gradient added straight into its fp32
// gradient slot (Note [Fused weight-gradient accumulation]).
#pragma once

#include "accrue/core/tensor.h"

namespace accrue {

// Note [FP8 linear]
// ~~~~~~~~~~~~~~~~~
// fp8_linear(x, weight, w8) computes y = x W^T (+ bias) with x and W in FP8:
//  - forward: x [M, K] (M: every dim of x but the last) gets current scaling
//    (scale = max / amax(x), Note [FP8 scaling]) and one cast that also
//    writes x^T's codes, kept for the weight gradient; y = fp8_matmul(x_q,
//    W_q) in out_dtype;
//  - backward: dy [M, N] gets its own current scaling in grad_dtype (e5m2 by
//    default: gradients need range more than precision) and one cast with
//    its transpose; dx = fp8_matmul(dy_q, W^T_q) in out_dtype; dW =
//    fp8_matmul(dy^T_q, x^T_q) lands in W's fp32 gradient slot in the GEMM
//    (beta 0 on the window's first micro-batch, 1 after: each micro-batch's
//    contribution is rounded once, to f32, and summed there in micro-batch
//    order); the bias gradient is Linear's row sum of dy.
// The FP8 copy of the weight (w8: codes, their transpose, scale_inv) is
// either the caller's, made by fp8_weight() from W's current values, or the
// one W's store keeps, cast once per window at the close (Note [Window FP8
// weights] in optim/fp8_weights.h): within a window the weights do not
// change, so one copy serves every micro-batch. fp8_linear checks that w8
// has W's shape, not that it is fresh.
// Every GEMM dimension (M, N, K) must be a multiple of 16 (cuBLASLt's FP8
// rule, checked on every device so a CPU run says what a GPU run would). The
// amax of x and dy is its own read of them for now (fp8_amax): producing
// kernels that hand it over (norms, activation epilogues) are not built yet.
// Rounding: each product x_k w_k carries the two casts' relative errors
// (2^-4 for e4m3, 2^-3 for e5m2, plus the subnormal floor of the scaled
// values); the GEMM accumulates the products in f32 on the GPU (in double
// on the CPU) and rounds the result once (Note [FP8 GEMM]).
// The scaling recipe (Note [FP8 block recipe] in autograd/ops_fp8.cpp).
enum class Fp8Recipe {
  tensor,  // one current scale per tensor; the FP8 GEMMs (the default)
  block,   // a scale per 1 x 128 tile of x and dy, per 128 x 128 block of W
};

struct Fp8LinearOptions {
  Fp8Recipe recipe = Fp8Recipe::tensor;
  DType forward_dtype = DType::f8e4m3;  // x's codes (the weight's are w8's)
  DType grad_dtype = DType::f8e5m2;     // dy's codes (not e5m2 with an e5m2 weight)
  int margin = 0;                       // scale = max / amax / 2^margin
  DType out_dtype = DType::bf16;        // y and dx: bf16, f16 or f32
  // The forward GEMM without cuBLASLt's promotions of the partial sums to f32
  // (Note [FP8 GEMM]'s fast_accumulation), as Transformer Engine runs its
  // forward; the data and weight gradients always promote. Per-tensor recipe.
  bool fast_forward_accumulation = false;
};

// The FP8 copy of a weight [N, K] (f32, bf16 or f16): its codes and their
// transpose [K, N]. Per tensor (fp8_weight, the tensor recipe): scale_inv
// f32 [1], from one amax pass and one cast, with current scaling. In 128 x
// 128 blocks (the block recipe's kept copies, Note [Window FP8 weights]):
// scale_inv [ceil(N / 128), ceil(K / 128)] per block of q, scale_inv_t the
// same for q_t's blocks, and amax the weight's; the scales are not guarded,
// the reader guards them with amax (Note [FP8 block recipe]). No gradient
// flows through it.
struct Fp8Weight {
  Tensor q;
  Tensor q_t;
  Tensor scale_inv;
  Tensor scale_inv_t;  // block copies only
  Tensor amax;         // block copies only
  bool blocks() const { return scale_inv_t.defined(); }
};
Fp8Weight fp8_weight(const Tensor& weight, DType dtype = DType::f8e4m3, int margin = 0);

// Note [FP8 delayed scaling] (kernels/fp8.h) for one layer: its x's and its
// dy's scale, scale_inv and running amax of the window (f32 [1] views of the
// window state's rows, optim/fp8_scaling.h), the dtypes and margin the rows
// were made for, and whether a close has made the scales yet. Before it has
// (the first window), the layer casts with current scaling and merges each
// amax into the rows, which the first close turns into the first scales.
struct Fp8ScaleRow {
  Tensor scale, scale_inv, amax;
};
struct Fp8DelayedRows {
  Fp8ScaleRow x, dy;
  DType x_dtype = DType::f8e4m3, dy_dtype = DType::f8e5m2;
  int margin = 0;
  const bool* calibrated = nullptr;  // the owner's flag
};
// The rows the weight's owner keeps for its layer, or nullptr.
const Fp8DelayedRows* kept_fp8_scaling(const Tensor& weight);

// Note [FP8 shared input]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Layers that read one input (a Llama block's q, k and v projections; gate
// and up) need the same codes of it: current scaling gives the same amax,
// scale and codes whichever layer casts it. fp8_input casts x once (its
// amax, the cast and the transposed codes, as fp8_linear would) and each
// fp8_linear given it skips its own cast: the same bits as casting per
// layer, two passes over x fewer per extra reader (three of the seven input
// casts of a Llama block's forward). The cast holds x and fp8_linear checks that
// it is given the same tensor, cast with its options' forward_dtype and
// margin; like an Fp8Weight it is made from x's values now, so x must not
// change in place between the cast and the layers that take it. No gradient
// flows through it: each layer's gradient to x flows through its own x.
// Under the block recipe the shared cast is x in 1 x 128 tiles along the
// features (the forward's) and, while grad mode is on, x^T in 1 x 128 tiles
// along the tokens (the weight gradients'). The cast is the same tiles,
// codes and scales whichever layer makes it, so the bits are those of
// casting per layer. Every reader's backward keeps the same x^T codes, so a
// Llama block holds them once for q, k and v and once for gate and up.
// Casting per layer held them three times and twice: 3 of its 7 saved FP8
// inputs, about 28 KB a token at llama-125m (bench/RESULTS.md).
struct Fp8Input {
  Tensor x;  // the tensor cast
  // Its codes [M, K] and their transpose [K, M], M = rows of x. Block recipe:
  // q in tiles along K, q_t (x^T's own cast) in tiles along M; q_t undefined
  // when the cast was made without grad mode.
  Tensor q, q_t;
  // Tensor recipe: f32 [1], NaN when x overflowed (Note [FP8 overflow]).
  // Block recipe: q's tile scales [M, ceil(K / 128)] and q_t's [K, ceil(M / 128)],
  // guarded (NaN everywhere when x overflowed).
  Tensor scale_inv, scale_inv_t;
  DType dtype = DType::f8e4m3;
  int margin = 0;
  Fp8Recipe recipe = Fp8Recipe::tensor;
};
// With scaling_weight, a weight whose owner keeps delayed-scaling rows for
// its layer (Note [FP8 delayed scaling]), the per-tensor cast takes that
// layer's x row: the shared cast is scaled, and its amax merged, as that
// layer's own cast would be (the readers' other x rows stay unused).
Fp8Input fp8_input(const Tensor& x, const Fp8LinearOptions& options = {},
                   const Tensor& scaling_weight = Tensor());

// y [..., N] = x [..., K] W^T + bias, W [N, K], bias [N] or undefined
// (Note [FP8 linear]). Gradients to x, weight and bias as `linear`'s.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Fp8Weight& w8,
                  const Tensor& bias = Tensor(), const Fp8LinearOptions& options = {});
// The same with x's codes from fp8_input(x) (Note [FP8 shared input]); the
// weight's copy as below. Either recipe: the cast's must be the options'.
Tensor fp8_linear(const Tensor& x, const Fp8Input& x8, const Tensor& weight,
                  const Tensor& bias = Tensor(), const Fp8LinearOptions& options = {});
// The same with the FP8 copy the weight's store keeps (Note [Window FP8
// weights] in optim/fp8_weights.h: cast once per window, at the close), or,
// when it keeps none, a copy cast now by fp8_weight(). The block recipe casts
// the weight in its blocks now (the kept copies are per-tensor).
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                  const Fp8LinearOptions& options = {});
// gelu(fp8_linear(x, weight, bias)) with the bias and GELU in the FP8 GEMM's
// epilogue (kernels::fp8_matmul_gelu_into): no pass over the pre-activation
// of their own, as linear_gelu for 16-bit layers. Recorded as the linear's
// node and GELU's (which saves the pre-activation); the CPU gives the bits of
// the two ops apart. Per-tensor recipe, a bias, a bf16 or f16 out_dtype.
Tensor fp8_linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Fp8LinearOptions& options = {});
// scale_inv where amax is finite, NaN where it is not: what the GEMMs of an
// overflowed tensor multiply by, so that the window skips (Note [FP8
// overflow] in autograd/ops_fp8.cpp). Both f32 [1] on one device.
Tensor fp8_guarded_scale_inv(const Tensor& scale_inv, const Tensor& amax);
// Current scaling's amax (Note [FP8 scaling]): max |x| as f32 [1] on x's
// device, NaN when x holds a NaN, from one read of x (its own pass for now,
// Note [FP8 linear]).
Tensor fp8_amax(const Tensor& x);
// The weight's kept FP8 copy, or nullptr.
const Fp8Weight* kept_fp8_weight(const Tensor& weight);

}  // namespace accrue
