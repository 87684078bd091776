#include "examples/common/launch.h"

#include <cstdio>

#include "accrue/dist/bucket_plan.h"
#include "accrue/dist/mpi_bootstrap.h"
#ifdef ACCRUE_WITH_NCCL
#include "accrue/dist/nccl_communicator.h"
#endif

namespace accrue::examples {

std::string Launch::describe() const {
  return gpu ? device.str() : device.str() + " (" + cuda_unavailable_reason() + ")";
}

Launch launch(bool force_cpu) {
  Launch l;
  l.rank = dist::discover_rank();
  l.gpu = cuda_available() && !force_cpu;
  ACCRUE_CHECK(!l.rank.distributed() || l.gpu, "data parallelism (", dist::describe(l.rank),
               ") needs a GPU per rank");
  l.device = l.gpu ? Device::cuda(l.rank.local_rank) : Device::cpu();
  if (l.gpu) set_cuda_device(l.device.index);
  if (!l.main_rank() && !std::freopen("/dev/null", "w", stdout))
    ACCRUE_FAIL("cannot silence rank ", l.rank.rank);
  return l;
}

Device single_device(bool force_cpu) {
  if (force_cpu || !cuda_available()) return Device::cpu();
  set_cuda_device(0);
  return Device::cuda(0);
}

DataParallel connect_data_parallel(const Launch& where, optim::ParamStore& arena,
                                   const DataParallelOptions& dp_options) {
  DataParallel dp;
  if (!where.rank.distributed()) return dp;
#ifdef ACCRUE_WITH_NCCL
  dist::NcclOptions nccl;
  if (dp_options.nccl_max_ctas > 0) nccl.max_ctas = dp_options.nccl_max_ctas;
  dp.comm = dist::connect_nccl(where.rank, dist::layout_fingerprint(arena), nccl);
  dist::ReducerOptions options;
  options.zero1 = dp_options.zero1;
  options.copy_engine_all_reduce = dp_options.copy_engine_all_reduce;
  options.copy_engine_whole_buckets = dp_options.copy_engine_whole_buckets;
  options.timing = dp_options.timing;
  if (dp_options.bucket_mb) options.buckets = dist::buckets_of_mib(*dp_options.bucket_mb);
  options.transport = dp_options.transport;
  options.gemm_sm_margin = dp_options.gemm_sm_margin;
  dp.reducer = std::make_unique<dist::Reducer>(arena, *dp.comm, options);
  dp.reducer->broadcast_parameters();  // every rank starts from rank 0's weights
  std::printf("data parallel: %s, %zu buckets of up to %s%s%s%s, NCCL id bootstrap: %s\n",
              dist::describe(where.rank).c_str(), dp.reducer->plan().buckets().size(),
              mib(options.buckets.bucket_bytes).c_str(), dp_options.zero1 ? ", ZeRO-1" : "",
              dp_options.transport
                  ? (std::string(", ") + dtype_name(*dp_options.transport) + " transport").c_str()
                  : "",
              !dp.reducer->copy_engine_all_reduce() ? ""
              : dp.reducer->copy_engines_direct()
                  ? (dp_options.copy_engine_whole_buckets
                         ? ", summed on the copy engines between the arenas, whole buckets"
                         : ", summed on the copy engines between the arenas")
                  : ", summed on the copy engines through staging",
              dist::bootstrap_name(dist::bootstrap_method(where.rank)));
#else
  (void)arena;
  (void)dp_options;
  ACCRUE_FAIL("launched as ", dist::describe(where.rank), " but accrue was built without NCCL");
#endif
  return dp;
}

}  // namespace accrue::examples
