// main() of the multi-GPU test binaries: discover the rank, skip without
// enough GPUs, join the NCCL world (saying which bootstrap carried the id),
// run the tests.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/dist/mpi_bootstrap.h"
#include "tests/dist/multi_gpu_world.h"

namespace accrue::dist::multi_gpu {
namespace {
RankInfo g_info;
std::unique_ptr<NcclCommunicator> g_world;
}  // namespace

const RankInfo& info() {
  return g_info;
}

NcclCommunicator& world() {
  return *g_world;
}

}  // namespace accrue::dist::multi_gpu

int main(int argc, char** argv) {
  using namespace accrue::dist;
  ::testing::InitGoogleTest(&argc, argv);
  const char* mode = std::getenv("ACCRUE_TEST_ALLOCATOR");
  if (mode && std::strcmp(mode, "plain") == 0)
    accrue::set_cuda_allocator_mode(accrue::CudaAllocatorMode::Plain);
  try {
    multi_gpu::g_info = discover_rank();
  } catch (const accrue::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const RankInfo& info = multi_gpu::g_info;
  if (info.world_size < 2) {
    std::printf("SKIPPED: a world of %d rank(s); start the ranks with multi_gpu_launch.sh\n",
                info.world_size);
    return multi_gpu::kSkipReturnCode;
  }
  if (accrue::cuda_device_count() < info.local_world_size) {
    std::printf("SKIPPED: %d ranks on this node need %d GPUs, %d visible %s\n",
                info.local_world_size, info.local_world_size, accrue::cuda_device_count(),
                accrue::cuda_unavailable_reason());
    return multi_gpu::kSkipReturnCode;
  }
  try {
    NcclOptions options;
    options.timeout_s = multi_gpu::kTimeoutSeconds;
    options.bootstrap_timeout_s = 60.0;
    multi_gpu::g_world = connect_nccl(info, /*fingerprint=*/0, options);
  } catch (const accrue::Error& e) {
    std::fprintf(stderr, "%s: %s\n", describe(info).c_str(), e.what());
    return 1;
  }
  // multi_gpu_mpirun.sh checks this line: under mpirun the id went over MPI.
  std::printf("%s: bootstrap: %s\n", describe(info).c_str(),
              bootstrap_name(bootstrap_method(info)));
  std::fflush(stdout);
  const int result = RUN_ALL_TESTS();
  multi_gpu::g_world.reset();
  return result;
}
