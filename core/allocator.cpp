#include "accrue/core/allocator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>

#include <sys/sysinfo.h>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/error.h"

#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "accrue/core/status_check.h"
#endif

namespace accrue {

namespace {

constexpr int kMaxDevices = 64;

struct Counters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
};

// Slot 0 is the CPU, slot 1 + i is cuda:i.
std::array<Counters, kMaxDevices + 1>& counters() {
  static std::array<Counters, kMaxDevices + 1> c;
  return c;
}

Counters& counters_for(Device d) {
  return counters()[d.is_cpu() ? 0 : 1 + d.index];
}

void count_alloc(Device d, int64_t n) {
  Counters& c = counters_for(d);
  int64_t now = c.current.fetch_add(n) + n;
  c.allocations.fetch_add(1);
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

void count_free(Device d, int64_t n) {
  counters_for(d).current.fetch_sub(n);
}

std::atomic<CudaAllocatorMode> g_mode{CudaAllocatorMode::StreamOrderedPool};

size_t round_up(size_t n) {
  return (n + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
}

#ifdef ACCRUE_WITH_CUDA
// Keep freed pool memory instead of returning it to the driver at every
// synchronization: otherwise each window would pay for re-mapping it.
void keep_pool_warm(int device) {
  static std::once_flag flags[kMaxDevices];
  std::call_once(flags[device], [device] {
    cudaMemPool_t pool;
    ACCRUE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    ACCRUE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
}

[[noreturn]] void out_of_memory(Device d, size_t nbytes, cudaError_t e) {
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  MemoryStats s = memory_stats(d);
  throw OutOfMemoryError(
      detail::str_cat("out of memory on ", d.str(), ": asked for ", nbytes, " bytes, ", free_b,
                      " of ", total_b, " bytes free on the device, ", s.current_bytes,
                      " held by accrue (", cudaGetErrorString(e),
                      "). Use a smaller micro-batch and more accumulation steps K to keep the "
                      "same batch."),
      static_cast<int64_t>(nbytes), detail::str_cat(__FILE__, ":", __LINE__));
}
#endif

}  // namespace

int64_t max_allocation_bytes(Device device) {
  constexpr int64_t kCap = int64_t{1} << 62;
  if (!device.is_cpu()) return kCap;
  // RAM and swap: what the kernel's overcommit heuristic would grant at most.
  static const int64_t host = [] {
    struct sysinfo info {};
    if (sysinfo(&info) != 0) return kCap;
    const unsigned __int128 bytes =
        (static_cast<unsigned __int128>(info.totalram) + info.totalswap) * info.mem_unit;
    return bytes > static_cast<unsigned __int128>(kCap) ? kCap : static_cast<int64_t>(bytes);
  }();
  return host;
}

std::string mib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return s;
}

void set_cuda_allocator_mode(CudaAllocatorMode mode) {
  g_mode = mode;
}
CudaAllocatorMode cuda_allocator_mode() {
  return g_mode;
}

MemoryStats memory_stats(Device device) {
  ACCRUE_CHECK(device.is_cpu() || (device.index >= 0 && device.index < kMaxDevices),
               "memory_stats: bad device ", device.str());
  Counters& c = counters_for(device);
  return {c.current.load(), c.peak.load(), c.allocations.load()};
}

void reset_peak_memory(Device device) {
  Counters& c = counters_for(device);
  c.peak = c.current.load();
}

void release_unused_cuda_memory(Device device) {
  if (device.is_cpu()) return;
#ifdef ACCRUE_WITH_CUDA
  set_cuda_device(device.index);
  ACCRUE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(current_stream(device.index))));
  cudaMemPool_t pool;
  ACCRUE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device.index));
  ACCRUE_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
#else
  ACCRUE_FAIL("release_unused_cuda_memory(", device.str(), "): accrue was built without CUDA");
#endif
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  // Note [Checked sizes] in core/tensor.cpp: round_up must not wrap.
  const int64_t limit = max_allocation_bytes(device);
  if (nbytes > static_cast<uint64_t>(limit))
    throw OutOfMemoryError(
        detail::str_cat("out of memory on ", device.str(), ": asked for ", nbytes,
                        " bytes, more than the ", limit, " bytes one allocation may have there"),
        static_cast<int64_t>(std::min<uint64_t>(nbytes, std::numeric_limits<int64_t>::max())),
        detail::str_cat(__FILE__, ":", __LINE__));
  const size_t n = round_up(nbytes == 0 ? 1 : nbytes);
  if (device.is_cpu()) {
    data_ = std::aligned_alloc(kAllocationAlignment, n);
    if (data_ == nullptr)
      throw OutOfMemoryError(detail::str_cat("out of memory on cpu: asked for ", n, " bytes"),
                             static_cast<int64_t>(n), detail::str_cat(__FILE__, ":", __LINE__));
  } else {
#ifdef ACCRUE_WITH_CUDA
    set_cuda_device(device.index);
    cudaError_t e;
    if (g_mode == CudaAllocatorMode::StreamOrderedPool) {
      keep_pool_warm(device.index);
      pooled_ = true;
      e = cudaMallocAsync(&data_, n, current_stream(device.index));
    } else {
      e = cudaMalloc(&data_, n);
    }
    if (e != cudaSuccess) out_of_memory(device, n, e);
#else
    ACCRUE_FAIL("allocating ", nbytes, " bytes on ", device.str(),
                ": accrue was built without CUDA");
#endif
  }
  count_alloc(device, static_cast<int64_t>(nbytes));
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void()> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {
  ACCRUE_CHECK(release_ != nullptr, "Storage over external memory on ", device.str(),
               ": no release function (Note [External storage])");
}

Storage::~Storage() {
  if (release_) {  // Note [External storage]: the owner frees it, and it was never counted.
    release_();
    return;
  }
  count_free(device_, static_cast<int64_t>(nbytes_));
  if (device_.is_cpu()) {
    std::free(data_);
    return;
  }
#ifdef ACCRUE_WITH_CUDA
  // Destructors must not throw: a failed free at teardown is ignored.
  cudaSetDevice(device_.index);
  if (pooled_) {
    cudaFreeAsync(data_, current_stream(device_.index));
  } else {
    cudaFree(data_);
  }
#endif
}

}  // namespace accrue
