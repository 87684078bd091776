// 16-byte packs: N values of T moved as one aligned vector load or store.
// Shared by core's copies (core/copy.cu) and the kernels (kernels/cuda/).
#pragma once

#include <cstdint>
#include <cstring>

#include <vector_types.h>  // uint2, uint4

namespace accrue::cuda {

// N values of T moved as one aligned vector load/store.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// The unsigned type of exactly `bytes` bytes: nvcc splits a struct copy into
// per-member loads, so packs travel through these to get one LDG.128/STG.128.
template <int bytes>
struct RawOf;
template <>
struct RawOf<16> {
  using type = uint4;
};
template <>
struct RawOf<8> {
  using type = uint2;
};
template <>
struct RawOf<4> {
  using type = uint32_t;
};
template <>
struct RawOf<2> {
  using type = uint16_t;
};
template <>
struct RawOf<1> {
  using type = uint8_t;
};

// Pack i of p (p aligned to the pack's size).
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int64_t i) {
  using Raw = typename RawOf<sizeof(Pack<T, V>)>::type;
  const Raw raw = reinterpret_cast<const Raw*>(p)[i];
  Pack<T, V> pack;
  memcpy(&pack, &raw, sizeof(raw));
  return pack;
}

template <int V, class T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, V>& pack) {
  using Raw = typename RawOf<sizeof(Pack<T, V>)>::type;
  Raw raw;
  memcpy(&raw, &pack, sizeof(raw));
  reinterpret_cast<Raw*>(p)[i] = raw;
}

template <int V, class T>
__host__ __device__ __forceinline__ bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, V>) == 0;
}

}  // namespace accrue::cuda
