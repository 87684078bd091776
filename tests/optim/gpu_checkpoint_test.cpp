// Note [Mid-window checkpoints] on CUDA: the CPU's case
// (tests/optim/checkpoint_cases.h) with the model, arena and window on the GPU.
#include "tests/optim/checkpoint_cases.h"

namespace accrue {
namespace {

TEST(GpuWindowCheckpoint, resumes_bit_exactly_at_any_micro_step) {
  ACCRUE_REQUIRE_CUDA();
  test::checkpoint_resumes_bit_exactly_at_any_micro_step(Device::cuda(0));
}

}  // namespace
}  // namespace accrue
