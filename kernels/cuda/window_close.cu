// The CUDA window close (kernels/window_close.h; Note [Window close] in
// optim/window.h):
//   grad_norm_partials_kernel  one read of the gradient arena at memory speed;
//   window_scalar_step_kernel  one thread over the partials and the state;
//   fused_optimizer_kernel     one read-modify-write pass over p, g, m, v.
// Nothing here reads anything back to the host: the three launches can be
// captured in a CUDA graph, and the host reads the state when it wants.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_types.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/elementwise_ops.cuh"  // Pack, load_pack, store_pack, pack_aligned
#include "kernels/window_close_backend.h"

namespace accrue::kernels::cuda {
namespace {

namespace dev = ::accrue::cuda;

constexpr unsigned kFullMask = 0xffffffffu;

// ---- (a) the norm partials ------------------------------------------------------------------

// Note [Norm partials]
// ~~~~~~~~~~~~~~~~~~~~
// One read of the gradient arena gives the sum of squares and the count of
// non-finite elements, bit for bit the same on every run (Note [Determinism]):
// the order of every addition is fixed by the arena's size and the GPU's SM
// count alone.
//  - The arena is cut in packs of 16 bytes (4 floats or 2 doubles). A fixed
//    grid of `rows` blocks (norm_plan: at most kNormBlocksPerSm per SM, so one
//    wave, all resident) gives block b the contiguous packs
//    [b * packs_per_row, (b + 1) * packs_per_row), cut at the end.
//  - In a block, thread t takes packs t, t + T, t + 2T, ... (T threads), loading
//    kNormUnroll of them before using any: 64 bytes in flight per thread, enough
//    to cover the memory latency at full bandwidth. Each element is widened to
//    f64, squared and added in index order; non-finite ones are counted.
//  - The threads combine through a fixed warp butterfly, then warp by warp in
//    order; the block writes row b = (sum of squares, non-finite count).
//  - The few elements after the last whole pack go to row 0's thread 0.
//  - A launch may compute any range of rows (block b computes row
//    first_row + b): the same code on the same elements, so the same bits
//    (Note [Norm rows]).
// A misaligned arena is read with scalar loads in the same pattern: slower,
// same result. The scalar step folds the rows in order.
constexpr int kNormThreads = 512;
constexpr int kNormBlocksPerSm = 2;
constexpr int kNormUnroll = 4;
constexpr int kNormWarps = kNormThreads / 32;

struct NormPlan {
  int64_t rows;
  int64_t packs_per_row;
};

NormPlan norm_plan(int64_t numel, DType dtype, int sms) {
  const int64_t packs = numel / static_cast<int64_t>(16 / element_size(dtype));
  if (packs == 0) return {1, 0};
  const int64_t tile = int64_t{kNormThreads} * kNormUnroll;
  const int64_t max_rows = std::max<int64_t>(1, int64_t{sms} * kNormBlocksPerSm);
  const int64_t rows = std::clamp<int64_t>((packs + tile - 1) / tile, 1, max_rows);
  // A whole number of block widths per row keeps every block's start aligned.
  int64_t per_row = (packs + rows - 1) / rows;
  per_row = (per_row + kNormThreads - 1) / kNormThreads * kNormThreads;
  return {(packs + per_row - 1) / per_row, per_row};
}

int sm_count(int device) {
  int sms = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// Pack k of p, with one 16-byte load when the arena is aligned.
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_any(const T* p, int64_t k, bool vectorized) {
  if (vectorized) return load_pack<V>(p, k);
  Pack<T, V> x;
#pragma unroll
  for (int j = 0; j < V; ++j)
    x.v[j] = p[k * V + j];
  return x;
}

template <class T>
__device__ __forceinline__ void add_square(T x, double& sumsq, unsigned& nonfinite) {
  const double d = static_cast<double>(x);
  sumsq += d * d;
  nonfinite += std::isfinite(x) ? 0u : 1u;
}

template <class T>
__global__ void __launch_bounds__(kNormThreads, kNormBlocksPerSm)
    grad_norm_partials_kernel(const T* __restrict__ grads, int64_t n, int64_t packs_per_row,
                              int64_t first_row, bool vectorized, double* __restrict__ partials) {
  constexpr int V = 16 / sizeof(T);
  const int64_t packs = n / V;
  const int64_t row = first_row + blockIdx.x;  // Note [Norm rows]: launched by ranges
  const int64_t begin = row * packs_per_row;
  const int64_t end = begin + packs_per_row < packs ? begin + packs_per_row : packs;
  double sumsq = 0.0;
  unsigned nonfinite = 0;
  for (int64_t base = begin + threadIdx.x; base < end; base += kNormThreads * kNormUnroll) {
    Pack<T, V> x[kNormUnroll];
#pragma unroll
    for (int u = 0; u < kNormUnroll; ++u) {
      const int64_t k = base + static_cast<int64_t>(u) * kNormThreads;
      x[u] = k < end ? load_any<V>(grads, k, vectorized) : Pack<T, V>{};  // zeros add nothing
    }
#pragma unroll
    for (int u = 0; u < kNormUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        add_square(x[u].v[j], sumsq, nonfinite);
    }
  }
  if (row == 0 && threadIdx.x == 0) {
    for (int64_t i = packs * V; i < n; ++i)
      add_square(grads[i], sumsq, nonfinite);
  }

#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    sumsq += __shfl_xor_sync(kFullMask, sumsq, m);
    nonfinite += __shfl_xor_sync(kFullMask, nonfinite, m);
  }
  __shared__ double warp_sumsq[kNormWarps];
  __shared__ unsigned warp_nonfinite[kNormWarps];
  if (threadIdx.x % 32 == 0) {
    warp_sumsq[threadIdx.x / 32] = sumsq;
    warp_nonfinite[threadIdx.x / 32] = nonfinite;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0, bad = 0.0;
    for (int w = 0; w < kNormWarps; ++w) {
      total += warp_sumsq[w];
      bad += static_cast<double>(warp_nonfinite[w]);
    }
    partials[2 * row] = total;
    partials[2 * row + 1] = bad;
  }
}

template <class T>
void norm_partials_typed(const Tensor& grads, const Tensor& partials, int64_t first_row,
                         int64_t rows) {
  constexpr int V = 16 / sizeof(T);
  const int device = grads.device().index;
  dev::DeviceScope scope(device);
  const NormPlan plan = norm_plan(grads.numel(), grads.dtype(), sm_count(device));
  const T* g = static_cast<const T*>(grads.data_ptr());
  grad_norm_partials_kernel<T>
      <<<static_cast<unsigned>(rows), kNormThreads, 0, dev::stream_for(device)>>>(
          g, grads.numel(), plan.packs_per_row, first_row, pack_aligned<V>(g),
          partials.data<double>());
  ACCRUE_LAUNCH_CHECK();
}

// ---- (b) the scalar step --------------------------------------------------------------------

// One thread: see Note [Window scalar step].
__global__ void window_scalar_step_kernel(const double* partials, int64_t rows, double* state,
                                          CloseConfig config) {
  window_scalar_update(partials, rows, state, config);
}

// One thread: see Note [Scale calibration].
__global__ void calibrate_scale_kernel(const double* amax, double* state, ScalerConfig scaler,
                                       double scale_used, double margin) {
  calibrate_scale_update(*amax, state, scaler, scale_used, margin);
}

// ---- (c) the fused optimizer step -----------------------------------------------------------

// Note [Hyperparameters on the device]: the values arrive as the kernel's argument.
__global__ void store_hyper_kernel(const HyperValues values, double* out) {
  if (threadIdx.x < kHyperSize) out[threadIdx.x] = values.v[threadIdx.x];
}

// Note [Unused parameters]: written flags as the kernel's argument, as the
// hyperparameters travel: no host memory must outlive the call, nothing
// synchronizes, and a captured close replays them.
constexpr int kFlagsPerLaunch = 1024;
struct SlotFlags {
  unsigned char v[kFlagsPerLaunch];
};
__global__ void store_flags_kernel(const __grid_constant__ SlotFlags flags, int count,
                                   double* out) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x))
    out[i] = flags.v[i] != 0 ? 1.0 : 0.0;
}

// One thread per slot; see advance_slot_row.
__global__ void advance_slot_steps_kernel(double beta1, double beta2,
                                          const double* __restrict__ used,
                                          double* __restrict__ rows, int64_t slots,
                                          const double* __restrict__ state) {
  if (state[kFoundInf] != 0.0) return;  // Note [Skipped window]
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < slots && used[i] > 0.0) advance_slot_row(beta1, beta2, rows + 3 * i);
}

constexpr int kStepThreads = 256;

// The compute-copy type of a step that writes none.
struct NoCopy {};

template <class T, class C>
struct StepPointers {
  T* params;
  const T* grads;
  T* exp_avg;         // null when unused
  T* exp_avg_sq;      // null when unused
  T* max_exp_avg_sq;  // null when unused
  C* compute;         // null for NoCopy
  const int32_t* chunk_groups;
  int64_t first_element;  // OptimizerBuffers::first_element
  // Note [Unused parameters]: null chunk_slots for the window-wide step count.
  const int32_t* chunk_slots;
  const double* slot_used;
  const double* slot_steps;  // [slots, 3]
  int64_t slots;
};

// The group of element i. Out-of-range values are clamped rather than checked:
// a check would need a host synchronization (the CPU reference throws).
template <class P>
__device__ __forceinline__ int group_of(const P& ptr, int64_t i, int groups) {
  const int g = ptr.chunk_groups[(ptr.first_element + i) / kChunk];
  return g < 0 ? 0 : (g >= groups ? groups - 1 : g);
}

// The slot of element i (Note [Unused parameters]), clamped as group_of is.
template <class P>
__device__ __forceinline__ int64_t slot_of(const P& ptr, int64_t i) {
  const int64_t k = ptr.chunk_slots[(ptr.first_element + i) / kChunk];
  return k < 0 ? 0 : (k >= ptr.slots ? ptr.slots - 1 : k);
}

// The scalars of element i's update, or false when its slot is unused this
// window (Note [Unused parameters]): then nothing of it is loaded or stored.
template <class T, class P>
__device__ __forceinline__ bool scalars_of(const P& ptr, const StepScalars<T>& s, int group,
                                           int64_t i, UpdateScalars<T>& u) {
  if (ptr.chunk_slots == nullptr) {
    u = window_scalars(s, group);
    return true;
  }
  const int64_t slot = slot_of(ptr, i);
  if (!(ptr.slot_used[slot] > 0.0)) return false;
  u = slot_scalars(s, group, ptr.slot_steps + 3 * slot);
  return true;
}

template <bool kAdam, class T>
__device__ __forceinline__ void update(const OptimizerParams<T>& o, const UpdateScalars<T>& u,
                                       T grad, T& p, T& m, T& v, T& vmax) {
  if constexpr (kAdam) {
    adam_update(o, u, grad, p, m, v, vmax);
  } else {
    sgd_update(o, u, grad, p, m);
  }
}

// Pack k's step: loads the moments the optimizer keeps, updates p in place
// and stores p, the moments and the compute copy.
template <bool kAdam, class T, class C, int V>
__device__ __forceinline__ void step_pack(const OptimizerParams<T>& o, const UpdateScalars<T>& u,
                                          const StepPointers<T, C>& ptr, int64_t k,
                                          const Pack<T, V>& g, Pack<T, V>& p) {
  constexpr bool kCopy = !std::is_same_v<C, NoCopy>;
  const bool has_m = kAdam || o.momentum != T(0);
  const bool has_vmax = kAdam && o.amsgrad;
  Pack<T, V> m{}, v{}, vmax{};
  if (has_m) m = load_pack<V>(ptr.exp_avg, k);
  if (kAdam) v = load_pack<V>(ptr.exp_avg_sq, k);
  if (has_vmax) vmax = load_pack<V>(ptr.max_exp_avg_sq, k);
#pragma unroll
  for (int j = 0; j < V; ++j)
    update<kAdam>(o, u, g.v[j], p.v[j], m.v[j], v.v[j], vmax.v[j]);
  store_pack<V>(ptr.params, k, p);
  if (has_m) store_pack<V>(ptr.exp_avg, k, m);
  if (kAdam) store_pack<V>(ptr.exp_avg_sq, k, v);
  if (has_vmax) store_pack<V>(ptr.max_exp_avg_sq, k, vmax);
  if constexpr (kCopy) {
    Pack<C, V> c;
#pragma unroll
    for (int j = 0; j < V; ++j)
      c.v[j] = dev::convert<C>(p.v[j]);
    store_pack<V>(ptr.compute, k, c);
  }
}

// Note [Step sums]: the vectorized pass that also writes each chunk's row.
// The trip count is the same for every lane of a warp (base is the warp's
// first pack), so all of them take part in each butterfly; a chunk's P packs
// are P neighbouring lanes, and xor offsets below P never leave them.
template <bool kAdam, class T, class C>
__device__ __forceinline__ void step_and_sum(const OptimizerParams<T>& o, const StepScalars<T>& s,
                                             const StepPointers<T, C>& ptr, int64_t n,
                                             double* __restrict__ sums) {
  constexpr int V = 16 / sizeof(T);
  constexpr int P = static_cast<int>(kChunk) / V;  // packs per chunk: 8 (f32), 16 (f64)
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / V;  // a multiple of P: n is whole chunks
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - lane;
       base < packs; base += stride) {
    const int64_t k = base + lane;
    double g2 = 0.0, d2 = 0.0, p2 = 0.0;
    if (k < packs) {
      const Pack<T, V> g = load_pack<V>(ptr.grads, k);
      const Pack<T, V> before = load_pack<V>(ptr.params, k);
      Pack<T, V> p = before;
      UpdateScalars<T> u;
      // An unused slot (Note [Unused parameters]) is read for its sums, never written.
      if (scalars_of(ptr, s, group_of(ptr, k * V, o.groups), k * V, u))
        step_pack<kAdam>(o, u, ptr, k, g, p);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const double x = static_cast<double>(g.v[j]), w = static_cast<double>(before.v[j]);
        const double d = static_cast<double>(p.v[j]) - w;
        g2 += x * x;
        d2 += d * d;
        p2 += w * w;
      }
    }
#pragma unroll
    for (int m = P / 2; m > 0; m >>= 1) {
      g2 += __shfl_xor_sync(kFullMask, g2, m);
      d2 += __shfl_xor_sync(kFullMask, d2, m);
      p2 += __shfl_xor_sync(kFullMask, p2, m);
    }
    if (k < packs && lane % P == 0) {
      double* row = sums + 3 * ((ptr.first_element + k * V) / kChunk);
      row[0] = g2;
      row[1] = d2;
      row[2] = p2;
    }
  }
}

// Math in T (f32 or f64): the params' own type. Packs of 16 bytes when every
// buffer is aligned, then a grid-stride scalar loop over the rest (or over
// everything when not aligned). Reads p, g (+ m, v, vmax as the optimizer
// needs) and the chunk groups; writes p (+ m, v, vmax) and the compute copy.
template <class T, class C, bool kAdam, bool kSums>
__global__ void __launch_bounds__(kStepThreads)
    fused_optimizer_kernel(const __grid_constant__ OptimizerParams<T> o,
                           const StepPointers<T, C> ptr, int64_t n, bool vectorized,
                           const double* __restrict__ state, double* __restrict__ sums) {
  // Note [Skipped window]: a non-finite window returns before any write.
  if (state[kFoundInf] != 0.0) return;
  __shared__ StepScalars<T> s;
  if (threadIdx.x == 0) make_step_scalars(o, state, s);
  __syncthreads();
  if constexpr (kSums) {
    step_and_sum<kAdam>(o, s, ptr, n, sums);  // always vectorized (launch_step checks)
    return;
  }

  constexpr bool kCopy = !std::is_same_v<C, NoCopy>;
  constexpr int V = 16 / sizeof(T);
  const bool has_m = kAdam || o.momentum != T(0);
  const bool has_vmax = kAdam && o.amsgrad;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  // A pack never straddles two chunks: kChunk is a multiple of V, and the
  // launch vectorizes only when first_element is too.
  const int64_t packs = vectorized ? n / V : 0;
  for (int64_t k = first; k < packs; k += stride) {
    const int group = group_of(ptr, k * V, o.groups);
    UpdateScalars<T> u;
    if (!scalars_of(ptr, s, group, k * V, u)) continue;  // a pack lies in one chunk, one slot
    Pack<T, V> p = load_pack<V>(ptr.params, k);
    const Pack<T, V> g = load_pack<V>(ptr.grads, k);
    step_pack<kAdam>(o, u, ptr, k, g, p);
  }

  for (int64_t i = packs * V + first; i < n; i += stride) {
    const int group = group_of(ptr, i, o.groups);
    UpdateScalars<T> u;
    if (!scalars_of(ptr, s, group, i, u)) continue;
    T p = ptr.params[i];
    T m = has_m ? ptr.exp_avg[i] : T(0);
    T v = kAdam ? ptr.exp_avg_sq[i] : T(0);
    T vmax = has_vmax ? ptr.max_exp_avg_sq[i] : T(0);
    update<kAdam>(o, u, ptr.grads[i], p, m, v, vmax);
    ptr.params[i] = p;
    if (has_m) ptr.exp_avg[i] = m;
    if (kAdam) ptr.exp_avg_sq[i] = v;
    if (has_vmax) ptr.max_exp_avg_sq[i] = vmax;
    if constexpr (kCopy) ptr.compute[i] = dev::convert<C>(p);
  }
}

template <class T>
T* optional_ptr(const Tensor& t, bool used) {
  return used ? static_cast<T*>(t.data_ptr()) : nullptr;
}

template <class T, class C, bool kAdam, bool kSums>
void launch_step(const OptimizerConfig& config, const OptimizerBuffers& b, const Tensor& state) {
  constexpr int V = 16 / sizeof(T);
  const int64_t n = b.params.numel();
  const int device = b.params.device().index;
  dev::DeviceScope scope(device);

  StepPointers<T, C> ptr{};
  ptr.params = static_cast<T*>(b.params.data_ptr());
  ptr.grads = static_cast<const T*>(b.grads.data_ptr());
  ptr.exp_avg = optional_ptr<T>(b.exp_avg, uses_exp_avg(config));
  ptr.exp_avg_sq = optional_ptr<T>(b.exp_avg_sq, uses_exp_avg_sq(config));
  ptr.max_exp_avg_sq = optional_ptr<T>(b.max_exp_avg_sq, uses_max_exp_avg_sq(config));
  if constexpr (!std::is_same_v<C, NoCopy>) ptr.compute = static_cast<C*>(b.compute.data_ptr());
  ptr.chunk_groups = b.chunk_groups.data<int32_t>();
  ptr.first_element = b.first_element;
  if (b.chunk_slots.defined()) {
    ptr.chunk_slots = b.chunk_slots.data<int32_t>();
    ptr.slot_used = b.slot_used.data<double>();
    ptr.slot_steps = b.slot_steps.data<double>();
    ptr.slots = b.slot_used.numel();
  }
  // Null pointers count as aligned.
  bool vectorized = b.first_element % V == 0 && pack_aligned<V>(ptr.params) &&
                    pack_aligned<V>(ptr.grads) && pack_aligned<V>(ptr.exp_avg) &&
                    pack_aligned<V>(ptr.exp_avg_sq) && pack_aligned<V>(ptr.max_exp_avg_sq);
  if constexpr (!std::is_same_v<C, NoCopy>) vectorized = vectorized && pack_aligned<V>(ptr.compute);
  double* sums = nullptr;
  if constexpr (kSums) {
    // Note [Step sums]: whole chunks (the dispatch checked them) of aligned packs.
    ACCRUE_CHECK(vectorized,
                 "fused_optimizer_step: step_sums needs every buffer on a 16-byte "
                 "boundary (a GradArena's always are)");
    sums = b.step_sums.data<double>();
  }

  // A grid-stride loop over one wave of resident blocks.
  auto* kernel = fused_optimizer_kernel<T, C, kAdam, kSums>;
  int per_sm = 0;
  ACCRUE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kStepThreads, 0));
  const int64_t wave = std::max<int64_t>(1, int64_t{sm_count(device)} * per_sm);
  const int64_t work = vectorized ? n / V + n % V : n;
  const int64_t blocks = std::clamp<int64_t>((work + kStepThreads - 1) / kStepThreads, 1, wave);
  OptimizerParams<T> o = make_optimizer_params<T>(config);
  if (b.hyper.defined()) o.hyper = b.hyper.data<double>();
  kernel<<<static_cast<unsigned>(blocks), kStepThreads, 0, dev::stream_for(device)>>>(
      o, ptr, n, vectorized, state.data<double>(), sums);
  ACCRUE_LAUNCH_CHECK();
}

template <class T, class C, bool kSums>
void step_with_sums(const OptimizerConfig& config, const OptimizerBuffers& b, const Tensor& state) {
  if (!config.adam) {
    launch_step<T, C, false, kSums>(config, b, state);
  } else {
    launch_step<T, C, true, kSums>(config, b, state);
  }
}

template <class T, class C>
void step_with_copy(const OptimizerConfig& config, const OptimizerBuffers& b, const Tensor& state) {
  if (b.step_sums.defined()) {
    step_with_sums<T, C, true>(config, b, state);
  } else {
    step_with_sums<T, C, false>(config, b, state);
  }
}

template <class T>
void step_typed(const OptimizerConfig& config, const OptimizerBuffers& b, const Tensor& state) {
  if (!b.compute.defined()) {
    step_with_copy<T, NoCopy>(config, b, state);
  } else if (b.compute.dtype() == DType::bf16) {
    step_with_copy<T, __nv_bfloat16>(config, b, state);
  } else {
    step_with_copy<T, __half>(config, b, state);
  }
}

// ---- the monitor's per-slot sums -----------------------------------------------------------

constexpr int kSlotThreads = 256;
constexpr int64_t kTileChunks = 2048;  // 64 KiB of f32 elements, 48 KiB of rows per tile

// Note [Step sums]: the fold in two launches, so that a slot of a million
// chunks (GPT-2's token embedding) is spread over the GPU instead of one
// block. The chunk axis is cut into fixed tiles of kTileChunks; launch 1 has
// one block per tile and writes, for each slot that meets the tile, the
// slot's share of it as a partial row (|g|^2, |du|^2, |p|^2, non-finite
// count); launch 2 has one block per slot and adds the slot's partials in
// tile order. The cut depends on the chunk numbers alone, so the result is
// bitwise the same on every run and every GPU. Slot s owns partial rows
// [offset(s), offset(s) + tiles(s)), offset the sum of tiles() of the slots
// before it: at most tiles + slots rows for ascending, disjoint ranges (a
// GradArena's), and a row past that is never written or read, so bad ranges
// give wrong sums but never touch memory outside the buffers.
struct SlotSpan {
  int64_t c0, c1, first_tile, tiles;
};

__device__ __forceinline__ SlotSpan slot_span(const int64_t* ranges, int64_t slot, int64_t chunks) {
  SlotSpan s;
  s.c0 = std::min(std::max(ranges[2 * slot], int64_t{0}), chunks);
  s.c1 = std::min(std::max(ranges[2 * slot + 1], s.c0), chunks);
  s.first_tile = s.c0 / kTileChunks;
  s.tiles = s.c1 > s.c0 ? (s.c1 - 1) / kTileChunks - s.first_tile + 1 : 0;
  return s;
}

// Launch 1: tile blockIdx.x. Each thread a strided share of the slot's
// chunks in the tile (or, after a skipped window, of their elements), then
// the block in a fixed order.
template <class T>
__global__ void __launch_bounds__(kSlotThreads)
    tile_sums_kernel(const double* __restrict__ rows, const int64_t* __restrict__ ranges,
                     int64_t slots, int64_t chunks, const T* __restrict__ grads,
                     const T* __restrict__ params, int64_t n, const double* __restrict__ state,
                     double* __restrict__ partials, int64_t capacity) {
  __shared__ double scratch[32];
  const int64_t tile = blockIdx.x;
  const int64_t t0 = tile * kTileChunks, t1 = std::min(t0 + kTileChunks, chunks);
  const bool skipped = state[kFoundInf] != 0.0;  // Note [Skipped window]: no row was written
  int64_t offset = 0;
  for (int64_t slot = 0; slot < slots; ++slot) {
    const SlotSpan s = slot_span(ranges, slot, chunks);
    if (s.c0 >= t1) break;  // ascending ranges: no later slot meets the tile
    const int64_t row = offset + tile - s.first_tile;
    offset += s.tiles;
    if (tile < s.first_tile || tile >= s.first_tile + s.tiles || row >= capacity) continue;
    const int64_t c0 = std::max(s.c0, t0), c1 = std::min(s.c1, t1);
    double g2 = 0.0, d2 = 0.0, p2 = 0.0, bad = 0.0;
    if (!skipped) {
      for (int64_t c = c0 + threadIdx.x; c < c1; c += kSlotThreads) {
        g2 += rows[3 * c];
        d2 += rows[3 * c + 1];
        p2 += rows[3 * c + 2];
      }
    } else {
      const int64_t end = std::min(c1 * kChunk, n);
      for (int64_t e = std::min(c0 * kChunk, n) + threadIdx.x; e < end; e += kSlotThreads) {
        const double x = static_cast<double>(grads[e]), w = static_cast<double>(params[e]);
        bad += std::isfinite(x) ? 0.0 : 1.0;
        g2 += x * x;
        p2 += w * w;
      }
    }
    g2 = reduce::block_sum(g2, scratch);
    d2 = reduce::block_sum(d2, scratch);
    p2 = reduce::block_sum(p2, scratch);
    bad = reduce::block_sum(bad, scratch);
    if (threadIdx.x == 0) {
      double* r = partials + 4 * row;
      r[0] = g2;
      r[1] = d2;
      r[2] = p2;
      r[3] = bad;
    }
  }
}

// Launch 2: slot blockIdx.x adds its partial rows in tile order.
__global__ void __launch_bounds__(kSlotThreads)
    slot_sums_kernel(const double* __restrict__ partials, int64_t capacity,
                     const int64_t* __restrict__ ranges, int64_t chunks, double* __restrict__ out) {
  __shared__ double scratch[32];
  __shared__ long long offset_scratch[32];
  const int64_t slot = blockIdx.x;
  long long offset = 0;  // the tiles of the slots before this one
  for (int64_t j = threadIdx.x; j < slot; j += kSlotThreads)
    offset += slot_span(ranges, j, chunks).tiles;
  offset = reduce::block_sum(offset, offset_scratch);
  const SlotSpan s = slot_span(ranges, slot, chunks);
  const int64_t end = std::min<int64_t>(offset + s.tiles, capacity);
  double g2 = 0.0, d2 = 0.0, p2 = 0.0, bad = 0.0;
  for (int64_t r = offset + threadIdx.x; r < end; r += kSlotThreads) {
    g2 += partials[4 * r];
    d2 += partials[4 * r + 1];
    p2 += partials[4 * r + 2];
    bad += partials[4 * r + 3];
  }
  g2 = reduce::block_sum(g2, scratch);
  d2 = reduce::block_sum(d2, scratch);
  p2 = reduce::block_sum(p2, scratch);
  bad = reduce::block_sum(bad, scratch);
  if (threadIdx.x == 0) {
    out[3 * slot] = bad > 0.0 ? INFINITY : g2;
    out[3 * slot + 1] = d2;
    out[3 * slot + 2] = p2;
  }
}

}  // namespace

void step_sums_per_slot(const Tensor& step_sums, const Tensor& slot_chunks, const Tensor& grads,
                        const Tensor& params, const Tensor& state, const Tensor& out) {
  const int device = state.device().index;
  dev::DeviceScope scope(device);
  const int64_t n = params.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t slots = slot_chunks.size(0);
  const int64_t tiles = std::max<int64_t>((chunks + kTileChunks - 1) / kTileChunks, 1);
  const int64_t capacity = tiles + slots;
  const Tensor partials = empty({capacity, 4}, DType::f64, state.device());
  const cudaStream_t stream = dev::stream_for(device);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    tile_sums_kernel<T><<<static_cast<unsigned>(tiles), kSlotThreads, 0, stream>>>(
        step_sums.data<double>(), slot_chunks.data<int64_t>(), slots, chunks, grads.data<T>(),
        params.data<T>(), n, state.data<double>(), partials.data<double>(), capacity);
    ACCRUE_LAUNCH_CHECK();
  };
  if (params.dtype() == DType::f64) {
    launch(double{});
  } else {
    launch(float{});
  }
  slot_sums_kernel<<<static_cast<unsigned>(slots), kSlotThreads, 0, stream>>>(
      partials.data<double>(), capacity, slot_chunks.data<int64_t>(), chunks, out.data<double>());
  ACCRUE_LAUNCH_CHECK();
}

int64_t norm_partials_rows(int64_t numel, DType dtype, int device) {
  return norm_plan(numel, dtype, sm_count(device)).rows;
}

int64_t norm_row_elements(int64_t numel, DType dtype, int device) {
  const NormPlan plan = norm_plan(numel, dtype, sm_count(device));
  // An arena too small for one pack is one row of its few elements.
  return plan.packs_per_row > 0
             ? plan.packs_per_row * static_cast<int64_t>(16 / element_size(dtype))
             : std::max<int64_t>(numel, 1);
}

void grad_norm_partials(const Tensor& grads, const Tensor& partials, int64_t first_row,
                        int64_t rows) {
  if (grads.dtype() == DType::f64) {
    norm_partials_typed<double>(grads, partials, first_row, rows);
  } else {
    norm_partials_typed<float>(grads, partials, first_row, rows);
  }
}

void window_scalar_step(const Tensor& partials, const Tensor& state, const CloseConfig& config) {
  const int device = state.device().index;
  dev::DeviceScope scope(device);
  window_scalar_step_kernel<<<1, 1, 0, dev::stream_for(device)>>>(
      partials.data<double>(), partials.size(0), state.data<double>(), config);
  ACCRUE_LAUNCH_CHECK();
}

void calibrate_loss_scale(const Tensor& amax, const Tensor& state, const ScalerConfig& scaler,
                          double scale_used, double margin) {
  const int device = state.device().index;
  dev::DeviceScope scope(device);
  calibrate_scale_kernel<<<1, 1, 0, dev::stream_for(device)>>>(
      amax.data<double>(), state.data<double>(), scaler, scale_used, margin);
  ACCRUE_LAUNCH_CHECK();
}

void store_hyperparameters(const HyperValues& values, const Tensor& hyper) {
  const int device = hyper.device().index;
  dev::DeviceScope scope(device);
  store_hyper_kernel<<<1, kHyperSize, 0, dev::stream_for(device)>>>(values, hyper.data<double>());
  ACCRUE_LAUNCH_CHECK();
}

void store_slot_flags(const std::vector<bool>& written, const Tensor& slot_used) {
  const int device = slot_used.device().index;
  dev::DeviceScope scope(device);
  const int64_t n = static_cast<int64_t>(written.size());
  for (int64_t at = 0; at < n; at += kFlagsPerLaunch) {
    const int count = static_cast<int>(std::min<int64_t>(kFlagsPerLaunch, n - at));
    SlotFlags flags{};
    for (int i = 0; i < count; ++i)
      flags.v[i] = written[static_cast<size_t>(at + i)] ? 1 : 0;
    store_flags_kernel<<<1, 256, 0, dev::stream_for(device)>>>(flags, count,
                                                               slot_used.data<double>() + at);
    ACCRUE_LAUNCH_CHECK();
  }
}

void advance_slot_steps(double beta1, double beta2, const Tensor& slot_used,
                        const Tensor& slot_steps, const Tensor& state) {
  const int device = slot_used.device().index;
  dev::DeviceScope scope(device);
  const int64_t slots = slot_used.numel();
  const int threads = 256;
  advance_slot_steps_kernel<<<static_cast<unsigned>((slots + threads - 1) / threads), threads, 0,
                              dev::stream_for(device)>>>(beta1, beta2, slot_used.data<double>(),
                                                         slot_steps.data<double>(), slots,
                                                         state.data<double>());
  ACCRUE_LAUNCH_CHECK();
}

void fused_optimizer_step(const OptimizerConfig& config, const OptimizerBuffers& buffers,
                          const Tensor& state) {
  if (buffers.params.dtype() == DType::f64) {
    step_typed<double>(config, buffers, state);
  } else {
    step_typed<float>(config, buffers, state);
  }
}

}  // namespace accrue::kernels::cuda
