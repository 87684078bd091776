// Device-side element types and conversions, shared by every .cu file.
//
// bf16 and f16 are stored as __nv_bfloat16 / __half (bit-compatible with the
// host accrue::bf16 / accrue::f16) and computed in float; f8e4m3 and f8e5m2 as
// __nv_fp8_e4m3 / __nv_fp8_e5m2, converted with __NV_SATFINITE (Note [FP8 dtypes]).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/device_scope.h"
#include "accrue/core/dtype.h"
#include "accrue/core/error.h"
#include "accrue/core/status_check.h"

namespace accrue::cuda {

// The type used for arithmetic on an element type: float for the 16-bit
// floats, the type itself otherwise.
template <class T>
struct math_type {
  using type = T;
};
template <>
struct math_type<__nv_bfloat16> {
  using type = float;
};
template <>
struct math_type<__half> {
  using type = float;
};
template <class T>
using math_t = typename math_type<T>::type;

template <class T>
inline constexpr bool is_fp8_v =
    std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

template <class To, class From>
__host__ __device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16> || std::is_same_v<From, __half> ||
                       is_fp8_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (is_fp8_v<To>) {
    // One rounding, from the value itself (Note [FP8 dtypes]): float through
    // the satfinite cvt, double and integers through the double conversion.
    if constexpr (std::is_same_v<From, float>) {
      return To(v);
    } else {
      return To(static_cast<double>(v));
    }
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// The device element type of each dtype: the host type except where the device
// has its own (bit-compatible) type. See Note [DType list].
template <DType D>
struct device_type {
  using type = host_t<D>;
};
template <>
struct device_type<DType::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct device_type<DType::f16> {
  using type = __half;
};
template <>
struct device_type<DType::f8e4m3> {
  using type = __nv_fp8_e4m3;
};
template <>
struct device_type<DType::f8e5m2> {
  using type = __nv_fp8_e5m2;
};
template <DType D>
using device_t = typename device_type<D>::type;

// One case of a visitor's switch over a list of Note [DType list]: calls f with
// the device element type of the dtype.
#define ACCRUE_DEVICE_DTYPE_CASE(name, T, str) \
  case DType::name:                            \
    return f(device_t<DType::name>{});

// Calls f(T{}) with T the device element type of dtype t; FP8 throws (Note
// [FP8 dtypes]).
template <class F>
void visit_device_dtype(DType t, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_DTYPE(ACCRUE_DEVICE_DTYPE_CASE)
    default:
      break;
  }
  fail_fp8_dtype(t);
}

// visit_device_dtype with the FP8 dtypes too: for copies, casts and fills only.
template <class F>
void visit_any_device_dtype(DType t, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_ANY_DTYPE(ACCRUE_DEVICE_DTYPE_CASE)
    default:
      break;
  }
  fail_fp8_dtype(t);
}

// Float dtypes only (the ops of kernels/ compute on these).
template <class F>
void visit_float_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    ACCRUE_FOR_EACH_FLOAT_DTYPE(ACCRUE_DEVICE_DTYPE_CASE)
    default:
      ACCRUE_FAIL(op, ": dtype ", dtype_name(t), " is not a floating dtype");
  }
}

// DeviceScope (core/device_scope.h) selects the tensor's device for the scope of a launch.

inline cudaStream_t stream_for(int device) {
  return current_stream(device);
}

// The device's streaming multiprocessors, for grids sized in waves.
inline int sm_count(int device) {
  int sms = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 32) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

}  // namespace accrue::cuda
