// Where a trainer runs: its rank under a data-parallel launcher, its device,
// and the communicator and reducer that make K micro-batches on N GPUs one
// window.
//
// Data parallel: one process per GPU, started by a standard launcher:
//   torchrun --nproc-per-node=2 --no-python build/ci/examples/accrue_demo
//   mpirun -np 2 build/ci/examples/accrue_demo
// (under mpirun the NCCL id goes over MPI when accrue was built with MPI;
// without MPI it goes over TCP and needs MASTER_ADDR/MASTER_PORT exported).
// Each rank draws its own micro-batches; the last micro-step's buckets are
// all-reduced while its backward runs (Note [Buckets]); with ZeRO-1 they are
// reduce-scattered and each rank keeps and steps its shard (Note [ZeRO-1]).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "accrue.h"
#include "accrue/dist/launch_env.h"
#include "accrue/dist/reducer.h"

namespace accrue::examples {

struct Launch {
  dist::RankInfo rank;
  bool gpu = false;
  Device device = Device::cpu();
  bool main_rank() const { return rank.rank == 0; }
  int world_size() const { return rank.world_size; }
  // "cuda:0" or "cpu (why there is no GPU)".
  std::string describe() const;
};

// The rank from the launcher's environment and its device: GPU local_rank
// unless `force_cpu` or none is visible. A data-parallel launch needs a GPU per
// rank. Ranks other than 0 train silently (their stdout goes to /dev/null).
Launch launch(bool force_cpu);

// A one-process binary's device: GPU 0 unless `force_cpu` or none is visible.
Device single_device(bool force_cpu);

// The communicator and the reducer the Window drives under a data-parallel
// launch; both null on one process.
struct DataParallel {
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::Reducer> reducer;
};

// What connect_data_parallel builds the reducer with.
struct DataParallelOptions {
  bool zero1 = false;                      // reduce-scatter and shard steps (Note [ZeRO-1])
  bool copy_engine_all_reduce = false;     // Note [Copy-engine all-reduce]
  bool copy_engine_whole_buckets = false;  // ... its Direct::whole form
  bool timing = false;                     // per-bucket events: Reducer::last_timing() (benchmarks)
  std::optional<double> bucket_mb = std::nullopt;  // MiB (unset: BucketPlanOptions')
  std::optional<DType> transport = std::nullopt;   // Note [Gradient transport] (unset: exact)
  int gemm_sm_margin = 0;                          // Note [GEMM SM margin]
  int nccl_max_ctas = 0;                           // NcclOptions::max_ctas (0: NCCL's choice)
};

// Connects the ranks (refusing a different parameter layout on any rank),
// builds the reducer over `arena`, broadcasts rank 0's weights and prints one
// line about it.
DataParallel connect_data_parallel(const Launch& where, optim::ParamStore& arena,
                                   const DataParallelOptions& options = {});

}  // namespace accrue::examples
