// CUDA fused batch normalization (Note [Fused batch norm kernels],
// kernels/batch_norm.h). Forward: per-chunk shifted sums, a per-channel
// combine that folds weight and bias into scale and shift, the elementwise
// pass. Backward: per-chunk sums of g and g (x - mean), a per-channel combine
// into dweight, dbias and the dx coefficients, the elementwise pass.
#include <algorithm>

#include "core/cuda_types.cuh"
#include "core/device_scope.h"
#include "kernels/batch_norm_backend.h"
#include "kernels/cuda/block_reduce.cuh"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

constexpr int kThreads = 256;
// Channels-last tiles: 32 channels (a warp, consecutive in memory) x 8 row lanes.
constexpr int kTileChannels = 32;
constexpr int kTileRows = kThreads / kTileChannels;

// The two per-chunk sums of one element, for the statistics: v - shift and
// its square (shift: the channel's first value, Note [Fused batch norm kernels]).
template <class T, class A>
struct StatsTerms {
  const T* x;
  const A* shift;  // [C]; null: read x's first value of the channel
  __device__ void operator()(int64_t k, int64_t c, A& s1, A& s2) const {
    const A v = reduce::load<A>(x[k]) - shift[c];
    s1 += v;
    s2 += v * v;
  }
};

// For the backward: g and g (x - mean).
template <class T, class A>
struct BackwardTerms {
  const T* g;
  const T* x;
  const A* mean;
  __device__ void operator()(int64_t k, int64_t c, A& s1, A& s2) const {
    const A gv = reduce::load<A>(g[k]);
    s1 += gv;
    s2 += gv * (reduce::load<A>(x[k]) - mean[c]);
  }
};

// partials[(chunk C + c) 2 + {0, 1}]: the chunk's two sums for channel c.
// Contiguous-like layout (inner > 1): block (c, chunk), threads over the
// chunk's (o, i) pairs; a block sum in a fixed order.
template <class A, class Terms>
__global__ void chunk_sums_kernel(Terms terms, int64_t outer, int64_t channels, int64_t inner,
                                  int64_t outer_per_chunk, A* __restrict__ partials) {
  __shared__ A scratch[32];
  const int64_t c = blockIdx.x, chunk = blockIdx.y;
  const int64_t o0 = chunk * outer_per_chunk;
  const int64_t o1 = o0 + outer_per_chunk < outer ? o0 + outer_per_chunk : outer;
  const int64_t count = (o1 - o0) * inner;
  A s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t o = o0 + j / inner, i = j % inner;
    terms((o * channels + c) * inner + i, c, s1, s2);
  }
  s1 = reduce::block_sum(s1, scratch);
  s2 = reduce::block_sum(s2, scratch);
  if (threadIdx.x == 0) {
    partials[(chunk * channels + c) * 2] = s1;
    partials[(chunk * channels + c) * 2 + 1] = s2;
  }
}

// Channels-last (inner == 1): block (tile of 32 channels, chunk) of 32 x 8
// threads, lane x a channel, lane y every 8th row of the chunk; the 8 row
// lanes summed in order.
template <class A, class Terms>
__global__ void chunk_sums_rows_kernel(Terms terms, int64_t rows, int64_t channels,
                                       int64_t rows_per_chunk, A* __restrict__ partials) {
  __shared__ A sums[2][kTileRows][kTileChannels + 1];
  const int tx = threadIdx.x % kTileChannels, ty = threadIdx.x / kTileChannels;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileChannels + tx, chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A s1 = 0, s2 = 0;
  if (c < channels)
    for (int64_t r = r0 + ty; r < r1; r += kTileRows)
      terms(r * channels + c, c, s1, s2);
  sums[0][ty][tx] = s1;
  sums[1][ty][tx] = s2;
  __syncthreads();
  if (ty == 0 && c < channels) {
    A t1 = 0, t2 = 0;
    for (int y = 0; y < kTileRows; ++y) {
      t1 += sums[0][y][tx];
      t2 += sums[1][y][tx];
    }
    partials[(chunk * channels + c) * 2] = t1;
    partials[(chunk * channels + c) * 2 + 1] = t2;
  }
}

// The chunks' sums of channel c, combined in chunk order in double.
template <class A>
__device__ void combine(const A* partials, int64_t chunks, int64_t channels, int64_t c, double* s1,
                        double* s2) {
  double t1 = 0.0, t2 = 0.0;
  for (int64_t k = 0; k < chunks; ++k) {
    t1 += static_cast<double>(partials[(k * channels + c) * 2]);
    t2 += static_cast<double>(partials[(k * channels + c) * 2 + 1]);
  }
  *s1 = t1;
  *s2 = t2;
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
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double s1, s2;
  combine(partials, chunks, channels, c, &s1, &s2);
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
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double sum_g, sum_gx;
  combine(partials, chunks, channels, c, &sum_g, &sum_gx);
  const double r = static_cast<double>(invstd[c]);
  const double w = static_cast<double>(reduce::load<A>(weight[c]));
  dbias[c] = static_cast<A>(sum_g);
  dweight[c] = static_cast<A>(sum_gx * r);
  coef[c] = static_cast<A>(w * r);
  coef[channels + c] = static_cast<A>(-w * r * r * r * sum_gx / n);
  coef[2 * channels + c] = static_cast<A>(sum_g / n);
}

__device__ __forceinline__ int64_t channel_of(int64_t k, int64_t channels, int64_t inner) {
  return inner == 1 ? k % channels : (k / inner) % channels;
}

template <class T, class A>
__global__ void normalize_kernel(const T* __restrict__ x, const A* __restrict__ coef, int64_t numel,
                                 int64_t channels, int64_t inner, T* __restrict__ out) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < numel;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = channel_of(k, channels, inner);
    out[k] = cu::convert<T>(reduce::load<A>(x[k]) * coef[c] + coef[channels + c]);
  }
}

template <class T, class A>
__global__ void input_grad_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                  const A* __restrict__ mean, const A* __restrict__ coef,
                                  int64_t numel, int64_t channels, int64_t inner,
                                  T* __restrict__ dx) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < numel;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = channel_of(k, channels, inner);
    const A a = coef[c], b = coef[channels + c], g_mean = coef[2 * channels + c];
    dx[k] = cu::convert<T>(a * (reduce::load<A>(g[k]) - g_mean) +
                           b * (reduce::load<A>(x[k]) - mean[c]));
  }
}

int sm_count(int device) {
  int sms = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// How the per-chunk sums split the work: about 4 blocks per SM, never more
// chunks than rows, from the shape and the SM count only (Note [Determinism]).
struct Chunking {
  int64_t chunks = 1, per_chunk = 1;  // per_chunk: outer indices (rows) per chunk
  unsigned channel_blocks = 1;
};
Chunking chunking(const BatchNormLayout& l, int device) {
  Chunking k;
  k.channel_blocks = static_cast<unsigned>(
      l.inner == 1 ? (l.channels + kTileChannels - 1) / kTileChannels : l.channels);
  const int64_t target = 4 * static_cast<int64_t>(sm_count(device));
  int64_t chunks = std::max<int64_t>(1, (target + k.channel_blocks - 1) / k.channel_blocks);
  // At least a block's worth of values per chunk where there are enough.
  const int64_t min_rows = l.inner == 1 ? 4 * kTileRows : (kThreads + l.inner - 1) / l.inner;
  chunks = std::min(chunks, std::max<int64_t>(1, l.outer / std::max<int64_t>(1, min_rows)));
  k.per_chunk = (l.outer + chunks - 1) / chunks;
  k.chunks = (l.outer + k.per_chunk - 1) / k.per_chunk;
  return k;
}

template <class A, class Terms>
void launch_chunk_sums(const Terms& terms, const BatchNormLayout& l, const Chunking& k, A* partials,
                       cudaStream_t stream) {
  const dim3 grid(k.channel_blocks, static_cast<unsigned>(k.chunks));
  if (l.inner == 1) {
    chunk_sums_rows_kernel<A>
        <<<grid, kThreads, 0, stream>>>(terms, l.outer, l.channels, k.per_chunk, partials);
  } else {
    chunk_sums_kernel<A>
        <<<grid, kThreads, 0, stream>>>(terms, l.outer, l.channels, l.inner, k.per_chunk, partials);
  }
  ACCRUE_LAUNCH_CHECK();
}

template <class T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// What both directions launch with: the device made current, its stream, the
// chunking, and a scratch buffer of the accumulation dtype with 3 [C]
// vectors followed by the partials [chunks, C, 2].
struct Launch {
  Launch(const Tensor& x, const BatchNormLayout& layout, DType acc)
      : scope(x.device().index),
        stream(cu::stream_for(x.device().index)),
        k(chunking(layout, x.device().index)),
        channels(layout.channels),
        numel(x.numel()),
        n(static_cast<double>(layout.outer * layout.inner)),
        scratch(empty({channels * (3 + 2 * k.chunks)}, acc, x.device())) {}
  template <class A>
  A* vectors() const {  // 3 [C]
    return data<A>(scratch);
  }
  template <class A>
  A* partials() const {
    return data<A>(scratch) + 3 * channels;
  }
  cu::DeviceScope scope;
  cudaStream_t stream;
  Chunking k;
  int64_t channels, numel;
  double n;  // values per channel
  Tensor scratch;
};

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const BatchNormLayout& layout, const Tensor& out, const Tensor& mean,
                        const Tensor& var, const Tensor& invstd) {
  const Launch l(x, layout, mean.dtype());
  const cudaStream_t stream = l.stream;
  const int64_t channels = l.channels;
  cu::visit_float_dtype(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    A* shift = l.vectors<A>();  // [C], then coef [2 C]
    A* coef = shift + channels;
    A* partials = l.partials<A>();
    const unsigned channel_grid = cu::grid_for(channels, kThreads);
    channel_shift_kernel<T, A>
        <<<channel_grid, kThreads, 0, stream>>>(data<T>(x), channels, layout.inner, shift);
    ACCRUE_LAUNCH_CHECK();
    launch_chunk_sums<A>(StatsTerms<T, A>{data<T>(x), shift}, layout, l.k, partials, stream);
    forward_combine_kernel<T, A><<<channel_grid, kThreads, 0, stream>>>(
        partials, l.k.chunks, channels, l.n, eps, shift, data<T>(weight), data<T>(bias),
        data<A>(mean), data<A>(var), data<A>(invstd), coef);
    ACCRUE_LAUNCH_CHECK();
    normalize_kernel<T, A><<<cu::grid_for(l.numel, kThreads), kThreads, 0, stream>>>(
        data<T>(x), coef, l.numel, channels, layout.inner, data<T>(out));
    ACCRUE_LAUNCH_CHECK();
  });
}

void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, const BatchNormLayout& layout,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const Launch l(x, layout, mean.dtype());
  const cudaStream_t stream = l.stream;
  const int64_t channels = l.channels;
  cu::visit_float_dtype(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    A* coef = l.vectors<A>();  // [3 C]
    A* partials = l.partials<A>();
    launch_chunk_sums<A>(BackwardTerms<T, A>{data<T>(grad), data<T>(x), data<A>(mean)}, layout, l.k,
                         partials, stream);
    backward_combine_kernel<T, A><<<cu::grid_for(channels, kThreads), kThreads, 0, stream>>>(
        partials, l.k.chunks, channels, l.n, data<T>(weight), data<A>(invstd), data<A>(dweight),
        data<A>(dbias), coef);
    ACCRUE_LAUNCH_CHECK();
    if (!dx.defined()) return;
    input_grad_kernel<T, A><<<cu::grid_for(l.numel, kThreads), kThreads, 0, stream>>>(
        data<T>(grad), data<T>(x), data<A>(mean), coef, l.numel, channels, layout.inner,
        data<T>(dx));
    ACCRUE_LAUNCH_CHECK();
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

}  // namespace accrue::kernels::cuda
