// ResNet training throughput: the ResNet-50 benchmark on accrue's side.
//
//   accrue_resnet_bench [--model resnet50|resnet18] [--image-size S] [--micro-batch B] [--k K]
//                       [--dtype bf16|f16|f32] [--channels-last] [--classes C]
//                       [--warmup N] [--windows N] [--no-pointwise-gemm] [--conv-timed]
//                       [--conv-nondeterministic] [--conv-16-bit-wgrad] [--conv-fixed-paths]
//                       [--tuning FILE] [--no-gemm-tuning] [--no-cuda-graphs]
//                       [--concurrent-micro-batches N]
//                       [--weight-grad-branch LAG] [--cpu]
//
// Trains on synthetic images (normal noise, a new batch for every
// micro-step, drawn on the device before the timed windows) with random
// labels: SGD with momentum 0.9 over fp32 masters, a bf16 (or f16) compute
// copy, K micro-batches per window, BatchNorm statistics moved once per window
// (Note [Window statistics]). --channels-last hands the model NHWC-packed
// inputs and lays its weights out channels-last (nn::Module::to_channels_last),
// and the model stays channels-last (Note [Channels-last results]);
// --no-pointwise-gemm sends its 1 x 1 convolutions to cuDNN instead of
// cuBLASLt (Note [Pointwise convolution as a GEMM]). By default each
// convolution's paths are timed on its shape's first call and the fastest is
// kept (Note [Per-shape convolution paths]: never slower than a fixed
// setting), recorded with the GEMM choices in --tuning FILE (Note [Tuning
// file]); --conv-fixed-paths runs the fixed order that --no-pointwise-gemm and
// --conv-16-bit-wgrad set instead. On a GPU the micro-steps and the close
// replay from CUDA graphs (optim::GraphedWindow, Note [Graphed window];
// BatchNorm's window statistics adopted eagerly after each replayed close) and,
// at K >= 2, two micro-steps run side by side (Note [Concurrent micro-batches];
// BatchNorm's statistics in order): Note [ResNet bench defaults]. Both give the
// eager loop's bits; --no-cuda-graphs runs it eagerly, --concurrent-micro-batches N
// sets N; --weight-grad-branch LAG issues their convolutions' and the
// classifier's weight gradients on a side stream instead (Note [Weight
// gradients on a branch]).
// Windows are timed with
// CUDA events after the warm-up windows (on the CPU, with the host clock),
// and the last line is one JSON object: images/s and window time (medians),
// the allocator's peak memory, and the configuration. bench/resnet_bench.py
// runs it beside torchvision's ResNet in PyTorch (bench/torch_resnet.py).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/nn/resnet.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/json.h"
#include "examples/common/launch.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"
#include "examples/common/timing.h"
#include "examples/common/trainer_options.h"
#include "examples/resnet/resnet_window.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_resnet_bench";

// The bench's default convolution policy: every path chosen per shape.
kernels::ConvAlgorithmPolicy per_shape_paths() {
  kernels::ConvAlgorithmPolicy policy;
  policy.path_per_shape = true;
  return policy;
}

struct Options {
  std::string model = "resnet50";
  int64_t image_size = 224;
  int64_t micro_batch = 64;
  int64_t k = 4;
  std::string dtype = "bf16";
  bool channels_last = false;
  int64_t classes = 1000;
  int64_t warmup = 2;
  int64_t windows = 5;
  bool pointwise_gemm = true;
  kernels::ConvAlgorithmPolicy conv = per_shape_paths();
  std::string tuning;
  bool gemm_tuning = true;  // see resolve_gemm_tuning_in_process
  bool cuda_graphs = true;
  int64_t concurrent_micro_batches = 1;  // see resolve_concurrent_micro_batches
  int64_t weight_grad_branch = 0;
  CloseUnderForward close_under_forward;
  bool cpu = false;
  bool concurrent_given = false;  // --concurrent-micro-batches was on the command line
};

// Note [ResNet bench defaults]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The bench's defaults are its fastest settings that keep the eager loop's
// bits: on a GPU the window replays from CUDA graphs and, at K >= 2, runs two
// micro-steps at once. Both give the eager loop's weights bit for bit (the
// GPU tests GpuResNet.graphed*). A small micro-batch leaves most SMs idle and
// a second micro-batch in flight fills them, for one more micro-batch's
// activations; on an H200 that measured 1.1-1.3x the graphed loop at 32 x 8
// and 8 x 32 with peak memory still under PyTorch eager's, and a third in
// flight measured slower (bench/RESULTS.md, fifteenth and seventeenth
// sessions). Where the user chose otherwise (--concurrent-micro-batches N,
// --weight-grad-branch, --close-under-forward, --no-cuda-graphs) or on the
// CPU, where graphs run eagerly, nothing is changed.
//
// With one micro-step at a time and nothing on a side stream (K = 1, or one in
// flight by choice), cuBLASLt's candidates for each GEMM shape (the 1 x 1
// convolutions as GEMMs, the classifier) are also timed on first use and the
// fastest kept for the process (kernels::set_gemm_tuning_in_process, Note
// [GEMM autotuning]), as the convolutions' paths are (Note [Per-shape
// convolution paths]). A candidate timed alone is the fastest alone: at 256 x 1
// on an H200 that measured 5,159-5,161 images/s against 5,142-5,145 with the
// heuristic's choices, while with two micro-batches in flight the timed
// choices ran 0.6% slower at 64 x 4 and no faster at 32 x 8 (bench/RESULTS.md,
// eighteenth session), so two in flight keep the heuristic's. Like the paths,
// a choice made in process may differ from another process's, and so may the
// bits: --tuning FILE records every choice (and times them whatever the
// micro-batches in flight), --no-gemm-tuning keeps the heuristic's.
int64_t resolve_concurrent_micro_batches(const Options& o, const Device& device) {
  if (o.concurrent_given || !o.cuda_graphs || !device.is_cuda() || o.k < 2 ||
      o.weight_grad_branch > 0 || o.close_under_forward.on)
    return o.concurrent_micro_batches;
  return 2;
}

// Note [ResNet bench defaults]: GEMM tuning kept in process where one
// micro-step runs at a time; `o.concurrent_micro_batches` is already resolved.
bool resolve_gemm_tuning_in_process(const Options& o, const Device& device) {
  return o.gemm_tuning && o.tuning.empty() && device.is_cuda() && o.concurrent_micro_batches == 1 &&
         o.weight_grad_branch == 0 && !o.close_under_forward.on;
}

// Parses the command line; false after --help.
bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Times ResNet training windows (SGD, momentum 0.9, K micro-batches each) on "
                  "synthetic images and prints one JSON line: images/s, window ms, peak memory.");
  cli.choice("--model", &o.model, {"resnet50", "resnet18"}, "torchvision's layout");
  cli.integer("--image-size", &o.image_size, "S", "square images of S x S, 3 channels").min(32);
  cli.integer("--micro-batch", &o.micro_batch, "B", "images per micro-batch").min(1);
  cli.integer("--k", &o.k, "K", "micro-batches per window").min(1);
  cli.choice("--dtype", &o.dtype, {"bf16", "f16", "f32"}, "compute dtype over fp32 masters");
  cli.flag("--channels-last", &o.channels_last,
           "NHWC-packed inputs and channels-last weights (the model stays channels-last)");
  cli.flag_off("--no-pointwise-gemm", &o.pointwise_gemm,
               "1 x 1 convolutions on cuDNN, not as cuBLASLt GEMMs (with --conv-fixed-paths)");
  cli.flag("--conv-timed", &o.conv.timed,
           "time every cuDNN plan on a convolution's first call, keep the fastest "
           "(kernels::ConvAlgorithmPolicy)");
  cli.flag("--conv-nondeterministic", &o.conv.allow_nondeterministic,
           "admit cuDNN engines marked non-deterministic");
  cli.flag("--conv-16-bit-wgrad", &o.conv.weight_gradient_in_operand_dtype,
           "cuDNN weight gradients in the compute dtype, then added to the fp32 slots (as "
           "PyTorch's autocast; with --conv-fixed-paths)");
  bool fixed_paths = false, per_shape = false;
  cli.flag("--conv-fixed-paths", &fixed_paths,
           "run the fixed order of convolution paths; the default times each convolution's "
           "paths (1 x 1: the GEMM or cuDNN; weight gradients: also cuDNN's fp32 output or "
           "its 16-bit output added) on its shape's first call and keeps the fastest, which "
           "overrides --conv-16-bit-wgrad and --no-pointwise-gemm where it chooses");
  cli.flag("--conv-per-shape", &per_shape, "the default (kept for the command lines that name it)");
  cli.path("--tuning", &o.tuning, "FILE",
           "time cuBLASLt's candidates for each GEMM shape on first use and keep the fastest, "
           "recorded in FILE with the convolutions' paths; a run with the same FILE reads them "
           "back and computes the same bits");
  cli.flag_off("--no-gemm-tuning", &o.gemm_tuning,
               "keep cuBLASLt's heuristic choice for every GEMM; the default times the "
               "candidates of each GEMM shape where one micro-step runs at a time (K = 1, or "
               "one in flight by choice; no side stream) and keeps the fastest for the process "
               "(Note [ResNet bench defaults])");
  cli.integer("--classes", &o.classes, "C", "output classes").min(2);
  cli.integer("--warmup", &o.warmup, "N", "untimed windows first").min(0);
  cli.integer("--windows", &o.windows, "N", "timed windows, median reported").min(1);
  cli.flag_off("--no-cuda-graphs", &o.cuda_graphs,
               "run the micro-steps and the close eagerly; the default replays them from CUDA "
               "graphs (optim::GraphedWindow; the same bits; eager on the CPU anyway)");
  cli.flag("--cuda-graphs", &o.cuda_graphs,
           "the default (kept for the command lines that name it)");
  declare_concurrent_micro_batches(cli, o.concurrent_micro_batches)
      .default_text(
          "2 with CUDA graphs on a GPU at K >= 2 and no --weight-grad-branch or "
          "--close-under-forward (Note [ResNet bench defaults]), else 1");
  declare_weight_grad_branch(cli, o.weight_grad_branch);
  declare_close_under_forward(cli, o.close_under_forward, "");
  cli.flag("--cpu", &o.cpu, "run on the CPU backend (default: GPU 0 when there is one)");
  if (!cli.parse(argc, argv)) return false;
  if (fixed_paths && per_shape)
    usage_error("--conv-fixed-paths and --conv-per-shape exclude each other");
  if (cli.given("--no-cuda-graphs") && cli.given("--cuda-graphs"))
    usage_error("--cuda-graphs and --no-cuda-graphs exclude each other");
  if (cli.given("--no-gemm-tuning") && !o.tuning.empty())
    usage_error("--no-gemm-tuning and --tuning exclude each other");
  o.concurrent_given = cli.given("--concurrent-micro-batches");
  check_close_under_forward(cli, o.close_under_forward, {});
  check_concurrent_micro_batches(o.concurrent_micro_batches, o.cuda_graphs,
                                 {o.close_under_forward.on ? "--close-under-forward" : nullptr});
  check_weight_grad_branch(o.weight_grad_branch, o.cuda_graphs, o.concurrent_micro_batches);
  o.conv.path_per_shape = !fixed_paths;
  return true;
}

int bench(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  const int64_t b = opt.micro_batch, s = opt.image_size;
  // Sizes that overflow are refused before anything is built.
  const int64_t window_images = checked_product({{"--micro-batch", b}, {"--k", opt.k}});
  checked_product(
      {{"--micro-batch", b}, {"--image-size", s}, {"--image-size", s}, {"channels", 3}});
  checked_product({{"--micro-batch", b}, {"--classes", opt.classes}});
  kernels::set_pointwise_conv_gemm(opt.pointwise_gemm);
  kernels::set_conv_algorithm_policy(opt.conv);
  if (!opt.tuning.empty()) {
    probe_output_file("--tuning", opt.tuning);
    kernels::set_gemm_tuning_file(opt.tuning);  // Note [Tuning file]
  }
  const Device device = single_device(opt.cpu);
  opt.concurrent_micro_batches = resolve_concurrent_micro_batches(opt, device);
  const bool gemm_tuning_in_process = resolve_gemm_tuning_in_process(opt, device);
  kernels::set_gemm_tuning_in_process(gemm_tuning_in_process);
  const DType compute = opt.dtype == "bf16"  ? DType::bf16
                        : opt.dtype == "f16" ? DType::f16
                                             : DType::f32;
  if (!device.is_cuda() && compute != DType::f32)
    std::printf("accrue_resnet_bench: the CPU backend computes %s in emulation: slow\n",
                opt.dtype.c_str());

  nn::ResNetConfig config = opt.model == "resnet50" ? nn::ResNetConfig::resnet50(opt.classes)
                                                    : nn::ResNetConfig::resnet18(opt.classes);
  Generator init(0);
  nn::ResNet model(config, {device, DType::f32, &init});
  // PyTorch's model.to(memory_format=torch.channels_last): the weights too, so
  // cuDNN reads them without a copy (Note [Parameter layouts]).
  if (opt.channels_last) model.to_channels_last();
  optim::Optimizer sgd(optim::SGDOptions(0.1).momentum(0.9));
  optim::ParamStore arena(model.named_parameters(),
                          optim::ParamStoreOptions().device(device).compute_dtype(compute).moments(
                              sgd.moments_needed()));
  optim::Window window(arena, sgd,
                       optim::WindowOptions().micro_steps(opt.k).close_under_forward(
                           opt.close_under_forward.on, opt.close_under_forward.layer_elements,
                           opt.close_under_forward.max_blocks));
  listen_batch_norms(model, window);

  // Two micro-batches of images and labels on the device, alternated: fresh
  // values every micro-step would time the generator, not the model.
  Generator data(1);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 2; ++i) {
    Tensor x = randn({b, s, s, 3}, DType::f32, device, &data).to(compute);
    x = opt.channels_last ? x.permute({0, 3, 1, 2}) : x.permute({0, 3, 1, 2}).contiguous();
    const Tensor y = randint(0, opt.classes, {b}, DType::i64, Device::cpu(), &data).to(device);
    batches.emplace_back(x, y);
  }
  std::unique_ptr<optim::GraphedWindow> graphed;
  if (opt.cuda_graphs) {
    graphed = std::make_unique<optim::GraphedWindow>(window, [&](const std::vector<Tensor>& in) {
      return cross_entropy(model.forward(in[0]), in[1]);
    });
    graphed->set_concurrent_micro_batches(static_cast<int>(opt.concurrent_micro_batches));
    graphed->set_weight_grad_branch(static_cast<int>(opt.weight_grad_branch));
  }
  int64_t step = 0;
  const std::vector<double> window_ms = time_windows(device, opt.warmup, opt.windows, [&] {
    if (!graphed) {
      run_window(model, window, opt.k,
                 [&](int64_t) { return batches[static_cast<size_t>(step++ % 2)]; });
      return;
    }
    for (int64_t m = 0; m < opt.k; ++m) {
      const auto& [x, y] = batches[static_cast<size_t>(step++ % 2)];
      graphed->backward({x, y});
    }
    graphed->close();
  });
  const optim::WindowReport r = window.report();
  // Note [Honest exit codes]; a timing that includes a skipped window is not of training.
  ACCRUE_CHECK(std::isfinite(r.loss), "the loss is not finite (", r.loss, ") at window ", r.window,
               ", the last: the training went wrong");
  ACCRUE_CHECK(r.skipped_windows == 0, r.skipped_windows, " of ", r.window,
               " windows were skipped (non-finite gradients; the last window's loss ", r.loss,
               "): the training went wrong");
  const double ms = median(window_ms);
  JsonObject config_json;
  config_json.text("model", opt.model)
      .integer("image_size", s)
      .integer("micro_batch", b)
      .integer("micro_steps", opt.k)
      .text("dtype", opt.dtype)
      .boolean("channels_last", opt.channels_last)
      .boolean("pointwise_gemm", opt.pointwise_gemm)
      .boolean("conv_per_shape", opt.conv.path_per_shape)
      .boolean("conv_16_bit_wgrad", opt.conv.weight_gradient_in_operand_dtype)
      .text("gemm_tuning", !opt.tuning.empty()      ? "file"
                           : gemm_tuning_in_process ? "in process"
                                                    : "off")
      .boolean("cuda_graphs", opt.cuda_graphs)
      .integer("concurrent_micro_batches", opt.concurrent_micro_batches)
      .integer("weight_grad_branch", opt.weight_grad_branch)
      .boolean("close_under_forward", opt.close_under_forward.on)
      .integer("classes", opt.classes)
      .integer("parameters", arena.numel())
      .integer("warmup_windows", opt.warmup)
      .integer("timed_windows", opt.windows);
  JsonObject line;
  line.text("bench", kProgram)
      .text("device", device.str())
      .number("images_per_s_median", static_cast<double>(window_images) / (ms / 1000.0))
      .number("window_ms_median", ms)
      .number("window_ms_min", *std::min_element(window_ms.begin(), window_ms.end()))
      .integer("peak_memory_bytes", memory_stats(device).peak_bytes)
      .number("final_loss", r.loss)
      .integer("graphs", graphed ? graphed->counts().graphs : 0)
      .integer("replayed_micro_steps", graphed ? graphed->counts().replayed_micro_steps : 0)
      .integer("weight_grad_branch_entries", graphed ? graphed->weight_grad_branch_entries() : 0)
      .object("config", config_json);
  std::printf("%s\n", line.str().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return bench(argc, argv); });
}
