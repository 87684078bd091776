#include "tests/golden/llama_hf_golden.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "accrue/nn/llama.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/golden/gpt2_golden.h"

namespace accrue::golden {

std::string llama_case_dir(const std::string& name) {
  return std::string(ACCRUE_GOLDEN_DIR) + "/llama_hf/" + name;
}

PaddedBatch padded_batch(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths,
                         int64_t first, int64_t B, int64_t T) {
  PaddedBatch r{std::vector<int64_t>(static_cast<size_t>(B * T)),
                std::vector<int64_t>(static_cast<size_t>(B * T)),
                std::vector<int64_t>(static_cast<size_t>(B))};
  for (int64_t b = 0; b < B; ++b) {
    const int64_t seq = first + b;
    const int64_t len = lengths[static_cast<size_t>(seq)];
    r.lengths[static_cast<size_t>(b)] = len;
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < len;
      const size_t at = static_cast<size_t>(seq * (T + 1) + t);
      r.inputs[static_cast<size_t>(b * T + t)] = real ? tokens[at] : 0;
      r.targets[static_cast<size_t>(b * T + t)] = real ? tokens[at + 1] : -100;
    }
  }
  return r;
}

double max_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(DType::f64).contiguous().to_vector<double>(),
                            y = b.to(DType::f64).contiguous().to_vector<double>();
  if (x.size() != y.size()) return INFINITY;
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    diff = std::max(diff, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

LlamaRun train_llama_case(const std::string& name, const LlamaRunOptions& o) {
  const std::string dir = llama_case_dir(name);
  const FixtureFile data(dir + "/data.safetensors");
  Generator gen(1);
  std::unique_ptr<nn::Llama> model =
      nn::Llama::from_hf(dir + "/hf", {o.device, o.master_dtype, &gen}, o.checkpointing);
  optim::Optimizer optimizer(optim::AdamWOptions(data.number("lr"))
                                 .betas(data.number("beta1"), data.number("beta2"))
                                 .eps(data.number("eps"))
                                 .weight_decay(data.number("weight_decay")));
  const std::vector<Tensor> fp8_weights = o.fp8 ? model->use_fp8() : std::vector<Tensor>{};
  std::vector<Tensor> no_decay;
  for (const nn::NamedParameter& p : model->named_parameters())
    if (p.tensor.dim() < 2) no_decay.push_back(p.tensor);
  optimizer.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optim::ParamStore store(model->named_parameters(), optim::ParamStoreOptions()
                                                         .device(o.device)
                                                         .master_dtype(o.master_dtype)
                                                         .compute_dtype(o.compute_dtype)
                                                         .moments(optimizer.moments_needed()));
  if (o.fp8 && o.keep_fp8_copies) store.keep_fp8_copies(fp8_weights);
  const int64_t fixture_windows = data.integer("windows"), KF = data.integer("micro_steps"),
                BF = data.integer("micro_batch"), T = data.integer("seq_len");
  const int64_t K = o.micro_steps, B = KF * BF / K;
  const int64_t windows = o.windows > 0 ? o.windows : fixture_windows;
  optim::Window window(
      store, optimizer,
      optim::WindowOptions().micro_steps(K).max_grad_norm(data.number("max_grad_norm")));
  const std::vector<int64_t> tokens = data.tensor("tokens").to_vector<int64_t>(),
                             lengths = data.tensor("lengths").to_vector<int64_t>();
  LlamaRun run;
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      // The window's sequences in order.
      const PaddedBatch mb =
          padded_batch(tokens, lengths, (w % fixture_windows) * KF * BF + k * B, B, T);
      window.backward(model->loss(from_vector<int64_t>(mb.inputs, {B, T}).to(o.device),
                                  from_vector<int64_t>(mb.targets, {B, T}).to(o.device),
                                  nn::BatchLayout::padded(mb.lengths, o.device)));
    }
    window.close();
    const optim::WindowReport r = window.report();
    run.loss.push_back(r.loss);
    run.grad_norm.push_back(r.grad_norm);
  }
  // state_dict gives the master weights (with a bf16 compute copy too).
  for (const auto& [key, t] : model->state_dict())
    run.final_state.emplace(key, t.to(Device::cpu()));
  return run;
}

}  // namespace accrue::golden
