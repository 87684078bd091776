// The CUDA side of the deferred index checks (Note [Deferred index checks]):
// two launches per call on the current stream, no host synchronization.
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/index_checks_backend.h"

namespace accrue::kernels::cuda {

namespace {

namespace cu = ::accrue::cuda;

constexpr int kThreads = 256;

// The smallest bad position into record[kFaultScratch] (-1, i.e. all ones as
// unsigned, when none): one integer atomicMin per thread that saw one.
template <typename I>
__global__ void first_out_of_range_kernel(const I* __restrict__ indices, int64_t n,
                                          IndexCheckCall call, long long* record) {
  unsigned long long first = ~0ull;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(indices[i]);
    if (!(call.use_ignore && v == call.ignore_index) && (v < 0 || v >= call.bound)) {
      first = static_cast<unsigned long long>(i);
      break;  // later positions of this thread are larger
    }
  }
  if (first != ~0ull)
    atomicMin(reinterpret_cast<unsigned long long*>(record + kFaultScratch), first);
}

// One thread: turns the scratch position into the kept fault (the first since
// the host last read the record) and N's NaN, then clears the scratch.
template <typename I>
__global__ void keep_first_fault_kernel(const I* __restrict__ indices, IndexCheckCall call,
                                        long long* record, double* items) {
  const long long position = record[kFaultScratch];
  if (position < 0) return;
  record[kFaultScratch] = -1;
  *items = __longlong_as_double(0x7ff8000000000000ll);  // quiet NaN
  if (record[kFaultRaised] != 0) return;
  record[kFaultRaised] = 1;
  record[kFaultCall] = call.id;
  record[kFaultPosition] = position;
  record[kFaultValue] = static_cast<long long>(indices[position]);
  record[kFaultWindow] = call.window;
  record[kFaultMicroStep] = call.micro_step;
}

}  // namespace

void record_index_fault(const Tensor& indices, const IndexCheckCall& call, const Tensor& record,
                        const Tensor& items) {
  const int dev = indices.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t n = indices.numel();
  if (n == 0) return;
  auto* r = static_cast<long long*>(record.data_ptr());
  visit_index_dtype(indices.dtype(), "record_index_fault", [&](auto tag) {
    using I = decltype(tag);
    const I* p = static_cast<const I*>(indices.data_ptr());
    first_out_of_range_kernel<I>
        <<<cu::grid_for(n, kThreads, 1024), kThreads, 0, stream>>>(p, n, call, r);
    ACCRUE_LAUNCH_CHECK();
    keep_first_fault_kernel<I>
        <<<1, 1, 0, stream>>>(p, call, r, static_cast<double*>(items.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::kernels::cuda
