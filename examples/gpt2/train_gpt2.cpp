// The GPT-2 trainer: llm.c-format token shards (or synthetic tokens) through
// nn::GPT2, K micro-batches per optimizer step in one accumulation Window,
// AdamW with GPT-2's decay groups and a warmup + cosine schedule, bf16/f16
// compute copies, checkpoints that resume bit-exactly, and data parallelism
// under torchrun/mpirun. `accrue_train_gpt2 --help` lists every option.
//
//   python3 tools/make_shards.py README.md --output-prefix /tmp/readme
//   accrue_train_gpt2 --model tiny --train-data '/tmp/readme_train_*.bin'
//                     --val-data '/tmp/readme_val_*.bin' --micro-batch 4 --seq-len 32
//   accrue_train_gpt2 --model d12 --synthetic --bench      # one JSON line of timings
//
// Data parallel, one process per GPU (examples/common/launch.h):
//   torchrun --nproc-per-node=2 --no-python build/ci/examples/accrue_train_gpt2 ...
//   mpirun -np 2 build/ci/examples/accrue_train_gpt2 ...
// Each rank reads its own disjoint tokens of every step (Note [Loader
// positions] in data/token_shards.h); the reducer all-reduces the gradient
// buckets during the last micro-step's backward.
//
// The pieces: gpt2_options (the command line, the model configuration, the
// batch arithmetic), gpt2_data (shards or synthetic tokens, validation),
// gpt2_checkpoint (Note [Trainer checkpoint]), gpt2_report (progress line,
// metrics, --bench's JSON line).
//
// Note [Trainer synchronization]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Tokens are read and validated against the vocabulary on the host (so
// kernels::set_check_indices(false) drops the device-side index checks, which
// inside the Window would be deferred, Note [Deferred index checks], but still
// cost two launches per call), and the Window keeps the loss, the item count, the
// norm and the loss scale on the device. The host reads them once per
// window, through window.report() after close(); --bench does not even do
// that until its last window (CUDA events time each window). One wait is
// left: with --train-data each micro-batch's tokens are copied from pageable
// host memory, and that copy waits for the stream to drain (core/copy.cpp)
// before the host may reuse the buffer, so the host cannot run ahead of the
// GPU by more than one micro-step. --synthetic draws its tokens on the device
// and its windows never wait. Validation and checkpoints happen between
// windows and may synchronize.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/core/nvtx.h"
#include "accrue/nn/gpt2.h"
#include "accrue/nn/gpt2_hf.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/launch.h"
#include "examples/common/layer_metrics.h"
#include "examples/common/loss_scaling.h"
#include "examples/common/run_guard.h"
#include "examples/common/run_main.h"
#include "examples/common/timing.h"
#include "examples/composed_gpt2/composed_gpt2.h"
#include "examples/gpt2/gpt2_checkpoint.h"
#include "examples/gpt2/gpt2_data.h"
#include "examples/gpt2/gpt2_options.h"
#include "examples/gpt2/gpt2_report.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_train_gpt2";

// AdamW; GPT-2 decays only the Linear weights (2-d, not the embeddings).
optim::Optimizer make_optimizer(const Gpt2Options& opt, nn::GPT2& model) {
  optim::Optimizer optimizer(optim::AdamWOptions(opt.lr)
                                 .betas(opt.beta1, opt.beta2)
                                 .eps(opt.eps)
                                 .weight_decay(opt.weight_decay));
  std::vector<Tensor> no_decay;
  for (const nn::NamedParameter& p : model.named_parameters())
    if (p.tensor.dim() < 2 || p.name == "wte" || p.name == "wpe") no_decay.push_back(p.tensor);
  optimizer.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optimizer.set_schedule(
      std::make_shared<optim::WarmupCosine>(opt.warmup_windows, opt.windows, opt.min_lr_factor));
  return optimizer;
}

void print_optimizer(const Gpt2Options& opt, DType compute) {
  std::printf(
      "optimizer: AdamW lr %g (warmup %lld, cosine to %g x over %lld windows), betas "
      "(%g, %g), eps %g, weight decay %g, clip %g, compute %s%s\n",
      opt.lr, (long long)opt.warmup_windows, opt.min_lr_factor, (long long)opt.windows, opt.beta1,
      opt.beta2, opt.eps, opt.weight_decay, opt.max_grad_norm, dtype_name(compute),
      compute == DType::f16 ? " with dynamic loss scaling" : "");
}

// The f16 loss scaler (examples/common/loss_scaling.h).
LossScaling loss_scaling(const Gpt2Options& opt, const BatchPlan& plan, DType compute) {
  return {compute, plan.B * plan.T, opt.init_scale, opt.calibrate_scale};
}

void print_setup(const Launch& where, const nn::GPT2Config& config, const BatchPlan& plan,
                 const Gpt2Options& opt, const TrainingData& data) {
  std::printf("accrue GPT-2 trainer on %s (%s)%s\n", where.device.str().c_str(),
              device_name(where.device).c_str(),
              where.gpu ? "" : (std::string(", ") + cuda_unavailable_reason()).c_str());
  std::printf(
      "model: %lld layers, %lld heads, width %lld, vocab %lld (padded %lld), block %lld, "
      "%lld parameters, dropout %g%s\n",
      (long long)config.n_layer, (long long)config.n_head, (long long)config.n_embd,
      (long long)config.vocab_size, (long long)config.padded_vocab(), (long long)config.block_size,
      (long long)config.parameter_count(), config.dropout,
      config.activation_checkpointing ? ", activation checkpointing" : "");
  std::printf("batch: micro-batch %lld x seq %lld x %d rank(s) x K=%lld = %lld tokens per window\n",
              (long long)plan.B, (long long)plan.T, where.world_size(), (long long)plan.K,
              (long long)plan.window_tokens);
  std::printf("data: %s\n",
              opt.synthetic ? "synthetic tokens" : data.train_shards->describe().c_str());
  if (data.val_shards) std::printf("validation: %s\n", data.val_shards->describe().c_str());
}

// The run's last lines: the loss from its first to its last window and the
// windows skipped (Note [Honest exit codes] decides whether the run failed).
void report_run(int64_t start, int64_t end, double first_loss, const optim::WindowReport& last) {
  if (end <= start) {
    std::printf("nothing to do: the run is already at window %lld (--stop-after/--windows %lld)\n",
                (long long)start, (long long)end);
    return;
  }
  std::printf("loss %.4f -> %.4f over windows %lld..%lld, %lld skipped since window 1\n",
              first_loss, last.loss, (long long)start + 1, (long long)end,
              (long long)last.skipped_windows);
  // All digits: a resumed run must print exactly the uninterrupted run's line.
  std::printf("final: window %lld loss %.17g\n", (long long)end, last.loss);
}

// --metrics (Note [Metrics log]): rank 0 writes, appending when the run
// resumes, after the rows of the windows it computes again (Note [Metrics
// after resume]); the other ranks get a log that writes nothing.
optim::MetricsLog open_metrics(const Gpt2Options& opt, int64_t start, bool main_rank) {
  if (opt.metrics.empty() || !main_rank) return {};
  if (!opt.resume.empty()) {
    const int64_t removed = truncate_metrics_log(opt.metrics, start);
    if (removed > 0)
      std::printf("metrics: %s cut after window %lld (%lld later row%s removed)\n",
                  opt.metrics.c_str(), (long long)start, (long long)removed,
                  removed == 1 ? "" : "s");
  }
  return optim::MetricsLog(opt.metrics, !opt.resume.empty());
}

// --checkpoint-every: due at window w before the last (whose save waits for
// the run's verdict), and never at a window whose loss is not finite.
bool periodic_checkpoint_due(const Gpt2Options& opt, int64_t w, int64_t end,
                             const optim::WindowReport& r) {
  if (opt.checkpoint.empty() || opt.checkpoint_every <= 0 || w % opt.checkpoint_every != 0 ||
      w >= end)
    return false;
  if (std::isfinite(r.loss)) return true;
  std::printf("checkpoint: not written at window %lld, whose loss is not finite\n", (long long)w);
  return false;
}

int train(int argc, char** argv) {
  Gpt2Options opt;
  if (!parse_gpt2_options(argc, argv, opt)) return 0;
  const Launch where = launch(opt.force_cpu);
  const Device device = where.device;
  if (where.main_rank()) probe_gpt2_outputs(opt);  // rank 0 writes them
  // Each rank its own dropout masks and synthetic tokens; everything else from the seed.
  const nn::GPT2Config config = make_gpt2_config(opt, opt.seed + 1 + where.rank.rank);
  const BatchPlan plan = plan_batch(opt, config, where.world_size());
  const DType compute = compute_dtype(opt, where.gpu);
  // Note [Run record]: a checkpoint of another run is refused before anything is built.
  const RunRecord record = gpt2_run_record(opt, config, plan, compute, where.world_size(),
                                           loss_scaler_text(loss_scaling(opt, plan, compute)));
  std::optional<CheckpointFile> resumed;
  if (!opt.resume.empty()) resumed = read_checkpoint(opt.resume, record, opt.allowed_changes);
  // Data first: a bad shard fails before a large model is built.
  TrainingData data = open_data(opt, config, plan, where);
  BatchSource& source = *data.source;
  print_setup(where, config, plan, opt, data);

  Generator init_gen(opt.seed);
  nn::GPT2 model(config, {device, DType::f32, &init_gen});
  if (!opt.init_from.empty()) {
    nn::load_hf_gpt2(model, opt.init_from);
    std::printf("initialized from %s\n", opt.init_from.c_str());
  }
  optim::Optimizer optimizer = make_optimizer(opt, model);
  // Note [Copy-engine all-reduce]: the copy engines sum straight between
  // arenas the peer can map.
  optim::ParamStore arena(model.named_parameters(),
                          optim::ParamStoreOptions()
                              .device(device)
                              .compute_dtype(compute)
                              .moments(optimizer.moments_needed())
                              .shareable_gradients(opt.copy_engine_all_reduce));
  // Note [Window FP8 weights]: kept before the Window, whose close recasts them.
  if (opt.fp8.on) opt.fp8.keep_in(arena, model.use_fp8(opt.fp8.options()));
  const DataParallel dp =
      connect_data_parallel(where, arena,
                            {.copy_engine_all_reduce = opt.copy_engine_all_reduce,
                             .copy_engine_whole_buckets = opt.copy_engine_whole_buckets,
                             .timing = opt.bench,
                             .bucket_mb = opt.grad_sync.bucket_mb,
                             .transport = opt.grad_sync.transport,
                             .gemm_sm_margin = static_cast<int>(opt.grad_sync.gemm_sm_margin),
                             .nccl_max_ctas = static_cast<int>(opt.grad_sync.nccl_max_ctas)});
  if ((opt.copy_engine_all_reduce || opt.grad_sync.given()) && !dp.reducer)
    std::printf(
        "--copy-engine-all-reduce, --bucket-mb, --grad-transport, --gemm-sm-margin, "
        "--nccl-max-ctas: one process, no gradients to sum across GPUs\n");
  optim::Window window(
      arena, optimizer,
      optim::WindowOptions()
          .micro_steps(plan.K)
          .max_grad_norm(opt.max_grad_norm)
          .scaler(loss_scaler_options(loss_scaling(opt, plan, compute)))
          .norm_under_backward(opt.norm_under_backward)
          .noise_scale(opt.noise_scale_every)
          .close_under_forward(opt.close_under_forward.on, opt.close_under_forward.layer_elements,
                               opt.close_under_forward.max_blocks),
      dp.reducer.get());
  print_optimizer(opt, compute);
  std::printf("memory per rank: %s\n", arena.memory().describe().c_str());

  // Note [Honest exit codes]: skips in a row are bounded, and counted across a resume.
  RunGuard guard(opt.max_skipped_windows, resumed ? resumed->skipped_in_a_row : 0);
  const TrainState state{arena, window, model, source, where.world_size(), record, &guard};
  const int64_t start = resumed ? resume_checkpoint(*resumed, state) : 0;
  resumed.reset();  // the file's tensors are in the run now
  auto save = [&](const std::string& at) {
    save_checkpoint_reported(opt.checkpoint, state, where.main_rank(), at);
  };

  // --composed: the same weights through the public primitives only (no fused op).
  std::unique_ptr<ComposedGPT2> composed;
  if (opt.composed) composed = std::make_unique<ComposedGPT2>(model);
  auto loss_of = [&model, &composed](const Tensor& x, const Tensor& y) {
    return composed ? composed->loss(x, y) : model.loss(x, y);
  };
  if (!opt.gemm_tuning.empty())
    kernels::set_gemm_tuning_file(opt.gemm_tuning);  // Note [GEMM autotuning]
  // Note [Trainer synchronization]: the loader checked every token against the vocabulary.
  kernels::set_check_indices(false);
  reset_peak_memory(device);
  if (opt.nvtx) set_nvtx(true);  // Note [NVTX ranges]
  // Note [Graphed window]: on a GPU with --cuda-graphs; the CPU would run it eagerly anyway.
  std::unique_ptr<optim::GraphedWindow> graphed;
  if (opt.cuda_graphs && where.gpu) {
    graphed = std::make_unique<optim::GraphedWindow>(
        window, [&loss_of](const std::vector<Tensor>& in) { return loss_of(in[0], in[1]); });
    graphed->set_concurrent_micro_batches(static_cast<int>(opt.concurrent_micro_batches));
    graphed->set_weight_grad_branch(static_cast<int>(opt.weight_grad_branch));
    std::printf(
        "cuda graphs: micro-steps and close captured after one eager warm-up each; %lld "
        "micro-step(s) in flight\n",
        (long long)opt.concurrent_micro_batches);
  }
  std::unique_ptr<optim::LayerMonitor> layers =
      make_layer_monitor(opt.layer_metrics_every, arena, optimizer, graphed != nullptr);
  auto measures_layers = [&](int64_t w) { return layers && w % opt.layer_metrics_every == 0; };
  auto micro_step = [&] {
    auto [x, y] = source.next();
    if (graphed) {
      graphed->backward({x, y});
    } else {
      window.backward(loss_of(x, y));
    }
  };
  auto run_window = [&] {
    run_one_window(window, graphed.get(), layers.get(),
                   measures_layers(window.windows_closed() + 1), plan.K, micro_step);
  };
  WindowReporter reporter(
      opt.windows, plan.window_tokens, compute, device, flops_per_token(config, plan.T),
      peak_flops(opt.peak_tflops, device, device_name(device)), where.world_size());

  if (opt.bench) {  // timing mode: no report until the end
    BenchResult result;
    result.window_ms = time_windows(device, opt.bench_warmup, opt.bench_windows, run_window);
    result.final_loss = window.report().loss;
    result.cuda_graphs = graphed != nullptr;
    if (dp.reducer) {  // where the last window's communication went (rank 0's)
      result.copy_engine_all_reduce = dp.reducer->copy_engine_all_reduce();
      try {
        result.reducer = dp.reducer->last_timing();
      } catch (const Error& e) {  // a figure left out, not a failed benchmark
        std::fprintf(stderr, "accrue_train_gpt2: no reducer timing: %s\n",
                     error_message(e).c_str());
      }
    }
    print_bench_line(opt, config, plan, compute, device, where.world_size(), result);
    guard.finish(window.report());
    return 0;
  }

  const int64_t end = opt.stop_after.value_or(opt.windows);
  optim::MetricsLog metrics = open_metrics(opt, start, where.main_rank());
  double first_loss = NAN;
  optim::WindowReport last;
  for (int64_t w = start + 1; w <= end; ++w) {
    run_window();
    const optim::WindowReport r = window.report();  // the window's one host synchronization
    if (w == start + 1) first_loss = r.loss;
    last = r;
    reporter.print(w, r, optimizer.config_at(r.window - 1).groups[0].lr);
    double val = NAN;
    if (data.val_loader && ((opt.val_every > 0 && w % opt.val_every == 0) || w == end)) {
      val = validation_loss(model, *data.val_loader, opt.val_batches, dp.comm.get(), device);
      std::printf("window %lld/%lld | val loss %.4f\n", (long long)w, (long long)opt.windows, val);
    }
    std::vector<std::pair<std::string, double>> extras = reporter.extras(val);
    if (measures_layers(r.window))
      add_layer_extras(*layers, r, optimizer.slot_groups(arena), &extras);
    metrics.write(r, extras);
    guard.after_window(r);
    // The last window's checkpoint waits for the run's verdict (below).
    if (periodic_checkpoint_due(opt, w, end, r)) save("window " + std::to_string(w));
    std::fflush(stdout);
  }
  report_run(start, end, first_loss, last);
  if (end > start) {
    std::fflush(stdout);
    guard.finish(last, {}, end == opt.windows);  // a failed run keeps its last checkpoint
    if (!opt.checkpoint.empty()) save("window " + std::to_string(end));
  }
  if (opt.stop_micro_steps > 0) {  // preempted inside the next window
    for (int64_t k = window.micro_step(); k < opt.stop_micro_steps; ++k) {
      auto [x, y] = source.next();
      window.backward(loss_of(x, y));
    }
    save("window " + std::to_string(end + 1) + ", micro-step " +
         std::to_string(window.micro_step()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
