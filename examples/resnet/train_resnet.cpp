// A small ResNet on 8x8 grey images with K micro-batches per SGD step, and
// what happens to BatchNorm's running statistics (Note [Window statistics]).
//
//   accrue_resnet [--data DIR | --synthetic] [--micro-batch B] [--k K] [--epochs E]
//                 [--bn window|window-compound|per-micro-batch] [--recompute-bn] [--lr LR]
//                 [--seed S] [--checkpoint PATH] [--resume PATH [--allow-changed lr]]
//                 [--max-skipped-windows N]
//
// A checkpoint, written after the last epoch, is the Window's state_dict
// (master weights, momentum, window state) plus the model's buffers (every
// BatchNorm's running and pending statistics) and the epochs done, as Note
// [Module state dict] describes, and in its metadata the run record (Note
// [Run record] in examples/common/checkpoint_file.h: --micro-batch, --k,
// --bn, --seed, the data, --lr) and the skipped windows in a row; --resume
// refuses a command line of another run, naming each field, and otherwise
// continues, with the data order of the epochs it skipped replayed, so the
// run ends as an uninterrupted one does. Windows whose gradients are not
// finite are skipped and counted in each epoch's line and the summary; too
// many in a row, a non-finite loss at the end or a run that never stepped
// (Note [Honest exit codes]) fail it, naming the window; a skipped window's
// non-finite batch statistics never reach the running ones (Note [Non-finite
// window statistics]), and a running statistic found non-finite anyway fails
// the run too. An epoch's loss is the mean over the windows that stepped.
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
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/nn/resnet.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/options.h"
#include "examples/common/run_guard.h"
#include "examples/common/run_main.h"
#include "examples/resnet/resnet_window.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_resnet";
constexpr int64_t kHeldOut = 300;
constexpr int64_t kClasses = 10;

struct Options {
  std::string data;
  bool synthetic = false;
  int64_t micro_batch = 2;
  int64_t k = 16;
  int64_t epochs = 15;
  std::string bn = "window";
  bool recompute_bn = false;
  std::string checkpoint, resume;
  double lr = 0.05;
  uint64_t seed = 0;
  bool cuda = false;
  std::string allow_changed;
  std::vector<std::string> allowed_changes;
  int64_t max_skipped_windows = 32;  // Note [Honest exit codes]
};

// Parses the command line; false after --help.
bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Trains a small ResNet on 8x8 images (the CPU; --cuda: GPU 0) with K "
                  "micro-batches per SGD step and reports how far BatchNorm's running variance "
                  "is from the training set's.");
  cli.path("--data", &o.data, "DIR",
           "digits_images.npy and digits_labels.npy (tools/make_digits.py)");
  cli.flag("--synthetic", &o.synthetic,
           "ten random 8x8 patterns plus noise (the default without --data)");
  cli.integer("--micro-batch", &o.micro_batch, "B", "images per micro-batch").min(1);
  cli.integer("--k", &o.k, "K", "micro-batches per SGD step").min(1);
  cli.integer("--epochs", &o.epochs, "E", "passes over the training images").min(1);
  cli.choice("--bn", &o.bn, {"window", "window-compound", "per-micro-batch"},
             "window: running statistics moved once per window by the merged statistics; "
             "window-compound: the same, by 1 - (1 - m)^K, PyTorch's pace; per-micro-batch: "
             "PyTorch's, once per forward");
  cli.flag("--recompute-bn", &o.recompute_bn,
           "after training, re-estimate the running statistics over the training set (precise "
           "BN) before the validation");
  cli.number("--lr", &o.lr, "LR", "SGD learning rate, momentum 0.9").above(0);
  cli.integer("--seed", &o.seed, "S", "initialization, data order and synthetic images");
  cli.path("--checkpoint", &o.checkpoint, "PATH",
           "after the last epoch, save weights, optimizer, window and BatchNorm statistics "
           "(safetensors)");
  cli.path("--resume", &o.resume, "PATH",
           "continue from such a checkpoint up to --epochs; a command line of another run "
           "(--micro-batch, --k, --bn, --seed, the data, --lr) is refused, naming each "
           "difference");
  cli.text("--allow-changed", &o.allow_changed, "WORDS",
           "with --resume, let these settings differ from the checkpoint's run: lr (--lr, from "
           "the next window on); the run prints what changed")
      .default_text("none");
  cli.integer("--max-skipped-windows", &o.max_skipped_windows, "N",
              "fail the run when more than N windows in a row are skipped (non-finite "
              "gradients)")
      .min(0);
  cli.flag("--cuda", &o.cuda,
           "train on GPU 0 (f32: convolutions composed of GEMMs, Note [Composed convolution])");
  if (!cli.parse(argc, argv)) return false;
  if (o.synthetic && !o.data.empty()) usage_error("--synthetic and --data exclude each other");
  if (!o.allow_changed.empty()) {
    if (o.resume.empty()) usage_error("--allow-changed needs --resume PATH");
    o.allowed_changes = parse_change_words("--allow-changed", o.allow_changed, {"lr"});
  }
  return true;
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

// The index of the first BatchNorm whose running statistics hold a value that
// is not finite, or -1.
int nonfinite_batch_norm(const std::vector<nn::BatchNorm*>& norms) {
  for (size_t i = 0; i < norms.size(); ++i)
    for (const Tensor& t : {norms[i]->running_mean(), norms[i]->running_var()})
      for (double v : t.to(Device::cpu()).to(DType::f64).to_vector<double>())
        if (!std::isfinite(v)) return static_cast<int>(i);
  return -1;
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

// The images and labels: --data's .npy files or the synthetic set.
void load_images(const Options& opt, Tensor* images, Tensor* labels) {
  if (opt.data.empty()) {
    synthetic(opt.seed, images, labels);
    return;
  }
  *images = load_npy(opt.data + "/digits_images.npy").to(DType::f32);
  *labels = load_npy(opt.data + "/digits_labels.npy").to(DType::i64);
  ACCRUE_CHECK(images->dim() == 4 && images->size(1) == 1 && images->size(2) == 8 &&
                   images->size(3) == 8 && labels->shape() == Shape{images->size(0)},
               opt.data, " holds images ", shape_str(images->shape()), " and labels ",
               shape_str(labels->shape()), "; expected [N, 1, 8, 8] and [N]");
}

constexpr const char* kCheckpointFormat = "accrue_resnet checkpoint v2";
constexpr const char* kSkippedInARow = "accrue.state.skipped_in_a_row";

// The settings that define the run (Note [Run record]).
RunRecord run_record(const Options& opt) {
  RunRecord r;
  r.integer("micro_batch", opt.micro_batch);
  r.integer("k", opt.k);
  r.text("bn", opt.bn);
  r.text("seed", std::to_string(opt.seed));
  r.text("data", opt.data.empty()
                     ? "synthetic"
                     : std::filesystem::absolute(opt.data).lexically_normal().string());
  r.number("lr", opt.lr, "lr");
  return r;
}

// The checkpoint: the Window's state_dict, the model's buffers (every
// BatchNorm's running and pending statistics) and the epochs done, and the
// run record in the metadata.
void save_checkpoint(const std::string& path, optim::Window& window, nn::ResNet& model,
                     int64_t epochs_done, const RunRecord& record, const RunGuard& guard) {
  std::map<std::string, Tensor> state = window.state_dict();
  for (const nn::NamedParameter& b : model.named_buffers())
    state["buffers." + b.name] = b.tensor;
  state["epochs_done"] = full({}, static_cast<double>(epochs_done), DType::i64);
  std::map<std::string, std::string> meta;
  record.write(&meta);
  meta["format"] = kCheckpointFormat;
  meta[kSkippedInARow] = std::to_string(guard.skipped_in_a_row());
  save_checkpoint_file(path, state, meta);
}

// A checkpoint read whole and its record compared with this run's, before
// the model is built.
struct Checkpoint {
  std::map<std::string, Tensor> state;
  int64_t skipped_in_a_row = 0;
};

Checkpoint read_checkpoint(const std::string& path, const RunRecord& record,
                           const std::vector<std::string>& allowed) {
  Checkpoint c;
  std::map<std::string, std::string> meta;
  c.state = load_safetensors(path, &meta);
  ACCRUE_CHECK(c.state.count("epochs_done") != 0, path,
               " has no 'epochs_done': not a checkpoint of this example");
  // A checkpoint of the first version has no metadata: compare() says what it could not check.
  ACCRUE_CHECK(!meta.count("format") || meta["format"] == kCheckpointFormat, path,
               " is not a checkpoint of this example (format '", meta["format"], "', expected '",
               kCheckpointFormat, "')");
  for (const std::string& line : record.compare(path, meta, allowed))
    std::printf("%s\n", line.c_str());
  if (meta.count(kSkippedInARow)) {
    const std::string& v = meta[kSkippedInARow];
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), c.skipped_in_a_row);
    ACCRUE_CHECK(
        ec == std::errc() && end == v.data() + v.size() && !v.empty() && c.skipped_in_a_row >= 0,
        "checkpoint ", path, ": metadata '", kSkippedInARow, "' = '", v, "' is not a count");
  }
  return c;
}

// Loads what save_checkpoint wrote; returns the epochs done.
int64_t load_checkpoint(const Checkpoint& c, optim::Window& window, nn::ResNet& model) {
  std::map<std::string, Tensor> window_state, buffers;
  for (const auto& [key, t] : c.state) {
    if (key.rfind("buffers.", 0) == 0) {
      buffers[key.substr(8)] = t;
    } else if (key != "epochs_done") {
      window_state[key] = t;
    }
  }
  window.load_state_dict(window_state);
  // The parameters came with the window's master weights: keep them, take the buffers.
  std::map<std::string, Tensor> module_state = model.state_dict();
  for (const auto& [name, t] : buffers)
    module_state[name] = t;
  model.load_state_dict(module_state);
  return static_cast<int64_t>(c.state.at("epochs_done").item());
}

// Compares each BatchNorm's running variance with its input's variance over
// the whole training set under the final weights, and prints both accuracies.
void report_batch_norm(const Options& opt, nn::ResNet& model,
                       const std::vector<nn::BatchNorm*>& norms, const Tensor& train_x,
                       const Tensor& val_x, const Tensor& val_y) {
  const Device device = val_x.device();
  const int64_t train_n = train_x.size(0);
  std::vector<Tensor> trained_mean, trained_var;
  for (nn::BatchNorm* bn : norms) {
    trained_mean.push_back(bn->running_mean().clone());
    trained_var.push_back(bn->running_var().clone());
  }
  const auto recompute = [&] {
    nn::recompute_batch_norm_statistics(model, [&] {
      for (int64_t start = 0; start < train_n; start += 64)
        model.forward(train_x.narrow(0, start, std::min<int64_t>(64, train_n - start))
                          .contiguous()
                          .to(device));
    });
  };
  if (!opt.recompute_bn) {  // only a report: data with a NaN has no statistics to compare with
    try {
      recompute();
    } catch (const Error& e) {
      std::printf("running variance vs the training set's: not computed (%s)\n",
                  e.message().c_str());
      std::printf("final: val accuracy %.4f running-var error nan\n",
                  accuracy(model, val_x, val_y));
      return;
    }
  } else {
    recompute();
  }
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
}

int train(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  if (opt.cuda && !cuda_available()) usage_error("--cuda needs a CUDA GPU, and none is visible");
  if (!opt.checkpoint.empty()) probe_output_file("--checkpoint", opt.checkpoint);
  const RunRecord record = run_record(opt);
  std::optional<Checkpoint> resumed;
  if (!opt.resume.empty()) resumed = read_checkpoint(opt.resume, record, opt.allowed_changes);
  const int64_t window_items =
      checked_product({{"--micro-batch", opt.micro_batch}, {"--k", opt.k}});
  Tensor images, labels;
  load_images(opt, &images, &labels);
  const int64_t n = images.size(0);
  ACCRUE_CHECK(n - kHeldOut > window_items, n, " images are too few for ", kHeldOut,
               " held out and a window of ", window_items);
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
  optim::ParamStore arena(model.named_parameters(),
                          optim::ParamStoreOptions().device(device).moments(1));
  optim::Window window(arena, sgd, optim::WindowOptions().micro_steps(opt.k).max_grad_norm(5.0));
  const std::vector<nn::BatchNorm*> norms = listen_batch_norms(model, window);
  std::printf(
      "accrue_resnet: %s images, %lld train / %lld held out; micro-batch %lld x K %lld, "
      "BatchNorm statistics %s, %zu BatchNorm layers, on %s\n",
      opt.data.empty() ? "synthetic" : opt.data.c_str(), (long long)train_n, (long long)kHeldOut,
      (long long)opt.micro_batch, (long long)opt.k, opt.bn.c_str(), norms.size(),
      opt.cuda ? "GPU 0" : "the CPU");

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
  // Note [Honest exit codes]: skips in a row are bounded, and counted across a resume.
  RunGuard guard(opt.max_skipped_windows, resumed ? resumed->skipped_in_a_row : 0);
  if (resumed) {
    first_epoch = load_checkpoint(*resumed, window, model) + 1;
    resumed.reset();
    for (int64_t e = 1; e < first_epoch; ++e)  // the data order of the epochs done
      std::shuffle(perm.begin(), perm.end(), order);
    std::printf("resumed %s after epoch %lld\n", opt.resume.c_str(), (long long)first_epoch - 1);
  }
  double first_loss = NAN, last_loss = NAN;
  optim::WindowReport last;
  for (int64_t epoch = first_epoch; epoch <= opt.epochs; ++epoch) {
    std::shuffle(perm.begin(), perm.end(), order);
    const std::string where = " of epoch " + std::to_string(epoch);
    double loss = 0.0;
    int64_t windows = 0;
    for (int64_t start = 0; start + window_items <= train_n; start += window_items) {
      run_window(model, window, opt.k, [&](int64_t m) {
        return batch(perm.cbegin() + start + m * opt.micro_batch, opt.micro_batch);
      });
      last = window.report();
      guard.after_window(last, where);
      // A skipped window keeps the weights; its batch statistics reach the
      // running ones only where they are finite (Note [Non-finite window
      // statistics]). Should a running statistic still be non-finite, the
      // model cannot be evaluated any more: that fails the run here.
      if (last.skipped) {
        const int bad = nonfinite_batch_norm(norms);
        ACCRUE_CHECK(bad < 0, "window ", last.window, where,
                     " was skipped (its gradients were not finite; loss ", last.loss,
                     "), and BatchNorm ", bad,
                     "'s running statistics, which took its batch statistics, are no longer "
                     "finite");
      }
      if (!last.skipped) {  // a skipped window's loss (NaN, inf) is not the model's
        loss += last.loss;
        ++windows;
      }
    }
    last_loss = windows > 0 ? loss / static_cast<double>(windows) : NAN;
    if (epoch == first_epoch) first_loss = last_loss;
    std::printf("epoch %lld | loss %.4f | val accuracy %.4f | skipped %lld\n", (long long)epoch,
                last_loss, accuracy(model, val_x, val_y), (long long)last.skipped_windows);
  }
  if (first_epoch <= opt.epochs) {
    std::printf(
        "loss %.4f -> %.4f over epochs %lld..%lld (windows %lld), %lld skipped since window 1\n",
        first_loss, last_loss, (long long)first_epoch, (long long)opt.epochs,
        (long long)last.window, (long long)last.skipped_windows);
    std::fflush(stdout);
    guard.finish(last, " of epoch " + std::to_string(opt.epochs));  // no checkpoint of a failed run
  }
  if (!opt.checkpoint.empty()) {
    save_checkpoint(opt.checkpoint, window, model, opt.epochs, record, guard);
    std::printf("checkpoint: %s (after epoch %lld)\n", opt.checkpoint.c_str(),
                (long long)opt.epochs);
  }
  report_batch_norm(opt, model, norms, train_x, val_x, val_y);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
