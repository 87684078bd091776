#include "accrue/dist/statistics_sync.h"

#include "accrue/core/cuda_runtime.h"

namespace accrue::dist {

void CommunicatorStatisticsSync::all_reduce_sum(const Tensor& t) {
  ACCRUE_CHECK(t.defined() && t.is_contiguous(), "CommunicatorStatisticsSync::all_reduce_sum: ",
               "expects a defined, contiguous tensor");
  const StreamHandle comm_stream = comm_.stream();
  if (comm_stream == nullptr) {  // a host communicator completes before returning
    comm_.all_reduce(t, ReduceOp::sum);
    return;
  }
  const StreamHandle compute = current_stream(t.device().index);
  Event produced;
  produced.record(compute);
  produced.block(comm_stream);
  comm_.all_reduce(t, ReduceOp::sum);
  Event reduced;
  reduced.record(comm_stream);
  reduced.block(compute);
}

}  // namespace accrue::dist
