// The accumulation demo: an MLP learns a synthetic classification task
// (labels from a fixed random "teacher" projection), with K micro-batches per
// optimizer step. Runs on the GPU when one is present, else on the CPU.
// `accrue_demo --help` lists the options.
//
// The training loop below is the whole accumulation story: backward per
// micro-batch into the gradient arena, one close per window. Under torchrun or
// mpirun it is data parallel (examples/common/launch.h), and --zero1 shards
// the optimizer state (Note [ZeRO-1]).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "accrue.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/launch.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"
#include "examples/common/timing.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_demo";
constexpr int64_t kFeatures = 32, kHidden = 256, kClasses = 10;

struct Options {
  int64_t micro_batch = 64;
  int64_t accum = 4;
  int64_t windows = 60;
  std::string optimizer = "adamw";
  double lr = 3e-3;
  double clip = 1.0;
  std::string scaler = "none";
  DType dtype = DType::f32;
  bool zero1 = false;
  bool force_cpu = false;
  std::string metrics;
};

// Parses the command line; false after --help.
bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Trains an MLP with K micro-batches per optimizer step (on the GPU when there "
                  "is one).");
  cli.integer("--micro-batch", &o.micro_batch, "B", "items per micro-batch").min(1);
  cli.integer("--accum", &o.accum, "K", "micro-batches per window, one optimizer step each").min(1);
  cli.integer("--windows", &o.windows, "W", "windows to train").min(1);
  cli.choice("--optimizer", &o.optimizer, {"sgd", "adam", "adamw"},
             "SGD with momentum 0.9, Adam, or AdamW with weight decay 0.01");
  cli.number("--lr", &o.lr, "LR", "learning rate").above(0);
  cli.number("--clip", &o.clip, "MAX_NORM", "global gradient-norm clipping, <= 0 turns it off");
  cli.choice("--scaler", &o.scaler, {"none", "static", "dynamic"},
             "loss scaling: none, a static 1024, or dynamic");
  cli.choice<DType>("--dtype", &o.dtype,
                    {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}},
                    "compute dtype over fp32 master weights");
  cli.flag("--zero1", &o.zero1, "under a data-parallel launcher, shard the optimizer state");
  cli.flag("--cpu", &o.force_cpu, "run on the CPU even when a GPU is present");
  cli.path("--metrics", &o.metrics, "FILE",
           "one JSON line per window (tools/plot_metrics.py draws it)");
  cli.epilog(
      "Data parallel: torchrun --nproc-per-node=N --no-python accrue_demo, or mpirun -np N.");
  return cli.parse(argc, argv);
}

optim::Optimizer make_optimizer(const Options& o) {
  if (o.optimizer == "sgd") return optim::Optimizer(optim::SGDOptions(o.lr).momentum(0.9));
  if (o.optimizer == "adam") return optim::Optimizer(optim::AdamOptions(o.lr));
  return optim::Optimizer(optim::AdamWOptions(o.lr).weight_decay(0.01));
}

optim::LossScalerOptions make_scaler(const Options& o) {
  if (o.scaler == "static") return optim::LossScalerOptions::fixed(1024.0);
  if (o.scaler == "dynamic") return optim::LossScalerOptions::dynamic();
  return optim::LossScalerOptions::none();
}

// On a terminal, windows without a progress line show a bar.
void progress_bar(int64_t w, int64_t windows) {
  const int filled = static_cast<int>(30 * w / windows);
  std::printf("\r[%.*s%*s] window %lld/%lld", filled, "==============================", 30 - filled,
              "", (long long)w, (long long)windows);
  std::fflush(stdout);
}

int train(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  const Launch where = launch(opt.force_cpu);
  const Device device = where.device;
  if (!opt.metrics.empty() && where.main_rank()) probe_output_file("--metrics", opt.metrics);
  const int64_t window_items =
      checked_product({{"--micro-batch", opt.micro_batch}, {"--accum", opt.accum}});
  const int64_t items_per_window = checked_product(
      {{"--micro-batch", opt.micro_batch}, {"--accum", opt.accum}, {"ranks", where.world_size()}});
  std::printf(
      "accrue demo on %s: MLP %lld-%lld-%lld-%lld, micro-batch %lld x K=%lld = batch %lld,"
      " %s, clip %.2g, scaler %s, compute %s\n",
      where.describe().c_str(), (long long)kFeatures, (long long)kHidden, (long long)kHidden,
      (long long)kClasses, (long long)opt.micro_batch, (long long)opt.accum,
      (long long)window_items, opt.optimizer.c_str(), opt.clip, opt.scaler.c_str(),
      dtype_name(opt.dtype));

  Generator gen(1234);
  nn::MLP model({kFeatures, kHidden, kHidden, kClasses}, {device, DType::f32, &gen});
  optim::Optimizer optimizer = make_optimizer(opt);
  optim::ParamStoreOptions arena_options =
      optim::ParamStoreOptions().device(device).compute_dtype(opt.dtype).moments(
          optimizer.moments_needed());
  // Note [ZeRO-1]: slots padded so that every bucket splits evenly over any world size.
  if (opt.zero1) arena_options.shard_ranks(where.world_size());
  optim::ParamStore arena(model.named_parameters(), arena_options);
  const DataParallel dp = connect_data_parallel(where, arena, {.zero1 = opt.zero1});
  std::printf("memory per rank: %s\n", arena.memory().describe().c_str());
  optim::Window window(arena, optimizer,
                       optim::WindowOptions().micro_steps(opt.accum).max_grad_norm(opt.clip).scaler(
                           make_scaler(opt)),
                       dp.reducer.get());
  Generator data_gen(1000 + static_cast<uint64_t>(where.rank.rank));  // each rank its own data
  const Tensor teacher = randn({kFeatures, kClasses}, DType::f32, device, &gen);
  auto batch = [&](int64_t n) {
    Tensor x = randn({n, kFeatures}, DType::f32, device, &data_gen);
    Tensor y = kernels::argmax(kernels::matmul(x, teacher), 1);
    return std::make_pair(x.to(opt.dtype), y);
  };

  // The targets come from argmax, valid by construction. Inside the Window their
  // checks would be deferred (Note [Deferred index checks]: no synchronization, two
  // small launches per call); they are not needed, so they are off.
  kernels::set_check_indices(false);
  reset_peak_memory(device);
  const bool tty = isatty(fileno(stdout));
  double first_loss = 0, last_loss = 0;
  Stopwatch clock;
  // --metrics (Note [Metrics log]): a report, and so a host synchronization, every window.
  optim::MetricsLog metrics;
  if (!opt.metrics.empty() && where.main_rank()) metrics = optim::MetricsLog(opt.metrics, false);
  for (int64_t w = 1; w <= opt.windows; ++w) {
    // One window: K micro-batches accumulate into the arena, then one close.
    for (int64_t k = 0; k < opt.accum; ++k) {
      auto [x, y] = batch(opt.micro_batch);
      window.backward(cross_entropy(model.forward(x), y));
    }
    window.close();
    if (metrics.is_open())
      metrics.write(window.report(),
                    {{"peak_bytes", static_cast<double>(memory_stats(device).peak_bytes)}});
    if (w != 1 && w % 10 != 0 && w != opt.windows) {
      if (tty) progress_bar(w, opt.windows);
      continue;
    }
    const optim::WindowReport r = window.report();  // the only host synchronization
    const double items_per_s =
        (w == 1 ? 1 : 10) * static_cast<double>(items_per_window) / clock.lap();
    if (w == 1) first_loss = r.loss;
    last_loss = r.loss;
    if (tty) std::printf("\r\033[K");
    std::printf(
        "window %4lld  loss %.4f  grad-norm %.4f  scale %g  skipped %lld  %.0f items/s  "
        "peak %.1f MB\n",
        (long long)w, r.loss, r.grad_norm, r.loss_scale, (long long)r.skipped_windows, items_per_s,
        memory_stats(device).peak_bytes / 1e6);
  }
  std::printf("loss %.4f -> %.4f over %lld windows of %lld micro-batches\n", first_loss, last_loss,
              (long long)opt.windows, (long long)opt.accum);
  ACCRUE_CHECK(std::isfinite(last_loss), "the loss is not finite (", last_loss, ") at window ",
               opt.windows);
  // One window has nothing to compare with.
  ACCRUE_CHECK(opt.windows == 1 || last_loss < first_loss, "the loss did not fall");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
