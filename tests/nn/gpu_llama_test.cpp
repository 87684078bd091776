// nn::Llama on CUDA against the CPU in f64: the same weights and batches
// (right-padded with device-resident lengths, packed documents with
// device-resident offsets, positions derived on the device), in f32 (TF32
// off) and bf16; hidden state, loss and every gradient. Activation
// checkpointing gives bitwise-equal gradients on the GPU too, device layouts
// replay from CUDA graphs, and a transformers directory loads onto the GPU.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/core/env_flag.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/attention.h"
#include "accrue/nn/llama.h"
#include "accrue/optim/graphed_window.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

Tensor tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return randint(0, vocab, {B, T}, DType::i64, Device::cpu(), &gen);
}

nn::LlamaConfig config(bool qwen3) {
  nn::LlamaConfig c = qwen3 ? nn::LlamaConfig::qwen3_tiny() : nn::LlamaConfig::llama_tiny();
  if (!qwen3) c.rope_scaling = {nn::RopeScaling::Type::llama3, 4.0, 1.0, 4.0, 16};
  return c;
}

std::unique_ptr<nn::Llama> make(const nn::LlamaConfig& c, Device device, DType dtype) {
  Generator gen(5);
  auto model = std::make_unique<nn::Llama>(c, nn::ParamOptions{device, dtype, &gen});
  // Norms start at one: perturb them (the same on every device) so they act.
  NoGradGuard no_grad;
  Generator noise(6);
  for (const nn::NamedParameter& p : model->named_parameters())
    if (p.tensor.dim() == 1)
      p.tensor.copy_((randn(p.tensor.shape(), DType::f64, Device::cpu(), &noise) * 0.2 + 1.0)
                         .to(dtype)
                         .to(device));
  return model;
}

enum class Kind { padded, packed, within };

// On the GPU the packed layout's positions are derived there from the offsets
// (Note [Positions from document offsets]); the CPU reference is given them.
// Within rows (Note [Documents within rows]): rows of 9 + 7, 16 and 3 + 13
// tokens through the bias on the GPU, the same documents packed on the CPU.
nn::BatchLayout layout_for(Kind kind, Device device) {
  if (kind == Kind::within) {
    const nn::BatchLayout docs =
        nn::BatchLayout::packed_documents({9, 7, 16, 3, 13}, 3, 16, device);
    return device.is_cpu() ? docs : nn::BatchLayout::documents_within_rows(docs.positions);
  }
  const bool packed = kind == Kind::packed;
  if (packed && !device.is_cpu())
    return nn::BatchLayout::packed(
        from_vector<int64_t>({0, 9, 29, 32, 48}, {5}, DType::i64, device));
  if (packed) return nn::BatchLayout::packed_documents({9, 20, 3, 16}, 3, 16, device);
  return nn::BatchLayout::padded({16, 7, 12}, device);
}

struct Result {
  Tensor hidden;
  double loss = 0;
  std::vector<Tensor> grads;
};

Result run(const nn::LlamaConfig& c, Device device, DType dtype, Kind kind) {
  const auto model = make(c, device, dtype);
  const Tensor idx = tokens(3, 16, c.vocab_size, 1).to(device);
  Tensor targets = tokens(3, 16, c.vocab_size, 2);
  if (kind == Kind::padded) {  // the padding's targets are -100
    const std::vector<int64_t> lens = {16, 7, 12};
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t t = lens[static_cast<size_t>(b)]; t < 16; ++t)
        targets.data<int64_t>()[b * 16 + t] = -100;
  }
  const nn::BatchLayout layout = layout_for(kind, device);
  Result r;
  {
    NoGradGuard no_grad;
    r.hidden = model->forward(idx, layout).to(Device::cpu()).to(DType::f64);
  }
  const Loss l = model->loss(idx, targets.to(device), layout);
  r.loss = l.sum.item() / l.count.item();
  backward(l.sum);
  for (const Tensor& p : model->parameters())
    r.grads.push_back(grad(p).to(Device::cpu()).to(DType::f64));
  return r;
}

void expect_close_to_cpu(DType dtype, double hidden_tol, double loss_tol, double grad_tol) {
  test::Tf32Scope tf32(false);
  for (bool qwen3 : {false, true}) {
    for (Kind kind : {Kind::padded, Kind::packed, Kind::within}) {
      const nn::LlamaConfig c = config(qwen3);
      const Result cpu = run(c, Device::cpu(), DType::f64, kind);
      const Result gpu = run(c, kGpu, dtype, kind);
      // Within rows, bf16 keeps cuDNN's fused kernels (the bias is its input),
      // unless the sanitizer runs turned them off (Note [Attention paths]).
      if (kind == Kind::within && dtype == DType::bf16 && !env_flag("ACCRUE_ATTENTION_COMPOSED")) {
        EXPECT_EQ(kernels::last_attention_path(), kernels::AttentionPath::cudnn);
      }
      double worst_grad = 0;
      for (size_t i = 0; i < cpu.grads.size(); ++i)
        worst_grad = std::max(worst_grad, test::relative_error(gpu.grads[i], cpu.grads[i]));
      const double hidden = test::relative_error(gpu.hidden, cpu.hidden);
      const double loss = std::fabs(gpu.loss - cpu.loss) / cpu.loss;
      std::printf("[gpu llama] %s %s %s: hidden %.3g, loss %.3g, worst gradient %.3g\n",
                  dtype_name(dtype), qwen3 ? "qwen3" : "llama",
                  kind == Kind::padded   ? "padded"
                  : kind == Kind::packed ? "packed"
                                         : "within rows",
                  hidden, loss, worst_grad);
      EXPECT_LE(hidden, hidden_tol);
      EXPECT_LE(loss, loss_tol);
      EXPECT_LE(worst_grad, grad_tol);
    }
  }
}

TEST(GpuLlama, f32_matches_the_cpu_in_f64) {
  ACCRUE_REQUIRE_CUDA();
  expect_close_to_cpu(DType::f32, 1e-5, 1e-5, 1e-4);
}

TEST(GpuLlama, bf16_stays_close_to_the_cpu_in_f64) {
  ACCRUE_REQUIRE_CUDA();
  expect_close_to_cpu(DType::bf16, 3e-2, 2e-2, 1e-1);
}

TEST(GpuLlama, activation_checkpointing_gives_bitwise_equal_gradients) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16}) {
    nn::LlamaConfig c = config(true);
    const Result plain = run(c, kGpu, dtype, Kind::padded);
    c.activation_checkpointing = true;
    const Result ckpt = run(c, kGpu, dtype, Kind::padded);
    EXPECT_EQ(ckpt.loss, plain.loss);
    for (size_t i = 0; i < plain.grads.size(); ++i)
      EXPECT_TRUE(test::all_equal(ckpt.grads[i], plain.grads[i])) << dtype_name(dtype) << " " << i;
  }
}

// Note [Llama batch layouts]: the layout's tensors live on the device and
// are never read back, so a micro-step records into a CUDA graph (Note
// [Graphed window]): 4 windows of K = 3 with a bf16 compute copy, per-window
// lengths or document offsets (positions derived on the device), replayed
// from graphs bitwise equal to the eager run.
struct LlamaRun {
  std::unique_ptr<nn::Llama> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::ParamStore> store;
  std::unique_ptr<optim::Window> window;

  explicit LlamaRun(const nn::LlamaConfig& c) {
    Generator gen(7);
    model = std::make_unique<nn::Llama>(c, nn::ParamOptions{kGpu, DType::f32, &gen});
    optimizer = std::make_unique<optim::Optimizer>(optim::AdamWOptions(3e-3).weight_decay(0.1));
    store = std::make_unique<optim::ParamStore>(model->named_parameters(),
                                                optim::ParamStoreOptions()
                                                    .device(kGpu)
                                                    .compute_dtype(DType::bf16)
                                                    .moments(optimizer->moments_needed()));
    window = std::make_unique<optim::Window>(
        *store, *optimizer, optim::WindowOptions().micro_steps(3).max_grad_norm(1.0));
  }
  // idx, targets, and the layout tensor: lengths [4] or offsets [4] (3 documents).
  std::vector<Tensor> batch(int64_t w, int64_t k, bool packed, int64_t V) const {
    const int64_t B = 4, T = 32, seed = 100 * w + k;
    Tensor idx = tokens(B, T, V, static_cast<uint64_t>(seed));
    std::vector<int64_t> targets =
        tokens(B, T, V, static_cast<uint64_t>(seed) + 50).to_vector<int64_t>();
    Tensor layout;
    if (packed) {
      const int64_t a = 10 + (seed % 40), b = a + 30 + (seed % 50);
      layout = from_vector<int64_t>({0, a, b, B * T}, {4}, DType::i64, kGpu);
    } else {
      std::vector<int64_t> lens(static_cast<size_t>(B));
      for (int64_t i = 0; i < B; ++i) {
        lens[static_cast<size_t>(i)] = 8 + (seed * 7 + i * 5) % 25;
        for (int64_t t = lens[static_cast<size_t>(i)]; t < T; ++t)
          targets[static_cast<size_t>(i * T + t)] = -100;
      }
      layout = from_vector<int64_t>(lens, {B}, DType::i64, kGpu);
    }
    return {idx.to(kGpu), from_vector<int64_t>(targets, {B, T}).to(kGpu), layout};
  }
  optim::GraphedWindow::StepFn step(bool packed) const {
    return [m = model.get(), packed](const std::vector<Tensor>& in) {
      return m->loss(in[0], in[1],
                     packed ? nn::BatchLayout::packed(in[2]) : nn::BatchLayout::padded(in[2]));
    };
  }
};

// With the weight-gradient branch too (Note [Weight gradients on a branch]):
// the Linears' and RMSNorms' parameter gradients on a side stream, the same bits.
TEST(GpuLlama, device_layouts_replay_from_cuda_graphs_bitwise) {
  ACCRUE_REQUIRE_CUDA();
  const CudaAllocatorMode before = cuda_allocator_mode();
  set_cuda_allocator_mode(CudaAllocatorMode::StreamOrderedPool);
  for (int lag : {0, 2})
    for (bool packed : {false, true}) {
      SCOPED_TRACE(std::string(packed ? "packed" : "padded") + ", branch lag " +
                   std::to_string(lag));
      nn::LlamaConfig c = config(true);
      LlamaRun eager(c), graphed(c);
      optim::GraphedWindow g(*graphed.window, graphed.step(packed));
      g.set_weight_grad_branch(lag);
      for (int64_t w = 0; w < 4; ++w) {
        for (int64_t k = 0; k < 3; ++k) {
          const std::vector<Tensor> in = eager.batch(w, k, packed, c.vocab_size);
          eager.window->backward(eager.step(packed)(in));
          g.backward(graphed.batch(w, k, packed, c.vocab_size));
        }
        eager.window->close();
        g.close();
        EXPECT_EQ(graphed.window->report().loss, eager.window->report().loss) << "window " << w;
      }
      EXPECT_EQ(g.counts().graphs, 3) << g.why_eager();
      EXPECT_EQ(g.counts().replayed_micro_steps, 10);
      EXPECT_EQ(g.weight_grad_branch_entries() > 0, lag > 0);
      EXPECT_TRUE(test::all_equal(graphed.store->master(), eager.store->master()));
    }
  set_cuda_allocator_mode(before);
}

TEST(GpuLlama, a_transformers_directory_loads_onto_the_gpu) {
  ACCRUE_REQUIRE_CUDA();
  const std::string dir = std::string(ACCRUE_NN_FIXTURES) + "/hf_qwen3_tiny";
  const auto cpu = nn::Llama::from_hf(dir, {Device::cpu(), DType::f32, nullptr});
  const auto gpu = nn::Llama::from_hf(dir, {kGpu, DType::f32, nullptr});
  const std::map<std::string, Tensor> a = cpu->state_dict(), b = gpu->state_dict();
  for (const auto& [name, t] : a)
    EXPECT_TRUE(test::all_equal(detach(b.at(name)).to(Device::cpu()), detach(t))) << name;
}

}  // namespace
}  // namespace accrue
