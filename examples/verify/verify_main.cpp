// accrue_verify: the accumulation check before a long run (Note [Accumulation
// verifier] in optim/verify.h). Trains an MLP classifier on padded synthetic
// data twice from the same seed, K micro-batches per window against one batch
// of K b items, prints the per-window parameter difference and PASS or FAIL.
//
//   accrue_verify [--K 4] [--windows 5] [--batch 32] [--normalization item|mean]
//                 [--dtype f64|f32] [--cpu] [--help]
//
// Exit status: 0 PASS, 1 FAIL, 2 a bad option.
#include <cstdio>
#include <memory>
#include <string>

#include "accrue.h"
#include "accrue/optim/verify.h"
#include "examples/common/launch.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"

namespace {

using namespace accrue;
using namespace accrue::examples;

constexpr const char* kProgram = "accrue_verify";

struct Options {
  int64_t K = 4, windows = 5, batch = 32;
  kernels::Normalization normalization = kernels::Normalization::ItemCount;
  DType dtype = DType::f64;
  bool cpu = false;
};

// Parses the command line; false after --help.
bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Trains an MLP twice from one seed, K micro-batches per window against one "
                  "batch of K b items, and compares the parameters after every window.");
  cli.integer("--K", &o.K, "N", "micro-batches per window").min(2);
  cli.integer("--windows", &o.windows, "N", "windows to compare").min(1);
  cli.integer("--batch", &o.batch, "N", "items per window, a multiple of K").min(1);
  cli.choice<kernels::Normalization>(
      "--normalization", &o.normalization,
      {{"item", kernels::Normalization::ItemCount},
       {"mean", kernels::Normalization::MeanOfMicroBatchMeans}},
      "item: divide by the window's items; mean: the mean of per-micro-batch means (fails on "
      "padded data)");
  cli.choice<DType>("--dtype", &o.dtype, {{"f64", DType::f64}, {"f32", DType::f32}},
                    "f64 (tolerance 1e-10) or f32 (1e-5, TF32 off)");
  cli.flag("--cpu", &o.cpu, "run on the CPU even when a GPU is present");
  cli.epilog("Exit status: 0 PASS, 1 FAIL, 2 a bad option.");
  if (!cli.parse(argc, argv)) return false;
  if (o.batch % o.K != 0)
    usage_error("--batch ", o.batch, " does not split into K = ", o.K, " micro-batches");
  return true;
}

constexpr int64_t kFeatures = 16, kClasses = 5, kIgnore = -100;

// An MLP under AdamW with clipping, in a Window; window w's data is drawn from
// seed w, a quarter of its later items padding (ignore_index).
class MlpRun : public optim::VerifyRun {
 public:
  MlpRun(const Options& o, Device device, int64_t K)
      : o_(o),
        device_(device),
        gen_(11),
        model_({kFeatures, 32, kClasses}, {device, o.dtype, &gen_}),
        opt_(optim::AdamWOptions(1e-2).weight_decay(0.1)),
        arena_(model_.named_parameters(),
               optim::ParamStoreOptions().device(device).master_dtype(o.dtype)),
        window_(arena_, opt_,
                optim::WindowOptions().micro_steps(K).max_grad_norm(1.0).normalization(
                    o.normalization)) {}
  void micro_step(int64_t w, int64_t begin, int64_t end) override {
    Generator data(500 + static_cast<uint64_t>(w));
    const Tensor x = randn({o_.batch, kFeatures}, o_.dtype, Device::cpu(), &data);
    std::vector<int64_t> y =
        randint(0, kClasses, {o_.batch}, DType::i64, Device::cpu(), &data).to_vector<int64_t>();
    for (int64_t i = o_.batch / 2; i < o_.batch; ++i)
      if (i % 4 != 0) y[static_cast<size_t>(i)] = kIgnore;
    const Tensor xs = x.narrow(0, begin, end - begin).to(device_);
    const Tensor ys = from_vector<int64_t>(y, {o_.batch}).narrow(0, begin, end - begin).to(device_);
    window_.backward(cross_entropy(model_.forward(xs), ys, kIgnore));
  }
  void close() override { window_.close(); }
  std::vector<double> parameters() const override {
    return arena_.master().to(DType::f64).to_vector<double>();
  }

 private:
  Options o_;
  Device device_;
  Generator gen_;
  nn::MLP model_;
  optim::Optimizer opt_;
  optim::ParamStore arena_;
  optim::Window window_;
};

int verify(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 0;
  // The whole window's inputs exist at once: refuse a size that overflows before any allocation.
  checked_product({{"--batch", o.batch}, {"features", kFeatures}, {"bytes per value", 8}});
  const Device device = single_device(o.cpu);
  if (device.is_cuda()) kernels::set_allow_tf32(false);
  optim::VerifyOptions v;
  v.windows = o.windows;
  v.micro_steps = o.K;
  v.batch = o.batch;
  v.tolerance = optim::VerifyOptions::tolerance_for(o.dtype);
  std::printf("accrue_verify: MLP %lld-32-%lld on %s, %s, K=%lld x %lld items, %lld windows, %s\n",
              static_cast<long long>(kFeatures), static_cast<long long>(kClasses),
              device.str().c_str(), dtype_name(o.dtype), static_cast<long long>(o.K),
              static_cast<long long>(o.batch / o.K), static_cast<long long>(o.windows),
              o.normalization == kernels::Normalization::ItemCount ? "item-count normalization"
                                                                   : "mean of micro-batch means");
  const optim::VerifyReport r = optim::verify_accumulation(
      [&](int64_t K) { return std::make_unique<MlpRun>(o, device, K); }, v);
  std::printf("%s", r.table().c_str());
  return r.passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return verify(argc, argv); });
}
