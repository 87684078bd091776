// The accumulation demo: an MLP learns a synthetic classification task
// (labels from a fixed random "teacher" projection), with K micro-batches per
// optimizer step. Runs on the GPU when one is present, else on the CPU.
//
//   accrue_demo [--micro-batch B] [--accum K] [--windows W] [--optimizer sgd|adam|adamw]
//               [--lr LR] [--clip MAX_NORM] [--scaler none|static|dynamic]
//               [--dtype f32|bf16|f16] [--zero1] [--cpu] [--help]
//
// The training loop below is the whole accumulation story: backward per
// micro-batch into the gradient arena, one close per window.
//
// Data parallel: start one process per GPU with a standard launcher, e.g.
//   torchrun --nproc-per-node=2 --no-python build/ci/examples/accrue_demo
//   mpirun -np 2 build/ci/examples/accrue_demo
// (under mpirun the NCCL id goes over MPI when accrue was built with MPI;
// without MPI it goes over TCP and needs MASTER_ADDR/MASTER_PORT exported).
// Each rank draws its own micro-batches; the last micro-step's buckets are
// all-reduced while its backward runs (Note [Buckets]); with --zero1 they are
// reduce-scattered and each rank keeps and steps its shard (Note [ZeRO-1]).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "accrue.h"
#include "dist/bucket_plan.h"
#include "dist/launch_env.h"
#include "dist/mpi_bootstrap.h"
#include "dist/reducer.h"
#ifdef ACCRUE_WITH_NCCL
#include "dist/nccl_communicator.h"
#endif

using namespace accrue;

namespace {

struct Options {
  int64_t micro_batch = 64;
  int64_t accum = 4;
  int64_t windows = 60;
  std::string optimizer = "adamw";
  double lr = 3e-3;
  double clip = 1.0;
  std::string scaler = "none";
  std::string dtype = "f32";
  bool zero1 = false;
  bool force_cpu = false;
  bool help = false;
  std::string metrics;
};

void print_usage() {
  const Options d;
  std::printf(
      "usage: accrue_demo [options]\n"
      "Trains an MLP with K micro-batches per optimizer step (on the GPU when there is one).\n"
      "  --micro-batch B        items per micro-batch (default %lld)\n"
      "  --accum K              micro-batches per window, one optimizer step each (default %lld)\n"
      "  --windows W            windows to train (default %lld)\n"
      "  --optimizer NAME       sgd, adam or adamw (default %s)\n"
      "  --lr LR                learning rate (default %g)\n"
      "  --clip MAX_NORM        global gradient-norm clipping, <= 0 turns it off (default %g)\n"
      "  --scaler MODE          loss scaling: none, static or dynamic (default %s)\n"
      "  --dtype DTYPE          compute dtype: f32, bf16 or f16 (default %s)\n"
      "  --zero1                under a data-parallel launcher, shard the optimizer state\n"
      "  --cpu                  run on the CPU even when a GPU is present\n"
      "  --metrics FILE         one JSON line per window (tools/plot_metrics.py draws it)\n"
      "  --help                 print this and exit\n"
      "Data parallel: torchrun --nproc-per-node=N --no-python accrue_demo, or mpirun -np N.\n",
      (long long)d.micro_batch, (long long)d.accum, (long long)d.windows, d.optimizer.c_str(), d.lr,
      d.clip, d.scaler.c_str(), d.dtype.c_str());
}

// std::stoll / std::stod, but a malformed value is an accrue::Error naming the option.
int64_t parse_int(const std::string& option, const std::string& v) {
  size_t used = 0;
  int64_t r = 0;
  try {
    r = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ACCRUE_CHECK(!v.empty() && used == v.size(), "accrue_demo: ", option,
               " expects an integer, got '", v, "'");
  return r;
}

double parse_double(const std::string& option, const std::string& v) {
  size_t used = 0;
  double r = 0;
  try {
    r = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ACCRUE_CHECK(!v.empty() && used == v.size(), "accrue_demo: ", option, " expects a number, got '",
               v, "'");
  return r;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      ACCRUE_CHECK(i + 1 < argc, "accrue_demo: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h")
      o.help = true;
    else if (a == "--micro-batch")
      o.micro_batch = parse_int(a, value());
    else if (a == "--accum")
      o.accum = parse_int(a, value());
    else if (a == "--windows")
      o.windows = parse_int(a, value());
    else if (a == "--optimizer")
      o.optimizer = value();
    else if (a == "--lr")
      o.lr = parse_double(a, value());
    else if (a == "--clip")
      o.clip = parse_double(a, value());
    else if (a == "--scaler")
      o.scaler = value();
    else if (a == "--dtype")
      o.dtype = value();
    else if (a == "--zero1")
      o.zero1 = true;
    else if (a == "--cpu")
      o.force_cpu = true;
    else if (a == "--metrics")
      o.metrics = value();
    else
      ACCRUE_FAIL("accrue_demo: unknown option ", a, " (--help lists the options)");
  }
  ACCRUE_CHECK(o.micro_batch > 0 && o.accum > 0 && o.windows > 0,
               "accrue_demo: --micro-batch, --accum and --windows must be positive");
  return o;
}

optim::Optimizer make_optimizer(const Options& o) {
  if (o.optimizer == "sgd") return optim::Optimizer(optim::SGDOptions(o.lr).momentum(0.9));
  if (o.optimizer == "adam") return optim::Optimizer(optim::AdamOptions(o.lr));
  if (o.optimizer == "adamw") return optim::Optimizer(optim::AdamWOptions(o.lr).weight_decay(0.01));
  ACCRUE_FAIL("accrue_demo: unknown optimizer '", o.optimizer, "' (sgd, adam, adamw)");
}

optim::LossScalerOptions make_scaler(const Options& o) {
  if (o.scaler == "none") return optim::LossScalerOptions::none();
  if (o.scaler == "static") return optim::LossScalerOptions::fixed(1024.0);
  if (o.scaler == "dynamic") return optim::LossScalerOptions::dynamic();
  ACCRUE_FAIL("accrue_demo: unknown scaler '", o.scaler, "' (none, static, dynamic)");
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  ACCRUE_FAIL("accrue_demo: unknown dtype '", s, "' (f32, bf16, f16)");
}

constexpr int64_t kFeatures = 32, kHidden = 256, kClasses = 10;

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  if (opt.help) {
    print_usage();
    return 0;
  }
  const dist::RankInfo rank = dist::discover_rank();
  const bool gpu = cuda_available() && !opt.force_cpu;
  ACCRUE_CHECK(!rank.distributed() || gpu, "accrue_demo: data parallelism (", dist::describe(rank),
               ") needs a GPU per rank");
  const Device device = gpu ? Device::cuda(rank.local_rank) : Device::cpu();
  if (gpu) set_cuda_device(device.index);
  const bool main_rank = rank.rank == 0;
  // One rank reports; the others train silently.
  if (!main_rank && !std::freopen("/dev/null", "w", stdout))
    ACCRUE_FAIL("accrue_demo: cannot silence rank ", rank.rank);
  const DType compute = parse_dtype(opt.dtype);
  std::printf(
      "accrue demo on %s%s: MLP %lld-%lld-%lld-%lld, micro-batch %lld x K=%lld = batch %lld,"
      " %s, clip %.2g, scaler %s, compute %s\n",
      device.str().c_str(),
      gpu ? "" : (std::string(" (") + cuda_unavailable_reason() + ")").c_str(),
      (long long)kFeatures, (long long)kHidden, (long long)kHidden, (long long)kClasses,
      (long long)opt.micro_batch, (long long)opt.accum, (long long)(opt.micro_batch * opt.accum),
      opt.optimizer.c_str(), opt.clip, opt.scaler.c_str(), dtype_name(compute));

  Generator gen(1234);
  nn::MLP model({kFeatures, kHidden, kHidden, kClasses}, {device, DType::f32, &gen});
  optim::Optimizer optimizer = make_optimizer(opt);
  ArenaOptions arena_options{device, DType::f32, compute, optimizer.moments_needed()};
  // Note [ZeRO-1]: slots padded so that every bucket splits evenly over any world size.
  if (opt.zero1) arena_options.shard_ranks = rank.world_size;
  GradArena arena(model.parameters(), {}, arena_options);
  // Data parallelism: a communicator and a reducer that the Window drives.
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::Reducer> reducer;
  if (rank.distributed()) {
#ifdef ACCRUE_WITH_NCCL
    comm = dist::connect_nccl(rank, dist::layout_fingerprint(arena));
    dist::ReducerOptions reducer_options;
    reducer_options.zero1 = opt.zero1;
    reducer = std::make_unique<dist::Reducer>(arena, *comm, reducer_options);
    reducer->broadcast_parameters();  // every rank starts from rank 0's weights
    std::printf("data parallel: %s, %zu buckets%s\n", dist::describe(rank).c_str(),
                reducer->plan().buckets().size(), opt.zero1 ? ", ZeRO-1" : "");
    std::printf("NCCL id bootstrap: %s\n", dist::bootstrap_name(dist::bootstrap_method(rank)));
#else
    ACCRUE_FAIL("accrue_demo: launched as ", dist::describe(rank),
                " but accrue was built without NCCL");
#endif
  }
  std::printf("memory per rank: %s\n", arena.memory().describe().c_str());
  optim::Window window(arena, optimizer,
                       optim::WindowOptions().micro_steps(opt.accum).max_grad_norm(opt.clip).scaler(
                           make_scaler(opt)),
                       reducer.get());
  Generator data_gen(1000 + static_cast<uint64_t>(rank.rank));  // each rank its own data
  const Tensor teacher = randn({kFeatures, kClasses}, DType::f32, device, &gen);
  auto batch = [&](int64_t n) {
    Tensor x = randn({n, kFeatures}, DType::f32, device, &data_gen);
    Tensor y = kernels::argmax(kernels::matmul(x, teacher), 1);
    return std::make_pair(x.to(compute), y);
  };

  // The targets come from argmax, valid by construction. Inside the Window their
  // checks would be deferred (Note [Deferred index checks]: no synchronization, two
  // small launches per call); they are not needed, so they are off.
  kernels::set_check_indices(false);
  reset_peak_memory(device);
  const bool tty = isatty(fileno(stdout));
  double first_loss = 0, last_loss = 0;
  auto last_time = std::chrono::steady_clock::now();
  // --metrics (Note [Metrics log]): a report, and so a host synchronization, every window.
  optim::MetricsLog metrics;
  if (!opt.metrics.empty() && rank.rank == 0) metrics = optim::MetricsLog(opt.metrics, false);
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
    if (w == 1 || w % 10 == 0 || w == opt.windows) {
      const optim::WindowReport r = window.report();  // the only host synchronization
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - last_time).count();
      last_time = now;
      const double items_per_s =
          (w == 1 ? 1 : 10) * opt.micro_batch * opt.accum * rank.world_size / seconds;
      if (w == 1) first_loss = r.loss;
      last_loss = r.loss;
      if (tty) std::printf("\r\033[K");
      std::printf(
          "window %4lld  loss %.4f  grad-norm %.4f  scale %g  skipped %lld  %.0f items/s  "
          "peak %.1f MB\n",
          (long long)w, r.loss, r.grad_norm, r.loss_scale, (long long)r.skipped_windows,
          items_per_s, memory_stats(device).peak_bytes / 1e6);
    } else if (tty) {
      const int filled = static_cast<int>(30 * w / opt.windows);
      std::printf("\r[%.*s%*s] window %lld/%lld", filled,
                  "==============================", 30 - filled, "", (long long)w,
                  (long long)opt.windows);
      std::fflush(stdout);
    }
  }
  std::printf("loss %.4f -> %.4f over %lld windows of %lld micro-batches\n", first_loss, last_loss,
              (long long)opt.windows, (long long)opt.accum);
  if (!(last_loss < first_loss)) {
    std::fprintf(stderr, "accrue demo: the loss did not fall\n");
    return 1;
  }
  return 0;
} catch (const accrue::Error& e) {
  std::fprintf(stderr, "accrue demo: %s\n", e.what());
  return 2;
}
