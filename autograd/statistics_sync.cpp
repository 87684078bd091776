#include "accrue/autograd/statistics_sync.h"

#include "accrue/autograd/node.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"

namespace accrue {

Tensor all_reduce_sum(const Tensor& x, StatisticsSync& sync) {
  ACCRUE_CHECK(x.defined(), "all_reduce_sum: input is an undefined tensor");
  Tensor out;
  {
    NoGradGuard no_grad;
    out = detach(x).contiguous().clone();
    sync.all_reduce_sum(out);
  }
  StatisticsSync* s = &sync;
  return autograd::record("AllReduceSumBackward", out, {x},
                          [s](const Tensor& g) -> std::vector<Tensor> {
                            Tensor summed = g.contiguous().clone();
                            s->all_reduce_sum(summed);
                            return {summed};
                          });
}

}  // namespace accrue
