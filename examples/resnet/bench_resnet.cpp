// ResNet training throughput: the ResNet-50 benchmark on accrue's side.
//
//   accrue_resnet_bench [--model resnet50|resnet18] [--image-size S] [--micro-batch B] [--k K]
//                       [--dtype bf16|f16|f32] [--channels-last] [--classes C]
//                       [--warmup N] [--windows N] [--no-pointwise-gemm] [--conv-timed]
//                       [--conv-nondeterministic] [--conv-16-bit-wgrad] [--cpu]
//
// Trains on synthetic images (normal noise, a new batch for every
// micro-step, drawn on the device before the timed windows) with random
// labels: SGD with momentum 0.9 over fp32 masters, a bf16 (or f16) compute
// copy, K micro-batches per window, BatchNorm statistics moved once per window
// (Note [Window statistics]). --channels-last hands the model NHWC-packed
// inputs and lays its weights out channels-last (nn::Module::to_channels_last),
// and the model stays channels-last (Note [Channels-last results]);
// --no-pointwise-gemm sends its 1 x 1 convolutions to cuDNN instead of
// cuBLASLt (Note [Pointwise convolution as a GEMM]). Windows are timed with
// CUDA events after the warm-up windows (on the CPU, with the host clock),
// and the last line is one JSON object: images/s and window time (medians),
// the allocator's peak memory, and the configuration. bench/resnet_bench.py
// runs it beside torchvision's ResNet in PyTorch (bench/torch_resnet.py).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "accrue.h"
#include "nn/resnet.h"
#include "resnet_cli.h"

using namespace accrue;

namespace {

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
  kernels::ConvAlgorithmPolicy conv;
  bool cpu = false;
};

void print_usage() {
  const Options d;
  std::printf(
      "usage: accrue_resnet_bench [options]\n"
      "Times ResNet training windows (SGD, momentum 0.9, K micro-batches each) on synthetic\n"
      "images and prints one JSON line: images/s, window ms, peak memory.\n"
      "  --model M           resnet50 or resnet18 (torchvision's layout) (default %s)\n"
      "  --image-size S      square images of S x S, 3 channels (default %lld)\n"
      "  --micro-batch B     images per micro-batch (default %lld)\n"
      "  --k K               micro-batches per window (default %lld)\n"
      "  --dtype D           compute dtype over fp32 masters: bf16, f16 or f32 (default %s)\n"
      "  --channels-last     NHWC-packed inputs and channels-last weights (the model stays\n"
      "                      channels-last)\n"
      "  --no-pointwise-gemm 1 x 1 convolutions on cuDNN, not as cuBLASLt GEMMs\n"
      "  --conv-timed        time every cuDNN plan on a convolution's first call, keep the\n"
      "                      fastest (kernels::ConvAlgorithmPolicy)\n"
      "  --conv-nondeterministic  admit cuDNN engines marked non-deterministic\n"
      "  --conv-16-bit-wgrad cuDNN weight gradients in the compute dtype, then added to\n"
      "                      the fp32 slots (as PyTorch's autocast)\n"
      "  --classes C         output classes (default %lld)\n"
      "  --warmup N          untimed windows first (default %lld)\n"
      "  --windows N         timed windows, median reported (default %lld)\n"
      "  --cpu               run on the CPU backend (default: GPU 0 when there is one)\n"
      "  -h, --help          this text\n",
      d.model.c_str(), (long long)d.image_size, (long long)d.micro_batch, (long long)d.k,
      d.dtype.c_str(), (long long)d.classes, (long long)d.warmup, (long long)d.windows);
}

using examples::parse_int;
using examples::UsageError;

Options parse(int argc, char** argv, bool* help) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      *help = true;
    } else if (a == "--model") {
      o.model = value();
      if (o.model != "resnet50" && o.model != "resnet18")
        throw UsageError("--model must be resnet50 or resnet18, got '" + o.model + "'");
    } else if (a == "--image-size") {
      o.image_size = parse_int(a, value(), 32);
    } else if (a == "--micro-batch") {
      o.micro_batch = parse_int(a, value(), 1);
    } else if (a == "--k") {
      o.k = parse_int(a, value(), 1);
    } else if (a == "--dtype") {
      o.dtype = value();
      if (o.dtype != "bf16" && o.dtype != "f16" && o.dtype != "f32")
        throw UsageError("--dtype must be bf16, f16 or f32, got '" + o.dtype + "'");
    } else if (a == "--channels-last") {
      o.channels_last = true;
    } else if (a == "--classes") {
      o.classes = parse_int(a, value(), 2);
    } else if (a == "--warmup") {
      o.warmup = parse_int(a, value(), 0);
    } else if (a == "--windows") {
      o.windows = parse_int(a, value(), 1);
    } else if (a == "--no-pointwise-gemm") {
      o.pointwise_gemm = false;
    } else if (a == "--conv-timed") {
      o.conv.timed = true;
    } else if (a == "--conv-nondeterministic") {
      o.conv.allow_nondeterministic = true;
    } else if (a == "--conv-16-bit-wgrad") {
      o.conv.weight_gradient_in_operand_dtype = true;
    } else if (a == "--cpu") {
      o.cpu = true;
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  bool help = false;
  const Options opt = parse(argc, argv, &help);
  if (help) {
    print_usage();
    return 0;
  }
  kernels::set_pointwise_conv_gemm(opt.pointwise_gemm);
  kernels::set_conv_algorithm_policy(opt.conv);
  const bool gpu = !opt.cpu && cuda_available();
  const Device device = gpu ? Device::cuda(0) : Device::cpu();
  const DType compute = opt.dtype == "bf16"  ? DType::bf16
                        : opt.dtype == "f16" ? DType::f16
                                             : DType::f32;
  if (!gpu && compute != DType::f32)
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
  GradArena arena(model.parameters(), {}, {device, DType::f32, compute, sgd.moments_needed()});
  optim::Window window(arena, sgd, optim::WindowOptions().micro_steps(opt.k));
  for (nn::Module* m : model.modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(m)) window.add_listener(bn);

  // Two micro-batches of images and labels on the device, alternated: fresh
  // values every micro-step would time the generator, not the model.
  const int64_t b = opt.micro_batch, s = opt.image_size;
  Generator data(1);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 2; ++i) {
    Tensor x = randn({b, s, s, 3}, DType::f32, device, &data).to(compute);
    x = opt.channels_last ? x.permute({0, 3, 1, 2}) : x.permute({0, 3, 1, 2}).contiguous();
    const Tensor y = randint(0, opt.classes, {b}, DType::i64, Device::cpu(), &data).to(device);
    batches.emplace_back(x, y);
  }
  int64_t step = 0;
  auto run_window = [&]() {
    for (int64_t m = 0; m < opt.k; ++m, ++step) {
      const auto& [x, y] = batches[static_cast<size_t>(step % 2)];
      window.backward(cross_entropy(model.forward(x), y));
    }
    window.close();
  };

  std::vector<double> window_ms;
  for (int64_t w = 0; w < opt.warmup; ++w)
    run_window();
  if (gpu) {
    const StreamHandle stream = current_stream(device.index);
    std::vector<std::unique_ptr<Event>> marks;
    for (int64_t w = 0; w <= opt.windows; ++w)
      marks.push_back(std::make_unique<Event>(/*timing=*/true));
    marks[0]->record(stream);
    for (int64_t w = 1; w <= opt.windows; ++w) {
      run_window();
      marks[static_cast<size_t>(w)]->record(stream);
    }
    marks.back()->synchronize();
    for (size_t w = 1; w < marks.size(); ++w)
      window_ms.push_back(marks[w - 1]->elapsed_ms(*marks[w]));
  } else {
    for (int64_t w = 0; w < opt.windows; ++w) {
      const auto t0 = std::chrono::steady_clock::now();
      run_window();
      window_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const optim::WindowReport r = window.report();
  ACCRUE_CHECK(std::isfinite(r.loss) && r.skipped_windows == 0, "accrue_resnet_bench: loss ",
               r.loss, ", ", r.skipped_windows, " skipped windows: the training went wrong");
  const double ms = median(window_ms);
  const double images = static_cast<double>(b * opt.k);
  std::printf(
      "{\"bench\": \"accrue_resnet_bench\", \"device\": \"%s\", \"images_per_s_median\": %.1f, "
      "\"window_ms_median\": %.4f, \"window_ms_min\": %.4f, \"peak_memory_bytes\": %lld, "
      "\"final_loss\": %.6f, \"config\": {\"model\": \"%s\", \"image_size\": %lld, "
      "\"micro_batch\": %lld, \"micro_steps\": %lld, \"dtype\": \"%s\", \"channels_last\": %s, "
      "\"pointwise_gemm\": %s, \"classes\": %lld, \"parameters\": %lld, \"warmup_windows\": %lld, "
      "\"timed_windows\": %lld}}\n",
      device.str().c_str(), images / (ms / 1000.0), ms,
      *std::min_element(window_ms.begin(), window_ms.end()),
      (long long)memory_stats(device).peak_bytes, r.loss, opt.model.c_str(),
      (long long)opt.image_size, (long long)b, (long long)opt.k, opt.dtype.c_str(),
      opt.channels_last ? "true" : "false", opt.pointwise_gemm ? "true" : "false",
      (long long)opt.classes, (long long)arena.numel(), (long long)opt.warmup,
      (long long)opt.windows);
  return 0;
} catch (const UsageError& e) {
  std::fprintf(stderr, "accrue_resnet_bench: error: %s (see --help)\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "accrue_resnet_bench: %s\n", e.what());
  return 1;
}
