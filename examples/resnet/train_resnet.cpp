// A small ResNet on 8x8 grey images with K micro-batches per SGD step, and
// what happens to BatchNorm's running statistics (Note [Window statistics]).
//
//   accrue_resnet [--data DIR | --synthetic] [--micro-batch B] [--k K] [--epochs E]
//                 [--bn window|window-compound|per-micro-batch] [--recompute-bn] [--lr LR]
//                 [--seed S] [--checkpoint PATH] [--resume PATH]
//
// A checkpoint, written after the last epoch, is the Window's state_dict
// (master weights, momentum, window state) plus the model's buffers (every
// BatchNorm's running and pending statistics) and the epochs done, as Note
// [Module state dict] describes; --resume continues from it, with the data
// order of the epochs it skipped replayed, so the run ends as an
// uninterrupted one does.
//
// --data DIR reads DIR/digits_images.npy (f32 [N, 1, 8, 8]) and
// DIR/digits_labels.npy (i64 [N]), which tools/make_digits.py writes from
// scikit-learn's bundled digits (1,797 images, no download). Without it the
// images are synthetic: ten fixed random 8x8 patterns plus noise.
//
// The last 300 images are held out. After training, the running variance of
// every BatchNorm is compared with the variance of its input over the whole
// training set under the final weights (what recompute_batch_norm_statistics
// measures), and the validation accuracy is measured in eval mode.
//
// It runs on the CPU, or with --cuda on GPU 0, in f32 (its convolutions then
// run composed: Note [Composed convolution]). accrue_resnet_bench times the
// large ResNets.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "accrue.h"
#include "nn/resnet.h"
#include "resnet_cli.h"

using namespace accrue;

namespace {

constexpr int64_t kHeldOut = 300;
constexpr int64_t kClasses = 10;

struct Options {
  std::string data;
  int64_t micro_batch = 2;
  int64_t k = 16;
  int64_t epochs = 15;
  std::string bn = "window";
  bool recompute_bn = false;
  std::string checkpoint, resume;
  double lr = 0.05;
  uint64_t seed = 0;
  bool cuda = false;
};

void print_usage() {
  const Options d;
  std::printf(
      "usage: accrue_resnet [options]\n"
      "Trains a small ResNet on 8x8 images (the CPU; --cuda: GPU 0) with K micro-batches per SGD\n"
      "step and reports\n"
      "how far BatchNorm's running variance is from the training set's.\n"
      "  --data DIR          digits_images.npy and digits_labels.npy (tools/make_digits.py)\n"
      "  --synthetic         ten random 8x8 patterns plus noise (the default without --data)\n"
      "  --micro-batch B     images per micro-batch (default %lld)\n"
      "  --k K               micro-batches per SGD step (default %lld)\n"
      "  --epochs E          passes over the training images (default %lld)\n"
      "  --bn MODE           window (running statistics moved once per window by the merged\n"
      "                      statistics), window-compound (the same, by 1 - (1 - m)^K, PyTorch's\n"
      "                      pace) or per-micro-batch (PyTorch's: once per forward) (default %s)\n"
      "  --recompute-bn      after training, re-estimate the running statistics over the\n"
      "                      training set (precise BN) before the validation\n"
      "  --lr LR             SGD learning rate, momentum 0.9 (default %g)\n"
      "  --seed S            initialization, data order and synthetic images (default %llu)\n"
      "  --checkpoint PATH   after the last epoch, save weights, optimizer, window and\n"
      "                      BatchNorm statistics (safetensors)\n"
      "  --resume PATH       continue from such a checkpoint up to --epochs\n"
      "  --cuda              train on GPU 0 (f32: convolutions composed of GEMMs, Note\n"
      "                      [Composed convolution])\n"
      "  -h, --help          this text\n",
      (long long)d.micro_batch, (long long)d.k, (long long)d.epochs, d.bn.c_str(), d.lr,
      (unsigned long long)d.seed);
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
    } else if (a == "--data") {
      o.data = value();
    } else if (a == "--synthetic") {
      o.data.clear();
    } else if (a == "--micro-batch") {
      o.micro_batch = parse_int(a, value(), 1);
    } else if (a == "--k") {
      o.k = parse_int(a, value(), 1);
    } else if (a == "--epochs") {
      o.epochs = parse_int(a, value(), 1);
    } else if (a == "--bn") {
      o.bn = value();
      if (o.bn != "window" && o.bn != "window-compound" && o.bn != "per-micro-batch")
        throw UsageError("--bn must be window, window-compound or per-micro-batch, got '" + o.bn +
                         "'");
    } else if (a == "--checkpoint") {
      o.checkpoint = value();
    } else if (a == "--resume") {
      o.resume = value();
    } else if (a == "--recompute-bn") {
      o.recompute_bn = true;
    } else if (a == "--lr") {
      const std::string v = value();
      char* end = nullptr;
      o.lr = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.lr > 0.0))
        throw UsageError("--lr needs a positive number, got '" + v + "'");
    } else if (a == "--cuda") {
      o.cuda = true;
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(a, value(), 0));
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  return o;
}

// Ten fixed random patterns, each image one of them plus noise; labels cycle.
void synthetic(uint64_t seed, Tensor* images, Tensor* labels) {
  Generator gen(seed + 1000);
  const int64_t n = 1797;
  const Tensor patterns = randn({kClasses, 64}, DType::f64, Device::cpu(), &gen);
  const Tensor noise = randn({n, 64}, DType::f64, Device::cpu(), &gen);
  const std::vector<double> p = patterns.to_vector<double>(), z = noise.to_vector<double>();
  std::vector<double> x(static_cast<size_t>(n * 64));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[static_cast<size_t>(i)] = i % kClasses;
    for (int64_t j = 0; j < 64; ++j)
      x[static_cast<size_t>(i * 64 + j)] = p[static_cast<size_t>((i % kClasses) * 64 + j)] +
                                           1.5 * z[static_cast<size_t>(i * 64 + j)];
  }
  *images = from_vector<double>(x, {n, 1, 8, 8}, DType::f32);
  *labels = from_vector<int64_t>(y, {n});
}

// Mean over BatchNorm layers of |running_var - reference_var| / |reference_var| (L2).
double variance_error(const std::vector<nn::BatchNorm*>& norms,
                      const std::vector<Tensor>& reference) {
  double total = 0.0;
  for (size_t i = 0; i < norms.size(); ++i) {
    const std::vector<double> a =
        norms[i]->running_var().to(Device::cpu()).to(DType::f64).to_vector<double>();
    const std::vector<double> b = reference[i].to(Device::cpu()).to(DType::f64).to_vector<double>();
    double num = 0.0, den = 0.0;
    for (size_t j = 0; j < a.size(); ++j) {
      num += (a[j] - b[j]) * (a[j] - b[j]);
      den += b[j] * b[j];
    }
    total += std::sqrt(num / den);
  }
  return total / static_cast<double>(norms.size());
}

double accuracy(nn::ResNet& model, const Tensor& images, const Tensor& labels) {
  NoGradGuard no_grad;
  model.eval();
  const Tensor predicted = kernels::argmax(model.forward(images), 1);
  model.train();
  const std::vector<int64_t> p = predicted.to(Device::cpu()).to_vector<int64_t>(),
                             y = labels.to(Device::cpu()).to_vector<int64_t>();
  int64_t right = 0;
  for (size_t i = 0; i < p.size(); ++i)
    right += p[i] == y[i];
  return static_cast<double>(right) / static_cast<double>(p.size());
}

}  // namespace

int main(int argc, char** argv) try {
  bool help = false;
  const Options opt = parse(argc, argv, &help);
  if (help) {
    print_usage();
    return 0;
  }
  Tensor images, labels;
  if (opt.data.empty()) {
    synthetic(opt.seed, &images, &labels);
  } else {
    images = load_npy(opt.data + "/digits_images.npy").to(DType::f32);
    labels = load_npy(opt.data + "/digits_labels.npy").to(DType::i64);
    ACCRUE_CHECK(images.dim() == 4 && images.size(1) == 1 && images.size(2) == 8 &&
                     images.size(3) == 8 && labels.shape() == Shape{images.size(0)},
                 "accrue_resnet: ", opt.data, " holds images ", shape_str(images.shape()),
                 " and labels ", shape_str(labels.shape()), "; expected [N, 1, 8, 8] and [N]");
  }
  const int64_t n = images.size(0);
  ACCRUE_CHECK(n > kHeldOut + opt.micro_batch * opt.k, "accrue_resnet: ", n,
               " images are too few for ", kHeldOut, " held out and a window of ",
               opt.micro_batch * opt.k);
  if (opt.cuda && !cuda_available())
    throw UsageError("--cuda needs a CUDA GPU, and none is visible");
  const Device device = opt.cuda ? Device::cuda(0) : Device::cpu();
  const int64_t train_n = n - kHeldOut;
  const Tensor train_x = images.narrow(0, 0, train_n), train_y = labels.narrow(0, 0, train_n);
  const Tensor val_x = images.narrow(0, train_n, kHeldOut).contiguous().to(device);
  const Tensor val_y = labels.narrow(0, train_n, kHeldOut).contiguous();

  nn::ResNetConfig config;
  config.blocks = {1, 1};
  config.width = 8;
  config.in_channels = 1;
  config.num_classes = kClasses;
  config.small_input = true;
  config.batch_norm.statistics = opt.bn == "per-micro-batch"
                                     ? nn::BatchNormStatistics::PerMicroBatch
                                     : nn::BatchNormStatistics::Window;
  config.batch_norm.compound_momentum = opt.bn == "window-compound";
  Generator init(opt.seed);
  nn::ResNet model(config, {device, DType::f32, &init});
  optim::Optimizer sgd(optim::SGDOptions(opt.lr).momentum(0.9));
  GradArena arena(model.parameters(), {}, {device, DType::f32, DType::f32, 1});
  optim::Window window(arena, sgd, optim::WindowOptions().micro_steps(opt.k).max_grad_norm(5.0));
  std::vector<nn::BatchNorm*> norms;
  for (nn::Module* m : model.modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(m)) {
      norms.push_back(bn);
      window.add_listener(bn);  // Note [Window statistics]
    }
  std::printf(
      "accrue_resnet: %s images, %lld train / %lld held out; micro-batch %lld x K %lld, "
      "BatchNorm statistics %s, %zu BatchNorm layers, on %s\n",
      opt.data.empty() ? "synthetic" : opt.data.c_str(), (long long)train_n, (long long)kHeldOut,
      (long long)opt.micro_batch, (long long)opt.k, opt.bn.c_str(), norms.size(),
      opt.cuda ? "GPU 0" : "the CPU");

  const int64_t window_items = opt.micro_batch * opt.k;
  const std::vector<float> pixels = train_x.contiguous().to_vector<float>();
  const std::vector<int64_t> targets = train_y.contiguous().to_vector<int64_t>();
  // The micro-batch of these training rows, copied out.
  auto batch = [&](std::vector<int64_t>::const_iterator first, int64_t count) {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = first[i];
      x.insert(x.end(), pixels.begin() + row * 64, pixels.begin() + (row + 1) * 64);
      y.push_back(targets[static_cast<size_t>(row)]);
    }
    return std::make_pair(from_vector<float>(x, {count, 1, 8, 8}).to(device),
                          from_vector<int64_t>(y, {count}).to(device));
  };
  std::mt19937_64 order(opt.seed + 7);  // the data order: the same for every run with this seed
  std::vector<int64_t> perm(static_cast<size_t>(train_n));
  for (int64_t i = 0; i < train_n; ++i)
    perm[static_cast<size_t>(i)] = i;
  int64_t first_epoch = 1;
  if (!opt.resume.empty()) {
    std::map<std::string, Tensor> state = load_safetensors(opt.resume);
    std::map<std::string, Tensor> window_state, buffers;
    for (auto& [key, t] : state) {
      if (key.rfind("buffers.", 0) == 0) {
        buffers[key.substr(8)] = t;
      } else if (key != "epochs_done") {
        window_state[key] = t;
      }
    }
    ACCRUE_CHECK(state.count("epochs_done") != 0, "accrue_resnet: ", opt.resume,
                 " has no 'epochs_done': not a checkpoint of this example");
    window.load_state_dict(window_state);
    // The parameters came with the window's master weights: keep them, take the buffers.
    std::map<std::string, Tensor> module_state = model.state_dict();
    for (const auto& [name, t] : buffers)
      module_state[name] = t;
    model.load_state_dict(module_state);
    first_epoch = static_cast<int64_t>(state.at("epochs_done").item()) + 1;
    for (int64_t e = 1; e < first_epoch; ++e)  // the data order of the epochs done
      std::shuffle(perm.begin(), perm.end(), order);
    std::printf("resumed %s after epoch %lld\n", opt.resume.c_str(), (long long)first_epoch - 1);
  }
  for (int64_t epoch = first_epoch; epoch <= opt.epochs; ++epoch) {
    std::shuffle(perm.begin(), perm.end(), order);
    double loss = 0.0;
    int64_t windows = 0;
    for (int64_t start = 0; start + window_items <= train_n; start += window_items) {
      for (int64_t m = 0; m < opt.k; ++m) {
        const auto [x, y] = batch(perm.cbegin() + start + m * opt.micro_batch, opt.micro_batch);
        window.backward(cross_entropy(model.forward(x), y));
      }
      window.close();
      loss += window.report().loss;
      ++windows;
    }
    std::printf("epoch %lld | loss %.4f | val accuracy %.4f\n", (long long)epoch,
                loss / static_cast<double>(windows), accuracy(model, val_x, val_y));
  }

  if (!opt.checkpoint.empty()) {
    std::map<std::string, Tensor> state = window.state_dict();
    for (const nn::NamedParameter& b : model.named_buffers())
      state["buffers." + b.name] = b.tensor;
    state["epochs_done"] = full({}, static_cast<double>(opt.epochs), DType::i64);
    save_safetensors(opt.checkpoint, state);
    std::printf("checkpoint: %s (after epoch %lld)\n", opt.checkpoint.c_str(),
                (long long)opt.epochs);
  }

  // The reference: each BatchNorm input's variance over the whole training set.
  std::vector<Tensor> trained_mean, trained_var;
  for (nn::BatchNorm* bn : norms) {
    trained_mean.push_back(bn->running_mean().clone());
    trained_var.push_back(bn->running_var().clone());
  }
  nn::recompute_batch_norm_statistics(model, [&] {
    for (int64_t start = 0; start < train_n; start += 64)
      model.forward(
          train_x.narrow(0, start, std::min<int64_t>(64, train_n - start)).contiguous().to(device));
  });
  std::vector<Tensor> reference;
  for (nn::BatchNorm* bn : norms)
    reference.push_back(bn->running_var().clone());
  const double recomputed_accuracy = accuracy(model, val_x, val_y);
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < norms.size(); ++i) {
      norms[i]->running_mean().copy_(trained_mean[i]);
      norms[i]->running_var().copy_(trained_var[i]);
    }
  }
  const double error = variance_error(norms, reference);
  const double trained_accuracy = accuracy(model, val_x, val_y);
  std::printf("running variance vs the training set's: %.4f mean relative L2 error\n", error);
  std::printf("val accuracy: %.4f with the trained running statistics, %.4f recomputed\n",
              trained_accuracy, recomputed_accuracy);
  std::printf("final: val accuracy %.4f running-var error %.12f\n",
              opt.recompute_bn ? recomputed_accuracy : trained_accuracy,
              opt.recompute_bn ? 0.0 : error);
  return 0;
} catch (const UsageError& e) {
  std::fprintf(stderr, "accrue_resnet: error: %s (see --help)\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "accrue_resnet: %s\n", e.what());
  return 1;
}
