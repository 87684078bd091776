// The CUDA window close's fused optimizer pass (kernels/cuda/window_close.cuh):
// one read-modify-write pass over p, g, m, v, and the small launches that
// stage its inputs on the device (hyperparameters, written flags, slot steps).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/elementwise_ops.cuh"  // Pack, load_pack, store_pack, pack_aligned
#include "accrue/kernels/cuda/window_close.cuh"
#include "accrue/kernels/window_close_backend.h"

namespace accrue::kernels::cuda {
namespace {

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
  const int64_t cap = b.max_blocks > 0 ? std::min(wave, b.max_blocks) : wave;
  const int64_t blocks = std::clamp<int64_t>((work + kStepThreads - 1) / kStepThreads, 1, cap);
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

}  // namespace

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
