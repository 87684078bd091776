// The dispatch point of the FP8 family (kernels/fp8.h): validate, allocate,
// call the backend of the inputs' device. Note [FP8 scaling].
#include "accrue/kernels/fp8.h"

#include <cstdint>
#include <utility>

#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels {

namespace du = dispatch_util;

namespace {

void check_cast(const Tensor& x, const Tensor* scale, DType out_dtype, const char* op) {
  du::check_defined(x, op, "x");
  ACCRUE_CHECK(x.dtype() == DType::f32 || du::is_16_bit(x.dtype()), op, ": x of shape ",
               shape_str(x.shape()), " has dtype ", dtype_name(x.dtype()),
               "; expected f32, bf16 or f16");
  du::check_fp8_dtype(out_dtype, op, "out_dtype");
  if (scale != nullptr) du::check_device_scalar(*scale, x.device(), op, "scale", "x");
}

// A cast-transpose's q [M, K] and q_t [K, M] for x [M, K].
void check_transpose_buffers(const Tensor& x, const Tensor& q, const Tensor& q_t, const char* op) {
  const int64_t m = x.size(0), k = x.size(1);
  du::check_defined(q_t, op, "q_t");
  ACCRUE_CHECK(q.shape() == (Shape{m, k}) && q_t.shape() == (Shape{k, m}) &&
                   q_t.dtype() == q.dtype() && q.is_contiguous() && q_t.is_contiguous() &&
                   q.device() == x.device() && q_t.device() == x.device(),
               op, ": q ", shape_str(q.shape()), " ", dtype_name(q.dtype()), " and q_t ",
               shape_str(q_t.shape()), " ", dtype_name(q_t.dtype()),
               " must be contiguous, of one FP8 dtype, on x's device, shaped ",
               shape_str(Shape{m, k}), " and ", shape_str(Shape{k, m}));
}

// A block cast's x (2-D f32/bf16/f16) and tiles, checked; the scales' shape.
Shape block_cast_tiles(const Tensor& x, int64_t tile_rows, int64_t tile_cols, DType out_dtype,
                       const char* op) {
  check_cast(x, nullptr, out_dtype, op);
  ACCRUE_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", shape_str(x.shape()));
  ACCRUE_CHECK(tile_rows >= 1 && tile_cols >= 1 && tile_cols <= kFp8MaxTileCols, op, ": tile ",
               tile_rows, " x ", tile_cols, " must have rows >= 1 and columns in [1, ",
               kFp8MaxTileCols, "]");
  return {(x.size(0) + tile_rows - 1) / tile_rows, (x.size(1) + tile_cols - 1) / tile_cols};
}

}  // namespace

Fp8Cast cast_to_fp8(const Tensor& x, const Tensor& scale, DType out_dtype) {
  check_cast(x, &scale, out_dtype, "cast_to_fp8");
  Fp8Cast r{empty(x.shape(), out_dtype, x.device()), empty({1}, DType::f32, x.device())};
  cast_to_fp8_into(x, scale, r.q, r.amax);
  return r;
}

void cast_to_fp8_into(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& amax) {
  constexpr const char* op = "cast_to_fp8";
  NoGradGuard no_grad;
  du::check_defined(q, op, "q");
  check_cast(x, &scale, q.dtype(), op);
  ACCRUE_CHECK(q.shape() == x.shape() && q.is_contiguous() && q.device() == x.device(), op, ": q ",
               shape_str(q.shape()), " must be contiguous, on x's device, shaped like x ",
               shape_str(x.shape()));
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  if (x.numel() == 0) {
    du::fill(amax, 0.0);  // the max of nothing, as the scale rule reads it: an all-zero tensor
    return;
  }
  const Tensor dense = x.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), cast_to_fp8, dense, scale, q, amax);
}

Tensor fp8_amax(const Tensor& x) {
  du::check_defined(x, "fp8_amax", "x");
  Tensor amax = empty({1}, DType::f32, x.device());
  fp8_amax_into(x, amax);
  return amax;
}

void fp8_amax_into(const Tensor& x, const Tensor& amax) {
  constexpr const char* op = "fp8_amax";
  NoGradGuard no_grad;
  check_cast(x, nullptr, DType::f8e4m3, op);
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  if (x.numel() == 0) {
    du::fill(amax, 0.0);  // as cast_to_fp8's
    return;
  }
  const Tensor dense = x.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), fp8_amax, dense, amax);
}

Fp8CastTranspose cast_to_fp8_transpose(const Tensor& x, const Tensor& scale, DType out_dtype) {
  constexpr const char* op = "cast_to_fp8_transpose";
  check_cast(x, &scale, out_dtype, op);
  ACCRUE_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", shape_str(x.shape()));
  const int64_t m = x.size(0), k = x.size(1);
  Fp8CastTranspose r{empty({m, k}, out_dtype, x.device()), empty({k, m}, out_dtype, x.device()),
                     empty({1}, DType::f32, x.device())};
  cast_to_fp8_transpose_into(x, scale, r.q, r.q_t, r.amax);
  return r;
}

void cast_to_fp8_transpose_into(const Tensor& x, const Tensor& scale, const Tensor& q,
                                const Tensor& q_t, const Tensor& amax, bool merge_amax) {
  constexpr const char* op = "cast_to_fp8_transpose";
  NoGradGuard no_grad;
  du::check_defined(q, op, "q");
  check_cast(x, &scale, q.dtype(), op);
  ACCRUE_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", shape_str(x.shape()));
  check_transpose_buffers(x, q, q_t, op);
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  if (x.numel() == 0) {
    if (!merge_amax) du::fill(amax, 0.0);
    return;
  }
  const Tensor dense = x.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), cast_to_fp8_transpose, dense, scale, q, q_t, amax, merge_amax);
}

namespace {

// x 2-D and dbias its f32 contiguous [K] on x's device (Note [FP8 bias
// gradient in the cast]).
void check_column_sums(const Tensor& x, const Tensor& dbias, const char* op) {
  du::check_defined(dbias, op, "dbias");
  ACCRUE_CHECK(x.defined() && x.dim() == 2, op, ": x must be 2-D [M, K], got ",
               x.defined() ? "shape " + shape_str(x.shape()) : std::string("an undefined tensor"));
  ACCRUE_CHECK(dbias.dtype() == DType::f32 && dbias.dim() == 1 && dbias.size(0) == x.size(1), op,
               ": dbias must be f32 [", x.size(1), "] for x of shape ", shape_str(x.shape()),
               ", got ", dtype_name(dbias.dtype()), " ", shape_str(dbias.shape()));
  du::check_contiguous(dbias, op, "dbias");
  du::check_same_device(x, dbias, op);
}

}  // namespace

void cast_to_fp8_transpose_with_column_sums_into(const Tensor& x, const Tensor& scale,
                                                 const Tensor& q, const Tensor& q_t,
                                                 const Tensor& amax, bool merge_amax,
                                                 const Tensor& dbias, bool accumulate) {
  constexpr const char* op = "cast_to_fp8_transpose_with_column_sums_into";
  check_column_sums(x, dbias, op);
  if (x.device().is_cpu() || x.numel() == 0) {
    cast_to_fp8_transpose_into(x, scale, q, q_t, amax, merge_amax);
    sum_rows_into(x, dbias, accumulate);
    return;
  }
  NoGradGuard no_grad;
  du::check_defined(q, op, "q");
  check_cast(x, &scale, q.dtype(), op);
  check_transpose_buffers(x, q, q_t, op);
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  const Tensor dense = x.contiguous();
  if (!cuda::cast_to_fp8_transpose_dbias(dense, scale, q, q_t, amax, merge_amax, dbias, accumulate))
    sum_rows_into(dense, dbias, accumulate);  // the shapes the cast's packed kernel cannot take
}

void fp8_amax_merge_(const Tensor& running, const Tensor& amax) {
  constexpr const char* op = "fp8_amax_merge_";
  NoGradGuard no_grad;
  du::check_defined(running, op, "running");
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(running, running.device(), op, "running", "running");
  du::check_device_scalar(amax, running.device(), op, "amax", "running");
  ACCRUE_BACKEND_CALL(running.device(), fp8_amax_merge, running, amax);
}

void fp8_delayed_scale_update(const Tensor& state, DType fp8_dtype, int margin) {
  constexpr const char* op = "fp8_delayed_scale_update";
  NoGradGuard no_grad;
  du::check_defined(state, op, "state");
  ACCRUE_CHECK(state.dtype() == DType::f32 && state.dim() == 2 && state.size(1) >= 4, op,
               ": state must be f32 [n, 3 + H] with H >= 1, got ", dtype_name(state.dtype()), " ",
               shape_str(state.shape()));
  du::check_contiguous(state, op, "state");
  ACCRUE_CHECK(is_fp8(fp8_dtype), op, ": dtype ", dtype_name(fp8_dtype), " is not an FP8 dtype");
  ACCRUE_CHECK(margin >= 0 && margin <= kFp8MaxMargin, op, ": margin = ", margin,
               " is outside [0, ", kFp8MaxMargin, "]");
  if (state.size(0) == 0) return;
  ACCRUE_BACKEND_CALL(state.device(), fp8_delayed_scale_update, state,
                      static_cast<float>(fp8_max(fp8_dtype)), margin);
}

Fp8BlockCast cast_to_fp8_blockwise(const Tensor& x, int64_t tile_rows, int64_t tile_cols,
                                   DType out_dtype, bool power_of_two) {
  const Shape tiles = block_cast_tiles(x, tile_rows, tile_cols, out_dtype, "cast_to_fp8_blockwise");
  Fp8BlockCast r{empty(x.shape(), out_dtype, x.device()), empty(tiles, DType::f32, x.device()),
                 empty({1}, DType::f32, x.device())};
  cast_to_fp8_blockwise_into(x, tile_rows, tile_cols, power_of_two, r.q, r.scale_inv, r.amax);
  return r;
}

void cast_to_fp8_blockwise_into(const Tensor& x, int64_t tile_rows, int64_t tile_cols,
                                bool power_of_two, const Tensor& q, const Tensor& scale_inv,
                                const Tensor& amax) {
  constexpr const char* op = "cast_to_fp8_blockwise";
  NoGradGuard no_grad;
  du::check_defined(q, op, "q");
  const Shape tiles = block_cast_tiles(x, tile_rows, tile_cols, q.dtype(), op);
  ACCRUE_CHECK(q.shape() == x.shape() && q.is_contiguous() && q.device() == x.device(), op, ": q ",
               shape_str(q.shape()), " must be contiguous, on x's device, shaped like x ",
               shape_str(x.shape()));
  du::check_defined(scale_inv, op, "scale_inv");
  ACCRUE_CHECK(scale_inv.dtype() == DType::f32 && scale_inv.shape() == tiles &&
                   scale_inv.is_contiguous() && scale_inv.device() == x.device(),
               op, ": scale_inv ", shape_str(scale_inv.shape()), " ", dtype_name(scale_inv.dtype()),
               " must be contiguous f32 on x's device, shaped ", shape_str(tiles), " (one per ",
               tile_rows, " x ", tile_cols, " tile)");
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  if (x.numel() == 0) {
    du::fill(amax, 0.0);
    return;
  }
  // Note [FP8 block cast of a transpose]: 1 x 128 tiles of a transposed view
  // straight from its base, without the transpose copy.
  // (Both sizes above 1: a contiguous x is not taken for one.)
  if (tile_rows == 1 && tile_cols == 128 && x.dim() == 2 && x.size(0) > 1 && x.size(1) > 1 &&
      x.transpose(0, 1).is_contiguous()) {
    ACCRUE_BACKEND_CALL(x.device(), cast_to_fp8_blockwise_of_transpose, x.transpose(0, 1),
                        static_cast<float>(fp8_max(q.dtype())), power_of_two, q, scale_inv, amax);
    return;
  }
  const Tensor dense = x.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), cast_to_fp8_blockwise, dense, tile_rows, tile_cols,
                      static_cast<float>(fp8_max(q.dtype())), power_of_two, q, scale_inv, amax);
}

Fp8ScaledCastTranspose cast_to_fp8_transpose_scaled(const Tensor& x, const Tensor& amax,
                                                    DType out_dtype, int margin, bool power_of_two,
                                                    bool nan_on_overflow) {
  constexpr const char* op = "cast_to_fp8_transpose_scaled";
  check_cast(x, nullptr, out_dtype, op);
  ACCRUE_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", shape_str(x.shape()));
  const int64_t m = x.size(0), k = x.size(1);
  Fp8ScaledCastTranspose r{empty({m, k}, out_dtype, x.device()),
                           empty({k, m}, out_dtype, x.device()),
                           empty({1}, DType::f32, x.device())};
  cast_to_fp8_transpose_scaled_into(x, amax, margin, power_of_two, nan_on_overflow, r.q, r.q_t,
                                    r.scale_inv);
  return r;
}

void cast_to_fp8_transpose_scaled_into(const Tensor& x, const Tensor& amax, int margin,
                                       bool power_of_two, bool nan_on_overflow, const Tensor& q,
                                       const Tensor& q_t, const Tensor& scale_inv) {
  constexpr const char* op = "cast_to_fp8_transpose_scaled";
  NoGradGuard no_grad;
  du::check_defined(q, op, "q");
  check_cast(x, nullptr, q.dtype(), op);
  ACCRUE_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", shape_str(x.shape()));
  check_transpose_buffers(x, q, q_t, op);
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  du::check_defined(scale_inv, op, "scale_inv");
  du::check_device_scalar(scale_inv, x.device(), op, "scale_inv", "x");
  ACCRUE_CHECK(margin >= 0 && margin <= kFp8MaxMargin, op, ": margin = ", margin,
               " is outside [0, ", kFp8MaxMargin, "]");
  const float max = static_cast<float>(fp8_max(q.dtype()));
  if (x.numel() == 0) {  // no codes; the scale as the rule makes it
    Tensor unused = empty({1}, DType::f32, x.device());
    ACCRUE_BACKEND_CALL(x.device(), fp8_scale_from_amax, amax, max, margin, power_of_two,
                        nan_on_overflow, unused, scale_inv);
    return;
  }
  const Tensor dense = x.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), cast_to_fp8_transpose_scaled, dense, amax, max, margin,
                      power_of_two, nan_on_overflow, q, q_t, scale_inv);
}

Fp8ScaledCastTranspose cast_to_fp8_transpose_scaled_with_column_sums(
    const Tensor& x, const Tensor& amax, DType out_dtype, int margin, bool power_of_two,
    bool nan_on_overflow, const Tensor& dbias, bool accumulate) {
  constexpr const char* op = "cast_to_fp8_transpose_scaled_with_column_sums";
  check_column_sums(x, dbias, op);
  if (x.device().is_cpu() || x.numel() == 0) {
    Fp8ScaledCastTranspose r =
        cast_to_fp8_transpose_scaled(x, amax, out_dtype, margin, power_of_two, nan_on_overflow);
    sum_rows_into(x, dbias, accumulate);
    return r;
  }
  check_cast(x, nullptr, out_dtype, op);
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, x.device(), op, "amax", "x");
  ACCRUE_CHECK(margin >= 0 && margin <= kFp8MaxMargin, op, ": margin = ", margin,
               " is outside [0, ", kFp8MaxMargin, "]");
  NoGradGuard no_grad;
  const int64_t m = x.size(0), k = x.size(1);
  Fp8ScaledCastTranspose r{empty({m, k}, out_dtype, x.device()),
                           empty({k, m}, out_dtype, x.device()),
                           empty({1}, DType::f32, x.device())};
  const Tensor dense = x.contiguous();
  if (!cuda::cast_to_fp8_transpose_scaled_dbias(dense, amax, static_cast<float>(fp8_max(out_dtype)),
                                                margin, power_of_two, nan_on_overflow, r.q, r.q_t,
                                                r.scale_inv, dbias, accumulate))
    sum_rows_into(dense, dbias, accumulate);  // the shapes the cast's packed kernel cannot take
  return r;
}

Fp8Scale fp8_scale_from_amax(const Tensor& amax, DType fp8_dtype, int margin, bool power_of_two,
                             bool nan_on_overflow) {
  du::check_defined(amax, "fp8_scale_from_amax", "amax");
  Fp8Scale r{empty({1}, DType::f32, amax.device()), empty({1}, DType::f32, amax.device())};
  fp8_scale_from_amax_into(amax, fp8_dtype, margin, power_of_two, r.scale, r.scale_inv,
                           nan_on_overflow);
  return r;
}

void fp8_scale_from_amax_into(const Tensor& amax, DType fp8_dtype, int margin, bool power_of_two,
                              const Tensor& scale, const Tensor& scale_inv, bool nan_on_overflow) {
  constexpr const char* op = "fp8_scale_from_amax";
  NoGradGuard no_grad;
  du::check_defined(amax, op, "amax");
  du::check_device_scalar(amax, amax.device(), op, "amax", "amax");
  du::check_fp8_dtype(fp8_dtype, op, "fp8_dtype");
  ACCRUE_CHECK(margin >= 0 && margin <= kFp8MaxMargin, op, ": margin = ", margin,
               " is outside [0, ", kFp8MaxMargin, "]");
  du::check_defined(scale, op, "scale");
  du::check_defined(scale_inv, op, "scale_inv");
  du::check_device_scalar(scale, amax.device(), op, "scale", "amax");
  du::check_device_scalar(scale_inv, amax.device(), op, "scale_inv", "amax");
  ACCRUE_BACKEND_CALL(amax.device(), fp8_scale_from_amax, amax,
                      static_cast<float>(fp8_max(fp8_dtype)), margin, power_of_two, nan_on_overflow,
                      scale, scale_inv);
}

namespace {

constexpr int64_t kFp8GemmMultiple = 16;

void check_fp8_operand(const Tensor& t, const char* op, const char* what) {
  du::check_fp8_tensor(t, op, what);
  ACCRUE_CHECK(t.dim() == 2, op, ": ", what, " must be 2-D, got shape ", shape_str(t.shape()));
  du::check_contiguous(t, op, what);
  du::check_aligned(t, 16, op, what);
}

// fp8_matmul's and fp8_block_matmul's rules on the operands and the output
// (Note [FP8 GEMM]).
void check_fp8_gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                    const char* op) {
  check_fp8_operand(a, op, "a");
  check_fp8_operand(b, op, "b");
  du::check_same_device(a, b, op, "a", "b");
  ACCRUE_CHECK(!(a.dtype() == DType::f8e5m2 && b.dtype() == DType::f8e5m2), op,
               ": a and b are both f8e5m2, which cuBLASLt does not multiply; cast one of them "
               "(the weight or the activation) to f8e4m3");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  ACCRUE_CHECK(b.size(1) == k, op, ": a of shape ", shape_str(a.shape()), " and b of shape ",
               shape_str(b.shape()), " differ in K (a is [M, K], b is [N, K]: out = a @ b^T)");
  for (const auto& [size, name] : {std::pair<int64_t, const char*>{m, "M"}, {n, "N"}, {k, "K"}})
    ACCRUE_CHECK(size > 0 && size % kFp8GemmMultiple == 0, op, ": ", name, " = ", size,
                 " must be a positive multiple of ", kFp8GemmMultiple,
                 " (cuBLASLt's FP8 GEMM; shapes a ", shape_str(a.shape()), ", b ",
                 shape_str(b.shape()), ")");
  du::check_defined(out, op, "out");
  du::check_device(out, a.device(), op, "out", "a");
  ACCRUE_CHECK(out.shape() == (Shape{m, n}), op, ": out has shape ", shape_str(out.shape()),
               "; expected [", m, ", ", n, "] (a ", shape_str(a.shape()), " @ b^T, b ",
               shape_str(b.shape()), ")");
  ACCRUE_CHECK(out.dtype() == DType::f32 || du::is_16_bit(out.dtype()), op, ": out has dtype ",
               dtype_name(out.dtype()), "; expected f32, bf16 or f16");
  ACCRUE_CHECK(!accumulate || out.dtype() == DType::f32, op,
               ": accumulate adds into an f32 out (the fp32 gradient slot), got ",
               dtype_name(out.dtype()));
  du::check_contiguous(out, op, "out");
  du::check_aligned(out, 16, op, "out");
}

// Note [FP8 block GEMM]: the rows a scale covers, and its scale_inv's shape.
constexpr int64_t kFp8BlockK = 128;

int64_t rows_per_tile(Fp8Tiles tiles) {
  return tiles == Fp8Tiles::block ? kFp8BlockK : 1;
}

void check_block_scales(const Tensor& q, const Tensor& scale_inv, Fp8Tiles tiles, const char* op,
                        const char* what) {
  du::check_defined(scale_inv, op, what);
  du::check_device(scale_inv, q.device(), op, what, "a");
  du::check_dtype(scale_inv, DType::f32, op, what);
  du::check_contiguous(scale_inv, op, what);
  const int64_t r = rows_per_tile(tiles);
  const Shape want{(q.size(0) + r - 1) / r, (q.size(1) + kFp8BlockK - 1) / kFp8BlockK};
  ACCRUE_CHECK(scale_inv.shape() == want, op, ": ", what, " has shape ",
               shape_str(scale_inv.shape()), "; tiles of ", r, " x ", kFp8BlockK, " over ",
               shape_str(q.shape()), " take ", shape_str(want));
}

// A per-tensor GEMM's two scale_inv, f32 [1] on a's device.
void check_tensor_scales(const Tensor& a, const Tensor& scale_inv_a, const Tensor& scale_inv_b,
                         const char* op) {
  du::check_device_scalar(scale_inv_a, a.device(), op, "scale_inv_a", "a");
  du::check_device_scalar(scale_inv_b, a.device(), op, "scale_inv_b", "a");
}

// An epilogue's bias: [N] (b's rows), out's dtype, contiguous, on a's device.
void check_gemm_bias(const Tensor& bias, const Tensor& a, const Tensor& b, const Tensor& out,
                     const char* op) {
  du::check_defined(bias, op, "bias");
  ACCRUE_CHECK(bias.shape() == Shape{b.size(0)} && bias.dtype() == out.dtype(), op,
               ": bias of shape ", shape_str(bias.shape()), " and dtype ", dtype_name(bias.dtype()),
               "; expected [", b.size(0), "] in out's dtype ", dtype_name(out.dtype()));
  du::check_device(bias, a.device(), op, "bias", "a");
  du::check_contiguous(bias, op, "bias");
}

// The [M, N] output of a @ b^T for the allocating forms, a and b 2-D.
Tensor gemm_output(const Tensor& a, const Tensor& b, DType out_dtype, const char* op) {
  du::check_defined(a, op, "a");
  du::check_defined(b, op, "b");
  ACCRUE_CHECK(a.dim() == 2 && b.dim() == 2, op, ": a and b must be 2-D, got shapes ",
               shape_str(a.shape()), " and ", shape_str(b.shape()));
  return empty({a.size(0), b.size(0)}, out_dtype, a.device());
}

}  // namespace

void fp8_matmul_into(const Tensor& a, const Tensor& b, const Tensor& scale_inv_a,
                     const Tensor& scale_inv_b, const Tensor& out, bool accumulate,
                     bool fast_accumulation, const Tensor& bias) {
  constexpr const char* op = "fp8_matmul";
  NoGradGuard no_grad;
  check_fp8_gemm(a, b, out, accumulate, op);
  check_tensor_scales(a, scale_inv_a, scale_inv_b, op);
  if (bias.defined()) {
    ACCRUE_CHECK(!accumulate, op, ": a bias with accumulate (a gradient slot takes no bias)");
    check_gemm_bias(bias, a, b, out, op);
  }
  ACCRUE_BACKEND_CALL(a.device(), fp8_matmul, a, b, scale_inv_a, scale_inv_b, bias, out, accumulate,
                      fast_accumulation);
}

void fp8_block_matmul_into(const Tensor& a, const Tensor& scale_inv_a, Fp8Tiles tiles_a,
                           const Tensor& b, const Tensor& scale_inv_b, Fp8Tiles tiles_b,
                           const Tensor& out, bool accumulate) {
  constexpr const char* op = "fp8_block_matmul";
  NoGradGuard no_grad;
  check_fp8_gemm(a, b, out, accumulate, op);
  check_block_scales(a, scale_inv_a, tiles_a, op, "scale_inv_a");
  check_block_scales(b, scale_inv_b, tiles_b, op, "scale_inv_b");
  ACCRUE_CHECK(!(tiles_a == Fp8Tiles::block && tiles_b == Fp8Tiles::block), op,
               ": a and b are both scaled per 128 x 128 block; one operand (the activation or "
               "the gradient) takes 1 x 128 tiles (cuBLASLt's block-scaled FP8 GEMM)");
  ACCRUE_BACKEND_CALL(a.device(), fp8_block_matmul, a, scale_inv_a, rows_per_tile(tiles_a), b,
                      scale_inv_b, rows_per_tile(tiles_b), out, accumulate);
}

Tensor fp8_block_matmul(const Tensor& a, const Tensor& scale_inv_a, Fp8Tiles tiles_a,
                        const Tensor& b, const Tensor& scale_inv_b, Fp8Tiles tiles_b,
                        DType out_dtype) {
  const Tensor out = gemm_output(a, b, out_dtype, "fp8_block_matmul");
  fp8_block_matmul_into(a, scale_inv_a, tiles_a, b, scale_inv_b, tiles_b, out, false);
  return out;
}

void fp8_matmul_gelu_into(const Tensor& a, const Tensor& b, const Tensor& scale_inv_a,
                          const Tensor& scale_inv_b, const Tensor& bias, const Tensor& pre,
                          const Tensor& out, bool fast_accumulation) {
  constexpr const char* op = "fp8_matmul_gelu";
  NoGradGuard no_grad;
  check_fp8_gemm(a, b, out, false, op);
  check_tensor_scales(a, scale_inv_a, scale_inv_b, op);
  ACCRUE_CHECK(du::is_16_bit(out.dtype()), op, ": out has dtype ", dtype_name(out.dtype()),
               "; the GELU epilogue writes bf16 or f16");
  du::check_defined(pre, op, "pre");
  ACCRUE_CHECK(pre.shape() == out.shape() && pre.dtype() == out.dtype() && pre.is_contiguous(), op,
               ": pre of shape ", shape_str(pre.shape()), " and dtype ", dtype_name(pre.dtype()),
               " must be contiguous and match out (", shape_str(out.shape()), ", ",
               dtype_name(out.dtype()), ")");
  du::check_device(pre, a.device(), op, "pre", "a");
  check_gemm_bias(bias, a, b, out, op);
  ACCRUE_BACKEND_CALL(a.device(), fp8_matmul_gelu, a, b, scale_inv_a, scale_inv_b, bias, pre, out,
                      fast_accumulation);
}

Tensor fp8_matmul(const Tensor& a, const Tensor& b, const Tensor& scale_inv_a,
                  const Tensor& scale_inv_b, DType out_dtype, bool fast_accumulation,
                  const Tensor& bias) {
  const Tensor out = gemm_output(a, b, out_dtype, "fp8_matmul");
  fp8_matmul_into(a, b, scale_inv_a, scale_inv_b, out, false, fast_accumulation, bias);
  return out;
}

}  // namespace accrue::kernels
