// Element types and the host representations of the 16-bit and 8-bit floats.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "accrue/core/error.h"

namespace accrue {

// Note [DType list]
// ~~~~~~~~~~~~~~~~~
// The dtypes are listed once, here: X(enumerator, host element type, name).
// Everything that switches over dtypes expands these lists -- the enum, its
// names, element sizes, dtype_of, visit_dtype / visit_index_dtype below, the
// CUDA visitors of core/cuda_types.cuh (through the device type map there) and
// the CPU kernels' visit_float (kernels/cpu/cpu_util.h) -- so adding a dtype
// means adding one line to one list (and a device_type entry if the device
// stores it differently). The list order is the enum order: keep it, it fixes
// the DType values.
//
// Note [FP8 dtypes]
// ~~~~~~~~~~~~~~~~~
// f8e4m3 (e4m3fn: bias 7, no infinity, max 448, NaN only at S.1111.111) and
// f8e5m2 (IEEE-like: bias 15, infinities, max 57344) are storage for the
// scaled GEMMs of kernels/fp8.h, not compute dtypes: they are not in
// ACCRUE_FOR_EACH_DTYPE, so visit_dtype and the CUDA visitors (what every
// generic kernel switches over) refuse them by name, and is_floating is false
// for them, so every op that wants a floating dtype refuses them too. They
// exist for: element sizes, names, host types (below), allocation, copies and
// casts (Tensor::to(DType), copy_, fill_: through visit_any_dtype), the FP8
// family of kernels/fp8.h, and safetensors (F8_E4M3 / F8_E5M2).
// A plain cast to FP8 rounds to nearest even and saturates: any magnitude at or
// above the format's max (infinity included) becomes +-max, NaN stays NaN --
// for both formats, which is what cuda_fp8.h's __NV_SATFINITE conversions
// (the device side) do, so a CPU and a CUDA cast give the same bytes. So a
// cast never produces an e5m2 infinity; overflow is seen in the amax of the
// scaled cast (kernels/fp8.h), never in the codes. NaN is encoded as
// S.1111.111 in both formats. Values below half the smallest subnormal
// become zero, keeping their sign.
// clang-format off
#define ACCRUE_FOR_EACH_FLOAT_DTYPE(X) \
  X(f32, float, "f32")                 \
  X(f64, double, "f64")                \
  X(bf16, ::accrue::bf16, "bf16")      \
  X(f16, ::accrue::f16, "f16")
#define ACCRUE_FOR_EACH_INDEX_DTYPE(X) \
  X(i32, int32_t, "i32")               \
  X(i64, int64_t, "i64")
#define ACCRUE_FOR_EACH_DTYPE(X)  \
  ACCRUE_FOR_EACH_FLOAT_DTYPE(X)  \
  ACCRUE_FOR_EACH_INDEX_DTYPE(X)  \
  X(boolean, bool, "bool")
// Note [FP8 dtypes]: storage only, outside ACCRUE_FOR_EACH_DTYPE.
#define ACCRUE_FOR_EACH_FP8_DTYPE(X)      \
  X(f8e4m3, ::accrue::f8e4m3, "f8e4m3")   \
  X(f8e5m2, ::accrue::f8e5m2, "f8e5m2")
#define ACCRUE_FOR_EACH_ANY_DTYPE(X) \
  ACCRUE_FOR_EACH_DTYPE(X)           \
  ACCRUE_FOR_EACH_FP8_DTYPE(X)
// clang-format on

struct f8e4m3;
struct f8e5m2;

enum class DType : uint8_t {
#define ACCRUE_DTYPE_ENUMERATOR(name, type, str) name,
  ACCRUE_FOR_EACH_ANY_DTYPE(ACCRUE_DTYPE_ENUMERATOR)
#undef ACCRUE_DTYPE_ENUMERATOR
};

constexpr bool is_floating(DType t) {
#define ACCRUE_DTYPE_IS(name, type, str) || t == DType::name
  return false ACCRUE_FOR_EACH_FLOAT_DTYPE(ACCRUE_DTYPE_IS);
#undef ACCRUE_DTYPE_IS
}

constexpr bool is_fp8(DType t) {
  return t == DType::f8e4m3 || t == DType::f8e5m2;
}

// The dtype that work on t's values accumulates and keeps its statistics in
// (sums, losses, norm statistics, overlapping adds): f64 for f64, f32 for
// every other floating dtype.
constexpr DType widened(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

const char* dtype_name(DType t);

// bf16 and f16 on the host: storage-only types. Arithmetic happens in float
// (the CPU backend widens, computes, rounds back), exactly as the GPU kernels do.
// Both round to nearest even on narrowing, like __float2bfloat16 / __float2half.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// FP8 on the host (Note [FP8 dtypes]): storage-only, like bf16 and f16.
// encode rounds a double to nearest even once (a float converts to double
// exactly) and saturates to +-kMax; decode is exact.
struct f8e4m3 {
  uint8_t bits = 0;
  static constexpr float kMax = 448.0f;
  f8e4m3() = default;
  explicit f8e4m3(float f) : bits(encode(f)) {}
  explicit operator float() const { return decode(bits); }
  static uint8_t encode(double v);
  static float decode(uint8_t b);
};

struct f8e5m2 {
  uint8_t bits = 0;
  static constexpr float kMax = 57344.0f;
  f8e5m2() = default;
  explicit f8e5m2(float f) : bits(encode(f)) {}
  explicit operator float() const { return decode(bits); }
  static uint8_t encode(double v);
  static float decode(uint8_t b);
};

// The largest finite value of an FP8 dtype; throws for any other dtype.
double fp8_max(DType t);

// The host element type of each dtype, and its inverse dtype_of. See Note [DType list].
template <DType D>
struct host_type;
template <class T>
struct dtype_of;
#define ACCRUE_DTYPE_HOST_TYPE(name, T, str)    \
  template <>                                   \
  struct host_type<DType::name> {               \
    using type = T;                             \
  };                                            \
  template <>                                   \
  struct dtype_of<T> {                          \
    static constexpr DType value = DType::name; \
  };
ACCRUE_FOR_EACH_ANY_DTYPE(ACCRUE_DTYPE_HOST_TYPE)
#undef ACCRUE_DTYPE_HOST_TYPE
template <DType D>
using host_t = typename host_type<D>::type;

constexpr size_t element_size(DType t) {
  switch (t) {
#define ACCRUE_DTYPE_SIZE(name, T, str) \
  case DType::name:                     \
    return sizeof(T);
    ACCRUE_FOR_EACH_ANY_DTYPE(ACCRUE_DTYPE_SIZE)
#undef ACCRUE_DTYPE_SIZE
  }
  return 0;
}
static_assert(element_size(DType::boolean) == 1 && element_size(DType::bf16) == 2 &&
              element_size(DType::f16) == 2 && element_size(DType::f8e4m3) == 1 &&
              element_size(DType::f8e5m2) == 1);

// Throws for an FP8 dtype reaching a visitor of compute dtypes: Note [FP8 dtypes].
[[noreturn]] void fail_fp8_dtype(DType t);

// One case of a visitor's switch over a list of Note [DType list]: calls f with
// the host element type of the dtype.
#define ACCRUE_HOST_DTYPE_CASE(name, T, str) \
  case DType::name:                          \
    return f(host_t<DType::name>{});

// Calls f(T{}) with T the C++ type of dtype t: one switch shared by every op.
// FP8 dtypes throw (Note [FP8 dtypes]).
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_DTYPE(ACCRUE_HOST_DTYPE_CASE)
    default:
      break;
  }
  fail_fp8_dtype(t);
}

// visit_dtype with the FP8 dtypes too: for copies, casts and fills only.
template <class F>
decltype(auto) visit_any_dtype(DType t, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_ANY_DTYPE(ACCRUE_HOST_DTYPE_CASE)
    default:
      break;
  }
  fail_fp8_dtype(t);
}

// Calls f(T{}) for the index dtypes i32 and i64; any other dtype throws, naming op.
template <class F>
decltype(auto) visit_index_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_INDEX_DTYPE(ACCRUE_HOST_DTYPE_CASE)
    default:
      break;
  }
  ACCRUE_FAIL(op, ": indices must be i32 or i64, got ", dtype_name(t));
}

// Widening to the math type: double stays double, everything else computes in
// float except integers, which compute in double so that i64 stays exact up to 2^53.
template <class T>
inline double to_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double to_double<double>(double v) {
  return v;
}
template <>
inline double to_double<int32_t>(int32_t v) {
  return v;
}
template <>
inline double to_double<int64_t>(int64_t v) {
  return static_cast<double>(v);
}
template <>
inline double to_double<bool>(bool v) {
  return v ? 1.0 : 0.0;
}

template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, f8e4m3> || std::is_same_v<T, f8e5m2>) {
    T t;
    t.bits = T::encode(v);  // one rounding, from the double itself
    return t;
  } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace accrue
