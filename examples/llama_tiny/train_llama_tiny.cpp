// A tiny Llama (examples/llama_tiny/llama.h) trained with the Window on
// right-padded batches of variable-length sequences, on the GPU when there is
// one. The sequences follow a learnable rule (every other token repeats the
// one before it), so the loss falls well below log(vocabulary).
// `accrue_llama_tiny --help` lists the options.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "accrue.h"
#include "examples/common/launch.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"
#include "examples/llama_tiny/llama.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_llama_tiny";

struct Options {
  int64_t micro_batch = 8, accum = 4, windows = 40, seq_len = 64, min_len = 8, seed = 1;
  double lr = 1e-2;
  DType dtype = DType::f32;
  bool force_cpu = false;
};

bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Trains a tiny Llama (grouped-query attention, RMSNorm, rotary embeddings, "
                  "SwiGLU) on right-padded variable-length batches, K micro-batches per window.");
  cli.integer("--micro-batch", &o.micro_batch, "B", "sequences per micro-batch").min(1);
  cli.integer("--accum", &o.accum, "K", "micro-batches per window").min(1);
  cli.integer("--windows", &o.windows, "W", "windows to train").min(1);
  cli.integer("--seq-len", &o.seq_len, "T", "the longest sequence (the padded length)")
      .min(2)
      .max(256);
  cli.integer("--min-len", &o.min_len, "L", "the shortest sequence").min(1);
  cli.integer("--seed", &o.seed, "S", "seed of the weights and the data").min(0);
  cli.number("--lr", &o.lr, "LR", "AdamW learning rate").above(0);
  cli.choice<DType>("--dtype", &o.dtype,
                    {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f64", DType::f64}},
                    "compute dtype (bf16 over f32 master weights)");
  cli.flag("--cpu", &o.force_cpu, "run on the CPU even when a GPU is present");
  if (!cli.parse(argc, argv)) return false;
  if (o.min_len > o.seq_len)
    usage_error("--min-len ", o.min_len, " is longer than --seq-len ", o.seq_len);
  return true;
}

// One right-padded micro-batch: inputs (pad 0), targets (-100 past each
// length) and the lengths, drawn from `gen`.
struct Batch {
  Tensor inputs, targets;
  std::vector<int64_t> lengths;
};
Batch make_batch(const Options& o, int64_t vocab, Generator& gen, Device device) {
  const int64_t B = o.micro_batch, T = o.seq_len;
  const std::vector<int64_t> draws =
      randint(1, vocab, {B, T + 1}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  const std::vector<int64_t> lens =
      randint(o.min_len, T + 1, {B}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  std::vector<int64_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> seq(draws.begin() + b * (T + 1), draws.begin() + (b + 1) * (T + 1));
    for (int64_t t = 1; t <= T; t += 2)
      seq[static_cast<size_t>(t)] = seq[static_cast<size_t>(t - 1)];
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < lens[static_cast<size_t>(b)];
      inputs[static_cast<size_t>(b * T + t)] = real ? seq[static_cast<size_t>(t)] : 0;
      targets[static_cast<size_t>(b * T + t)] = real ? seq[static_cast<size_t>(t + 1)] : -100;
    }
  }
  return {from_vector<int64_t>(inputs, {B, T}, DType::i64, device),
          from_vector<int64_t>(targets, {B, T}, DType::i64, device), lens};
}

int train(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  const Launch where = launch(opt.force_cpu);
  const Device device = where.device;
  LlamaConfig config;
  config.max_positions = opt.seq_len;
  std::printf(
      "%s on %s: Llama %lld layers, %lld query / %lld kv heads, hidden %lld; micro-batch "
      "%lld x K=%lld, sequences of %lld to %lld tokens, %s\n",
      kProgram, where.describe().c_str(), (long long)config.layers, (long long)config.heads,
      (long long)config.kv_heads, (long long)config.hidden, (long long)opt.micro_batch,
      (long long)opt.accum, (long long)opt.min_len, (long long)opt.seq_len, dtype_name(opt.dtype));

  Generator init(static_cast<uint64_t>(opt.seed)), data(static_cast<uint64_t>(opt.seed) + 1);
  const DType master = opt.dtype == DType::f64 ? DType::f64 : DType::f32;
  Llama model(config, {device, master, &init});
  optim::Optimizer optimizer(optim::AdamWOptions(opt.lr).betas(0.9, 0.95).weight_decay(0.1));
  std::vector<Tensor> norms;  // RMSNorm weights are not decayed
  for (const nn::NamedParameter& p : model.named_parameters())
    if (p.tensor.dim() < 2) norms.push_back(p.tensor);
  optimizer.add_param_group(norms, optim::GroupOptions().weight_decay(0.0));
  optim::ParamStore store(model.named_parameters(), optim::ParamStoreOptions()
                                                        .device(device)
                                                        .master_dtype(master)
                                                        .compute_dtype(opt.dtype)
                                                        .moments(optimizer.moments_needed()));
  optim::Window window(store, optimizer,
                       optim::WindowOptions().micro_steps(opt.accum).max_grad_norm(1.0));
  double first = NAN, last = NAN;
  for (int64_t w = 1; w <= opt.windows; ++w) {
    for (int64_t k = 0; k < opt.accum; ++k) {
      const Batch b = make_batch(opt, config.vocab_size, data, device);
      window.backward(model.loss(b.inputs, b.targets, b.lengths));
    }
    window.close();
    if (w != 1 && w % 10 != 0 && w != opt.windows) continue;
    const optim::WindowReport r = window.report();
    if (w == 1) first = r.loss;
    last = r.loss;
    std::printf("window %4lld  loss %.4f  grad-norm %.4f  tokens %.0f\n", (long long)w, r.loss,
                r.grad_norm, r.items);
  }
  std::printf("loss %.4f -> %.4f over %lld windows (log(vocabulary) = %.4f)\n", first, last,
              (long long)opt.windows, std::log(static_cast<double>(config.vocab_size)));
  ACCRUE_CHECK(std::isfinite(last), "the loss is not finite (", last, ") at window ", opt.windows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
