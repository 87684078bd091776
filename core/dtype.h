// Element types and the host representations of the 16-bit floats.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace accrue {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, boolean };

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::boolean:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
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

// Maps a C++ element type to its DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};

// Calls f(T{}) with T the C++ type of dtype t: one switch shared by every op.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::boolean:
      return f(bool{});
  }
  return f(float{});
}

// Calls f(T{}) for the index dtypes i32 and i64; any other dtype throws, naming op.
template <class F>
decltype(auto) visit_index_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
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
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace accrue
