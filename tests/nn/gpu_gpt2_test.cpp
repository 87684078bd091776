// nn::GPT2 on CUDA: the same model and batch as the CPU reference (f32), a
// bf16 compute copy, and activation checkpointing (bitwise-equal gradients,
// lower peak memory).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/gpt2.h"
#include "accrue/optim/param_store.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

nn::GPT2Config tiny_config() {
  nn::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 32;
  c.vocab_size = 200;  // padded to 256
  return c;
}

std::unique_ptr<nn::GPT2> make_gpt2(const nn::GPT2Config& c, Device device, uint64_t seed = 1) {
  Generator gen(seed);
  return std::make_unique<nn::GPT2>(c, nn::ParamOptions{device, DType::f32, &gen});
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return randint(0, vocab, {B, T}, DType::i64, Device::cpu(), &gen);
}

std::unique_ptr<optim::ParamStore> arena_for(const nn::GPT2& model, DType compute) {
  return std::make_unique<optim::ParamStore>(
      model.named_parameters(),
      optim::ParamStoreOptions().device(kGpu).compute_dtype(compute).moments(0));
}

// TF32 off for the scope: the f32 GEMMs compare with the CPU in true fp32.
class TF32Off {
 public:
  TF32Off() : previous_(kernels::allow_tf32()) { kernels::set_allow_tf32(false); }
  ~TF32Off() { kernels::set_allow_tf32(previous_); }

 private:
  bool previous_;
};

TEST(GpuGPT2, forward_loss_and_gradients_match_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  TF32Off tf32_off;
  const nn::GPT2Config c = tiny_config();
  const auto cpu = make_gpt2(c, Device::cpu()), gpu = make_gpt2(c, kGpu);
  const Tensor idx = tokens(4, 32, c.vocab_size, 2);
  Tensor targets = tokens(4, 32, c.vocab_size, 3);
  targets.data<int64_t>()[5] = -100;
  {
    NoGradGuard no_grad;
    const double err =
        test::relative_error(gpu->forward(idx.to(kGpu)).to(Device::cpu()), cpu->forward(idx));
    std::printf("[gpu gpt2] f32 hidden state vs the CPU: %.3g\n", err);
    EXPECT_LT(err, 1e-5);
  }
  const Loss lc = cpu->loss(idx, targets);
  const Loss lg = gpu->loss(idx.to(kGpu), targets.to(kGpu));
  EXPECT_EQ(lg.count.item(), lc.count.item());
  EXPECT_NEAR(lg.sum.item(), lc.sum.item(), 1e-5 * std::fabs(lc.sum.item()));
  backward(lc.sum);
  backward(lg.sum);
  const auto cp = cpu->named_parameters(), gp = gpu->named_parameters();
  ASSERT_EQ(cp.size(), gp.size());
  double worst = 0;
  for (size_t i = 0; i < cp.size(); ++i) {
    ASSERT_TRUE(grad(gp[i].tensor).defined()) << gp[i].name;
    const double err =
        test::relative_error(grad(gp[i].tensor).to(Device::cpu()), grad(cp[i].tensor));
    worst = std::max(worst, err);
    EXPECT_LT(err, 1e-4) << cp[i].name;
  }
  std::printf("[gpu gpt2] f32 gradients vs the CPU: worst relative error %.3g\n", worst);
}

// Note [Module device and dtype]: a model built on the CPU and moved takes its
// positions buffer along (before, it stayed on the CPU and the GPU forward failed).
TEST(GpuGPT2, a_model_moved_to_the_gpu_takes_its_buffers) {
  ACCRUE_REQUIRE_CUDA();
  TF32Off tf32_off;
  const nn::GPT2Config c = tiny_config();
  const auto cpu = make_gpt2(c, Device::cpu()), moved = make_gpt2(c, Device::cpu());
  moved->to(kGpu);
  for (const auto& b : moved->named_buffers())
    EXPECT_EQ(b.tensor.device(), kGpu) << b.name;
  const Tensor idx = tokens(2, 32, c.vocab_size, 4);
  NoGradGuard no_grad;
  EXPECT_LT(test::relative_error(moved->forward(idx.to(kGpu)), cpu->forward(idx)), 1e-5);
}

TEST(GpuGPT2, bf16_compute_copy_runs_close_to_f32) {
  ACCRUE_REQUIRE_CUDA();
  TF32Off tf32_off;
  const nn::GPT2Config c = tiny_config();
  const auto f32 = make_gpt2(c, kGpu), bf16 = make_gpt2(c, kGpu);
  auto a32 = arena_for(*f32, DType::f32);
  auto a16 = arena_for(*bf16, DType::bf16);
  ASSERT_EQ(bf16->wte().dtype(), DType::bf16);  // the tied table is one compute slot
  const Tensor idx = tokens(4, 32, c.vocab_size, 4).to(kGpu);
  const Tensor targets = tokens(4, 32, c.vocab_size, 5).to(kGpu);
  {
    NoGradGuard no_grad;
    const Tensor h16 = bf16->forward(idx);
    EXPECT_EQ(h16.dtype(), DType::bf16);
    const double err = test::relative_error(h16.to(DType::f32), f32->forward(idx));
    std::printf("[gpu gpt2] bf16 hidden state vs f32: %.3g\n", err);
    EXPECT_LT(err, 3e-2);
  }
  a32->begin_window();
  a16->begin_window();
  const Loss l32 = f32->loss(idx, targets), l16 = bf16->loss(idx, targets);
  backward(l32.sum);
  backward(l16.sum);
  const double loss32 = l32.sum.item(), loss16 = l16.sum.item();
  std::printf("[gpu gpt2] loss f32 %.6f, bf16 compute copy %.6f\n", loss32, loss16);
  EXPECT_NEAR(loss16, loss32, 1e-2 * std::fabs(loss32));
  EXPECT_EQ(a16->zero_unwritten(), 0);
  // The gradients land in the f32 arena; bf16 activations cost a few percent.
  const double err = test::relative_error(a16->grads(), a32->grads());
  std::printf("[gpu gpt2] bf16 gradients vs f32: %.3g\n", err);
  EXPECT_LT(err, 0.1);
  for (float g : a16->grads().to_vector<float>())
    ASSERT_TRUE(std::isfinite(g));
}

TEST(GpuGPT2, d12_builds_with_the_gpt2_parameter_count_and_trains) {
  ACCRUE_REQUIRE_CUDA();
  // Under compute-sanitizer's initcheck this one test ran past 300 s on an
  // H100 (bench/RESULTS.md); the smaller GPT-2 tests here run the same kernels.
  if (std::getenv("ACCRUE_UNDER_SANITIZER") != nullptr)
    GTEST_SKIP() << "the 124M model is too slow under compute-sanitizer (ACCRUE_UNDER_SANITIZER "
                    "is set); the smaller GPT-2 tests cover its kernels";
  // The real 124M model (its initial values are drawn on the CPU: seconds).
  const auto start = std::chrono::steady_clock::now();
  const nn::GPT2Config c = nn::GPT2Config::d12();
  const auto model = make_gpt2(c, kGpu);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(model->parameter_count(), 124475904);
  EXPECT_EQ(model->parameters().size(), 2u + 12u * 12u + 2u);
  const auto arena = arena_for(*model, DType::bf16);
  arena->begin_window();
  const Loss loss = model->loss(tokens(4, 128, c.vocab_size, 12).to(kGpu),
                                tokens(4, 128, c.vocab_size, 13).to(kGpu));
  backward(loss.sum);
  const double mean = loss.sum.item() / loss.count.item();
  std::printf("[gpu gpt2] d12 built in %.1f s; bf16 loss at init %.4f (log(50257) = %.4f)\n",
              seconds, mean, std::log(50257.0));
  // Small initial logits: the loss starts near log(vocab).
  EXPECT_NEAR(mean, std::log(50257.0), 0.5);
  EXPECT_EQ(arena->zero_unwritten(), 0);
}

// One backward of a model in an arena: its gradients (f32 arena, copied to the
// host) and the peak memory above what was allocated before the forward.
struct Measured {
  Tensor grads;
  double loss = 0;
  int64_t peak_bytes = 0;
};

Measured measure(const nn::GPT2Config& c, DType compute, const Tensor& idx, const Tensor& targets) {
  const auto model = make_gpt2(c, kGpu, 7);
  const auto arena = arena_for(*model, compute);
  arena->begin_window();
  synchronize_device(0);
  reset_peak_memory(kGpu);
  const int64_t before = memory_stats(kGpu).current_bytes;
  Measured m;
  {
    const Loss loss = model->loss(idx, targets);
    backward(loss.sum);
    m.loss = loss.sum.item();
  }
  synchronize_device(0);
  m.peak_bytes = memory_stats(kGpu).peak_bytes - before;
  m.grads = arena->grads().to(Device::cpu());
  return m;
}

TEST(GpuGPT2, checkpointing_gives_bitwise_equal_gradients_and_a_lower_peak) {
  ACCRUE_REQUIRE_CUDA();
  nn::GPT2Config c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 256;
  c.block_size = 256;
  c.vocab_size = 1024;  // small, so that the activations dominate the peak
  const Tensor idx = tokens(8, 256, c.vocab_size, 8).to(kGpu);
  const Tensor targets = tokens(8, 256, c.vocab_size, 9).to(kGpu);
  for (DType compute : {DType::f32, DType::bf16}) {
    c.activation_checkpointing = false;
    const Measured plain = measure(c, compute, idx, targets);
    c.activation_checkpointing = true;
    const Measured ckpt = measure(c, compute, idx, targets);
    std::printf(
        "[gpu gpt2] %s, 4 x 256 wide, B=8 T=256: peak %.1f MiB plain, %.1f MiB "
        "checkpointed\n",
        dtype_name(compute), plain.peak_bytes / 1048576.0, ckpt.peak_bytes / 1048576.0);
    EXPECT_EQ(ckpt.loss, plain.loss) << dtype_name(compute);
    EXPECT_TRUE(test::all_equal(ckpt.grads, plain.grads)) << dtype_name(compute);
    EXPECT_LT(ckpt.peak_bytes, plain.peak_bytes) << dtype_name(compute);
  }
}

TEST(GpuGPT2, checkpointing_with_dropout_redraws_the_forward_masks) {
  ACCRUE_REQUIRE_CUDA();
  nn::GPT2Config c = tiny_config();
  c.dropout = 0.1;
  c.dropout_seed = 3;
  const Tensor idx = tokens(4, 32, c.vocab_size, 10).to(kGpu);
  const Tensor targets = tokens(4, 32, c.vocab_size, 11).to(kGpu);
  const Measured plain = measure(c, DType::f32, idx, targets);
  c.activation_checkpointing = true;
  const Measured ckpt = measure(c, DType::f32, idx, targets);
  EXPECT_EQ(ckpt.loss, plain.loss);
  EXPECT_TRUE(test::all_equal(ckpt.grads, plain.grads));
  // And dropout did something: the loss differs from the model without it.
  c.dropout = 0.0;
  EXPECT_NE(measure(c, DType::f32, idx, targets).loss, plain.loss);
}

}  // namespace
}  // namespace accrue
