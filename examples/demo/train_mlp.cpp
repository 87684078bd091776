// The demo trainer: an MLP learns a synthetic classification task (labels
// from a fixed random "teacher" projection). It runs on the GPU when one is
// present, else on the CPU, and prints the loss falling.
//
//   accrue_demo [--steps N] [--batch B] [--lr LR] [--cpu]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "accrue.h"

using namespace accrue;

namespace {

struct Options {
  int steps = 200;
  int64_t batch = 256;
  double lr = 0.1;
  bool force_cpu = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      ACCRUE_CHECK(i + 1 < argc, "accrue_demo: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--steps") {
      o.steps = std::stoi(value());
    } else if (a == "--batch") {
      o.batch = std::stoll(value());
    } else if (a == "--lr") {
      o.lr = std::stod(value());
    } else if (a == "--cpu") {
      o.force_cpu = true;
    } else {
      ACCRUE_FAIL("accrue_demo: unknown option ", a,
                  " (options: --steps N --batch B --lr LR --cpu)");
    }
  }
  return o;
}

constexpr int64_t kFeatures = 32, kHidden = 128, kClasses = 10;

// A batch of the synthetic task: x ~ N(0, 1), label = argmax(x @ teacher).
struct Batch {
  Tensor x, y;
};

Batch make_batch(const Tensor& teacher, int64_t n, Device device, Generator& gen) {
  Tensor x = randn({n, kFeatures}, DType::f32, device, &gen);
  Tensor y = kernels::argmax(kernels::matmul(x, teacher), 1);
  return {x, y};
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  const bool gpu = cuda_available() && !opt.force_cpu;
  const Device device = gpu ? Device::cuda(0) : Device::cpu();
  std::printf("accrue demo: MLP %lld-%lld-%lld-%lld on %s%s\n", (long long)kFeatures,
              (long long)kHidden, (long long)kHidden, (long long)kClasses, device.str().c_str(),
              gpu ? "" : (std::string(" (") + cuda_unavailable_reason() + ")").c_str());

  Generator gen(1234);
  nn::MLP model({kFeatures, kHidden, kHidden, kClasses}, {device, DType::f32, &gen});
  optim::PlainSGD sgd(model.parameters(), opt.lr);
  const Tensor teacher = randn({kFeatures, kClasses}, DType::f32, device, &gen);
  const Batch eval = make_batch(teacher, 4096, device, gen);

  const auto start = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0;
  for (int step = 1; step <= opt.steps; ++step) {
    const Batch b = make_batch(teacher, opt.batch, device, gen);
    Loss loss = cross_entropy(model.forward(b.x), b.y);
    // Normalize by the number of counted targets (see Note [Normalization]).
    Tensor mean_loss = loss.sum / static_cast<double>(opt.batch);
    backward(mean_loss);
    sgd.step();
    last_loss = mean_loss.item();
    if (step == 1) first_loss = last_loss;
    if (step == 1 || step % 20 == 0 || step == opt.steps) {
      NoGradGuard no_grad;
      Tensor pred = kernels::argmax(model.forward(eval.x), 1);
      const double acc =
          kernels::mean(kernels::compare(kernels::CompareOp::Eq, pred, eval.y).to(DType::f32))
              .item();
      std::printf("step %4d  loss %.4f  eval accuracy %.3f\n", step, last_loss, acc);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("loss %.4f -> %.4f in %d steps, %.2f s, peak memory %.1f MB on %s\n", first_loss,
              last_loss, opt.steps, seconds, memory_stats(device).peak_bytes / 1e6,
              device.str().c_str());
  if (!(last_loss < first_loss)) {
    std::fprintf(stderr, "accrue demo: the loss did not fall\n");
    return 1;
  }
  return 0;
} catch (const accrue::Error& e) {
  std::fprintf(stderr, "accrue demo: %s\n", e.what());
  return 2;
}
