// CUDA fused batch normalization (Note [Fused batch norm kernels],
// kernels/batch_norm.h). Forward: per-chunk shifted sums, a per-channel
// combine that folds weight and bias into scale and shift, the elementwise
// pass. Backward: per-chunk sums of g and g (x - mean), a per-channel combine
// into dweight, dbias and the dx coefficients, the elementwise pass.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/core/device_scope.h"
#include "accrue/kernels/batch_norm_backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

constexpr int kThreads = 256;

// V elements loaded or stored as one 16-byte (or V-element) access.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Note [Batch norm packs]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The passes over x read and write V elements at once (16 bytes: 8 bf16,
// 4 f32, 2 f64) where the layout allows it, with 32-bit index math where the
// tensor is small enough: at one element per access and 64-bit divisions per
// element the kernels reached about a third of the H100's bandwidth. A pack
// of V consecutive elements is either V consecutive channels of one row
// (channels-last: inner == 1, channels % V == 0) or V positions of one
// channel (inner % V == 0). Otherwise V = 1. The sums stay in the same
// fixed order for a given shape, so results are still bitwise repeatable.

// The two per-chunk sums, for the statistics: v - shift and its square
// (shift: the channel's first value, Note [Fused batch norm kernels]).
template <class T, class A>
struct StatsTerms {
  const T* x;
  const A* shift;
  // V elements of channel c from offset k.
  template <int V, class I>
  __device__ void same(I k, I c, A& s1, A& s2) const {
    const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(x + k);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const A d = reduce::load<A>(p.v[v]) - shift[c];
      s1 += d;
      s2 += d * d;
    }
  }
  // Channels c0 .. c0 + V - 1 of one row, from offset k.
  template <int V, class I>
  __device__ void spread(I k, I c0, A* s1, A* s2) const {
    const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(x + k);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const A d = reduce::load<A>(p.v[v]) - shift[c0 + v];
      s1[v] += d;
      s2[v] += d * d;
    }
  }
};

// For the backward: g and g (x - mean).
template <class T, class A>
struct BackwardTerms {
  const T* g;
  const T* x;
  const A* mean;
  template <int V, class I>
  __device__ void same(I k, I c, A& s1, A& s2) const {
    const Pack<T, V> gp = *reinterpret_cast<const Pack<T, V>*>(g + k);
    const Pack<T, V> xp = *reinterpret_cast<const Pack<T, V>*>(x + k);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const A gv = reduce::load<A>(gp.v[v]);
      s1 += gv;
      s2 += gv * (reduce::load<A>(xp.v[v]) - mean[c]);
    }
  }
  template <int V, class I>
  __device__ void spread(I k, I c0, A* s1, A* s2) const {
    const Pack<T, V> gp = *reinterpret_cast<const Pack<T, V>*>(g + k);
    const Pack<T, V> xp = *reinterpret_cast<const Pack<T, V>*>(x + k);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const A gv = reduce::load<A>(gp.v[v]);
      s1[v] += gv;
      s2[v] += gv * (reduce::load<A>(xp.v[v]) - mean[c0 + v]);
    }
  }
};

// partials[(chunk C + c) 2 + {0, 1}]: the chunk's two sums for channel c.
// inner > 1: block (c, chunk), threads over the chunk's packs of V positions
// (inner % V == 0); a block sum in a fixed order.
template <class A, int V, class I, class Terms>
__global__ void chunk_sums_kernel(Terms terms, I outer, I channels, I inner, I outer_per_chunk,
                                  A* __restrict__ partials) {
  __shared__ A scratch[32];
  const I c = blockIdx.x, chunk = blockIdx.y;
  const I o0 = chunk * outer_per_chunk;
  const I o1 = o0 + outer_per_chunk < outer ? o0 + outer_per_chunk : outer;
  const I packs = (o1 - o0) * (inner / V);
  A s1 = 0, s2 = 0;
  for (I j = threadIdx.x; j < packs; j += blockDim.x) {
    const I e = j * V;  // element index within the chunk
    terms.template same<V>(((o0 + e / inner) * channels + c) * inner + e % inner, c, s1, s2);
  }
  s1 = reduce::block_sum(s1, scratch);
  s2 = reduce::block_sum(s2, scratch);
  if (threadIdx.x == 0) {
    partials[(static_cast<int64_t>(chunk) * channels + c) * 2] = s1;
    partials[(static_cast<int64_t>(chunk) * channels + c) * 2 + 1] = s2;
  }
}

// Channels-last (inner == 1, channels % V == 0): a thread holds a pack of V
// channels; a block is `lanes` packs across x `kThreads / lanes` rows, grid
// (channel tiles of lanes V, chunks); each thread walks every
// (kThreads / lanes)-th row of the chunk, and the row lanes are summed in order.
template <class A, int V, class I, class Terms>
__global__ void chunk_sums_rows_kernel(Terms terms, I rows, I channels, I rows_per_chunk, int lanes,
                                       A* __restrict__ partials) {
  __shared__ A sums[2][kThreads * V];
  const int tx = threadIdx.x % lanes, ty = threadIdx.x / lanes, row_lanes = kThreads / lanes;
  const I c0 = (static_cast<I>(blockIdx.x) * lanes + tx) * V, chunk = blockIdx.y;
  const I r0 = chunk * rows_per_chunk;
  const I r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A s1[V] = {}, s2[V] = {};
  if (c0 < channels)
    for (I r = r0 + ty; r < r1; r += row_lanes)
      terms.template spread<V>(r * channels + c0, c0, s1, s2);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    sums[0][threadIdx.x * V + v] = s1[v];
    sums[1][threadIdx.x * V + v] = s2[v];
  }
  __syncthreads();
  if (ty != 0 || c0 >= channels) return;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    A t1 = 0, t2 = 0;
    for (int y = 0; y < row_lanes; ++y) {
      t1 += sums[0][(y * lanes + tx) * V + v];
      t2 += sums[1][(y * lanes + tx) * V + v];
    }
    partials[(static_cast<int64_t>(chunk) * channels + c0 + v) * 2] = t1;
    partials[(static_cast<int64_t>(chunk) * channels + c0 + v) * 2 + 1] = t2;
  }
}

// The per-channel combines run on blocks of kCombineThreads: kCombineLanes
// channels across, kCombineRows rows of chunks down.
constexpr int kCombineLanes = 32, kCombineRows = 16, kCombineThreads = kCombineLanes * kCombineRows;

unsigned combine_grid(int64_t channels) {
  return static_cast<unsigned>((channels + kCombineLanes - 1) / kCombineLanes);
}

// The chunks' sums of one channel, combined in double in a fixed order: row r
// adds chunks r, r + kCombineRows, ...; row 0 then adds the row sums in
// order. One thread per channel walking every chunk serially took 70 us per
// call in ResNet-50 (528 chunks of 64 channels), longer than the chunk sums
// themselves. Every thread of the block calls this; it returns true on the
// thread that holds channel *c's sums.
template <class A>
__device__ bool combine(const A* partials, int64_t chunks, int64_t channels, int64_t* c, double* s1,
                        double* s2) {
  __shared__ double sums[2][kCombineRows][kCombineLanes];
  const int tx = threadIdx.x % kCombineLanes, ty = threadIdx.x / kCombineLanes;
  *c = blockIdx.x * static_cast<int64_t>(kCombineLanes) + tx;
  double t1 = 0.0, t2 = 0.0;
  if (*c < channels) {
#pragma unroll 4
    for (int64_t k = ty; k < chunks; k += kCombineRows) {
      t1 += static_cast<double>(partials[(k * channels + *c) * 2]);
      t2 += static_cast<double>(partials[(k * channels + *c) * 2 + 1]);
    }
  }
  sums[0][ty][tx] = t1;
  sums[1][ty][tx] = t2;
  __syncthreads();
  if (ty != 0 || *c >= channels) return false;
  t1 = 0.0;
  t2 = 0.0;
  for (int y = 0; y < kCombineRows; ++y) {
    t1 += sums[0][y][tx];
    t2 += sums[1][y][tx];
  }
  *s1 = t1;
  *s2 = t2;
  return true;
}

// shift[c] = the channel's first value (element (0, c, 0)).
template <class T, class A>
__global__ void channel_shift_kernel(const T* __restrict__ x, int64_t channels, int64_t inner,
                                     A* __restrict__ shift) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c < channels) shift[c] = reduce::load<A>(x[c * inner]);
}

// Per channel: mean, var, invstd, and coef = {scale, offset} with
// out = x scale + offset.
template <class T, class A>
__global__ void forward_combine_kernel(const A* __restrict__ partials, int64_t chunks,
                                       int64_t channels, double n, double eps,
                                       const A* __restrict__ shift, const T* __restrict__ weight,
                                       const T* __restrict__ bias, A* __restrict__ mean,
                                       A* __restrict__ var, A* __restrict__ invstd,
                                       A* __restrict__ coef) {
  int64_t c;
  double s1, s2;
  if (!combine(partials, chunks, channels, &c, &s1, &s2)) return;
  const double d = s1 / n;
  const double v = fmax(s2 / n - d * d, 0.0);
  const double m = static_cast<double>(shift[c]) + d;
  const double r = 1.0 / sqrt(v + eps);
  const double scale = static_cast<double>(reduce::load<A>(weight[c])) * r;
  mean[c] = static_cast<A>(m);
  var[c] = static_cast<A>(v);
  invstd[c] = static_cast<A>(r);
  coef[c] = static_cast<A>(scale);
  coef[channels + c] = static_cast<A>(static_cast<double>(reduce::load<A>(bias[c])) - m * scale);
}

// Per channel: dbias, dweight, and coef = {a, b, g_mean} with
// dx = a (g - g_mean) + b (x - mean).
template <class T, class A>
__global__ void backward_combine_kernel(const A* __restrict__ partials, int64_t chunks,
                                        int64_t channels, double n, const T* __restrict__ weight,
                                        const A* __restrict__ invstd, A* __restrict__ dweight,
                                        A* __restrict__ dbias, A* __restrict__ coef) {
  int64_t c;
  double sum_g, sum_gx;
  if (!combine(partials, chunks, channels, &c, &sum_g, &sum_gx)) return;
  const double r = static_cast<double>(invstd[c]);
  const double w = static_cast<double>(reduce::load<A>(weight[c]));
  dbias[c] = static_cast<A>(sum_g);
  dweight[c] = static_cast<A>(sum_gx * r);
  coef[c] = static_cast<A>(w * r);
  coef[channels + c] = static_cast<A>(-w * r * r * r * sum_gx / n);
  coef[2 * channels + c] = static_cast<A>(sum_g / n);
}

// The channel of pack j's first element (Note [Batch norm packs]); the pack's
// element v is in channel c0 + v when inner == 1, else in c0.
template <int V, class I>
__device__ __forceinline__ I first_channel(I j, I channels, I inner) {
  return inner == 1 ? (j * V) % channels : (j * V / inner) % channels;
}

template <class T, class A, int V, class I>
__global__ void normalize_kernel(const T* __restrict__ x, const A* __restrict__ coef, I packs,
                                 I channels, I inner, T* __restrict__ out) {
  using P = Pack<T, V>;
  for (I j = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; j < packs;
       j += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c0 = first_channel<V>(j, channels, inner);
    const P xp = reinterpret_cast<const P*>(x)[j];
    P yp;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const I c = inner == 1 ? c0 + v : c0;
      yp.v[v] = cu::convert<T>(reduce::load<A>(xp.v[v]) * coef[c] + coef[channels + c]);
    }
    reinterpret_cast<P*>(out)[j] = yp;
  }
}

template <class T, class A, int V, class I>
__global__ void input_grad_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                  const A* __restrict__ mean, const A* __restrict__ coef, I packs,
                                  I channels, I inner, T* __restrict__ dx) {
  using P = Pack<T, V>;
  for (I j = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; j < packs;
       j += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c0 = first_channel<V>(j, channels, inner);
    const P gp = reinterpret_cast<const P*>(g)[j];
    const P xp = reinterpret_cast<const P*>(x)[j];
    P dp;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const I c = inner == 1 ? c0 + v : c0;
      dp.v[v] = cu::convert<T>(coef[c] * (reduce::load<A>(gp.v[v]) - coef[2 * channels + c]) +
                               coef[channels + c] * (reduce::load<A>(xp.v[v]) - mean[c]));
    }
    reinterpret_cast<P*>(dx)[j] = dp;
  }
}

// Note [Batch norm packs]: the pack size for x's dtype and layout.
int pack_size(DType dtype, const BatchNormLayout& l) {
  const int64_t v = 16 / static_cast<int64_t>(element_size(dtype));
  return (l.inner == 1 ? l.channels % v : l.inner % v) == 0 ? static_cast<int>(v) : 1;
}

// How the per-chunk sums split the work: about 4 blocks per SM, never more
// chunks than rows, from the shape and the SM count only (Note [Determinism]).
struct Chunking {
  int64_t chunks = 1, per_chunk = 1;  // per_chunk: outer indices (rows) per chunk
  unsigned channel_blocks = 1;
  int lanes = 1;  // channels-last: packs of channels across a block
};
Chunking chunking(const BatchNormLayout& l, int v, int device) {
  Chunking k;
  int64_t min_rows = 1;  // at least a block's worth of values per chunk where there are enough
  if (l.inner == 1) {
    const int64_t packs = l.channels / v;
    k.lanes = static_cast<int>(std::min<int64_t>(32, packs));
    k.channel_blocks = static_cast<unsigned>((packs + k.lanes - 1) / k.lanes);
    min_rows = 4 * (kThreads / k.lanes);
  } else {
    k.channel_blocks = static_cast<unsigned>(l.channels);
    min_rows = (kThreads * v + l.inner - 1) / l.inner;
  }
  const int64_t target = 4 * static_cast<int64_t>(cu::sm_count(device));
  int64_t chunks = std::max<int64_t>(1, (target + k.channel_blocks - 1) / k.channel_blocks);
  chunks = std::min(chunks, std::max<int64_t>(1, l.outer / min_rows));
  k.per_chunk = (l.outer + chunks - 1) / chunks;
  k.chunks = (l.outer + k.per_chunk - 1) / k.per_chunk;
  return k;
}

template <class T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// What both directions launch with: the device made current, its stream, the
// pack size, the chunking, and a scratch buffer of the accumulation dtype
// with 3 [C] vectors followed by the partials [chunks, C, 2].
struct Launch {
  Launch(const Tensor& x, const BatchNormLayout& layout, DType acc)
      : scope(x.device().index),
        stream(cu::stream_for(x.device().index)),
        v(pack_size(x.dtype(), layout)),
        k(chunking(layout, v, x.device().index)),
        layout(layout),
        small(x.numel() <= std::numeric_limits<int32_t>::max()),
        n(static_cast<double>(layout.outer * layout.inner)),
        scratch(empty({layout.channels * (3 + 2 * k.chunks)}, acc, x.device())) {}
  template <class A>
  A* vectors() const {  // 3 [C]
    return data<A>(scratch);
  }
  template <class A>
  A* partials() const {
    return data<A>(scratch) + 3 * layout.channels;
  }
  // f(std::integral_constant<int, V>{}, I{}): the pack size and index type as types.
  template <int VMax, class F>
  void visit(F&& f) const {
    auto with_index = [&](auto pack) {
      if (small) {
        f(pack, int32_t{});
      } else {
        f(pack, int64_t{});
      }
    };
    if (v == VMax) {
      with_index(std::integral_constant<int, VMax>{});
    } else {
      with_index(std::integral_constant<int, 1>{});
    }
  }
  unsigned elementwise_grid() const {
    return cu::grid_for((layout.outer * layout.channels * layout.inner) / v, kThreads);
  }
  cu::DeviceScope scope;
  cudaStream_t stream;
  int v;
  Chunking k;
  BatchNormLayout layout;
  bool small;  // 32-bit indices
  double n;    // values per channel
  Tensor scratch;
};

template <class A, int V, class I, class Terms>
void launch_chunk_sums(const Terms& terms, const Launch& l, A* partials) {
  const dim3 grid(l.k.channel_blocks, static_cast<unsigned>(l.k.chunks));
  const BatchNormLayout& s = l.layout;
  if (s.inner == 1) {
    chunk_sums_rows_kernel<A, V, I><<<grid, kThreads, 0, l.stream>>>(
        terms, static_cast<I>(s.outer), static_cast<I>(s.channels), static_cast<I>(l.k.per_chunk),
        l.k.lanes, partials);
  } else {
    chunk_sums_kernel<A, V, I><<<grid, kThreads, 0, l.stream>>>(
        terms, static_cast<I>(s.outer), static_cast<I>(s.channels), static_cast<I>(s.inner),
        static_cast<I>(l.k.per_chunk), partials);
  }
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const BatchNormLayout& layout, const Tensor& out, const Tensor& mean,
                        const Tensor& var, const Tensor& invstd) {
  const Launch l(x, layout, mean.dtype());
  const int64_t channels = layout.channels;
  cu::visit_float_dtype(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    A* shift = l.vectors<A>();  // [C], then coef [2 C]
    A* coef = shift + channels;
    A* partials = l.partials<A>();
    const unsigned channel_grid = cu::grid_for(channels, kThreads);
    channel_shift_kernel<T, A>
        <<<channel_grid, kThreads, 0, l.stream>>>(data<T>(x), channels, layout.inner, shift);
    ACCRUE_LAUNCH_CHECK();
    l.visit<16 / sizeof(T)>([&](auto pack, auto index) {
      constexpr int V = decltype(pack)::value;
      using I = decltype(index);
      launch_chunk_sums<A, V, I>(StatsTerms<T, A>{data<T>(x), shift}, l, partials);
      forward_combine_kernel<T, A><<<combine_grid(channels), kCombineThreads, 0, l.stream>>>(
          partials, l.k.chunks, channels, l.n, eps, shift, data<T>(weight), data<T>(bias),
          data<A>(mean), data<A>(var), data<A>(invstd), coef);
      ACCRUE_LAUNCH_CHECK();
      normalize_kernel<T, A, V, I><<<l.elementwise_grid(), kThreads, 0, l.stream>>>(
          data<T>(x), coef, static_cast<I>(x.numel() / V), static_cast<I>(channels),
          static_cast<I>(layout.inner), data<T>(out));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, const BatchNormLayout& layout,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const Launch l(x, layout, mean.dtype());
  const int64_t channels = layout.channels;
  cu::visit_float_dtype(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    A* coef = l.vectors<A>();  // [3 C]
    A* partials = l.partials<A>();
    l.visit<16 / sizeof(T)>([&](auto pack, auto index) {
      constexpr int V = decltype(pack)::value;
      using I = decltype(index);
      launch_chunk_sums<A, V, I>(BackwardTerms<T, A>{data<T>(grad), data<T>(x), data<A>(mean)}, l,
                                 partials);
      backward_combine_kernel<T, A><<<combine_grid(channels), kCombineThreads, 0, l.stream>>>(
          partials, l.k.chunks, channels, l.n, data<T>(weight), data<A>(invstd), data<A>(dweight),
          data<A>(dbias), coef);
      ACCRUE_LAUNCH_CHECK();
      if (!dx.defined()) return;
      input_grad_kernel<T, A, V, I><<<l.elementwise_grid(), kThreads, 0, l.stream>>>(
          data<T>(grad), data<T>(x), data<A>(mean), coef, static_cast<I>(x.numel() / V),
          static_cast<I>(channels), static_cast<I>(layout.inner), data<T>(dx));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

namespace {

// One block: every thread reads count before thread 0 writes it.
template <class A>
__global__ void merge_statistics_kernel(double* __restrict__ count, double* __restrict__ mean,
                                        double* __restrict__ m2, const A* __restrict__ batch_mean,
                                        const A* __restrict__ batch_var, int64_t channels,
                                        double nb) {
  const double na = count[0], total = na + nb;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const double delta = static_cast<double>(batch_mean[c]) - mean[c];
    mean[c] += delta * nb / total;
    m2[c] += static_cast<double>(batch_var[c]) * nb + delta * delta * na * nb / total;
  }
  __syncthreads();
  if (threadIdx.x == 0) count[0] = total;
}

}  // namespace

void batch_norm_merge_statistics(const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 const Tensor& batch_mean, const Tensor& batch_var,
                                 double batch_count) {
  const int dev = mean.device().index;
  cu::DeviceScope scope(dev);
  auto launch = [&](auto tag) {
    using A = decltype(tag);
    merge_statistics_kernel<A><<<1, kThreads, 0, cu::stream_for(dev)>>>(
        data<double>(count), data<double>(mean), data<double>(m2), data<A>(batch_mean),
        data<A>(batch_var), mean.numel(), batch_count);
    ACCRUE_LAUNCH_CHECK();
  };
  if (batch_mean.dtype() == DType::f64) {
    launch(double{});
  } else {
    launch(float{});
  }
}

namespace {

// One block, as the merge. __dmul_rn / __dadd_rn keep the CPU's roundings
// (no fused multiply-add).
__global__ void adopt_statistics_kernel(double* __restrict__ running_mean,
                                        double* __restrict__ running_var,
                                        double* __restrict__ count, double* __restrict__ mean,
                                        double* __restrict__ m2, int64_t channels,
                                        double momentum) {
  const double n = count[0];
  // Note [Non-finite window statistics]: all channels or none.
  int nonfinite = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x)
    nonfinite |= !isfinite(mean[c]) || !isfinite(m2[c]);
  const bool finite = !__syncthreads_or(nonfinite);
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    if (n > 0.0 && finite) {
      const double unbiased = m2[c] / (n - 1.0);
      if (momentum == 1.0) {
        running_mean[c] = mean[c];
        running_var[c] = unbiased;
      } else {
        running_mean[c] =
            __dadd_rn(__dmul_rn(running_mean[c], 1.0 - momentum), __dmul_rn(mean[c], momentum));
        running_var[c] =
            __dadd_rn(__dmul_rn(running_var[c], 1.0 - momentum), __dmul_rn(unbiased, momentum));
      }
    }
    mean[c] = 0.0;
    m2[c] = 0.0;
  }
  __syncthreads();
  if (threadIdx.x == 0) count[0] = 0.0;
}

}  // namespace

void batch_norm_adopt_statistics(const Tensor& running_mean, const Tensor& running_var,
                                 const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 double momentum) {
  const int dev = mean.device().index;
  cu::DeviceScope scope(dev);
  adopt_statistics_kernel<<<1, kThreads, 0, cu::stream_for(dev)>>>(
      data<double>(running_mean), data<double>(running_var), data<double>(count),
      data<double>(mean), data<double>(m2), mean.numel(), momentum);
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::kernels::cuda
