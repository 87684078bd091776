#include "examples/common/validation.h"

#include <vector>

namespace accrue::examples {

double validation_loss(const std::function<Loss()>& next_loss, int64_t batches,
                       dist::Communicator* comm, Device device) {
  NoGradGuard no_grad;
  double sum = 0.0, count = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    const Loss loss = next_loss();
    sum += loss.sum.item();
    count += loss.count.item();
  }
  if (comm != nullptr) {
    const Tensor totals = from_vector(std::vector<double>{sum, count}, {2}).to(device);
    Event produced;
    produced.record(current_stream(device.index));
    produced.block(comm->stream());  // Note [Collective ordering]
    comm->all_reduce(totals);
    comm->synchronize();
    const std::vector<double> v = totals.to_vector<double>();
    sum = v[0];
    count = v[1];
  }
  return sum / count;
}

}  // namespace accrue::examples
