// The world a multi-GPU test binary runs in. multi_gpu_launch.sh starts one
// process per GPU with torchrun's variables (the TCP bootstrap), or
// multi_gpu_mpirun.sh with mpirun (the MPI bootstrap in builds with MPI);
// main() (multi_gpu_main.cpp) joins them into one NCCL communicator before any
// test runs, and every test uses it. All ranks run the same tests in the same order, so their
// collectives match; a failure on one rank can only make the others' next
// collective time out (Note [No silent hang]), never hang them.
#pragma once

#include "accrue/dist/launch_env.h"
#include "accrue/dist/nccl_communicator.h"

namespace accrue::dist::multi_gpu {

// The watchdog timeout of the tests' communicator: a dead peer must turn into
// accrue::Error well within the fault test's 20 s.
inline constexpr double kTimeoutSeconds = 10.0;
// ctest's SKIP_RETURN_CODE: fewer GPUs than ranks, or not started by the launcher.
inline constexpr int kSkipReturnCode = 77;

const RankInfo& info();
NcclCommunicator& world();
// This rank's GPU.
inline Device device() {
  return Device::cuda(info().local_rank);
}

}  // namespace accrue::dist::multi_gpu
