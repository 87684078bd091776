// The differentiable FP8 linear layer (Note [FP8 linear] in autograd/fp8_ops.h).
#include "accrue/autograd/fp8_ops.h"

#include "accrue/autograd/node.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/sink_target.h"
#include "accrue/autograd/variable.h"
#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/fp8.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"

namespace accrue {

// Note [FP8 overflow]
// ~~~~~~~~~~~~~~~~~~~
// A saturating cast turns an infinity into the format's max, so an
// overflowed tensor (an infinity or NaN in x, dy or a weight) would pass
// through the FP8 GEMMs as finite values and the window would step on them.
// Its amax says so (Note [FP8 scaling]): scale_inv + amax * 0 is scale_inv
// when amax is finite and NaN when it is not, so every output of a GEMM
// that reads the tensor becomes NaN, the gradients follow, and the window
// skips as on a loss-scale overflow (Note [Skipped window]; a dynamic scaler
// lowers its scale). All on the device, no host sync. The per-tensor
// recipe gets it from the scale rule itself (nan_on_overflow of the cast
// that makes its scale, cast_to_fp8_transpose_scaled: the same f32
// operations, no kernels of their own); the block recipe's per-tile scales
// take fp8_guarded_scale_inv.
Tensor fp8_guarded_scale_inv(const Tensor& scale_inv, const Tensor& amax) {
  return kernels::binary(kernels::BinaryOp::Add, scale_inv,
                         kernels::binary_scalar(kernels::BinaryOp::Mul, amax, 0.0));
}

Tensor fp8_amax(const Tensor& x) {
  return kernels::fp8_amax(x);
}

namespace {

using autograd::SinkTarget;

// x cast with current scaling from its amax, with its transpose's codes, in
// one launch that makes the scale (Note [FP8 overflow]: scale_inv is
// guarded). With dbias (an f32 [K] bias slot), x's column sums go there (or
// onto it, accumulate) from the cast's read (Note [FP8 bias gradient in the
// cast]).
using ScaledCast = kernels::Fp8ScaledCastTranspose;
ScaledCast cast_from_amax(const Tensor& x2, const Tensor& amax, DType dtype, int margin,
                          const Tensor& dbias, bool accumulate) {
  if (dbias.defined())
    return kernels::cast_to_fp8_transpose_scaled_with_column_sums(
        x2, amax, dtype, margin, /*power_of_two=*/false, /*nan_on_overflow=*/true, dbias,
        accumulate);
  return kernels::cast_to_fp8_transpose_scaled(x2, amax, dtype, margin,
                                               /*power_of_two=*/false, /*nan_on_overflow=*/true);
}

// Current scaling: x's amax (one read of x), then the cast from it.
ScaledCast cast_current(const Tensor& x2, DType dtype, int margin, const Tensor& dbias = Tensor(),
                        bool accumulate = false) {
  return cast_from_amax(x2, fp8_amax(x2), dtype, margin, dbias, accumulate);
}

// Note [FP8 delayed scaling] (kernels/fp8.h): x cast with its row's scale, its
// amax merged into the row's running amax in the same read; scale_inv guarded
// by that running amax (Note [FP8 overflow]: an overflow in this window, here
// or earlier, makes the GEMMs NaN and the window skip). Before the first close
// has made a scale (calibrated false): current scaling, its amax merged.
// dbias and accumulate as cast_current's.
ScaledCast cast_delayed(const Tensor& x2, const Fp8ScaleRow& row, bool calibrated, DType dtype,
                        int margin, const Tensor& dbias = Tensor(), bool accumulate = false) {
  if (!calibrated) {
    const Tensor amax = fp8_amax(x2);
    ScaledCast c = cast_from_amax(x2, amax, dtype, margin, dbias, accumulate);
    kernels::fp8_amax_merge_(row.amax, amax);
    return c;
  }
  const int64_t m = x2.size(0), k = x2.size(1);
  ScaledCast c{empty({m, k}, dtype, x2.device()), empty({k, m}, dtype, x2.device()), Tensor()};
  if (dbias.defined()) {
    kernels::cast_to_fp8_transpose_with_column_sums_into(x2, row.scale, c.q, c.q_t, row.amax,
                                                         /*merge_amax=*/true, dbias, accumulate);
  } else {
    kernels::cast_to_fp8_transpose_into(x2, row.scale, c.q, c.q_t, row.amax, /*merge_amax=*/true);
  }
  c.scale_inv = fp8_guarded_scale_inv(row.scale_inv, row.amax);
  return c;
}

// x's cast for the layer of `weight`: delayed when its owner keeps rows for it.
ScaledCast cast_input(const Tensor& x2, const Tensor& weight, DType dtype, int margin) {
  const Fp8DelayedRows* rows = kept_fp8_scaling(weight);
  return rows ? cast_delayed(x2, rows->x, *rows->calibrated, dtype, margin)
              : cast_current(x2, dtype, margin);
}

// The weight gradient of an FP8 linear layer: into(out, accumulate) writes
// (or adds) the f32 product dy^T x into out. Note [Fused weight-gradient
// accumulation]: an f32 slot takes it straight from the GEMM; otherwise it
// is computed into an f32 [out, in] and widened into an f64 slot, or
// returned in the weight's dtype when there is no slot.
template <class Into>
Tensor fp8_weight_grad(const SinkTarget& target, DType w_dtype, int64_t out_features,
                       int64_t in_features, Device device, Into&& into) {
  double beta = 0.0;
  const Tensor slot = target.claim(&beta);
  if (slot.defined() && slot.dtype() == DType::f32) {
    into(slot, /*accumulate=*/beta != 0.0);
    return autograd::delivered();
  }
  const Tensor sum = empty({out_features, in_features}, DType::f32, device);
  into(sum, false);
  if (!slot.defined()) return sum.to(w_dtype);
  if (beta != 0.0) {  // an f64 arena: the f32 product widened into the slot
    kernels::axpy_(slot, 1.0, sum);
  } else {
    slot.copy_(sum);
  }
  return autograd::delivered();
}

bool is_gemm_output(DType t) {
  return t == DType::bf16 || t == DType::f16 || t == DType::f32;
}

// w8: the weight's FP8 copy, or nullptr under the block recipe (cast per call).
const char* recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::block ? "block" : "tensor";
}

// Note [FP8 delayed scaling]: the rows were made for one recipe, dtypes and margin.
void check_delayed_rows(const Fp8DelayedRows& rows, const Fp8LinearOptions& o, const char* op) {
  ACCRUE_CHECK(o.recipe == Fp8Recipe::tensor && rows.x_dtype == o.forward_dtype &&
                   rows.dy_dtype == o.grad_dtype && rows.margin == o.margin,
               op, ": the weight's delayed scaling is per tensor for ", dtype_name(rows.x_dtype),
               " inputs, ", dtype_name(rows.dy_dtype), " gradients and margin ", rows.margin,
               "; the layer asks for the ", recipe_name(o.recipe), " recipe, ",
               dtype_name(o.forward_dtype), ", ", dtype_name(o.grad_dtype), " and margin ",
               o.margin);
}

void check_fp8_linear(const Tensor& x, const Tensor& weight, const Fp8Weight* w8,
                      const Tensor& bias, const Fp8LinearOptions& o) {
  ACCRUE_CHECK(weight.defined() && weight.dim() == 2, "fp8_linear: weight must be 2-D [out, in]",
               weight.defined() ? ", got " + shape_str(weight.shape()) : std::string());
  ACCRUE_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1),
               "fp8_linear: input of shape ", x.defined() ? shape_str(x.shape()) : "undefined",
               " does not match weight of shape ", shape_str(weight.shape()));
  ACCRUE_CHECK(is_gemm_output(x.dtype()), "fp8_linear: input dtype ", dtype_name(x.dtype()),
               "; expected f32, bf16 or f16");
  const int64_t n = weight.size(0), k = weight.size(1);
  ACCRUE_CHECK(!w8 || (w8->q.defined() && w8->q.shape() == weight.shape() && w8->q_t.defined() &&
                       w8->q_t.shape() == (Shape{k, n}) && w8->scale_inv.defined() &&
                       w8->scale_inv.numel() == 1),
               "fp8_linear: the FP8 weight (codes ",
               w8 && w8->q.defined() ? shape_str(w8->q.shape()) : "?", ", transposed ",
               w8 && w8->q_t.defined() ? shape_str(w8->q_t.shape()) : "?",
               ") is not a copy of the weight ", shape_str(weight.shape()),
               ": make it with fp8_weight(weight)");
  ACCRUE_CHECK(is_fp8(o.forward_dtype) && is_fp8(o.grad_dtype), "fp8_linear: forward_dtype ",
               dtype_name(o.forward_dtype), " and grad_dtype ", dtype_name(o.grad_dtype),
               " must be FP8 dtypes (f8e4m3 or f8e5m2)");
  ACCRUE_CHECK(is_gemm_output(o.out_dtype), "fp8_linear: out_dtype ", dtype_name(o.out_dtype),
               "; expected bf16, f16 or f32");
  ACCRUE_CHECK(!bias.defined() || bias.shape() == Shape{n}, "fp8_linear: bias of shape ",
               bias.defined() ? shape_str(bias.shape()) : "", " for weight of shape ",
               shape_str(weight.shape()));
  if (const Fp8DelayedRows* rows = kept_fp8_scaling(weight))
    check_delayed_rows(*rows, o, "fp8_linear");
  const int64_t m = x.numel() / k;
  ACCRUE_CHECK(m % 16 == 0 && n % 16 == 0 && k % 16 == 0, "fp8_linear: rows ", m, ", in ", k,
               " and out ", n,
               " must all be multiples of 16 (the FP8 GEMMs' rule, Note [FP8 GEMM]; pad the "
               "batch or the layer)");
}

// Note [FP8 block recipe]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Fp8Recipe::block scales each 1 x 128 tile and each 128 x 128 weight block
// by its own power-of-two scale (cast_to_fp8_blockwise, Note [FP8 block
// scaling]), as DeepSeek-V3 does, so an outlier costs precision in its own
// tile only, and multiplies the codes on the block-scaled FP8 GEMM (Note
// [FP8 block GEMM]), which takes tiles along K, the summed dimension. So
// each GEMM casts its operands along its own K:
//   y = x W^T     x in 1 x 128 tiles along the features, W in blocks;
//   dx = dy W     dy in 1 x 128 tiles along the out features, W^T in blocks
//                 (the blocks of W transposed: the same codes and scales);
//   dW += dy^T x  dy^T and x^T in 1 x 128 tiles along the tokens, the f32
//                 product added into the gradient slot by the GEMM (Note
//                 [Fused weight-gradient accumulation]).
// The forward keeps x^T's codes and scales (a byte an element) for the
// weight gradient; dy is cast twice (along each of its dimensions). W and
// W^T come from the store's block copy when it keeps one (Note [Window FP8
// weights]: cast once per window, at the close; W^T cast from W^T, the same
// codes and scales as W's blocks transposed), else they are cast at every
// call. A tile that overflowed makes its scale_inv NaN (fp8_guarded_scale_inv
// over the tensor's amax, here also over a kept copy's), so the GEMM's
// outputs are NaN (Note [FP8 overflow]).
using kernels::Fp8Tiles;
constexpr int64_t kBlock = 128;

struct BlockCast {
  Tensor q;
  Tensor scale_inv;  // guarded: NaN everywhere when the tensor overflowed
};

// Codes with their tiles' scales, guarded by the tensor's amax.
BlockCast guarded_blocks(const Tensor& q, const Tensor& scale_inv, const Tensor& amax) {
  return {q, fp8_guarded_scale_inv(scale_inv, amax)};
}

// x2 [rows, K] cast in tiles of tile_rows x 128 along K.
BlockCast cast_blocks(const Tensor& x2, int64_t tile_rows, DType dtype) {
  const kernels::Fp8BlockCast c = kernels::cast_to_fp8_blockwise(x2, tile_rows, kBlock, dtype);
  return guarded_blocks(c.q, c.scale_inv, c.amax);
}

Tensor block_matmul(const BlockCast& a, Fp8Tiles ta, const BlockCast& b, Fp8Tiles tb, DType out) {
  return kernels::fp8_block_matmul(a.q, a.scale_inv, ta, b.q, b.scale_inv, tb, out);
}

// x8: x's shared cast (Note [FP8 shared input]), or nullptr to cast x here.
Tensor fp8_linear_blocks(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Fp8LinearOptions& o, const Fp8Input* x8 = nullptr) {
  check_fp8_linear(x, weight, nullptr, bias, o);
  const int64_t n = weight.size(0), k = weight.size(1);
  const DType dt = o.out_dtype;
  const Tensor x2 = detach(x).reshape({-1, k});
  const BlockCast cx = x8 ? BlockCast{x8->q, x8->scale_inv} : cast_blocks(x2, 1, o.forward_dtype);
  // Note [Window FP8 weights]: the window's block copy when the store keeps
  // one (cast at the close, the same codes and scales as a cast here).
  const Fp8Weight* kept = kept_fp8_weight(weight);
  if (kept != nullptr && !kept->blocks()) kept = nullptr;
  ACCRUE_CHECK(kept == nullptr || kept->q.dtype() == o.forward_dtype,
               "fp8_linear: the kept block copy is ",
               dtype_name(kept ? kept->q.dtype() : DType::f32), "; the recipe's forward dtype is ",
               dtype_name(o.forward_dtype));
  const BlockCast cw = kept ? guarded_blocks(kept->q, kept->scale_inv, kept->amax)
                            : cast_blocks(detach(weight), kBlock, o.forward_dtype);
  Tensor y2 = block_matmul(cx, Fp8Tiles::row, cw, Fp8Tiles::block, dt);
  if (bias.defined()) {
    const Tensor b = detach(bias);
    y2 = kernels::binary(kernels::BinaryOp::Add, y2, b.dtype() == dt ? b : b.to(dt));
  }
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const bool gx = autograd::wants_grad(x), gw = autograd::wants_grad(weight),
             gb = autograd::wants_grad(bias);
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = weight.dtype(),
              b_dtype = bias.defined() ? bias.dtype() : dt;
  const Tensor sw = autograd::saved(weight);
  const SinkTarget w_target = autograd::sink_target(weight), b_target = autograd::sink_target(bias);
  const DType grad_dtype = o.grad_dtype, forward_dtype = o.forward_dtype;
  // W^T's blocks for dx: the kept copy's, or cast in the backward.
  const BlockCast kept_t =
      kept && gx ? guarded_blocks(kept->q_t, kept->scale_inv_t, kept->amax) : BlockCast{};
  // x^T along the tokens, for the weight gradient only.
  const BlockCast cxt = !gw ? BlockCast{}
                        : x8 && x8->q_t.defined()
                            ? BlockCast{x8->q_t, x8->scale_inv_t}
                            : cast_blocks(x2.transpose(0, 1), 1, forward_dtype);
  return autograd::record(
      "Fp8LinearBackward", y2.reshape(out_shape), {x, weight, bias},
      [=](const Tensor& g) -> std::vector<Tensor> {
        const Tensor g2 = g.reshape({-1, n});
        Tensor dx, dw, db;
        if (gw) {
          // Note [Weight gradients on a branch]: dy^T's cast and dW beside dx, into a slot.
          double w_beta = 0.0;
          autograd::write_slots_beside(w_target.peek(&w_beta), {g2, cxt.q, cxt.scale_inv}, [&] {
            const BlockCast cgt = cast_blocks(g2.transpose(0, 1), 1, grad_dtype);
            dw = fp8_weight_grad(
                w_target, w_dtype, n, k, g2.device(), [&](const Tensor& out, bool accumulate) {
                  kernels::fp8_block_matmul_into(cgt.q, cgt.scale_inv, Fp8Tiles::row, cxt.q,
                                                 cxt.scale_inv, Fp8Tiles::row, out, accumulate);
                });
          });
        }
        if (gx) {
          const BlockCast cwt =
              kept_t.q.defined() ? kept_t
                                 : cast_blocks(detach(sw).transpose(0, 1), kBlock, forward_dtype);
          dx = block_matmul(cast_blocks(g2, 1, grad_dtype), Fp8Tiles::row, cwt, Fp8Tiles::block,
                            x_dtype)
                   .reshape(x_shape);
        }
        if (gb) {
          db = autograd::linear_bias_grad(g2, b_target);
          if (!autograd::is_delivered(db) && db.dtype() != b_dtype) db = db.to(b_dtype);
        }
        return {dx, dw, db};
      });
}

}  // namespace

Fp8Weight fp8_weight(const Tensor& weight, DType dtype, int margin) {
  ACCRUE_CHECK(weight.defined() && weight.dim() == 2, "fp8_weight: weight must be 2-D [out, in]",
               weight.defined() ? ", got " + shape_str(weight.shape()) : std::string());
  const ScaledCast c = cast_current(detach(weight), dtype, margin);
  return {c.q, c.q_t, c.scale_inv, Tensor(), Tensor()};
}

namespace {

// fp8_linear of the per-tensor recipe with x's codes given (x_q, their
// transpose x_codes_t and x_scale_inv), cast by the caller or shared (Note
// [FP8 shared input]). The caller checks the arguments.
// With then_gelu, gelu of it: the bias and GELU in the GEMM's epilogue, the
// linear's node recorded on the pre-activation and GELU's on the result.
Tensor fp8_linear_cast(const Tensor& x, const Tensor& x_q, const Tensor& x_codes_t,
                       const Tensor& x_scale_inv, const Tensor& weight, const Fp8Weight& w8,
                       const Tensor& bias, const Fp8LinearOptions& o, bool then_gelu = false) {
  const int64_t n = weight.size(0), k = weight.size(1);
  // Note [FP8 GEMM]: the bias in the GEMM's epilogue, in the output's dtype.
  Tensor b = bias.defined() ? detach(bias) : Tensor();
  if (b.defined() && b.dtype() != o.out_dtype) b = b.to(o.out_dtype);
  Tensor y2, act2;
  if (then_gelu) {
    y2 = empty({x_q.size(0), n}, o.out_dtype, x.device());
    act2 = empty({x_q.size(0), n}, o.out_dtype, x.device());
    kernels::fp8_matmul_gelu_into(x_q, w8.q, x_scale_inv, w8.scale_inv, b, y2, act2,
                                  o.fast_forward_accumulation);
  } else {
    y2 = kernels::fp8_matmul(x_q, w8.q, x_scale_inv, w8.scale_inv, o.out_dtype,
                             o.fast_forward_accumulation, b);
  }
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const Tensor out = y2.reshape(out_shape);

  const bool gx = autograd::wants_grad(x), gw = autograd::wants_grad(weight),
             gb = autograd::wants_grad(bias);
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = weight.dtype(),
              b_dtype = bias.defined() ? bias.dtype() : o.out_dtype;
  const SinkTarget w_target = autograd::sink_target(weight), b_target = autograd::sink_target(bias);
  const DType grad_dtype = o.grad_dtype;
  const int margin = o.margin;
  // Note [FP8 delayed scaling]: dy's row, and whether the forward found it calibrated.
  const Fp8DelayedRows* rows = kept_fp8_scaling(weight);
  const Fp8ScaleRow dy_row = rows ? rows->dy : Fp8ScaleRow{};
  const bool calibrated = rows && *rows->calibrated;
  const Tensor pre = autograd::record(
      "Fp8LinearBackward", out, {x, weight, bias}, [=](const Tensor& g) -> std::vector<Tensor> {
        const Tensor g2 = g.reshape({-1, n});
        // Note [FP8 bias gradient in the cast]: an f32 bias slot takes its sums from the read
        // of dy that the cast makes; otherwise a row sum of its own, below.
        double b_beta = 0.0;
        const Tensor b_slot = gb ? b_target.claim(&b_beta) : Tensor();
        const bool sums_in_cast = b_slot.defined() && b_slot.dtype() == DType::f32;
        const Tensor dbias = sums_in_cast ? b_slot : Tensor();
        const ScaledCast cg =
            dy_row.scale.defined()
                ? cast_delayed(g2, dy_row, calibrated, grad_dtype, margin, dbias, b_beta != 0.0)
                : cast_current(g2, grad_dtype, margin, dbias, b_beta != 0.0);
        Tensor dx, dw, db;
        if (gw) {
          // Note [Weight gradients on a branch]: dW beside dx, into a slot.
          double w_beta = 0.0;
          autograd::write_slots_beside(
              w_target.peek(&w_beta), {cg.q_t, cg.scale_inv, x_codes_t, x_scale_inv}, [&] {
                dw = fp8_weight_grad(w_target, w_dtype, n, k, g2.device(),
                                     [&](const Tensor& out, bool accumulate) {
                                       kernels::fp8_matmul_into(cg.q_t, x_codes_t, cg.scale_inv,
                                                                x_scale_inv, out, accumulate);
                                     });
              });
        }
        if (gx) {
          dx = kernels::fp8_matmul(cg.q, w8.q_t, cg.scale_inv, w8.scale_inv, x_dtype)
                   .reshape(x_shape);
        }
        if (b_slot.defined()) {
          if (!sums_in_cast) kernels::sum_rows_into(g2, b_slot, b_beta != 0.0);
          db = autograd::delivered();
        } else if (gb) {
          db = autograd::linear_bias_grad(g2, b_target);  // no slot: a fresh tensor
          if (db.dtype() != b_dtype) db = db.to(b_dtype);
        }
        return {dx, dw, db};
      });
  if (!then_gelu) return pre;
  // GELU's node, as autograd's gelu: its derivative reads the pre-activation.
  const Tensor spre = autograd::saved(pre);
  return autograd::record("GeluBackward", act2.reshape(out_shape), {pre},
                          [=](const Tensor& g) -> std::vector<Tensor> {
                            return {kernels::unary_backward(kernels::UnaryOp::Gelu, g, spre, spre)};
                          });
}

void check_tensor_recipe(const Fp8LinearOptions& o) {
  ACCRUE_CHECK(o.recipe == Fp8Recipe::tensor,
               "fp8_linear: a given FP8 weight copy or input cast is per-tensor; the block recipe "
               "casts the weight and x itself (call fp8_linear without them)");
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Fp8Weight& w8, const Tensor& bias,
                  const Fp8LinearOptions& o) {
  check_tensor_recipe(o);
  check_fp8_linear(x, weight, &w8, bias, o);
  const ScaledCast cx =
      cast_input(detach(x).reshape({-1, weight.size(1)}), weight, o.forward_dtype, o.margin);
  return fp8_linear_cast(x, cx.q, cx.q_t, cx.scale_inv, weight, w8, bias, o);
}

Fp8Input fp8_input(const Tensor& x, const Fp8LinearOptions& o, const Tensor& scaling_weight) {
  ACCRUE_CHECK(x.defined() && x.dim() >= 1 && is_gemm_output(x.dtype()),
               "fp8_input: x must be f32, bf16 or f16 with at least one dimension, got ",
               x.defined() ? dtype_name(x.dtype()) + std::string(" ") + shape_str(x.shape())
                           : std::string("undefined"));
  ACCRUE_CHECK(is_fp8(o.forward_dtype), "fp8_input: forward_dtype ", dtype_name(o.forward_dtype),
               " must be an FP8 dtype (f8e4m3 or f8e5m2)");
  const Tensor x2 = detach(x).reshape({-1, x.size(-1)});
  if (o.recipe == Fp8Recipe::block) {  // Note [FP8 block recipe]: a cast along each K
    const BlockCast c = cast_blocks(x2, 1, o.forward_dtype);
    const BlockCast ct =
        GradMode::is_enabled() ? cast_blocks(x2.transpose(0, 1), 1, o.forward_dtype) : BlockCast{};
    return {x, c.q, ct.q, c.scale_inv, ct.scale_inv, o.forward_dtype, o.margin, o.recipe};
  }
  const Fp8DelayedRows* rows = kept_fp8_scaling(scaling_weight);
  if (rows) check_delayed_rows(*rows, o, "fp8_input");
  const ScaledCast c = rows
                           ? cast_delayed(x2, rows->x, *rows->calibrated, o.forward_dtype, o.margin)
                           : cast_current(x2, o.forward_dtype, o.margin);
  return {x, c.q, c.q_t, c.scale_inv, Tensor(), o.forward_dtype, o.margin, o.recipe};
}

const Fp8Weight* kept_fp8_weight(const Tensor& weight) {
  const AutogradMeta* m = weight.defined() ? autograd::find_meta(weight) : nullptr;
  return m && m->owner ? m->owner->fp8_copy(weight) : nullptr;
}

const Fp8DelayedRows* kept_fp8_scaling(const Tensor& weight) {
  const AutogradMeta* m = weight.defined() ? autograd::find_meta(weight) : nullptr;
  return m && m->owner ? m->owner->fp8_scaling(weight) : nullptr;
}

namespace {

// The weight's kept FP8 copy (Note [Window FP8 weights]), or one cast now.
Fp8Weight kept_or_cast(const Tensor& weight) {
  const Fp8Weight* kept = kept_fp8_weight(weight);
  if (kept != nullptr && !kept->blocks()) return *kept;
  ACCRUE_CHECK(weight.defined() && weight.dim() == 2, "fp8_linear: weight must be 2-D [out, in]",
               weight.defined() ? ", got " + shape_str(weight.shape()) : std::string());
  return fp8_weight(weight);
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Fp8Input& x8, const Tensor& weight, const Tensor& bias,
                  const Fp8LinearOptions& o) {
  ACCRUE_CHECK(x8.x.defined() && x.defined() && x8.x.is_same(x) && x8.dtype == o.forward_dtype &&
                   x8.margin == o.margin && x8.recipe == o.recipe,
               "fp8_linear: the input cast (", x8.x.defined() ? shape_str(x8.x.shape()) : "none",
               ", ", dtype_name(x8.dtype), ", margin ", x8.margin, ", ", recipe_name(x8.recipe),
               " recipe) was not made by fp8_input from this x with these options (",
               dtype_name(o.forward_dtype), ", margin ", o.margin, ", ", recipe_name(o.recipe),
               " recipe)");
  if (o.recipe == Fp8Recipe::block) return fp8_linear_blocks(x, weight, bias, o, &x8);
  const Fp8Weight w8 = kept_or_cast(weight);
  check_fp8_linear(x, weight, &w8, bias, o);
  return fp8_linear_cast(x, x8.q, x8.q_t, x8.scale_inv, weight, w8, bias, o);
}

Tensor fp8_linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Fp8LinearOptions& o) {
  check_tensor_recipe(o);
  ACCRUE_CHECK(bias.defined() && (o.out_dtype == DType::bf16 || o.out_dtype == DType::f16),
               "fp8_linear_gelu: a bias and a bf16 or f16 out_dtype (the GELU epilogue's), got ",
               bias.defined() ? "a bias" : "no bias", " and ", dtype_name(o.out_dtype));
  const Fp8Weight w8 = kept_or_cast(weight);
  check_fp8_linear(x, weight, &w8, bias, o);
  const ScaledCast cx =
      cast_input(detach(x).reshape({-1, weight.size(1)}), weight, o.forward_dtype, o.margin);
  return fp8_linear_cast(x, cx.q, cx.q_t, cx.scale_inv, weight, w8, bias, o, /*then_gelu=*/true);
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Fp8LinearOptions& options) {
  if (options.recipe == Fp8Recipe::block) return fp8_linear_blocks(x, weight, bias, options);
  return fp8_linear(x, weight, kept_or_cast(weight), bias, options);
}

}  // namespace accrue
