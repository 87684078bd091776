// CUDA kernels of the indexing ops (Note [Indexing ops]): the gather, the
// deterministic scatter-add and cumsum (the row sorts: cuda/sort_rows.cu).
//
// No float atomics (Note [Determinism]): a scatter-add sorts its destinations
// (a stable radix sort keeps each destination's sources in position order)
// and one thread sums each destination, in f32 for 16-bit data and f64 for
// f64. cumsum runs one warp per row along the last dim, else one thread per
// line, in a fixed order.
#include <cub/device/device_radix_sort.cuh>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "accrue/core/collapsed_geometry.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/nn_util.cuh"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/indexing_backend.h"

namespace accrue::kernels::cuda {

namespace {

// An index tensor's geometry; contiguous ones skip the divisions.
struct IndexReader {
  const int64_t* data;
  StridedGeometry geometry;
  bool contiguous;
  __device__ int64_t operator()(int64_t j) const {
    return data[contiguous ? j : geometry.offset_of(j)];
  }
};

IndexReader index_reader(const Tensor& index) {
  IndexReader r{};
  r.data = static_cast<const int64_t*>(index.data_ptr());
  r.contiguous = index.is_contiguous();
  ACCRUE_CHECK(index.dim() <= kMaxDims, "indexing: rank ", index.dim(), " exceeds ", kMaxDims);
  r.geometry.rank = static_cast<int32_t>(index.dim());
  for (int d = 0; d < r.geometry.rank; ++d) {
    r.geometry.sizes[d] = index.shape()[d];
    r.geometry.strides[d] = index.strides()[d];
  }
  return r;
}

// ---- gather ------------------------------------------------------------------------

// What a bad index reads (a deferred check's, Note [Deferred index checks]):
// all-ones bytes, NaN in every float dtype, instead of a wild read.
template <class T>
__device__ __forceinline__ T bad_value() {
  if constexpr (std::is_same_v<T, bool>) {
    return true;
  } else {
    T bad;
    memset(static_cast<void*>(&bad), 0xff, sizeof(T));
    return bad;
  }
}

// One element a thread. `g` holds the output's, the index's and x's lines'
// offsets (x's strides with the indexed dim's 0) collapsed, so an element's
// offsets cost a fast division per collapsed dim (Note [Fast division] in
// core/collapsed_geometry.h), not a 64-bit one per dim of the shape.
template <class T>
__global__ void gather_kernel(const T* __restrict__ x, CollapsedGeometry<3> g, int64_t stride,
                              int64_t size, const int64_t* __restrict__ index, int64_t n,
                              T* __restrict__ out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    g.offsets(j, off);
    const int64_t v = index[off[1]];
    out[off[0]] = v >= 0 && v < size ? x[off[2] + v * stride] : bad_value<T>();
  }
}

// Whole rows (index_select, and any gather whose index varies along dim
// only, over dims after it that are contiguous in x): one block per output
// row [outer, i] copies the x row at index[i], its offset found once.
template <class T>
__global__ void gather_rows_kernel(const T* __restrict__ x, StridedGeometry outer, int64_t stride,
                                   int64_t size, const int64_t* __restrict__ index,
                                   int64_t index_stride, int64_t n, int64_t rows, int64_t inner,
                                   T* __restrict__ out) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t o = row / n, i = row - o * n;
    const int64_t v = index[i * index_stride];
    T* dst = out + row * inner;
    if (v >= 0 && v < size) {
      const T* src = x + outer.offset_of(o) + v * stride;
      for (int64_t c = threadIdx.x; c < inner; c += blockDim.x)
        dst[c] = src[c];
    } else {
      for (int64_t c = threadIdx.x; c < inner; c += blockDim.x)
        dst[c] = bad_value<T>();
    }
  }
}

// The row path's shape when a gather or scatter has one: the dims after
// at.dim are contiguous in the indexed tensor and the index varies along
// at.dim only. inner is the row.
struct GatherRows {
  bool ok = false;
  StridedGeometry outer;
  int64_t n = 1, rows = 1, inner = 1, index_stride = 0;
};

GatherRows gather_rows(const IndexedDim& at, const Tensor& index) {
  GatherRows g;
  if (at.lines.rank == 0) return g;
  const int d = at.dim;
  int64_t expected = 1;
  for (int e = at.lines.rank - 1; e > d; --e) {
    if (at.lines.sizes[e] > 1 && at.lines.strides[e] != expected) return g;
    if (at.lines.sizes[e] > 1 && index.stride(e) != 0) return g;
    expected *= at.lines.sizes[e];
  }
  for (int e = 0; e < d; ++e)
    if (at.lines.sizes[e] > 1 && index.stride(e) != 0) return g;
  g.inner = expected;
  g.n = at.lines.sizes[d];
  g.index_stride = index.stride(d);
  g.outer.rank = d;
  for (int e = 0; e < d; ++e) {
    g.outer.sizes[e] = at.lines.sizes[e];
    g.outer.strides[e] = at.lines.strides[e];
    g.rows *= at.lines.sizes[e];
  }
  g.rows *= g.n;
  // Rows shorter than a warp copy faster one element per thread.
  g.ok = g.inner >= 32;
  return g;
}

// ---- scatter-add ----------------------------------------------------------------------

// (destination, position) pairs for the sort; a bad index's destination is
// `none` (out's size), which sorts last and is skipped.
__global__ void scatter_keys_kernel(IndexedDim at, IndexReader index, int64_t n, int64_t none,
                                    int64_t* __restrict__ keys, int32_t* __restrict__ positions) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = index(j);
    keys[j] = v >= 0 && v < at.size ? at.lines.offset_of(j) + v * at.stride : none;
    positions[j] = static_cast<int32_t>(j);
  }
}

// dst = dst + alpha * acc, rounded once. Integers wrap as the integer add
// would, with no signed overflow.
template <class T, class A>
__device__ __forceinline__ void add_scaled(T& dst, A acc, A alpha) {
  if constexpr (std::is_integral_v<A>) {
    const auto scaled =
        static_cast<uint64_t>(acc) * static_cast<uint64_t>(static_cast<int64_t>(alpha));
    dst = static_cast<T>(static_cast<uint64_t>(dst) + scaled);
  } else {
    dst = cu::convert<T>(cu::convert<A>(dst) + alpha * acc);
  }
}

// The thread at the first sorted entry of each destination sums that run's
// sources in position order (the sort is stable) and writes out once.
template <class T, class A>
__global__ void scatter_runs_kernel(const T* __restrict__ src, const int64_t* __restrict__ keys,
                                    const int32_t* __restrict__ positions, int64_t n, int64_t none,
                                    A alpha, T* __restrict__ out) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t key = keys[p];
    if (key == none || (p > 0 && keys[p - 1] == key)) continue;
    A acc = 0;
    for (int64_t q = p; q < n && keys[q] == key; ++q)
      acc += cu::convert<A>(src[positions[q]]);
    add_scaled(out[key], acc, alpha);
  }
}

// Whole rows (index_add, and any scatter whose index varies along dim only,
// over rows of the output contiguous in it: the GatherRows shape): only the
// n indices are sorted, and the thread of (first sorted entry of a run, outer
// o, column c) sums that run's source rows at column c in position order.
__global__ void scatter_row_keys_kernel(const int64_t* __restrict__ index, int64_t index_stride,
                                        int64_t n, int64_t size, int64_t* __restrict__ keys,
                                        int32_t* __restrict__ positions) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = index[i * index_stride];
    keys[i] = v >= 0 && v < size ? v : size;
    positions[i] = static_cast<int32_t>(i);
  }
}

// by_entry splits a thread's index j into (sorted entry p, o * inner + c) and
// by_column that into (o, c): fast divisions (Note [Fast division]), not two
// 64-bit ones per element.
template <class T, class A>
__global__ void scatter_rows_kernel(const T* __restrict__ src, const int64_t* __restrict__ keys,
                                    const int32_t* __restrict__ positions, int64_t n,
                                    StridedGeometry outer, int64_t total, RowSplitter by_entry,
                                    RowSplitter by_column, int64_t inner, int64_t stride,
                                    int64_t size, A alpha, T* __restrict__ out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < total;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t p, oc, o, c;
    by_entry.split(j, p, oc);
    const int64_t key = keys[p];
    if (key == size || (p > 0 && keys[p - 1] == key)) continue;
    by_column.split(oc, o, c);
    A acc = 0;
    for (int64_t q = p; q < n && keys[q] == key; ++q)
      acc += cu::convert<A>(src[(o * n + positions[q]) * inner + c]);
    add_scaled(out[outer.offset_of(o) + key * stride + c], acc, alpha);
  }
}

// ---- cumsum --------------------------------------------------------------------------

// One thread per (outer, inner) line, walking its n elements in order.
template <class T, class A>
__global__ void cumsum_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t inner,
                              bool reverse, T* __restrict__ out) {
  const int64_t lines = outer * inner;
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = l / inner, c = l - o * inner;
    A acc = 0;
    for (int64_t step = 0; step < n; ++step) {
      const int64_t at = (o * n + (reverse ? n - 1 - step : step)) * inner + c;
      acc += cu::convert<A>(x[at]);
      out[at] = cu::convert<T>(acc);
    }
  }
}

// Rows (inner == 1, the common last-dim case): one warp per row, 32 elements
// a step scanned by shuffles and carried into the next step. The additions'
// order is fixed by n alone, so the result is deterministic; integer sums are
// exact, float ones round differently from the CPU's sequential double sum.
template <class T, class A>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t n, bool reverse,
                                   T* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; row < rows;
       row += warps) {
    const T* in = x + row * n;
    T* o = out + row * n;
    A carry = 0;
    for (int64_t base = 0; base < n; base += 32) {
      const int64_t step = base + lane;
      const int64_t i = reverse ? n - 1 - step : step;
      A v = step < n ? cu::convert<A>(in[i]) : A(0);
      for (int offset = 1; offset < 32; offset <<= 1) {
        const A up = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += up;
      }
      v += carry;
      if (step < n) o[i] = cu::convert<T>(v);
      carry = __shfl_sync(0xffffffffu, v, 31);
    }
  }
}

// Whether a row gather can move 16-byte vectors of k elements: both bases
// aligned and every offset (row length, the indexed stride, the outer
// strides) a whole number of vectors.
bool vector_rows(const Tensor& x, const Tensor& out, const GatherRows& rows, int64_t stride,
                 int64_t k) {
  if (k <= 1 || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 != 0 || rows.inner % k != 0 ||
      stride % k != 0)
    return false;
  for (int e = 0; e < rows.outer.rank; ++e)
    if (rows.outer.strides[e] % k != 0) return false;
  return true;
}

StridedGeometry scaled(StridedGeometry g, int64_t k) {
  for (int e = 0; e < g.rank; ++e)
    g.strides[e] /= k;
  return g;
}

template <class U>
void launch_gather_rows(const U* x, const StridedGeometry& outer, int64_t stride, int64_t size,
                        const Tensor& index, const GatherRows& rows, int64_t inner, U* out,
                        int dev) {
  const int threads = static_cast<int>(std::min<int64_t>(256, (inner + 31) / 32 * 32));
  // One wave of blocks that loop over the rows: a block a row spends about as
  // long being scheduled as copying a short row (index_select of 4 KB rows ran
  // at 47% of the copy rate, 1.75x PyTorch's time: bench/RESULTS.md, the
  // twenty-fifth session).
  const int64_t wave = static_cast<int64_t>(cu::sm_count(dev)) * (2048 / threads);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows.rows, wave));
  gather_rows_kernel<U><<<blocks, threads, 0, cu::stream_for(dev)>>>(
      x, outer, stride, size, static_cast<const int64_t*>(index.data_ptr()), rows.index_stride,
      rows.n, rows.rows, inner, out);
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace

// ---- the backend functions -------------------------------------------------------------

void gather(const Tensor& x, const IndexedDim& at, const Tensor& index, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const int64_t n = out.numel();
  const GatherRows rows = gather_rows(at, index);
  cu::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (rows.ok) {
      // Rows of whole 16-byte vectors copy as such (a bad index's all-ones
      // bytes are the same in either unit, except bool's true).
      constexpr int64_t k = 16 / static_cast<int64_t>(sizeof(T));
      if (!std::is_same_v<T, bool> && vector_rows(x, out, rows, at.stride, k)) {
        launch_gather_rows(static_cast<const uint4*>(x.data_ptr()), scaled(rows.outer, k),
                           at.stride / k, at.size, index, rows, rows.inner / k,
                           static_cast<uint4*>(out.data_ptr()), dev);
      } else {
        launch_gather_rows(static_cast<const T*>(x.data_ptr()), rows.outer, at.stride, at.size,
                           index, rows, rows.inner, static_cast<T*>(out.data_ptr()), dev);
      }
      return;
    }
    std::vector<int64_t> lines(static_cast<size_t>(at.lines.rank));
    for (int e = 0; e < at.lines.rank; ++e)
      lines[static_cast<size_t>(e)] = at.lines.strides[e];
    const CollapsedGeometry<3> g =
        collapse_geometry<3>(out.shape(), {&out.strides(), &index.strides(), &lines}, "gather");
    gather_kernel<T><<<cu::grid_for(n, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
        static_cast<const T*>(x.data_ptr()), g, at.stride, at.size,
        static_cast<const int64_t*>(index.data_ptr()), n, static_cast<T*>(out.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });
}

void scatter_add(const Tensor& index, const Tensor& src, double alpha, const IndexedDim& at,
                 const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  // Rows sort only the n indices; otherwise every source gets its destination.
  const GatherRows rows = gather_rows(at, index);
  const int64_t n = rows.ok ? rows.n : src.numel();
  const int64_t none = rows.ok ? at.size : out.numel();
  ACCRUE_CHECK(n <= std::numeric_limits<int32_t>::max(), "scatter_add: ", n,
               " sources exceed the 32-bit positions of the CUDA sort");
  const Device device = Device::cuda(dev);
  Tensor keys = empty({2, n}, DType::i64, device);
  Tensor positions = empty({2, n}, DType::i32, device);
  int64_t* keys_in = keys.data<int64_t>();
  int64_t* keys_out = keys_in + n;
  int32_t* positions_in = positions.data<int32_t>();
  int32_t* positions_out = positions_in + n;
  if (rows.ok) {
    scatter_row_keys_kernel<<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const int64_t*>(index.data_ptr()), rows.index_stride, n, none, keys_in,
        positions_in);
  } else {
    scatter_keys_kernel<<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
        at, index_reader(index), n, none, keys_in, positions_in);
  }
  ACCRUE_LAUNCH_CHECK();
  // Only the bits a destination (or `none`) can have are sorted.
  const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(none))));
  const int num_items = static_cast<int>(n);
  size_t temp_bytes = 0;
  ACCRUE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                    positions_in, positions_out, num_items, 0,
                                                    end_bit, stream));
  Tensor temp =
      empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::boolean, device);
  ACCRUE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in, keys_out,
                                                    positions_in, positions_out, num_items, 0,
                                                    end_bit, stream));
  const auto runs = [&](auto tag, auto acc_tag) {
    using T = decltype(tag);
    using A = decltype(acc_tag);
    const T* s = static_cast<const T*>(src.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (rows.ok) {
      const int64_t per_entry = rows.rows / rows.n * rows.inner;
      const int64_t total = n * per_entry;
      if (total == 0) return;  // an empty outer dim: nothing to add, no divider of 0
      scatter_rows_kernel<T, A><<<cu::grid_for(total, kThreads), kThreads, 0, stream>>>(
          s, keys_out, positions_out, n, rows.outer, total, RowSplitter(total, per_entry),
          RowSplitter(per_entry, rows.inner), rows.inner, at.stride, none, static_cast<A>(alpha),
          o);
    } else {
      scatter_runs_kernel<T, A><<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
          s, keys_out, positions_out, n, none, static_cast<A>(alpha), o);
    }
    ACCRUE_LAUNCH_CHECK();
  };
  if (out.dtype() == DType::i64) {
    runs(int64_t{}, int64_t{});
  } else if (out.dtype() == DType::i32) {
    runs(int32_t{}, int64_t{});
  } else {
    cu::visit_float_dtype(out.dtype(), "scatter_add", [&](auto tag) {
      using T = decltype(tag);
      runs(T{}, std::conditional_t<std::is_same_v<T, double>, double, float>{});
    });
  }
}

void cumsum(const Tensor& x, bool reverse, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const int64_t outer = x.size(0), n = x.size(1), inner = x.size(2);
  const auto launch = [&](auto tag, auto acc_tag) {
    using T = decltype(tag);
    using A = decltype(acc_tag);
    if (inner == 1) {
      cumsum_rows_kernel<T, A>
          <<<cu::grid_for(outer * 32, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
              static_cast<const T*>(x.data_ptr()), outer, n, reverse,
              static_cast<T*>(out.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
      return;
    }
    cumsum_kernel<T, A>
        <<<cu::grid_for(outer * inner, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
            static_cast<const T*>(x.data_ptr()), outer, n, inner, reverse,
            static_cast<T*>(out.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  };
  if (x.dtype() == DType::i64) {
    launch(int64_t{}, int64_t{});
    return;
  }
  cu::visit_float_dtype(x.dtype(), "cumsum", [&](auto tag) {
    using T = decltype(tag);
    launch(T{}, std::conditional_t<std::is_same_v<T, double>, double, float>{});
  });
}

}  // namespace accrue::kernels::cuda
