// accrue_bench_dist: the data-parallel benchmarks, one process per GPU.
//
//   accrue_bench_dist --mode allreduce [--bucket-mb 1,2,4,...] [--warmup 5] [--repeats 20]
//                     [--json FILE]
//   accrue_bench_dist --mode scaling [--width 4096] [--depth 6] [--in 4096] [--classes 1024]
//                     [--dtype bf16] [--micro-batch 2048] [--global-batch 16384] [--k 1,4,8]
//                     [--tables fixed_micro,fixed_global] [--variants ddp,zero1] [--warmup 3]
//                     [--windows 20] [--json FILE]
//
// Start the ranks with a launcher (tests/dist/multi_gpu_launch.sh 2 accrue_bench_dist ...,
// or torchrun --no-python); without launcher variables it is world size 1 (scaling only).
// Rank 0 prints the tables and writes --json. A plain main, not Google Benchmark: its
// runner does not fit ranks that must issue the same collectives in the same order.
//
// allreduce: the GPT-2 124M fp32 gradient arena (bench_window_close.cpp's layout), cut
// by dist::BucketPlan at each --bucket-mb, every bucket view all-reduced in plan order
// through the NcclCommunicator as the Reducer does, against one raw ncclAllReduce of the
// same bytes (a second, plain NCCL communicator) and a raw ncclAllReduce of one bucket's
// size. See Note [Collective timing].
//
// scaling: an MLP (nn::MLP, >= 100M parameters by default) trained with Window + Reducer
// exactly as examples/demo/train_mlp.cpp does: AdamW, item-count normalization, clipping
// at 1.0, f32 master weights and a bf16 compute copy. Each table row is one K: either at
// a fixed micro-batch (fixed_micro) or at a fixed global batch of items per window
// (fixed_global: micro-batch = global / (K x world)). See Note [Window timing].
// bench/torch_ddp.py runs the same model in PyTorch DDP and writes the same row keys;
// bench/compare_dist.py puts both side by side.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "accrue.h"
#include "accrue/core/status_check.h"
#include "accrue/dist/bucket_plan.h"
#include "accrue/dist/launch_env.h"
#include "accrue/dist/nccl_communicator.h"
#include "accrue/dist/reducer.h"
#include "bench/bench_util.h"
#include "bench/gpt2_layout.h"

namespace accrue::bench {
namespace {

// ---- options ------------------------------------------------------------------------------------

struct Options {
  std::string mode;
  std::string json;
  int64_t warmup = -1;  // per mode default below
  // allreduce
  std::vector<int64_t> bucket_mb = {1, 2, 4, 8, 16, 25, 32, 64, 128, 256};
  std::vector<int64_t> growth = {1};  // BucketPlanOptions::growth, per schedule
  int64_t max_bucket_mb = 256;        // its cap when growth > 1
  int64_t repeats = 20;
  // scaling
  int64_t width = 4096, depth = 6, in = 4096, classes = 1024;
  std::string dtype = "bf16";
  int64_t micro_batch = 2048, global_batch = 16384;
  std::vector<int64_t> ks = {1, 4, 8};
  std::vector<std::string> tables = {"fixed_micro", "fixed_global"};
  std::vector<std::string> variants = {"ddp", "zero1"};
  int64_t windows = 20;
  double lr = 3e-4;
  bool phases = false;
  // NcclOptions::high_priority_stream: the communicator's stream ahead of the
  // backward's kernels (the default) or behind them (a second-GPU lever).
  bool comm_high_priority = true;
  // NcclOptions::cta_policy (unset: NCCL's default).
  std::optional<dist::NcclOptions::CtaPolicy> cta_policy;
  // NcclOptions::max_ctas (unset: NCCL's choice).
  std::optional<int> nccl_max_ctas;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// A whole decimal integer, or an accrue::Error naming the option and the text.
int64_t parse_int(const std::string& option, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, v);
  ACCRUE_CHECK(error == std::errc() && stop == end && !text.empty(), "accrue_bench_dist: ", option,
               " expects an integer, got '", text, "'");
  return v;
}

// A finite number, or an accrue::Error naming the option and the text.
double parse_number(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  ACCRUE_CHECK(!text.empty() && end == text.c_str() + text.size() && std::isfinite(v),
               "accrue_bench_dist: ", option, " expects a finite number, got '", text, "'");
  return v;
}

std::vector<int64_t> split_ints(const std::string& s, const std::string& option) {
  std::vector<int64_t> out;
  for (const std::string& item : split(s)) {
    const int64_t v = parse_int(option, item);
    ACCRUE_CHECK(v > 0, "accrue_bench_dist: ", option,
                 " takes positive integers separated by commas, got '", s, "'");
    out.push_back(v);
  }
  ACCRUE_CHECK(!out.empty(), "accrue_bench_dist: ", option, " is empty");
  return out;
}

// The reducer configurations the scaling mode compares at world size > 1, by name:
//   ddp    every rank all-reduces every bucket and steps the whole arena (replicated
//          optimizer state), as PyTorch DDP does;
//   zero1  Note [ZeRO-1]: buckets reduce-scattered, each rank steps its shard, the
//          parameters all-gathered.
// Either may carry suffixes, in any order, for the levers of the second GPU's cost:
//   _bf16  buckets travel in bf16 (Note [Gradient transport]);
//   _bN    buckets of N MiB instead of the default plan's 25 (e.g. ddp_b128);
//   _gF    a growing schedule: each bucket after the second F times the one
//          before, up to 256 MiB (or _mN: N MiB) (Note [Buckets]);
//   _norm  the norm rows run as the buckets are reduced (Note [Norm under the backward]);
//   _ce    two GPUs sum the buckets on their copy engines (Note [Copy-engine all-reduce]);
//   _smN   the last backward's GEMMs leave N SMs to the collectives (Note [GEMM SM margin]).
// torch_ddp.py's rows stay "ddp", and compare_dist.py shows every accrue variant
// against them.
constexpr const char* kVariants =
    "ddp or zero1, optionally with _bf16, _bN (N MiB buckets), _gF (growth), _mN (cap), _norm, "
    "_ce (the copy engines, between shareable arenas), _whole (_ce pulling whole buckets), "
    "_staged (_ce through staging) and _smN (the last backward's GEMMs leave N SMs free)";
dist::ReducerOptions reducer_options(const std::string& variant) {
  dist::ReducerOptions options;
  std::vector<std::string> parts;
  std::stringstream in(variant);
  for (std::string part; std::getline(in, part, '_');)
    parts.push_back(part);
  ACCRUE_CHECK(!parts.empty() && (parts[0] == "ddp" || parts[0] == "zero1"),
               "accrue_bench_dist: unknown --variants entry '", variant, "' (", kVariants, ")");
  options.zero1 = parts[0] == "zero1";
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p == "bf16") {
      options.transport = DType::bf16;
    } else if (p == "norm") {
      // a Window option: see norm_under_backward()
    } else if (p == "ce") {
      options.copy_engine_all_reduce = true;
    } else if (p == "whole") {
      options.copy_engine_whole_buckets = true;
    } else if (p == "staged") {
      // a store option: see shares_gradients()
    } else if (p.size() > 2 && p.compare(0, 2, "sm") == 0 &&
               p.find_first_not_of("0123456789", 2) == std::string::npos) {
      const int64_t v = parse_int("--variants", p.substr(2));
      ACCRUE_CHECK(v >= 1 && v < 1024, "accrue_bench_dist: --variants entry '", variant,
                   "': an SM margin of ", v, " is outside [1, 1024)");
      options.gemm_sm_margin = static_cast<int>(v);  // Note [GEMM SM margin]
    } else if (p.size() > 1 && (p[0] == 'b' || p[0] == 'g' || p[0] == 'm') &&
               p.find_first_not_of("0123456789", 1) == std::string::npos &&
               parse_int("--variants", p.substr(1)) > 0) {
      const int64_t v = parse_int("--variants", p.substr(1));
      ACCRUE_CHECK(v <= (int64_t{1} << 20), "accrue_bench_dist: --variants entry '", variant,
                   "': ", v, " is too large (at most 1048576)");
      if (p[0] == 'b') options.buckets.bucket_bytes = v << 20;
      if (p[0] == 'g') options.buckets.growth = static_cast<double>(v);
      if (p[0] == 'm') options.buckets.max_bucket_bytes = v << 20;
    } else {
      ACCRUE_FAIL("accrue_bench_dist: unknown suffix '_", p, "' in --variants entry '", variant,
                  "' (", kVariants, ")");
    }
  }
  if (options.buckets.growth > 1.0 && options.buckets.max_bucket_bytes == 0)
    options.buckets.max_bucket_bytes = int64_t{256} << 20;
  return options;
}

// Note [Copy-engine all-reduce]: _ce sums between the ranks' arenas, which
// the store must allocate shareable; _ce_staged keeps the pool's arena.
bool shares_gradients(const std::string& variant) {
  const std::string v = "_" + variant + "_";
  return v.find("_ce_") != std::string::npos && v.find("_staged_") == std::string::npos;
}

// The _norm suffix of a --variants entry.
bool norm_under_backward(const std::string& variant) {
  return ("_" + variant + "_").find("_norm_") != std::string::npos;
}

dist::NcclOptions nccl_options(const Options& o) {
  dist::NcclOptions options;
  options.high_priority_stream = o.comm_high_priority;
  options.cta_policy = o.cta_policy;
  options.max_ctas = o.nccl_max_ctas;
  return options;
}

void usage() {
  std::printf(
      "usage: accrue_bench_dist --mode allreduce|scaling [options]\n"
      "  --json FILE            rank 0 writes the results here\n"
      "  --warmup N             untimed repeats / windows first (allreduce 5, scaling 3)\n"
      "allreduce (needs >= 2 ranks):\n"
      "  --bucket-mb LIST       bucket sizes in MiB (default 1,2,4,8,16,25,32,64,128,256)\n"
      "  --growth LIST          schedules: each later bucket's limit times F (default 1)\n"
      "  --max-bucket-mb N      the growing schedules' cap in MiB (default 256)\n"
      "  --repeats N            timed repeats per measurement, median reported (default 20)\n"
      "scaling:\n"
      "  --width W --depth D    D Linear layers of width W (default 4096, 6)\n"
      "  --in N --classes C     input features and classes (default 4096, 1024)\n"
      "  --dtype bf16|f16|f32   compute dtype; master weights are f32 (default bf16)\n"
      "  --micro-batch B        items per micro-batch of the fixed_micro table (default 2048)\n"
      "  --global-batch G       items per window of the fixed_global table (default 16384)\n"
      "  --k LIST               micro-steps per window (default 1,4,8)\n"
      "  --tables LIST          fixed_micro,fixed_global (default both)\n"
      "  --variants LIST        reducer configurations to run at world size > 1 (default\n"
      "                         ddp,zero1; known: %s)\n"
      "  --windows N            timed windows per row, median reported (default 20)\n"
      "  --lr LR                AdamW learning rate (default 3e-4)\n"
      "  --phases               also print where each row's window goes (Note [Window phases])\n"
      "both modes:\n"
      "  --comm-priority P      the communicator's stream priority, high (default: its\n"
      "                         collectives scheduled ahead of the backward's kernels) or low\n"
      "  --cta-policy P         NCCL's CTA policy: default, efficiency or zero (NCCL >= 2.27;\n"
      "                         unset: NCCL's own default)\n"
      "  --nccl-max-ctas N      at most N CTAs per NCCL kernel, 1-64 (unset: NCCL's choice);\n"
      "                         with a variant's _smN the GEMMs leave N SMs to them\n",
      kVariants);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      ACCRUE_CHECK(i + 1 < argc, "accrue_bench_dist: ", a, " needs a value");
      return argv[++i];
    };
    auto count = [&]() {
      const std::string v = value();
      const int64_t n = parse_int(a, v);
      ACCRUE_CHECK(n >= 0, "accrue_bench_dist: ", a, " must be >= 0, got ", v);
      return n;
    };
    if (a == "--mode")
      o.mode = value();
    else if (a == "--json")
      o.json = value();
    else if (a == "--warmup")
      o.warmup = count();
    else if (a == "--bucket-mb")
      o.bucket_mb = split_ints(value(), a);
    else if (a == "--growth")
      o.growth = split_ints(value(), a);
    else if (a == "--max-bucket-mb")
      o.max_bucket_mb = count();
    else if (a == "--repeats")
      o.repeats = count();
    else if (a == "--width")
      o.width = count();
    else if (a == "--depth")
      o.depth = count();
    else if (a == "--in")
      o.in = count();
    else if (a == "--classes")
      o.classes = count();
    else if (a == "--dtype")
      o.dtype = value();
    else if (a == "--micro-batch")
      o.micro_batch = count();
    else if (a == "--global-batch")
      o.global_batch = count();
    else if (a == "--k")
      o.ks = split_ints(value(), a);
    else if (a == "--tables")
      o.tables = split(value());
    else if (a == "--variants")
      o.variants = split(value());
    else if (a == "--windows")
      o.windows = count();
    else if (a == "--lr")
      o.lr = parse_number(a, value());
    else if (a == "--phases")
      o.phases = true;
    else if (a == "--comm-priority") {
      const std::string p = value();
      ACCRUE_CHECK(p == "high" || p == "low",
                   "accrue_bench_dist: --comm-priority takes high or low, got '", p, "'");
      o.comm_high_priority = p == "high";
    } else if (a == "--cta-policy") {
      using P = dist::NcclOptions::CtaPolicy;
      const std::string p = value();
      ACCRUE_CHECK(p == "default" || p == "efficiency" || p == "zero",
                   "accrue_bench_dist: --cta-policy takes default, efficiency or zero, got '", p,
                   "'");
      o.cta_policy = p == "efficiency" ? P::efficiency : p == "zero" ? P::zero : P::nccl_default;
    } else if (a == "--nccl-max-ctas") {
      const int64_t n = parse_int(a, value());
      ACCRUE_CHECK(n >= 1 && n <= 64, "accrue_bench_dist: --nccl-max-ctas takes 1 to 64, got ", n);
      o.nccl_max_ctas = static_cast<int>(n);
    } else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else
      ACCRUE_FAIL("accrue_bench_dist: unknown option ", a);
  }
  ACCRUE_CHECK(o.mode == "allreduce" || o.mode == "scaling",
               "accrue_bench_dist: --mode must be allreduce or scaling, got '", o.mode, "'");
  if (o.warmup < 0) o.warmup = o.mode == "allreduce" ? 5 : 3;
  ACCRUE_CHECK(o.repeats >= 1 && o.windows >= 1, "accrue_bench_dist: --repeats and --windows >= 1");
  ACCRUE_CHECK(o.width > 0 && o.depth > 0 && o.in > 0 && o.classes > 0 && o.micro_batch > 0 &&
                   o.global_batch > 0,
               "accrue_bench_dist: model and batch sizes must be positive");
  for (const std::string& t : o.tables)
    ACCRUE_CHECK(t == "fixed_micro" || t == "fixed_global", "accrue_bench_dist: unknown table '", t,
                 "' (fixed_micro, fixed_global)");
  ACCRUE_CHECK(o.dtype == "bf16" || o.dtype == "f16" || o.dtype == "f32",
               "accrue_bench_dist: unknown --dtype '", o.dtype, "' (bf16, f16, f32)");
  for (const std::string& v : o.variants)
    (void)reducer_options(v);  // refused here, before any GPU work, if malformed
  return o;
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  ACCRUE_FAIL("accrue_bench_dist: unknown --dtype '", s, "' (bf16, f16, f32)");
}

// ---- results ------------------------------------------------------------------------------------

// One flat JSON object, built field by field: the results stay numbers and strings.
class JsonObject {
 public:
  JsonObject& num(const std::string& k, double v) {
    key(k);
    if (!std::isfinite(v)) {
      body_ += "null";
      return *this;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    body_ += buf;
    return *this;
  }
  JsonObject& str(const std::string& k, const std::string& v) {
    key(k);
    body_ += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') body_ += '\\';
      body_ += c;
    }
    body_ += '"';
    return *this;
  }
  // A value that is already JSON (the rows array).
  JsonObject& raw(const std::string& k, const std::string& json) {
    key(k);
    body_ += json;
    return *this;
  }
  std::string text() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k) {
    if (!body_.empty()) body_ += ", ";
    body_ += "\"" + k + "\": ";
  }
  std::string body_;
};

void write_json(const std::string& path, JsonObject header, const std::vector<JsonObject>& rows) {
  std::string array = "[\n";
  for (size_t i = 0; i < rows.size(); ++i)
    array += "  " + rows[i].text() + (i + 1 < rows.size() ? ",\n" : "\n");
  array += "]";
  std::ofstream out(path);
  ACCRUE_CHECK(out.good(), "accrue_bench_dist: cannot write ", path);
  out << header.raw("rows", array).text() << "\n";
  ACCRUE_CHECK(out.good(), "accrue_bench_dist: writing ", path, " failed");
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

double median(std::vector<double> v) {
  ACCRUE_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Element-wise max over ranks (identity without a communicator). Collective.
std::vector<double> max_over_ranks(dist::Communicator* comm, const std::vector<double>& values) {
  if (comm == nullptr || comm->world_size() == 1) return values;
  Tensor t = from_vector(values, {static_cast<int64_t>(values.size())}, DType::f64, comm->device());
  comm->all_reduce(t, dist::ReduceOp::max);
  comm->synchronize();
  return t.to_vector<double>();
}

std::vector<double> min_over_ranks(dist::Communicator* comm, std::vector<double> values) {
  for (double& v : values)
    v = -v;
  values = max_over_ranks(comm, values);
  for (double& v : values)
    v = -v;
  return values;
}

// Every rank leaves it within the communicator's polling interval of the others.
void barrier(dist::Communicator& comm) {
  Tensor t = ones({1}, DType::f32, comm.device());
  comm.all_reduce(t);
  comm.synchronize();
}

// ---- allreduce mode -----------------------------------------------------------------------------

// A plain NCCL communicator beside accrue's, for the raw baseline: rank 0's unique id
// travels by a broadcast over `comm`. Blocking config, default everything, as
// nccl-tests runs it.
class RawNccl {
 public:
  explicit RawNccl(dist::Communicator& comm) : stream_(comm.device().index) {
    ncclUniqueId id{};
    static_assert(sizeof(id) % sizeof(int64_t) == 0);
    std::vector<int64_t> words(sizeof(id) / sizeof(int64_t), 0);
    if (comm.rank() == 0) {
      ACCRUE_NCCL_CHECK(ncclGetUniqueId(&id));
      std::memcpy(words.data(), &id, sizeof(id));
    }
    Tensor t = from_vector(words, {static_cast<int64_t>(words.size())}, DType::i64, comm.device());
    comm.broadcast(t, 0);
    comm.synchronize();
    words = t.to_vector<int64_t>();
    std::memcpy(&id, words.data(), sizeof(id));
    ACCRUE_NCCL_CHECK(ncclCommInitRank(&comm_, comm.world_size(), id, comm.rank()));
  }
  ~RawNccl() {
    stream_.synchronize();
    ncclCommDestroy(comm_);
  }
  RawNccl(const RawNccl&) = delete;
  RawNccl& operator=(const RawNccl&) = delete;

  StreamHandle stream() const { return stream_.handle(); }
  // In place, sum, f32.
  void all_reduce(const Tensor& t) const {
    void* p = t.data_ptr();
    ACCRUE_NCCL_CHECK(ncclAllReduce(p, p, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum,
                                    comm_, stream_.handle()));
  }

 private:
  Stream stream_;
  ncclComm_t comm_ = nullptr;
};

// Note [Collective timing]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A measurement is `repeats` timed calls of `op`, which enqueues one or more collectives
// on `stream`, after `warmup` untimed ones. Each timed call: a host barrier over the
// ranks, a spin kernel on `stream` longer than the host takes to enqueue `op` (twice the
// slowest warm-up enqueue, the same on every rank), start event, op, end event. The
// spin hides the host's enqueue cost (hundreds of buckets at 1 MiB), as in Note [GPU
// timing]: the Reducer enqueues buckets during the backward, where that cost overlaps
// compute, so the GPU-side time is the figure to compare. The barrier leaves some skew
// between the ranks, and the rank that started first waits for the other inside the
// first collective; the rank that started last measures the collectives alone, so the
// time of a call is the MINIMUM over ranks, and the reported time their median. Between
// calls, outside the timing, `reset` scales the data by 1/world: repeated sums would
// otherwise overflow, and the data stays random and non-zero.
struct CollectiveTime {
  double ms = 0;          // median over repeats of the min over ranks
  double enqueue_us = 0;  // host time to enqueue op once (slowest warm-up, max over ranks)
};

CollectiveTime time_collective(dist::Communicator& comm, StreamHandle stream, int64_t warmup,
                               int64_t repeats, const std::function<void()>& op,
                               const std::function<void()>& reset) {
  double enqueue_s = 0;
  for (int64_t i = 0; i < std::max<int64_t>(warmup, 2); ++i) {
    barrier(comm);
    const auto begin = std::chrono::steady_clock::now();
    op();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (i > 0) enqueue_s = std::max(enqueue_s, s);  // the first may build NCCL plans
    synchronize_stream(stream);
    reset();
  }
  enqueue_s = max_over_ranks(&comm, {enqueue_s})[0];
  const double spin_us = std::clamp(2e6 * enqueue_s, 100.0, 100000.0);

  Event start(/*timing=*/true), end(/*timing=*/true);
  std::vector<double> ms;
  for (int64_t r = 0; r < repeats; ++r) {
    barrier(comm);
    spin_gpu(stream, spin_us);
    start.record(stream);
    op();
    end.record(stream);
    end.synchronize();
    ms.push_back(start.elapsed_ms(end));
    reset();
  }
  return {median(min_over_ranks(&comm, ms)), enqueue_s * 1e6};
}

// Standard-normal values in every slot; the alignment padding stays zero (Note [Grad arena]).
void fill_slots(const optim::ParamStore& arena, const Tensor& flat) {
  for (const optim::ParamStore::Slot& s : arena.slots())
    make_view(flat, {s.numel}, {1}, s.offset).copy_(randn({s.numel}, DType::f32, flat.device()));
}

int run_allreduce(const Options& o, const dist::RankInfo& rank) {
  ACCRUE_CHECK(rank.world_size >= 2, "accrue_bench_dist: --mode allreduce needs >= 2 ranks (",
               dist::describe(rank), "); start it with tests/dist/multi_gpu_launch.sh 2 ...");
  auto comm = dist::connect_nccl(rank, /*fingerprint=*/0, nccl_options(o));
  const Device device = comm->device();
  const int n = comm->world_size();
  const bool main_rank = rank.rank == 0;
  const double bus_factor = 2.0 * (n - 1) / n;

  // The arena: GPT-2 124M, gradients only matter (no moments).
  std::vector<NamedParameter> params;
  for (const ParamSpec& s : gpt2_124m())
    params.push_back({s.name, requires_grad_(randn(s.shape, DType::f32, device))});
  optim::ParamStore arena(params, optim::ParamStoreOptions().device(device).moments(0));
  params.clear();
  fill_slots(arena, arena.grads());
  const Tensor& grads = arena.grads();
  const double total_bytes = static_cast<double>(grads.nbytes());

  RawNccl raw(*comm);
  const int64_t largest_mb = *std::max_element(o.bucket_mb.begin(), o.bucket_mb.end());
  const int64_t max_bucket_numel = (largest_mb << 20) / 4;
  const Tensor raw_total = randn({grads.numel()}, DType::f32, device);
  const Tensor raw_bucket = randn({max_bucket_numel}, DType::f32, device);
  const StreamHandle compute = current_stream(device.index);
  auto rescaler = [n, compute](const Tensor& t) {
    return [n, compute, t] {
      t.copy_(kernels::binary_scalar(kernels::BinaryOp::Mul, t, 1.0 / n));
      synchronize_stream(compute);  // the raw stream is not ordered after the compute stream
    };
  };

  // Independent of the bucket size: one call over the whole arena, accrue's and raw.
  const CollectiveTime whole = time_collective(
      *comm, comm->stream(), o.warmup, o.repeats, [&] { comm->all_reduce(grads); },
      rescaler(grads));
  const CollectiveTime raw_whole = time_collective(
      *comm, raw.stream(), o.warmup, o.repeats, [&] { raw.all_reduce(raw_total); },
      rescaler(raw_total));
  const double raw_busbw = total_bytes / (raw_whole.ms * 1e-3) * bus_factor * 1e-9;
  if (main_rank) {
    std::printf(
        "allreduce of the GPT-2 124M gradient arena: %lld f32 (%.1f MB), %d ranks on %s\n"
        "one call: accrue %.3f ms, raw NCCL %.3f ms (busbw %.1f GB/s)\n\n",
        (long long)grads.numel(), total_bytes / 1e6, n, device_name(device.index).c_str(), whole.ms,
        raw_whole.ms, raw_busbw);
    std::printf("%9s %6s %8s %11s %13s %9s %13s %13s %12s\n", "bucket", "growth", "buckets",
                "bucketed_ms", "busbw_GB/s", "vs_raw", "enqueue_us/b", "raw_bucket_ms",
                "raw_bucket_bw");
  }

  std::vector<JsonObject> rows;
  for (const int64_t mb : o.bucket_mb)
    for (const int64_t growth : o.growth) {
      dist::BucketPlanOptions plan_options;
      plan_options.bucket_bytes = mb << 20;
      plan_options.first_bucket_bytes = std::min<int64_t>(int64_t{1} << 20, mb << 20);
      plan_options.growth = static_cast<double>(growth);
      if (growth > 1) plan_options.max_bucket_bytes = std::max(mb, o.max_bucket_mb) << 20;
      const dist::BucketPlan plan(arena, plan_options);
      std::vector<Tensor> views;
      for (size_t b = 0; b < plan.size(); ++b)
        views.push_back(plan.view(grads, b));
      const CollectiveTime bucketed = time_collective(
          *comm, comm->stream(), o.warmup, o.repeats,
          [&] {
            for (const Tensor& v : views)
              comm->all_reduce(v);  // plan order, as the Reducer
          },
          rescaler(grads));
      const Tensor one_bucket = make_view(raw_bucket, {(mb << 20) / 4}, {1}, 0);
      const CollectiveTime raw_one = time_collective(
          *comm, raw.stream(), o.warmup, o.repeats, [&] { raw.all_reduce(one_bucket); },
          rescaler(raw_bucket));

      const double busbw = total_bytes / (bucketed.ms * 1e-3) * bus_factor * 1e-9;
      const double bucket_bytes = static_cast<double>(one_bucket.nbytes());
      const double raw_bucket_busbw = bucket_bytes / (raw_one.ms * 1e-3) * bus_factor * 1e-9;
      const double enqueue_per_bucket = bucketed.enqueue_us / static_cast<double>(plan.size());
      if (main_rank)
        std::printf("%6lld MiB %6lld %8zu %11.3f %13.1f %8.1f%% %13.1f %13.3f %12.1f\n",
                    (long long)mb, (long long)growth, plan.size(), bucketed.ms, busbw,
                    100.0 * raw_whole.ms / bucketed.ms, enqueue_per_bucket, raw_one.ms,
                    raw_bucket_busbw);
      rows.push_back(
          JsonObject()
              .num("bucket_mb", static_cast<double>(mb))
              .num("growth", static_cast<double>(growth))
              .num("max_bucket_bytes", static_cast<double>(plan_options.max_bucket_bytes))
              .num("first_bucket_bytes", static_cast<double>(plan_options.first_bucket_bytes))
              .num("buckets", static_cast<double>(plan.size()))
              .num("total_bytes", total_bytes)
              .num("bucketed_ms", bucketed.ms)
              .num("bucketed_algbw_GBps", total_bytes / (bucketed.ms * 1e-3) * 1e-9)
              .num("bucketed_busbw_GBps", busbw)
              .num("enqueue_us_per_bucket", enqueue_per_bucket)
              .num("whole_ms", whole.ms)
              .num("raw_total_ms", raw_whole.ms)
              .num("raw_total_algbw_GBps", total_bytes / (raw_whole.ms * 1e-3) * 1e-9)
              .num("raw_total_busbw_GBps", raw_busbw)
              .num("bucketed_over_raw", raw_whole.ms / bucketed.ms)
              .num("raw_bucket_bytes", bucket_bytes)
              .num("raw_bucket_ms", raw_one.ms)
              .num("raw_bucket_busbw_GBps", raw_bucket_busbw));
    }
  if (main_rank && !o.json.empty())
    write_json(o.json,
               JsonObject()
                   .str("tool", "accrue")
                   .str("mode", "allreduce")
                   .num("world_size", n)
                   .str("device", device_name(device.index))
                   .str("layout", "gpt2_124m")
                   .num("warmup", static_cast<double>(o.warmup))
                   .num("repeats", static_cast<double>(o.repeats)),
               rows);
  return 0;
}

// ---- scaling mode -------------------------------------------------------------------------------

// Note [Window timing]
// ~~~~~~~~~~~~~~~~~~~~
// Nothing inside a window synchronizes the host (index checks are off, the loss is read
// only after the timed windows), so the host runs ahead and the GPU executes windows back
// to back. A timing event recorded on the compute stream after each close marks each
// window's end; a window's time is the gap between consecutive marks (it includes its
// all-reduces: the close waits for the reducer on the device), and a row reports the
// median over the timed windows, max over ranks. Throughput is the items of one window
// over all ranks divided by that time. Peak memory is accrue's allocator peak (max over
// ranks) from after setup (model, arena, optimizer state, reducer, the input batches) to
// the end of the row, so it counts the state as well as the activations.
struct Row {
  std::string table, variant;
  int64_t k = 0, micro_batch = 0;
};

// Note [Window phases]
// ~~~~~~~~~~~~~~~~~~~~
// With --phases a row also says where its window goes, to find what a second
// GPU costs. One more event, recorded before the last micro-step's forward,
// splits each window into micro-steps 1..K-1 (no communication) and the last
// micro-step with the close (the all-reduces and the optimizer). The host's
// enqueue time of a window (wall clock from its first forward call to its
// close's return) tells whether the GPU could have been waiting for the host.
// On more than one rank the reducer also records
// its per-bucket events (ReducerOptions::timing), and the last window's
// ReducerTiming is printed: the last backward's length, when each bucket's
// collective started and ended relative to the backward's end, and what the
// close had to wait for. All are medians over the timed windows, max over ranks
// (the timing of the reducer: rank 0's last window).
struct RowResult {
  double window_ms = 0, peak_bytes = 0, allreduces_per_window = 0, loss = 0;
  int64_t buckets = 0;
  double first_steps_ms = 0, last_step_close_ms = 0, host_ms = 0;  // --phases
  std::optional<dist::ReducerTiming> timing;                       // --phases, > 1 rank
};

// {in, width x depth, classes}: depth Linear+GELU layers of `width`, then the classifier.
std::vector<int64_t> mlp_widths(const Options& o) {
  std::vector<int64_t> widths = {o.in};
  for (int64_t l = 0; l < o.depth; ++l)
    widths.push_back(o.width);
  widths.push_back(o.classes);
  return widths;
}

RowResult run_scaling_row(const Options& o, const Row& row, const dist::RankInfo& rank,
                          dist::Communicator* comm, Device device) {
  const DType compute = parse_dtype(o.dtype);
  // Declared in this order so that they die in reverse: the reducer before the arena.
  Generator init_gen(1234);
  nn::MLP model(mlp_widths(o), {device, DType::f32, &init_gen});
  optim::Optimizer optimizer(optim::AdamWOptions(o.lr).betas(0.9, 0.95).weight_decay(0.1));
  optim::ParamStore arena(model.named_parameters(),
                          optim::ParamStoreOptions()
                              .device(device)
                              .compute_dtype(compute)
                              .moments(optimizer.moments_needed())
                              .shareable_gradients(shares_gradients(row.variant)));
  std::unique_ptr<dist::Reducer> reducer;
  if (comm != nullptr) {
    dist::ReducerOptions options = reducer_options(row.variant);
    options.timing = o.phases;
    reducer = std::make_unique<dist::Reducer>(arena, *comm, options);
    ACCRUE_CHECK(!options.copy_engine_all_reduce || reducer->copy_engine_all_reduce(),
                 "accrue_bench_dist: --variants ", row.variant,
                 ": the copy engines are not in use (the reducer said why)");
    reducer->broadcast_parameters();
  }
  optim::Window window(
      arena, optimizer,
      optim::WindowOptions().micro_steps(row.k).max_grad_norm(1.0).norm_under_backward(
          comm != nullptr && norm_under_backward(row.variant)),
      reducer.get());

  // Two micro-batches per rank, drawn once: the loop times training, not data generation.
  constexpr int64_t kBatches = 2;
  Generator data_gen(1000 + static_cast<uint64_t>(rank.rank));
  std::vector<Tensor> xs, ys;
  for (int64_t i = 0; i < kBatches; ++i) {
    xs.push_back(randn({row.micro_batch, o.in}, DType::f32, device, &data_gen).to(compute));
    ys.push_back(randint(0, o.classes, {row.micro_batch}, DType::i64, device, &data_gen));
  }
  const StreamHandle stream = current_stream(device.index);
  Event* before_last = nullptr;  // Note [Window phases]
  auto run_window = [&] {
    for (int64_t k = 0; k < row.k; ++k) {
      if (k + 1 == row.k && before_last != nullptr) before_last->record(stream);
      window.backward(cross_entropy(model.forward(xs[k % kBatches]), ys[k % kBatches]));
    }
    window.close();
  };

  synchronize_stream(stream);
  reset_peak_memory(device);
  for (int64_t w = 0; w < o.warmup; ++w)
    run_window();
  std::vector<std::unique_ptr<Event>> marks;
  std::vector<std::unique_ptr<Event>> lasts;
  std::vector<double> host_ms;
  for (int64_t w = 0; w <= o.windows; ++w) {
    marks.push_back(std::make_unique<Event>(true));
    if (o.phases) lasts.push_back(std::make_unique<Event>(true));
  }
  const int64_t issued_before = reducer ? reducer->collectives_issued() : 0;
  marks[0]->record(stream);
  for (int64_t w = 0; w < o.windows; ++w) {
    if (o.phases) before_last = lasts[w].get();
    const auto host_start = std::chrono::steady_clock::now();
    run_window();
    host_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
            .count());
    marks[w + 1]->record(stream);
  }
  marks.back()->synchronize();
  const int64_t issued = (reducer ? reducer->collectives_issued() : 0) - issued_before;
  std::vector<double> window_ms;
  for (int64_t w = 0; w < o.windows; ++w)
    window_ms.push_back(marks[w]->elapsed_ms(*marks[w + 1]));
  const optim::WindowReport report = window.report();
  ACCRUE_CHECK(std::isfinite(report.loss) && report.skipped_windows == 0,
               "accrue_bench_dist: training went wrong (loss ", report.loss, ", ",
               report.skipped_windows, " skipped windows)");

  const std::vector<double> worst = max_over_ranks(
      comm, {median(window_ms), static_cast<double>(memory_stats(device).peak_bytes)});
  RowResult r;
  if (o.phases) {
    std::vector<double> first, last;
    for (int64_t w = 0; w < o.windows; ++w) {
      first.push_back(marks[w]->elapsed_ms(*lasts[w]));
      last.push_back(lasts[w]->elapsed_ms(*marks[w + 1]));
    }
    const std::vector<double> phase =
        max_over_ranks(comm, {median(first), median(last), median(host_ms)});
    r.first_steps_ms = phase[0];
    r.last_step_close_ms = phase[1];
    r.host_ms = phase[2];
    if (reducer) r.timing = reducer->last_timing();
  }
  r.window_ms = worst[0];
  r.peak_bytes = worst[1];
  r.allreduces_per_window = static_cast<double>(issued) / static_cast<double>(o.windows);
  r.loss = report.loss;
  r.buckets = reducer ? static_cast<int64_t>(reducer->plan().size()) : 0;
  return r;
}

// Note [Window phases]: one indented line per row, then the reducer's timing.
void print_phases(const RowResult& r) {
  std::printf(
      "  phases: micro-steps 1..K-1 %.3f ms, last micro-step + close %.3f ms, host enqueue "
      "%.3f ms per window\n",
      r.first_steps_ms, r.last_step_close_ms, r.host_ms);
  if (!r.timing) return;
  const dist::ReducerTiming& t = *r.timing;
  std::printf("  reducer (rank 0, last window): last backward %.3f ms; the close waited %.3f ms\n",
              t.last_backward_ms, t.exposed_ms);
  for (size_t b = 0; b < t.bucket_start_ms.size(); ++b)
    std::printf(
        "    bucket %2zu: %+8.3f .. %+8.3f ms (%.3f ms); gradients ready %+8.3f ms; host: issued "
        "%.3f ms into the backward, the call took %.3f ms\n",
        b, t.bucket_start_ms[b], t.bucket_end_ms[b], t.bucket_end_ms[b] - t.bucket_start_ms[b],
        t.bucket_ready_ms[b], t.host_issue_ms[b], t.host_call_ms[b]);
  std::printf("    item count: ends %+8.3f ms\n", t.items_end_ms);
}

int run_scaling(const Options& o, const dist::RankInfo& rank) {
  std::unique_ptr<dist::NcclCommunicator> comm;
  if (rank.distributed()) comm = dist::connect_nccl(rank, /*fingerprint=*/0, nccl_options(o));
  const Device device = Device::cuda(rank.local_rank);
  const int world = rank.world_size;
  const bool main_rank = rank.rank == 0;
  // Targets are valid by construction: their (deferred) checks are not needed.
  kernels::set_check_indices(false);

  // At world size 1 there is no reducer, so every variant would give the same row.
  const std::vector<std::string> variants =
      world > 1 ? o.variants : std::vector<std::string>{o.variants.front()};
  for (const std::string& v : variants)
    reducer_options(v);  // unknown names fail up front
  std::vector<Row> plan;
  for (const std::string& table : o.tables)
    for (const std::string& variant : variants)
      for (const int64_t k : o.ks) {
        int64_t micro = o.micro_batch;
        if (table == "fixed_global") {
          ACCRUE_CHECK(o.global_batch % (k * world) == 0, "accrue_bench_dist: --global-batch ",
                       o.global_batch, " is not divisible by K x world = ", k, " x ", world);
          micro = o.global_batch / (k * world);
        }
        plan.push_back({table, variant, k, micro});
      }

  int64_t params = 0;
  const std::vector<int64_t> widths = mlp_widths(o);
  for (size_t i = 0; i + 1 < widths.size(); ++i)
    params += widths[i] * widths[i + 1] + widths[i + 1];
  if (main_rank) {
    std::printf(
        "scaling: MLP %lld x %lld (+ %lld -> %lld), %.1fM parameters, %s compute, %d "
        "rank(s) on %s; %lld warm-up + %lld timed windows per row\n",
        (long long)o.width, (long long)o.depth, (long long)o.in, (long long)o.classes, params / 1e6,
        o.dtype.c_str(), world, device_name(device.index).c_str(), (long long)o.warmup,
        (long long)o.windows);
    std::printf("%-13s %-8s %3s %6s %8s %11s %12s %11s %9s %11s\n", "table", "variant", "K",
                "micro", "items/w", "window_ms", "items/s", "allreduce/w", "buckets", "peak_MB");
  }
  std::vector<JsonObject> rows;
  for (const Row& row : plan) {
    const RowResult r = run_scaling_row(o, row, rank, comm.get(), device);
    const double items = static_cast<double>(row.k * row.micro_batch * world);
    if (main_rank) {
      std::printf("%-13s %-8s %3lld %6lld %8.0f %11.3f %12.0f %11.2f %9lld %11.1f\n",
                  row.table.c_str(), row.variant.c_str(), (long long)row.k,
                  (long long)row.micro_batch, items, r.window_ms, items / (r.window_ms * 1e-3),
                  r.allreduces_per_window, (long long)r.buckets, r.peak_bytes / 1e6);
      if (o.phases) print_phases(r);
      std::fflush(stdout);
    }
    rows.push_back(JsonObject()
                       .str("table", row.table)
                       .str("variant", row.variant)
                       .num("world_size", world)
                       .num("K", static_cast<double>(row.k))
                       .num("micro_batch", static_cast<double>(row.micro_batch))
                       .num("items_per_window", items)
                       .num("window_ms", r.window_ms)
                       .num("items_per_s", items / (r.window_ms * 1e-3))
                       .num("allreduces_per_window", r.allreduces_per_window)
                       .num("buckets", static_cast<double>(r.buckets))
                       .num("peak_mem_MB", r.peak_bytes / 1e6)
                       .num("loss", r.loss));
  }
  if (main_rank && !o.json.empty())
    write_json(o.json,
               JsonObject()
                   .str("tool", "accrue")
                   .str("mode", "scaling")
                   .num("world_size", world)
                   .str("device", device_name(device.index))
                   .str("model", "mlp")
                   .num("width", static_cast<double>(o.width))
                   .num("depth", static_cast<double>(o.depth))
                   .num("in", static_cast<double>(o.in))
                   .num("classes", static_cast<double>(o.classes))
                   .num("params", static_cast<double>(params))
                   .str("compute_dtype", o.dtype)
                   .num("warmup", static_cast<double>(o.warmup))
                   .num("windows", static_cast<double>(o.windows)),
               rows);
  return 0;
}

}  // namespace
}  // namespace accrue::bench

int main(int argc, char** argv) {
  using namespace accrue;
  dist::RankInfo rank;
  bench::Options options;
  try {
    options = bench::parse(argc, argv);
  } catch (const Error& e) {
    // A bad command line: exit 2, the message alone (Note [Error locations]).
    std::fprintf(stderr, "%s (see --help)\n", e.message().c_str());
    return 2;
  }
  try {
    rank = dist::discover_rank();
    ACCRUE_CHECK(cuda_available(), "accrue_bench_dist: needs a GPU (", cuda_unavailable_reason(),
                 ")");
    ACCRUE_CHECK(rank.local_rank < cuda_device_count(), "accrue_bench_dist: ", dist::describe(rank),
                 " but ", cuda_device_count(), " GPUs are visible");
    set_cuda_device(rank.local_rank);
    return options.mode == "allreduce" ? bench::run_allreduce(options, rank)
                                       : bench::run_scaling(options, rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accrue_bench_dist (rank %d): %s\n", rank.rank, error_message(e).c_str());
    return 1;
  }
}
