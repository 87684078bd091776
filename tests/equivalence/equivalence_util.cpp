#include "tests/equivalence/equivalence_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "accrue/autograd/engine.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"

namespace accrue::equivalence {

Precision cpu_f64() {
  return {"cpu-f64", Device::cpu(), DType::f64, Metric::SlotMax, 1e-12, 1e-10};
}

Precision cuda_f32() {
  return {"cuda-f32", Device::cuda(0), DType::f32, Metric::L2, 1e-6, 1e-5};
}

// ---- data ---------------------------------------------------------------------------------

Batch Batch::micro(int64_t k, int64_t K) const {
  ACCRUE_CHECK(K >= 1 && size() % K == 0 && k >= 0 && k < K, "Batch::micro: ", size(),
               " items do not split into ", K, " equal micro-batches (k = ", k, ")");
  const int64_t b = size() / K;
  return {inputs.narrow(0, k * b, b).contiguous(), targets.narrow(0, k * b, b).contiguous()};
}

Batch Batch::to(Device device) const {
  return {inputs.to(device), targets.to(device)};
}

Batch classifier_batch(int64_t n, const Precision& p, Generator& gen) {
  // Drawn in f64 on the CPU, so both precisions see the same numbers.
  Tensor x = randn({n, kFeatures}, DType::f64, Device::cpu(), &gen);
  Tensor y = randint(0, kClasses, {n}, DType::i64, Device::cpu(), &gen);
  return Batch{x.to(p.dtype), y}.to(p.device);
}

Batch lm_batch(int64_t n, const Precision& p, Generator& gen, bool variable_length) {
  // kSeq + 1 tokens per sequence: inputs are the first kSeq, targets the last kSeq.
  std::vector<int64_t> seq =
      randint(0, kVocab, {n, kSeq + 1}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  std::vector<int64_t> noise =
      randint(-1, 2, {n}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  std::vector<int64_t> inputs(n * kSeq), targets(n * kSeq);
  for (int64_t i = 0; i < n; ++i) {
    int64_t length = kSeq;
    if (variable_length) {
      // Lengths grow with i: the first micro-batches are short, the last long.
      length = 1 + (n > 1 ? i * (kSeq - 1) / (n - 1) : 0) + noise[i];
      length = std::clamp<int64_t>(length, 1, kSeq);
    }
    for (int64_t t = 0; t < kSeq; ++t) {
      const bool pad = t >= length;
      inputs[i * kSeq + t] = pad ? 0 : seq[i * (kSeq + 1) + t];
      targets[i * kSeq + t] = pad ? kIgnoreIndex : seq[i * (kSeq + 1) + t + 1];
    }
  }
  return Batch{from_vector(inputs, {n, kSeq}), from_vector(targets, {n, kSeq})}.to(p.device);
}

// ---- models -------------------------------------------------------------------------------

TinyClassifier::TinyClassifier(const nn::ParamOptions& o) {
  mlp_ = &register_module(
      "mlp",
      std::make_unique<nn::MLP>(std::vector<int64_t>{kFeatures, kHidden, kHidden, kClasses}, o));
}

Loss TinyClassifier::loss(const Batch& b) const {
  return cross_entropy(mlp_->forward(b.inputs), b.targets, kIgnoreIndex);
}

TinyLM::TinyLM(const nn::ParamOptions& o) {
  // std 0.5: the LayerNorm that follows undoes the scale; a wide spread keeps
  // the rows of the table distinguishable.
  embed_ = &register_module("embed", std::make_unique<nn::Embedding>(kVocab, kModel, o, 0.5));
  norm_ = &register_module("norm", std::make_unique<nn::LayerNorm>(kModel, o));
  up_ = &register_module("up", std::make_unique<nn::Linear>(kModel, kHidden, true, o));
  head_ = &register_module("head", std::make_unique<nn::Linear>(kHidden, kVocab, true, o));
}

Loss TinyLM::loss(const Batch& b) const {
  Tensor h = norm_->forward(embed_->forward(b.inputs));
  Tensor logits = head_->forward(gelu(up_->forward(h)));
  const int64_t tokens = b.inputs.numel();
  return cross_entropy(reshape(logits, {tokens, kVocab}), b.targets.reshape({tokens}),
                       kIgnoreIndex);
}

const char* model_name(ModelKind kind) {
  return kind == ModelKind::Classifier ? "classifier" : "lm";
}

std::unique_ptr<Model> make_model(ModelKind kind, const Precision& p, uint64_t seed,
                                  std::optional<DType> dtype) {
  Generator gen(seed);
  const nn::ParamOptions o{p.device, dtype.value_or(p.dtype), &gen};
  if (kind == ModelKind::Classifier) return std::make_unique<TinyClassifier>(o);
  return std::make_unique<TinyLM>(o);
}

std::vector<Batch> make_batches(ModelKind kind, int64_t count, int64_t n, const Precision& p,
                                uint64_t seed, bool variable_length) {
  Generator gen(seed);
  std::vector<Batch> out;
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(kind == ModelKind::Classifier ? classifier_batch(n, p, gen)
                                                : lm_batch(n, p, gen, variable_length));
  }
  return out;
}

// ---- a training run -----------------------------------------------------------------------

std::unique_ptr<optim::ParamStore> make_arena(const nn::Module& model,
                                              const optim::ParamStoreOptions& options) {
  return std::make_unique<optim::ParamStore>(model.named_parameters(), options);
}

Run::Run(std::unique_ptr<Model> model, const Precision& p, const optim::Optimizer& optimizer,
         const optim::WindowOptions& window, std::optional<DType> compute_dtype)
    : model_(std::move(model)), micro_steps_(window.micro_steps()) {
  arena_ = make_arena(*model_, optim::ParamStoreOptions()
                                   .device(p.device)
                                   .master_dtype(p.dtype)
                                   .compute_dtype(compute_dtype.value_or(p.dtype))
                                   .moments(optimizer.moments_needed()));
  optimizer_ = std::make_unique<optim::Optimizer>(optimizer);
  window_ = std::make_unique<optim::Window>(*arena_, *optimizer_, window);
}

void Run::backward(const Batch& micro) {
  window_->backward(model_->loss(micro));
}

void Run::close() {
  window_->close();
}

optim::WindowReport Run::step(const Batch& global) {
  for (int64_t k = 0; k < micro_steps_; ++k)
    backward(global.micro(k, micro_steps_));
  close();
  return window_->report();
}

double Run::coef() const {
  return window_->state().to_vector<double>()[kernels::kCoef];
}

std::vector<double> Run::applied_gradient() const {
  std::vector<double> g = host(arena_->grads());
  const double c = coef();
  for (double& x : g)
    x *= c;
  return g;
}

optim::Optimizer adamw() {
  return optim::Optimizer(optim::AdamWOptions(1e-2).weight_decay(0.1));
}

optim::WindowOptions clipped_window(int64_t K, double max_grad_norm) {
  return optim::WindowOptions().micro_steps(K).max_grad_norm(max_grad_norm);
}

std::vector<double> summed_gradient(Model& model, optim::ParamStore& arena,
                                    const std::vector<Batch>& micro) {
  arena.begin_window();
  for (const Batch& b : micro)
    backward(model.loss(b).sum);
  arena.zero_unwritten();
  return host(arena.grads());
}

// ---- measuring ----------------------------------------------------------------------------

std::vector<double> host(const Tensor& t) {
  return t.to_vector<double>();
}

std::vector<double> slot_elements(const optim::ParamStore& arena, const std::vector<double>& flat) {
  ACCRUE_CHECK(static_cast<int64_t>(flat.size()) == arena.padded_numel(),
               "slot_elements: ", flat.size(), " values for an arena of ", arena.padded_numel());
  std::vector<double> out;
  out.reserve(static_cast<size_t>(arena.numel()));
  for (const optim::ParamStore::Slot& s : arena.slots())
    out.insert(out.end(), flat.begin() + s.offset, flat.begin() + s.offset + s.numel);
  return out;
}

double arena_error(Metric metric, const optim::ParamStore& arena, const std::vector<double>& actual,
                   const std::vector<double>& expected) {
  ACCRUE_CHECK(actual.size() == expected.size(), "arena_error: sizes ", actual.size(), " and ",
               expected.size());
  if (metric == Metric::L2) return l2_relative(actual, expected);
  double worst = 0.0;
  for (const optim::ParamStore::Slot& s : arena.slots()) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      diff = std::max(diff, std::fabs(actual[i] - expected[i]));
      scale = std::max(scale, std::fabs(expected[i]));
    }
    // NaN must fail: std::max drops NaN, so test it explicitly.
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      if (std::isnan(actual[i]) != std::isnan(expected[i])) return INFINITY;
    }
    worst = std::max(worst, scale > 0.0 ? diff / scale : diff);
  }
  return worst;
}

double l2_norm(const std::vector<double>& a) {
  double s = 0.0;
  for (double x : a)
    s += x * x;
  return std::sqrt(s);
}

double l2_relative(const std::vector<double>& a, const std::vector<double>& b) {
  ACCRUE_CHECK(a.size() == b.size(), "l2_relative: sizes ", a.size(), " and ", b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (std::isnan(num)) return INFINITY;
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  ACCRUE_CHECK(a.size() == b.size(), "max_relative: sizes ", a.size(), " and ", b.size());
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor h = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const unsigned char*>(h.data_ptr());
  return std::vector<unsigned char>(p, p + h.nbytes());
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && bytes_of(a) == bytes_of(b);
}

TF32Off::TF32Off() : previous_(kernels::allow_tf32()) {
  kernels::set_allow_tf32(false);
}
TF32Off::~TF32Off() {
  kernels::set_allow_tf32(previous_);
}

}  // namespace accrue::equivalence
