// Memory for tensors: aligned host memory, and device memory from CUDA's
// stream-ordered pool (cudaMallocAsync) or, for compute-sanitizer runs, plain
// cudaMalloc. Every byte is counted: current and peak per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "accrue/core/device.h"

namespace accrue {

enum class CudaAllocatorMode {
  // cudaMallocAsync/cudaFreeAsync on the current stream, pool kept warm.
  StreamOrderedPool,
  // cudaMalloc/cudaFree: every allocation is a separate driver allocation, so
  // compute-sanitizer sees exact bounds.
  Plain,
};

// Applies to allocations made after the call; each block is freed the way it
// was allocated, so switching with live tensors is safe.
void set_cuda_allocator_mode(CudaAllocatorMode mode);
CudaAllocatorMode cuda_allocator_mode();

// Sets the mode for its lifetime and restores the previous one. A buffer that
// another process maps by CUDA IPC takes Plain (the stream-ordered pool's
// blocks cannot be exported): the gradient arena of Note [Copy-engine
// all-reduce] (GradArenaOptions::shareable).
class CudaAllocatorModeScope {
 public:
  explicit CudaAllocatorModeScope(CudaAllocatorMode mode) : saved_(cuda_allocator_mode()) {
    set_cuda_allocator_mode(mode);
  }
  ~CudaAllocatorModeScope() { set_cuda_allocator_mode(saved_); }
  CudaAllocatorModeScope(const CudaAllocatorModeScope&) = delete;
  CudaAllocatorModeScope& operator=(const CudaAllocatorModeScope&) = delete;

 private:
  CudaAllocatorMode saved_;
};

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // number of allocations made so far
};

MemoryStats memory_stats(Device device);
// The most bytes one allocation on `device` may ask for: the host's memory
// (RAM and swap) on the CPU, 2^62 on a GPU, whose driver refuses more than it
// has free (Note [Checked sizes] in core/tensor.cpp).
int64_t max_allocation_bytes(Device device);
// "123.4 MiB": how every report of accrue prints a byte count.
std::string mib(int64_t bytes);
// Peak := current, for measuring the peak of one phase.
void reset_peak_memory(Device device);
// Returns the memory the stream-ordered pool of cuda:`device` holds but no
// tensor uses to the driver, after synchronizing the device's current stream
// (so that every free queued on it has happened). The pool otherwise keeps
// it for reuse; a CUDA graph's memory nodes come from a pool of their own,
// so once micro-steps replay from graphs the eager warm-up's activations
// would stay held for nothing (Note [Graphed window]). Nothing on the CPU.
void release_unused_cuda_memory(Device device);

// Owns one allocation. Tensors share it through shared_ptr; views are
// (storage, offset, shape, strides).
class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Note [External storage]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // Memory that another library allocated and still owns (a DLPack
  // producer's tensor, imported without a copy): accrue reads and writes it
  // but never frees it. `release` runs once, when the last tensor viewing it
  // is gone, and hands the memory back to its owner (the DLPack deleter); it
  // must not throw. memory_stats does not count it: accrue did not allocate it.
  Storage(void* data, size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool pooled_ = false;
  std::function<void()> release_;  // Note [External storage]
};

// Alignment of every allocation: enough for 16-byte vector loads and for the
// 256-byte slots of the gradient arena.
inline constexpr size_t kAllocationAlignment = 256;

}  // namespace accrue
