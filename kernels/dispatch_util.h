// What every dispatch file of kernels/ shares: the backend call, the argument
// checks and the dense views. A dispatch file validates (every check through
// the helpers here, errors naming the op and the values), allocates, shapes
// the inputs as the family's *_backend.h promises, and calls the CPU or CUDA
// backend by the inputs' device through ACCRUE_BACKEND_CALL. The files:
//  - dispatch_elementwise.cpp: unary, binary, compare, where, axpy_;
//  - dispatch_reduce.cpp: reductions, sum_to, sum_rows_into, softmax;
//  - dispatch_matmul.cpp: matmul, gemm and the TF32 switch;
//  - dispatch_nn.cpp: embedding, cross-entropy, layer norm;
//  - attention.cpp, batch_norm.cpp, classifier.cpp, conv.cpp, dropout.cpp, fp8.cpp,
//    fused.cpp, index_checks.cpp, window_close.cpp: one family each.
//
// Note [Dispatch shapes]
// ~~~~~~~~~~~~~~~~~~~~~~
// The backends see only a few shapes, so each kernel is written once:
//  - elementwise: every input raw-expanded to the output shape (0 strides);
//    the output is a fresh contiguous tensor (a channels-last result is seen
//    permuted to [N, H, W, C], where it is contiguous: Note [Channels-last results]);
//  - reductions and softmax along any dims: the reduced dims permuted to the
//    end, made contiguous and viewed as [rows, cols];
//  - matmul: 3-D [B, M, K] @ [B, K, N] views whose last two dims are row- or
//    column-major (anything else is copied) and whose batch dims merge into
//    one stride (0 for a broadcast batch).
// Empty outputs never reach a backend (a CUDA launch of zero blocks is an
// error), and neither do reductions over nothing: sum of nothing is 0, mean
// NaN, and max throws.
//
// Every function runs under a NoGradGuard: the raw view methods of Tensor
// refuse tensors that require grad while grad mode is on (Note [Raw views]),
// and here they only shape data for a kernel; autograd records the op itself.
#pragma once

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/ops.h"

// Calls the backend function `fn` (a line of its family's .inc: Note
// [Backend function lists]) of the backend of `device`, from namespace
// accrue::kernels. A build without CUDA links the CUDA side to stubs that
// throw (kernels/cuda/unavailable.cpp), so no call needs an #ifdef.
#define ACCRUE_BACKEND_CALL(device, fn, ...) \
  ((device).is_cpu() ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))

namespace accrue::kernels::dispatch_util {

// ---- validation -------------------------------------------------------------

inline void check_defined(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

inline void check_floating(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(is_floating(t.dtype()), op, ": ", what, " of shape ", shape_str(t.shape()),
               " has dtype ", dtype_name(t.dtype()),
               "; expected a floating dtype (f32, f64, bf16 or f16)");
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  ACCRUE_CHECK(a.device() == b.device(), op, ": devices ", a.device().str(), " and ",
               b.device().str(), " differ (shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), ")");
}

// The same, naming the operands.
inline void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                              const char* what_b) {
  ACCRUE_CHECK(a.device() == b.device(), op, ": devices ", a.device().str(), " and ",
               b.device().str(), " differ (", what_a, " of shape ", shape_str(a.shape()), " and ",
               what_b, " of shape ", shape_str(b.shape()), ")");
}

// Note [Broadcasting and dtypes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Shapes broadcast as NumPy's and PyTorch's: aligned from the last dim, each
// pair of sizes equal or one of them 1 (a missing leading dim counts as 1),
// the result taking the larger. broadcast_shapes (core/tensor.h) computes it
// and names the op and both shapes when they do not broadcast; dispatch then
// raw-expands every input to the result (0 strides, Note [Dispatch shapes]).
// An op that keeps one operand's shape (axpy_'s dst, masked_fill's x)
// broadcasts the other operand to it, never the reverse.
//
// Dtypes are explicit: the tensor operands of one op share a dtype, and
// accrue never promotes one implicitly (PyTorch would compute f32 * f64 in
// f64). A silent promotion would move a model's compute to f64 because one
// table was built in f64, or double the memory of a bf16 activation that
// meets an f32 constant, and nothing would say so; a mismatch is instead an
// error naming both operands, their dtypes and the conversion to write
// (check_same_dtype below): `b.to(DType::f64)`, or `to_dtype(b, DType::f64)`
// (autograd/ops.h) where b needs its gradient. A scalar (a double) is not an
// operand: it takes the tensor's dtype (binary_scalar, where and masked_fill
// with a scalar, clamp's bounds). The exceptions are each stated where they
// are made: compare takes any dtype (one for both); where's cond and
// masked_fill's mask are bool; indices are i32 or i64; axpy_ adds a src of
// another floating dtype as its conversion would (Note [Mixed axpy]); and a
// parameter's gradient may be an f32 slot beside 16-bit compute
// (check_dtype_or_f32).

// How a dtype is spelled in C++ (DType::boolean prints as "bool").
inline const char* dtype_enum_name(DType t) {
  return t == DType::boolean ? "boolean" : dtype_name(t);
}

// Note [Broadcasting and dtypes]: no implicit promotion; the error says
// which operand to convert and how.
inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                             const char* what_b) {
  ACCRUE_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", dtype_name(a.dtype()), " and ",
               dtype_name(b.dtype()), " differ (", what_a, " of shape ", shape_str(a.shape()),
               " and ", what_b, " of shape ", shape_str(b.shape()),
               "); accrue never promotes dtypes implicitly: convert ", what_b, " with ", what_b,
               ".to(DType::", dtype_enum_name(a.dtype()), ") (to_dtype(", what_b,
               ", DType::", dtype_enum_name(a.dtype()), ") keeps its gradient), or ", what_a,
               " with ", what_a, ".to(DType::", dtype_enum_name(b.dtype()), ")");
}

// The same, the operands named a and b.
inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  check_same_dtype(a, b, op, "a", "b");
}

// `t` on `expected`, the device of `whose` (say, "the input").
inline void check_device(const Tensor& t, Device expected, const char* op, const char* what,
                         const char* whose) {
  ACCRUE_CHECK(t.device() == expected, op, ": ", what, " of shape ", shape_str(t.shape()),
               " is on ", t.device().str(), ", ", whose, " on ", expected.str());
}

// Note [Broadcasting and dtypes]: the error says how to convert.
inline void check_dtype(const Tensor& t, DType expected, const char* op, const char* what) {
  ACCRUE_CHECK(t.dtype() == expected, op, ": ", what, " of shape ", shape_str(t.shape()),
               " has dtype ", dtype_name(t.dtype()), "; expected ", dtype_name(expected),
               " (convert it with ", what, ".to(DType::", dtype_enum_name(expected), "))");
}

inline void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                             const char* what_b) {
  ACCRUE_CHECK(a.shape() == b.shape(), op, ": ", what_a, " of shape ", shape_str(a.shape()),
               " and ", what_b, " of shape ", shape_str(b.shape()), " differ");
}

// Two floating operands of one op: defined, on one device, of one dtype.
inline void check_float_pair(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                             const char* what_b) {
  check_defined(a, op, what_a);
  check_defined(b, op, what_b);
  check_same_device(a, b, op, what_a, what_b);
  check_same_dtype(a, b, op, what_a, what_b);
  check_floating(a, op, what_a);
}

// A tensor read beside the input x (a gradient of x's): x's float dtype,
// device and shape.
inline void check_like_input(const Tensor& t, const Tensor& x, const char* op, const char* what) {
  check_float_pair(t, x, op, what, "input");
  check_same_shape(t, x, op, what, "input");
}

// A tensor of the compute dtype, or f32 where `f32_ok`. The parameter
// gradients (sum_rows_into, embedding and layer-norm backward) may always be
// f32: the gradient arena's slots (Note [Fused weight-gradient accumulation]).
// The GEMM output and layer-norm parameters may be f32 next to 16-bit compute
// only (fp32 accumulators and fp32 master weights).
inline void check_dtype_or_f32(const Tensor& t, DType compute, bool f32_ok, const char* op,
                               const char* what) {
  ACCRUE_CHECK(t.dtype() == compute || (f32_ok && t.dtype() == DType::f32), op, ": ", what,
               " of shape ", shape_str(t.shape()), " has dtype ", dtype_name(t.dtype()),
               "; expected ", dtype_name(compute), f32_ok && compute != DType::f32 ? " or f32" : "",
               " (convert it with ", what, ".to(DType::", dtype_enum_name(compute), "))");
}

inline bool is_16_bit(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

inline void check_contiguous(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.is_contiguous(), op, ": ", what, " of shape ", shape_str(t.shape()),
               " and strides ", shape_str(t.strides()), " must be contiguous");
}

inline void check_unit_last_stride(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", what, " of shape ",
               shape_str(t.shape()), " and strides ", shape_str(t.strides()),
               " must have stride 1 in its last dim");
}

// Fills a caller's output tensor (the handle is const; its memory is not).
inline void fill(const Tensor& t, double value) {
  Tensor(t).fill_(value);
}

// ---- shaping -------------------------------------------------------------------

// Channels-last: Tensor::is_channels_last (Note [Channels-last results]).
inline bool channels_last(const Tensor& t) {
  return t.is_channels_last();
}

// A fresh [N, C, H, W] tensor laid out N, H, W, C.
inline Tensor empty_channels_last(const Shape& nchw, DType dtype, Device device) {
  return empty({nchw[0], nchw[2], nchw[3], nchw[1]}, dtype, device).permute({0, 3, 1, 2});
}

// A fresh tensor of `shape` laid out as `like`: channels-last for a
// channels-last `like`, else contiguous.
inline Tensor empty_in_layout_of(const Shape& shape, DType dtype, const Tensor& like) {
  return channels_last(like) && shape.size() == 4 ? empty_channels_last(shape, dtype, like.device())
                                                  : empty(shape, dtype, like.device());
}

// `t`, made contiguous, viewed as `shape` (same numel). Unlike Tensor::view
// this also takes 0-d tensors to [1] and back.
inline Tensor dense_view(const Tensor& t, const Shape& shape) {
  const Tensor c = t.contiguous();
  ACCRUE_CHECK(c.numel() == shape_numel(shape), "dense_view: ", shape_str(c.shape()), " has ",
               c.numel(), " elements, not the ", shape_numel(shape), " of ", shape_str(shape));
  return make_view(c, shape, contiguous_strides(shape), c.offset());
}

// ---- FP8 (kernels/fp8.h) ------------------------------------------------------

// An FP8 dtype argument (Note [FP8 dtypes]).
inline void check_fp8_dtype(DType t, const char* op, const char* what) {
  ACCRUE_CHECK(is_fp8(t), op, ": ", what, " is ", dtype_name(t),
               "; expected an FP8 dtype (f8e4m3 or f8e5m2)");
}

// A defined FP8 tensor.
inline void check_fp8_tensor(const Tensor& t, const char* op, const char* what) {
  check_defined(t, op, what);
  ACCRUE_CHECK(is_fp8(t.dtype()), op, ": ", what, " of shape ", shape_str(t.shape()), " has dtype ",
               dtype_name(t.dtype()),
               "; expected an FP8 dtype (f8e4m3 or f8e5m2: cast it with kernels::cast_to_fp8)");
}

// t's data starts at a multiple of `bytes` (a library's vector loads).
inline void check_aligned(const Tensor& t, int64_t bytes, const char* op, const char* what) {
  const auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
  ACCRUE_CHECK(address % static_cast<uintptr_t>(bytes) == 0, op, ": ", what, " of shape ",
               shape_str(t.shape()), " starts at an address that is not a multiple of ", bytes,
               " bytes (a view at offset ", t.offset(), "); pass a fresh contiguous copy");
}

// A value an FP8 cast or GEMM takes from the device (Note [FP8 scaling]): a
// defined f32 tensor of shape [1] on `device`, the device of `whose`.
inline void check_device_scalar(const Tensor& t, Device device, const char* op, const char* what,
                                const char* whose) {
  check_defined(t, op, what);
  ACCRUE_CHECK(t.dtype() == DType::f32 && t.shape() == Shape{1}, op, ": ", what,
               " must be an f32 tensor of shape [1] (a scalar kept on the device), got ",
               dtype_name(t.dtype()), " of shape ", shape_str(t.shape()));
  check_device(t, device, op, what, whose);
}

}  // namespace accrue::kernels::dispatch_util
