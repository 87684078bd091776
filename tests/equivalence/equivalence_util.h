// The equivalence suite's tiny models, data and measuring tools, shared by
// the CPU (f64) and GPU (f32) binaries.
//
// A check builds two or more runs from the same Generator seed, feeds them the
// same global batches split into different numbers of micro-batches K, and
// compares the arenas. Everything is small (widths 8-32) so that the f64 CPU
// binary stays fast on a 2-core CI machine.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/window.h"

namespace accrue::equivalence {

// How two gradient or parameter arenas are compared.
enum class Metric {
  // Per parameter slot: max_i |a_i - b_i| <= tol * max_i |b_i| (the error is
  // measured against the slot's largest magnitude, so tiny elements of a slot
  // are not held to a relative bound they cannot meet).
  SlotMax,
  // Over the whole arena: ||a - b||_2 <= tol * ||b||_2.
  L2,
};

// Where and in what precision a check runs, and what "equal" means there.
struct Precision {
  std::string name;
  Device device = Device::cpu();
  DType dtype = DType::f64;  // master and compute dtype
  Metric metric = Metric::SlotMax;
  double grad_tol = 1e-12;   // the accumulated gradient after one window
  double param_tol = 1e-10;  // the parameters after 20 windows of AdamW
};
// f64 on the CPU reference backend: SlotMax, grads 1e-12, params 1e-10.
Precision cpu_f64();
// f32 on cuda:0 (TF32 must be off): L2, grads 1e-6, params 1e-5.
Precision cuda_f32();

// ---- data ---------------------------------------------------------------------------------

// Dim 0 of inputs and targets indexes samples (classifier) or sequences (LM).
struct Batch {
  Tensor inputs;
  Tensor targets;
  int64_t size() const { return inputs.size(0); }
  // Micro-batch k of K: the k-th of K equal slices along dim 0.
  Batch micro(int64_t k, int64_t K) const;
  Batch to(Device device) const;
};

inline constexpr int64_t kIgnoreIndex = -100;

// Classifier data: inputs [n, kFeatures] normal, targets uniform in [0, kClasses).
Batch classifier_batch(int64_t n, const Precision& p, Generator& gen);
// LM data: tokens [n, kSeq] uniform in [0, kVocab), targets the next-token ids.
// With variable_length, sequence i keeps a length that grows with i (from 1 to
// kSeq, plus noise) and the rest of its targets are kIgnoreIndex, so the
// micro-batches of a window hold very different numbers of tokens.
Batch lm_batch(int64_t n, const Precision& p, Generator& gen, bool variable_length = false);

// ---- models -------------------------------------------------------------------------------

inline constexpr int64_t kFeatures = 16, kHidden = 32, kClasses = 8;
inline constexpr int64_t kVocab = 16, kSeq = 8, kModel = 16;

class Model : public nn::Module {
 public:
  // The (sum, count) cross-entropy of a batch (Note [Normalization]).
  virtual Loss loss(const Batch& b) const = 0;
};

// MLP [kFeatures, kHidden, kHidden, kClasses] with GELU, cross-entropy over samples.
class TinyClassifier : public Model {
 public:
  explicit TinyClassifier(const nn::ParamOptions& o);
  Loss loss(const Batch& b) const override;

 private:
  nn::MLP* mlp_;
};

// Embedding -> LayerNorm -> Linear -> GELU -> Linear to the vocabulary,
// cross-entropy over every token (ignore_index skips padding).
class TinyLM : public Model {
 public:
  explicit TinyLM(const nn::ParamOptions& o);
  Loss loss(const Batch& b) const override;

 private:
  nn::Embedding* embed_;
  nn::LayerNorm* norm_;
  nn::Linear* up_;
  nn::Linear* head_;
};

enum class ModelKind { Classifier, LM };
const char* model_name(ModelKind kind);
// A model whose initial values come from Generator(seed), in p's dtype and on p's device.
// dtype (default p.dtype) is the dtype the parameters are created in.
std::unique_ptr<Model> make_model(ModelKind kind, const Precision& p, uint64_t seed,
                                  std::optional<DType> dtype = std::nullopt);
// `count` global batches of `n` items each, from Generator(seed).
std::vector<Batch> make_batches(ModelKind kind, int64_t count, int64_t n, const Precision& p,
                                uint64_t seed, bool variable_length = false);

// ---- a training run -----------------------------------------------------------------------

// `model`'s parameters registered, by name, in a new arena.
std::unique_ptr<optim::ParamStore> make_arena(const nn::Module& model,
                                              const optim::ParamStoreOptions& options);

// A model in its arena, an optimizer and a window: the accumulation loop of
// optim/window.h, one global batch per window.
class Run {
 public:
  // The arena's master dtype is p.dtype; its compute dtype compute_dtype (default p.dtype).
  Run(std::unique_ptr<Model> model, const Precision& p, const optim::Optimizer& optimizer,
      const optim::WindowOptions& window, std::optional<DType> compute_dtype = std::nullopt);

  // One window: the global batch split into the window's K micro-batches,
  // backward on each, then close(). Returns the report of that window.
  optim::WindowReport step(const Batch& global);
  // Feeds micro-batches one by one (no close).
  void backward(const Batch& micro);
  void close();

  Model& model() { return *model_; }
  optim::ParamStore& arena() { return *arena_; }
  optim::Window& window() { return *window_; }
  int64_t micro_steps() const { return micro_steps_; }
  // state()[kCoef] of the last closed window: inv_scale * inv_N * clip.
  double coef() const;
  // The gradient the optimizer applied in the last window: grads * coef, in f64.
  std::vector<double> applied_gradient() const;

 private:
  std::unique_ptr<Model> model_;  // destroyed last: the arena re-points its parameters
  std::unique_ptr<optim::ParamStore> arena_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::Window> window_;
  int64_t micro_steps_;
};

// AdamW(1e-2, weight decay 0.1) and a window of K micro-steps clipping at 0.1
// (the tiny models' window norms are above it, so clipping is active).
optim::Optimizer adamw();
optim::WindowOptions clipped_window(int64_t K, double max_grad_norm = 0.1);

// The raw summed gradient of `micro` batches (Note [Overwrite first]: a
// begin_window, one seed-1 backward per batch, zero_unwritten), in f64: the
// reference for window runs, computed without any window close.
std::vector<double> summed_gradient(Model& model, optim::ParamStore& arena,
                                    const std::vector<Batch>& micro);

// ---- measuring ----------------------------------------------------------------------------

std::vector<double> host(const Tensor& t);
// The error of `actual` against `expected` under `metric` (slots from `arena`
// for SlotMax): the number compared with a Precision's tolerance.
// The real elements of a flat arena-shaped vector, slot after slot (padding
// dropped): arenas of different dtypes align their slots differently.
std::vector<double> slot_elements(const optim::ParamStore& arena, const std::vector<double>& flat);
double arena_error(Metric metric, const optim::ParamStore& arena, const std::vector<double>& actual,
                   const std::vector<double>& expected);
// ||a - b|| / ||b|| (0 when both are 0).
double l2_relative(const std::vector<double>& a, const std::vector<double>& b);
// max_i |a_i - b_i| / max_i |b_i| over the whole vector.
double max_relative(const std::vector<double>& a, const std::vector<double>& b);
double l2_norm(const std::vector<double>& a);
// Same shape, dtype and bytes (both copied to the host, contiguous).
bool same_bytes(const Tensor& a, const Tensor& b);
// The raw bytes of a tensor, copied to the host.
std::vector<unsigned char> bytes_of(const Tensor& t);

// Turns TF32 off for its scope (f32 GEMMs in true fp32), restoring the old setting.
class TF32Off {
 public:
  TF32Off();
  ~TF32Off();
  TF32Off(const TF32Off&) = delete;
  TF32Off& operator=(const TF32Off&) = delete;

 private:
  bool previous_;
};

}  // namespace accrue::equivalence
