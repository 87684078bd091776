// The one SM kernel of Note [Copy-engine all-reduce]: dst += src.
#include <cuda_runtime.h>

#include <algorithm>

#include "accrue/core/status_check.h"
#include "accrue/dist/copy_engine_all_reduce.h"

namespace accrue::dist {
namespace {

__global__ void add_f32_kernel(float4* dst, const float4* src, int64_t packs, float* dst_tail,
                               const float* src_tail, int64_t tail) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    float4 a = dst[i];
    const float4 b = src[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    dst[i] = a;
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) dst_tail[threadIdx.x] += src_tail[threadIdx.x];
}

}  // namespace

void copy_engine_add_f32(float* dst, const float* src, int64_t count, CUstream_st* stream) {
  if (count <= 0) return;
  const int64_t packs = count / 4, tail = count % 4;
  // A short grid: the add shares the SMs with the backward's GEMMs, and a
  // chunk of 1M floats is 8 MiB of traffic, a few microseconds at any width.
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(132, (packs + 511) / 512));
  add_f32_kernel<<<static_cast<unsigned>(blocks), 512, 0, stream>>>(
      reinterpret_cast<float4*>(dst), reinterpret_cast<const float4*>(src), packs, dst + packs * 4,
      src + packs * 4, tail);
  ACCRUE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace accrue::dist
