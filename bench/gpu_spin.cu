// The spin kernel of Note [GPU timing] (bench/bench_util.h): it holds the
// stream for a fixed wall time so that the host can enqueue the timed op
// before the GPU reaches the start event.
#include <cuda_runtime.h>

#include <cstdint>

#include "accrue/core/status_check.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

__device__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}

}  // namespace

void spin_gpu(StreamHandle stream, double microseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(microseconds * 1e3));
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::bench
