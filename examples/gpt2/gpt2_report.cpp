#include "examples/gpt2/gpt2_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "examples/common/json.h"

namespace accrue::examples {

double WindowReporter::mfu(double tokens_per_s) const {
  return model_flops_utilization(tokens_per_s, flops_token_, peak_, world_size_);
}

void WindowReporter::print(int64_t w, const optim::WindowReport& r, double lr) {
  lr_ = lr;
  tokens_per_s_ = window_tokens_ / clock_.lap();
  const double m = mfu(tokens_per_s_);
  char mfu_text[16] = "n/a";
  if (!std::isnan(m)) std::snprintf(mfu_text, sizeof(mfu_text), "%.1f%%", 100 * m);
  const int64_t in_use = device_bytes_in_use(device_);
  char scale_text[32] = "";
  if (compute_ == DType::f16)
    std::snprintf(scale_text, sizeof(scale_text), " | scale %g", r.loss_scale);
  loss_z_ = loss_z_score_.add(r.loss);
  norm_z_ = norm_z_score_.add(r.grad_norm);
  char noise_text[48] = "";
  if (r.noise_windows > 0)
    std::snprintf(noise_text, sizeof(noise_text), " | noise scale %.4g", r.noise_scale);
  char alert_text[64] = "";
  if (std::fabs(loss_z_) >= 3.0 || std::fabs(norm_z_) >= 3.0)
    std::snprintf(alert_text, sizeof(alert_text), " | ALERT z: loss %.1f, grad-norm %.1f", loss_z_,
                  norm_z_);
  std::printf(
      "window %lld/%lld | loss %.4f | grad-norm %.4f | lr %.3e | %.0f tok/s | MFU %s | "
      "peak %s%s | skipped %lld%s%s%s\n",
      (long long)w, (long long)windows_, r.loss, r.grad_norm, lr, tokens_per_s_, mfu_text,
      mib(memory_stats(device_).peak_bytes).c_str(),
      in_use >= 0 ? (" (device " + mib(in_use) + " in use)").c_str() : "",
      (long long)r.skipped_windows, scale_text, noise_text, alert_text);
}

std::vector<std::pair<std::string, double>> WindowReporter::extras(double val_loss) const {
  return {{"lr", lr_},
          {"tokens_per_s", tokens_per_s_},
          {"mfu", mfu(tokens_per_s_)},
          {"peak_bytes", static_cast<double>(memory_stats(device_).peak_bytes)},
          {"val_loss", val_loss},
          {"loss_z", loss_z_},
          {"grad_norm_z", norm_z_}};
}

void print_bench_line(const Gpt2Options& o, const nn::GPT2Config& config, const BatchPlan& plan,
                      DType compute, Device device, int world_size, const BenchResult& result) {
  const double peak = peak_flops(o.peak_tflops, device, device_name(device));
  JsonObject c;
  c.text("model", o.model)
      .integer("n_layer", config.n_layer)
      .integer("n_head", config.n_head)
      .integer("n_embd", config.n_embd)
      .integer("vocab_size", config.vocab_size)
      .integer("block_size", config.block_size)
      .integer("parameters", config.parameter_count())
      .integer("micro_batch", plan.B)
      .integer("seq_len", plan.T)
      .integer("micro_steps", plan.K)
      .integer("tokens_per_window", plan.window_tokens)
      .text("dtype", dtype_name(compute))
      .boolean("activation_checkpointing", config.activation_checkpointing)
      .number("dropout", config.dropout)
      .integer("warmup_windows", o.bench_warmup)
      .integer("timed_windows", o.bench_windows)
      .boolean("cuda_graphs", result.cuda_graphs);
  if (result.cuda_graphs) {
    c.integer("graph_memory_bytes", graph_memory(device.index).reserved_high_bytes);
  } else {
    c.null("graph_memory_bytes");
  }
  c.boolean("composed", o.composed);
  BenchTiming t;
  t.window_ms = result.window_ms;
  t.window_tokens = plan.window_tokens;
  t.flops_per_token = flops_per_token(config, plan.T);
  t.peak_flops = peak;
  t.world_size = world_size;
  t.final_loss = result.final_loss;
  JsonObject line = bench_summary("accrue_train_gpt2", device, t);
  line.object("config", c);
  std::printf("%s\n", line.str().c_str());
}

}  // namespace accrue::examples
