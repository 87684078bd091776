// CUDA row sorts of the indexing ops (Note [Indexing ops]: sort, argsort,
// topk): a row of up to kMaxCudaSortRow elements is a bitonic network in one
// block's shared memory, a longer one CUB's segmented stable radix sort
// (Note [CUDA row sorts]).
#include <cub/device/device_segmented_sort.cuh>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/nn_util.cuh"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/indexing_backend.h"

namespace accrue::kernels::cuda {

namespace {

// ---- sort ---------------------------------------------------------------------------

// The shared-memory key of a value: its arithmetic type (floats as float,
// f64 as double, integers as themselves), bool as int32.
template <class T>
using sort_key_t = std::conditional_t<std::is_same_v<T, bool>, int32_t, cu::math_t<T>>;

// Whether entry (ka, ia) comes before (kb, ib): the padding (positions >= n)
// last, then by key (NaN above every number, Note [Indexing ops]), then by
// position, which makes the network's result the stable sort.
template <class K>
__device__ __forceinline__ bool before(K ka, int32_t ia, K kb, int32_t ib, int32_t n,
                                       bool descending) {
  if (ia >= n) return false;
  if (ib >= n) return true;
  if constexpr (std::is_floating_point_v<K>) {
    const bool na = isnan(ka), nb = isnan(kb);
    if (na || nb) return na && nb ? ia < ib : (descending ? na : nb);
  }
  if (ka != kb) return descending ? ka > kb : ka < kb;
  return ia < ib;
}

template <class T, class K>
__global__ void sort_rows_kernel(const T* __restrict__ x, int32_t n, int32_t padded, int32_t k,
                                 bool descending, T* __restrict__ values,
                                 int64_t* __restrict__ indices) {
  extern __shared__ __align__(16) unsigned char shared[];
  K* keys = reinterpret_cast<K*>(shared);
  int32_t* pos = reinterpret_cast<int32_t*>(keys + padded);
  const int64_t row = blockIdx.x;
  const T* in = x + row * n;
  for (int32_t i = threadIdx.x; i < padded; i += blockDim.x) {
    keys[i] = i < n ? cu::convert<K>(in[i]) : K(0);
    pos[i] = i;
  }
  __syncthreads();
  for (int32_t size = 2; size <= padded; size <<= 1) {
    for (int32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int32_t i = threadIdx.x; i < padded; i += blockDim.x) {
        const int32_t j = i ^ stride;
        if (j <= i) continue;
        const bool ascending_run = (i & size) == 0;
        const bool swap = ascending_run ? before(keys[j], pos[j], keys[i], pos[i], n, descending)
                                        : before(keys[i], pos[i], keys[j], pos[j], n, descending);
        if (swap) {
          const K tk = keys[i];
          keys[i] = keys[j];
          keys[j] = tk;
          const int32_t tp = pos[i];
          pos[i] = pos[j];
          pos[j] = tp;
        }
      }
      __syncthreads();
    }
  }
  for (int32_t i = threadIdx.x; i < k; i += blockDim.x) {
    indices[row * k + i] = pos[i];
    if (values) values[row * k + i] = in[pos[i]];
  }
}

// ---- long rows: a segmented stable radix sort --------------------------------------------

// Note [CUDA row sorts]: the unsigned integer whose order is the sort's
// order: NaN (any payload) above +inf, -0 equal to +0, integers offset by
// their sign bit; descending inverts every bit, so the stable ascending sort
// still keeps ties in position order.
template <class T>
using order_key_t =
    std::conditional_t<std::is_same_v<T, double> || std::is_same_v<T, int64_t>, uint64_t, uint32_t>;

template <class T>
__device__ __forceinline__ order_key_t<T> order_key(T v, bool descending) {
  if constexpr (std::is_same_v<T, double>) {
    uint64_t bits = static_cast<uint64_t>(__double_as_longlong(v == 0.0 ? 0.0 : v));
    bits = isnan(v) ? ~uint64_t{0} : (bits >> 63) ? ~bits : bits | (uint64_t{1} << 63);
    return descending ? ~bits : bits;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    const uint64_t bits = static_cast<uint64_t>(v) ^ (uint64_t{1} << 63);
    return descending ? ~bits : bits;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    const uint32_t bits = static_cast<uint32_t>(v) ^ (uint32_t{1} << 31);
    return descending ? ~bits : bits;
  } else if constexpr (std::is_same_v<T, bool>) {
    const uint32_t bits = v ? 1u : 0u;
    return descending ? ~bits : bits;
  } else {
    const float f = cu::convert<float>(v);
    uint32_t bits = __float_as_uint(f == 0.0f ? 0.0f : f);
    bits = isnan(f) ? ~uint32_t{0} : (bits >> 31) ? ~bits : bits | (uint32_t{1} << 31);
    return descending ? ~bits : bits;
  }
}

// Keys and in-row positions of every element, and the rows' start offsets.
template <class T, class Key>
__global__ void order_keys_kernel(const T* __restrict__ x, int64_t total, int64_t n,
                                  bool descending, Key* __restrict__ keys,
                                  int32_t* __restrict__ positions, int64_t* __restrict__ offsets) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = order_key(x[i], descending);
    positions[i] = static_cast<int32_t>(i % n);
    if (i % n == 0) offsets[i / n] = i;
    if (i == total - 1) offsets[total / n] = total;
  }
}

// The first k sorted entries of each row: positions, and the values they hold.
template <class T>
__global__ void take_sorted_kernel(const T* __restrict__ x, const int32_t* __restrict__ sorted,
                                   int64_t rows, int64_t n, int64_t k, T* __restrict__ values,
                                   int64_t* __restrict__ indices) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * k;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / k, p = sorted[row * n + (i - row * k)];
    indices[i] = p;
    if (values) values[i] = x[row * n + p];
  }
}

// Rows longer than the bitonic network takes (Note [CUDA row sorts]).
template <class T>
void sort_long_rows(const Tensor& x, bool descending, const Tensor& values, const Tensor& indices) {
  const int dev = indices.device().index;
  cudaStream_t stream = cu::stream_for(dev);
  const Device device = Device::cuda(dev);
  const int64_t rows = x.size(0), n = x.size(1), k = indices.size(1), total = rows * n;
  ACCRUE_CHECK(total <= std::numeric_limits<int32_t>::max(), "sort: ", rows, " rows of ", n,
               " elements exceed the 2^31 - 1 elements of one CUDA segmented sort");
  using Key = order_key_t<T>;
  const DType key_dtype = sizeof(Key) == 8 ? DType::i64 : DType::i32;
  Tensor keys = empty({2, total}, key_dtype, device);
  Tensor positions = empty({2, total}, DType::i32, device);
  Tensor offsets = empty({rows + 1}, DType::i64, device);
  Key* keys_in = static_cast<Key*>(keys.data_ptr());
  Key* keys_out = keys_in + total;
  int32_t* positions_in = positions.data<int32_t>();
  int32_t* positions_out = positions_in + total;
  const int64_t* begin = offsets.data<int64_t>();
  order_keys_kernel<T, Key><<<cu::grid_for(total, kThreads), kThreads, 0, stream>>>(
      static_cast<const T*>(x.data_ptr()), total, n, descending, keys_in, positions_in,
      offsets.data<int64_t>());
  ACCRUE_LAUNCH_CHECK();
  const int num_items = static_cast<int>(total), num_segments = static_cast<int>(rows);
  size_t temp_bytes = 0;
  ACCRUE_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
      nullptr, temp_bytes, keys_in, keys_out, positions_in, positions_out, num_items, num_segments,
      begin, begin + 1, stream));
  Tensor temp =
      empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::boolean, device);
  ACCRUE_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
      temp.data_ptr(), temp_bytes, keys_in, keys_out, positions_in, positions_out, num_items,
      num_segments, begin, begin + 1, stream));
  take_sorted_kernel<T><<<cu::grid_for(rows * k, kThreads), kThreads, 0, stream>>>(
      static_cast<const T*>(x.data_ptr()), positions_out, rows, n, k,
      values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr, indices.data<int64_t>());
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace

void sort_rows(const Tensor& x, bool descending, const Tensor& values, const Tensor& indices) {
  const int dev = indices.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = x.size(0), n = x.size(1), k = indices.size(1);
  if (n > kMaxCudaSortRow) {
    cu::visit_device_dtype(x.dtype(), [&](auto tag) {
      sort_long_rows<decltype(tag)>(x, descending, values, indices);
    });
    return;
  }
  check_grid_x(rows, "sort");
  int32_t padded = 1;
  while (padded < n)
    padded <<= 1;
  const int threads = std::min<int>(512, std::max<int>(32, padded / 2));
  cu::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using K = sort_key_t<T>;
    const size_t shared = static_cast<size_t>(padded) * (sizeof(K) + sizeof(int32_t));
    sort_rows_kernel<T, K><<<static_cast<unsigned>(rows), threads, shared, cu::stream_for(dev)>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<int32_t>(n), padded,
        static_cast<int32_t>(k), descending,
        values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr, indices.data<int64_t>());
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::kernels::cuda
