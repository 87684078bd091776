// The store's device on a GPU: unset, it is the parameters' own, so a model
// built on the GPU stays there; parameters on two devices need it said.
#include "accrue/optim/param_store.h"

#include "accrue/autograd/ops.h"
#include "accrue/core/allocator.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using optim::ParamStore;
using optim::ParamStoreOptions;

const Device kGpu = Device::cuda(0);

TEST(GpuParamStore, without_a_device_the_store_lives_where_its_parameters_are) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor w = requires_grad_(test::random_normal({4, 3}, DType::f32, kGpu));
  const Tensor b = requires_grad_(test::random_normal({3}, DType::f32, kGpu));
  const Tensor w_values = detach(w).to(Device::cpu());
  ParamStore store(std::vector<Tensor>{w, b}, ParamStoreOptions().moments(0));
  EXPECT_EQ(store.options().device(), kGpu);
  EXPECT_EQ(store.master().device(), kGpu);
  EXPECT_EQ(w.device(), kGpu);  // re-pointed at its slot, on the same device
  EXPECT_TRUE(test::all_equal(detach(w).to(Device::cpu()), w_values));
}

TEST(GpuParamStore, parameters_on_two_devices_need_the_device_said) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor on_gpu = requires_grad_(test::random_normal({3}, DType::f32, kGpu));
  const Tensor on_cpu = requires_grad_(test::random_normal({3}, DType::f32, Device::cpu()));
  EXPECT_ERROR(ParamStore(std::vector<Tensor>{on_gpu, on_cpu}), "ParamStore",
               "parameters on cuda:0 and cpu", "ParamStoreOptions::device");
  ParamStore store(std::vector<Tensor>{on_gpu, on_cpu}, ParamStoreOptions().device(kGpu));
  EXPECT_EQ(on_cpu.device(), kGpu);
}

// Note [Copy-engine all-reduce]: shareable gradients are an allocation of
// their own (cudaMalloc, which CUDA IPC can export; the multi-GPU test
// MultiGpu.copy_engines_between_arenas_train_nccls_weights maps them from the
// peer), zeroed and counted like any other, and the allocator's mode is back
// to what it was.
TEST(GpuParamStore, shareable_gradients_are_zeroed_counted_and_leave_the_mode_alone) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor w = requires_grad_(test::random_normal({64, 33}, DType::f32, kGpu));
  const CudaAllocatorMode mode = cuda_allocator_mode();
  const int64_t before = memory_stats(kGpu).current_bytes;
  ParamStore store(std::vector<Tensor>{w},
                   ParamStoreOptions().moments(0).shareable_gradients(true));
  EXPECT_TRUE(store.options().shareable_gradients());
  EXPECT_EQ(cuda_allocator_mode(), mode);
  EXPECT_GE(memory_stats(kGpu).current_bytes - before, store.grads().numel() * 4);
  EXPECT_TRUE(
      test::all_equal(store.grads().to(Device::cpu()), zeros({store.grads().numel()}, DType::f32)));
}

}  // namespace
}  // namespace accrue
