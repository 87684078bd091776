// Device building blocks of the CUDA elementwise kernels (kernels/cuda/elementwise.cu),
// also used by the row kernels of kernels/cuda/reduce.cu: 16-byte packs and the
// per-element math.
//
// Each op exists once as a device function over the math type M (float for
// f32/bf16/f16, double for f64); the functors below wrap it with the loads'
// conversions. Two flavours of functor:
//  - `...Fn<T, op>`: the op is a template argument, for the contiguous fast
//    path (one kernel per dtype and op, no branch in the loop);
//  - `...AnyFn<T>`: the op is a runtime value switched on per element, for the
//    strided path, whose index arithmetic costs far more than a uniform branch;
//    this keeps the number of kernels (and the compile time) down.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::cuda {
namespace {

namespace dev = ::accrue::cuda;

// ---- 16-byte packs: core/cuda_pack.cuh -------------------------------------------

using dev::load_pack;
using dev::Pack;
using dev::pack_aligned;
using dev::store_pack;

// f applied to the elements of packs: out.v[j] = f(in.v[j]...).
template <int V, class F, class Out, class... In>
__device__ __forceinline__ Pack<Out, V> apply_pack(const F& f, const Pack<In, V>&... in) {
  Pack<Out, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j)
    out.v[j] = f(in.v[j]...);
  return out;
}

// ---- per-element math ------------------------------------------------------------------

template <class M>
__device__ __forceinline__ M exp_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}
template <class M>
__device__ __forceinline__ M log_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return logf(x);
  } else {
    return log(x);
  }
}
template <class M>
__device__ __forceinline__ M sqrt_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return sqrtf(x);
  } else {
    return sqrt(x);
  }
}
template <class M>
__device__ __forceinline__ M tanh_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return tanhf(x);
  } else {
    return tanh(x);
  }
}
template <class M>
__device__ __forceinline__ M pow_of(M x, M p) {
  if constexpr (std::is_same_v<M, float>) {
    return powf(x, p);
  } else {
    return pow(x, p);
  }
}

template <class M>
__device__ __forceinline__ M rsqrt_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return rsqrtf(x);
  } else {
    return rsqrt(x);
  }
}
template <class M>
__device__ __forceinline__ M abs_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return fabsf(x);
  } else {
    return fabs(x);
  }
}
template <class M>
__device__ __forceinline__ M sin_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return sinf(x);
  } else {
    return sin(x);
  }
}
template <class M>
__device__ __forceinline__ M cos_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return cosf(x);
  } else {
    return cos(x);
  }
}

// ---- binary ---------------------------------------------------------------------

template <BinaryOp op, class M>
__device__ __forceinline__ M binary_math(M a, M b) {
  if constexpr (op == BinaryOp::Add) {
    return a + b;
  } else if constexpr (op == BinaryOp::Sub) {
    return a - b;
  } else if constexpr (op == BinaryOp::Mul) {
    return a * b;
  } else if constexpr (op == BinaryOp::Div) {
    return a / b;
  } else if constexpr (op == BinaryOp::Min) {
    // A NaN in either operand wins (x != x only for NaN), as PyTorch's minimum.
    return a != a ? a : b != b ? b : b < a ? b : a;
  } else {
    return a != a ? a : b != b ? b : b > a ? b : a;
  }
}

template <class M>
__device__ __forceinline__ M binary_math_any(BinaryOp op, M a, M b) {
  switch (op) {
    case BinaryOp::Add:
      return binary_math<BinaryOp::Add>(a, b);
    case BinaryOp::Sub:
      return binary_math<BinaryOp::Sub>(a, b);
    case BinaryOp::Mul:
      return binary_math<BinaryOp::Mul>(a, b);
    case BinaryOp::Div:
      return binary_math<BinaryOp::Div>(a, b);
    case BinaryOp::Min:
      return binary_math<BinaryOp::Min>(a, b);
    case BinaryOp::Max:
      break;
  }
  return binary_math<BinaryOp::Max>(a, b);
}

template <class T, BinaryOp op>
struct BinaryFn {
  __device__ __forceinline__ T operator()(T a, T b) const {
    using M = dev::math_t<T>;
    return dev::convert<T>(binary_math<op>(dev::convert<M>(a), dev::convert<M>(b)));
  }
};

template <class T>
struct BinaryAnyFn {
  BinaryOp op;
  __device__ __forceinline__ T operator()(T a, T b) const {
    using M = dev::math_t<T>;
    return dev::convert<T>(binary_math_any(op, dev::convert<M>(a), dev::convert<M>(b)));
  }
};

// a op s, or s op a when scalar_first (a uniform branch: only Sub and Div care).
template <class T, BinaryOp op>
struct BinaryScalarFn {
  dev::math_t<T> s;
  bool scalar_first;
  __device__ __forceinline__ T operator()(T a) const {
    const dev::math_t<T> x = dev::convert<dev::math_t<T>>(a);
    return dev::convert<T>(scalar_first ? binary_math<op>(s, x) : binary_math<op>(x, s));
  }
};

template <class T>
struct BinaryScalarAnyFn {
  BinaryOp op;
  dev::math_t<T> s;
  bool scalar_first;
  __device__ __forceinline__ T operator()(T a) const {
    const dev::math_t<T> x = dev::convert<dev::math_t<T>>(a);
    return dev::convert<T>(scalar_first ? binary_math_any(op, s, x) : binary_math_any(op, x, s));
  }
};

// ---- unary ----------------------------------------------------------------------

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class M>
struct GeluConstants {
  static constexpr M kSqrt2OverPi = M(0.7978845608028654);
  static constexpr M kCubic = M(0.044715);
};

template <UnaryOp op, class M>
__device__ __forceinline__ M unary_math(M x, M p) {
  if constexpr (op == UnaryOp::Neg) {
    return -x;
  } else if constexpr (op == UnaryOp::Exp) {
    return exp_of(x);
  } else if constexpr (op == UnaryOp::Log) {
    return log_of(x);
  } else if constexpr (op == UnaryOp::Sqrt) {
    return sqrt_of(x);
  } else if constexpr (op == UnaryOp::Tanh) {
    return tanh_of(x);
  } else if constexpr (op == UnaryOp::Relu) {
    return x < M(0) ? M(0) : x;  // NaN passes through
  } else if constexpr (op == UnaryOp::Gelu) {
    using C = GeluConstants<M>;
    const M u = C::kSqrt2OverPi * (x + C::kCubic * x * x * x);
    return M(0.5) * x * (M(1) + tanh_of(u));
  } else if constexpr (op == UnaryOp::Sigmoid) {
    return M(1) / (M(1) + exp_of(-x));
  } else if constexpr (op == UnaryOp::Pow) {
    return pow_of(x, p);
  } else if constexpr (op == UnaryOp::Silu) {
    return x / (M(1) + exp_of(-x));
  } else if constexpr (op == UnaryOp::Rsqrt) {
    return rsqrt_of(x);
  } else if constexpr (op == UnaryOp::Sin) {
    return sin_of(x);
  } else if constexpr (op == UnaryOp::Cos) {
    return cos_of(x);
  } else {
    return abs_of(x);
  }
}

// True for the ops whose derivative is cheapest from the forward output y =
// f(x) (the backward then reads y instead of x); see unary_grad_math.
__host__ __device__ constexpr bool grad_uses_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Tanh ||
         op == UnaryOp::Sigmoid || op == UnaryOp::Rsqrt;
}

// g * f'(x). `v` is the forward output y when grad_uses_output(op), else the input x.
template <UnaryOp op, class M>
__device__ __forceinline__ M unary_grad_math(M g, M v, M p) {
  if constexpr (op == UnaryOp::Neg) {
    return -g;
  } else if constexpr (op == UnaryOp::Exp) {
    return g * v;
  } else if constexpr (op == UnaryOp::Log) {
    return g / v;
  } else if constexpr (op == UnaryOp::Sqrt) {
    return g / (M(2) * v);
  } else if constexpr (op == UnaryOp::Tanh) {
    return g * (M(1) - v * v);
  } else if constexpr (op == UnaryOp::Relu) {
    return v > M(0) ? g : M(0);
  } else if constexpr (op == UnaryOp::Gelu) {
    using C = GeluConstants<M>;
    const M x2 = v * v;
    const M t = tanh_of(C::kSqrt2OverPi * (v + C::kCubic * x2 * v));
    const M du = C::kSqrt2OverPi * (M(1) + M(3) * C::kCubic * x2);
    return g * (M(0.5) * (M(1) + t) + M(0.5) * v * (M(1) - t * t) * du);
  } else if constexpr (op == UnaryOp::Sigmoid) {
    return g * v * (M(1) - v);
  } else if constexpr (op == UnaryOp::Pow) {
    // d/dx x^0 is 0 everywhere (also at x = 0, where p x^(p-1) would be 0 * inf).
    return p == M(0) ? M(0) : g * p * pow_of(v, p - M(1));
  } else if constexpr (op == UnaryOp::Silu) {
    const M s = M(1) / (M(1) + exp_of(-v));
    return g * s * (M(1) + v * (M(1) - s));
  } else if constexpr (op == UnaryOp::Rsqrt) {
    return M(-0.5) * g * v * v * v;  // d x^-1/2 = -y^3 / 2
  } else if constexpr (op == UnaryOp::Sin) {
    return g * cos_of(v);
  } else if constexpr (op == UnaryOp::Cos) {
    return -g * sin_of(v);
  } else {
    return v > M(0) ? g : v < M(0) ? -g : M(0);  // sign(0) = 0, as PyTorch
  }
}

// Calls f(std::integral_constant<UnaryOp, op>{}) for the runtime op.
template <class F>
__host__ __device__ __forceinline__ auto with_unary_op(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::Neg:
      return f(std::integral_constant<UnaryOp, UnaryOp::Neg>{});
    case UnaryOp::Exp:
      return f(std::integral_constant<UnaryOp, UnaryOp::Exp>{});
    case UnaryOp::Log:
      return f(std::integral_constant<UnaryOp, UnaryOp::Log>{});
    case UnaryOp::Sqrt:
      return f(std::integral_constant<UnaryOp, UnaryOp::Sqrt>{});
    case UnaryOp::Tanh:
      return f(std::integral_constant<UnaryOp, UnaryOp::Tanh>{});
    case UnaryOp::Relu:
      return f(std::integral_constant<UnaryOp, UnaryOp::Relu>{});
    case UnaryOp::Gelu:
      return f(std::integral_constant<UnaryOp, UnaryOp::Gelu>{});
    case UnaryOp::Sigmoid:
      return f(std::integral_constant<UnaryOp, UnaryOp::Sigmoid>{});
    case UnaryOp::Pow:
      return f(std::integral_constant<UnaryOp, UnaryOp::Pow>{});
    case UnaryOp::Silu:
      return f(std::integral_constant<UnaryOp, UnaryOp::Silu>{});
    case UnaryOp::Rsqrt:
      return f(std::integral_constant<UnaryOp, UnaryOp::Rsqrt>{});
    case UnaryOp::Sin:
      return f(std::integral_constant<UnaryOp, UnaryOp::Sin>{});
    case UnaryOp::Cos:
      return f(std::integral_constant<UnaryOp, UnaryOp::Cos>{});
    case UnaryOp::Abs:
      break;
  }
  return f(std::integral_constant<UnaryOp, UnaryOp::Abs>{});
}

template <class F>
__host__ __device__ __forceinline__ auto with_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::Add:
      return f(std::integral_constant<BinaryOp, BinaryOp::Add>{});
    case BinaryOp::Sub:
      return f(std::integral_constant<BinaryOp, BinaryOp::Sub>{});
    case BinaryOp::Mul:
      return f(std::integral_constant<BinaryOp, BinaryOp::Mul>{});
    case BinaryOp::Div:
      return f(std::integral_constant<BinaryOp, BinaryOp::Div>{});
    case BinaryOp::Min:
      return f(std::integral_constant<BinaryOp, BinaryOp::Min>{});
    case BinaryOp::Max:
      break;
  }
  return f(std::integral_constant<BinaryOp, BinaryOp::Max>{});
}

template <class T, UnaryOp op>
struct UnaryFn {
  dev::math_t<T> param;
  __device__ __forceinline__ T operator()(T a) const {
    return dev::convert<T>(unary_math<op>(dev::convert<dev::math_t<T>>(a), param));
  }
};

template <class T>
struct UnaryAnyFn {
  UnaryOp op;
  dev::math_t<T> param;
  __device__ __forceinline__ T operator()(T a) const {
    using M = dev::math_t<T>;
    const M x = dev::convert<M>(a);
    const M p = param;
    return dev::convert<T>(
        with_unary_op(op, [x, p](auto o) { return unary_math<decltype(o)::value>(x, p); }));
  }
};

// (grad, v) -> grad * f'(x); v as in unary_grad_math.
template <class T, UnaryOp op>
struct UnaryGradFn {
  dev::math_t<T> param;
  __device__ __forceinline__ T operator()(T g, T v) const {
    using M = dev::math_t<T>;
    return dev::convert<T>(unary_grad_math<op>(dev::convert<M>(g), dev::convert<M>(v), param));
  }
};

template <class T>
struct UnaryGradAnyFn {
  UnaryOp op;
  dev::math_t<T> param;
  __device__ __forceinline__ T operator()(T g, T v) const {
    using M = dev::math_t<T>;
    const M mg = dev::convert<M>(g), mv = dev::convert<M>(v);
    const M p = param;
    return dev::convert<T>(with_unary_op(
        op, [mg, mv, p](auto o) { return unary_grad_math<decltype(o)::value>(mg, mv, p); }));
  }
};

// ---- minimum/maximum's and clamp's gradients -----------------------------------------

// (grad, x, y) -> grad where x wins, 0 where y wins, grad / 2 at ties and
// grad at a NaN (no comparison holds), as PyTorch's minimum and maximum.
template <class T>
struct MinMaxGradFn {
  bool max;
  __device__ __forceinline__ T operator()(T g, T x, T y) const {
    using M = dev::math_t<T>;
    const M mg = dev::convert<M>(g), mx = dev::convert<M>(x), my = dev::convert<M>(y);
    const bool loses = max ? mx < my : mx > my;
    return dev::convert<T>(mx == my ? mg / M(2) : loses ? M(0) : mg);
  }
};

// min(max(x, lo), hi); a NaN fails both tests and passes through.
template <class T>
struct ClampFn {
  dev::math_t<T> lo, hi;
  __device__ __forceinline__ T operator()(T a) const {
    const dev::math_t<T> x = dev::convert<dev::math_t<T>>(a);
    return dev::convert<T>(x < lo ? lo : x > hi ? hi : x);
  }
};

// (grad, x) -> grad where lo <= x <= hi, else 0 (0 at NaN).
template <class T>
struct ClampGradFn {
  dev::math_t<T> lo, hi;
  __device__ __forceinline__ T operator()(T g, T a) const {
    using M = dev::math_t<T>;
    const M x = dev::convert<M>(a);
    return x >= lo && x <= hi ? g : dev::convert<T>(M(0));
  }
};

// ---- compare, where, axpy ----------------------------------------------------------

// Any dtype (integers and bool compare as themselves, 16-bit floats in float).
// The op is always a runtime switch: comparisons are too cheap to deserve a kernel each.
template <class T>
struct CompareFn {
  CompareOp op;
  __device__ __forceinline__ bool operator()(T a, T b) const {
    using M = dev::math_t<T>;
    const M x = dev::convert<M>(a), y = dev::convert<M>(b);
    switch (op) {
      case CompareOp::Eq:
        return x == y;
      case CompareOp::Ne:
        return x != y;
      case CompareOp::Lt:
        return x < y;
      case CompareOp::Le:
        return x <= y;
      case CompareOp::Gt:
        return x > y;
      case CompareOp::Ge:
        break;
    }
    return x >= y;
  }
};

template <class T>
struct WhereFn {
  __device__ __forceinline__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};

// (dst, src) -> dst + alpha * src; src may be a 16-bit S into an f32 dst
// (Note [Mixed axpy]: widened exactly, as src.to(f32) would be).
template <class T, class S = T>
struct AxpyFn {
  dev::math_t<T> alpha;
  __device__ __forceinline__ T operator()(T d, S s) const {
    using M = dev::math_t<T>;
    return dev::convert<T>(dev::convert<M>(d) + alpha * dev::convert<M>(s));
  }
};

}  // namespace
}  // namespace accrue::kernels::cuda
