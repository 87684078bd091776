#include "examples/gpt2/gpt2_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "examples/common/json.h"

namespace accrue::examples {

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
      .boolean("cuda_graphs", result.cuda_graphs)
      .integer("concurrent_micro_batches", o.concurrent_micro_batches)
      .integer("weight_grad_branch", o.weight_grad_branch);
  if (result.cuda_graphs) {
    c.integer("graph_memory_bytes", graph_memory(device.index).reserved_high_bytes);
  } else {
    c.null("graph_memory_bytes");
  }
  c.boolean("composed", o.composed);
  c.boolean("copy_engine_all_reduce", result.copy_engine_all_reduce);
  c.number("bucket_mb", o.grad_sync.bucket_mib());
  c.text("grad_transport", o.grad_sync.transport_name());
  c.integer("gemm_sm_margin", o.grad_sync.gemm_sm_margin);
  c.integer("nccl_max_ctas", o.grad_sync.nccl_max_ctas);
  c.boolean("close_under_forward", o.close_under_forward.on);
  o.fp8.describe_json(c);
  BenchTiming t;
  t.window_ms = result.window_ms;
  t.window_tokens = plan.window_tokens;
  t.flops_per_token = flops_per_token(config, plan.T);
  t.peak_flops = peak;
  t.world_size = world_size;
  t.final_loss = result.final_loss;
  JsonObject line = bench_summary("accrue_train_gpt2", device, t);
  if (result.reducer) {
    // Rank 0's last window (dist::ReducerTiming): the last micro-step's
    // backward with the buckets under it, and what the close still waited for.
    line.number("reducer_last_backward_ms", result.reducer->last_backward_ms)
        .number("reducer_close_waited_ms", result.reducer->exposed_ms);
  }
  line.object("config", c);
  std::printf("%s\n", line.str().c_str());
}

}  // namespace accrue::examples
