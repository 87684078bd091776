// StatisticsSync over a Communicator: what nn::BatchNorm's sync mode
// (SyncBatchNorm) sums its statistics with under data parallelism.
#pragma once

#include "accrue/autograd/statistics_sync.h"
#include "accrue/dist/process_group.h"

namespace accrue::dist {

class CommunicatorStatisticsSync final : public StatisticsSync {
 public:
  // `comm` must outlive this.
  explicit CommunicatorStatisticsSync(Communicator& comm) : comm_(comm) {}
  // Note [Collective ordering]: the all-reduce waits for the current stream's
  // work (the statistics' producers), and the current stream waits for it.
  void all_reduce_sum(const Tensor& t) override;
  int world_size() const override { return comm_.world_size(); }

 private:
  Communicator& comm_;
};

}  // namespace accrue::dist
