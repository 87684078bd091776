// The GPT-2 golden tests' shared part: the fixtures make_gpt2_golden.py
// writes, and one accrue training run of the same recipe (nn::GPT2 in a
// GradArena, AdamW with GPT-2's decay groups, WarmupCosine, a clipping
// Window). gpt2_golden_test.cpp runs it in f64 on the CPU, and
// gpu_gpt2_golden_test.cpp in f32 and with a bf16 compute copy on CUDA.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/nn/gpt2.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/window.h"

#ifndef ACCRUE_GOLDEN_DIR
#error "ACCRUE_GOLDEN_DIR must name the fixture directory (see tests/golden/CMakeLists.txt)"
#endif

// The GPT-2 fixtures live in their own folder; without it every GPT-2 test
// skips, saying how to make them (a binary whose tests all skipped is reported
// skipped by ctest: Note [Skipped test binaries] in tests/test_main.cpp).
#define ACCRUE_GPT2_GOLDEN_DIR ACCRUE_GOLDEN_DIR "/gpt2"
#define ACCRUE_REQUIRE_GPT2_FIXTURES()                                                             \
  do {                                                                                             \
    if (!std::filesystem::is_directory(ACCRUE_GPT2_GOLDEN_DIR))                                    \
      GTEST_SKIP() << "no GPT-2 golden fixtures at " ACCRUE_GPT2_GOLDEN_DIR                        \
                      "; generate them with PyTorch (on a GPU machine for the GPU fixtures): "     \
                      "python3 tests/golden/make_gpt2_golden.py --out tests/golden/fixtures/gpt2"; \
  } while (0)

namespace accrue::golden {

// One safetensors fixture file: tensors and string metadata. A missing file,
// tensor or metadata key throws accrue::Error naming the file and the key.
class FixtureFile {
 public:
  explicit FixtureFile(const std::string& path);
  static bool exists(const std::string& path);

  const Tensor& tensor(const std::string& key) const;
  bool has_tensor(const std::string& key) const { return tensors_.count(key) != 0; }
  const std::string& str(const std::string& key) const;
  double number(const std::string& key) const;
  // A non-negative integer.
  int64_t integer(const std::string& key) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> meta_;
};

// model.safetensors: the config, the token batches and the initial weights.
class Gpt2Fixture {
 public:
  explicit Gpt2Fixture(const std::string& path);

  nn::GPT2Config config() const;
  int64_t seq_len() const { return seq_len_; }
  int64_t micro_batch() const { return micro_batch_; }
  int64_t micro_steps() const { return micro_steps_; }
  int64_t sequences() const { return micro_batch_ * micro_steps_; }  // per window
  int64_t token_windows() const { return tokens_.size(0); }
  // Window w's inputs and targets, i64 [sequences(), seq_len()] on the CPU.
  Tensor inputs(int64_t w) const;
  Tensor targets(int64_t w) const;
  // Parameter `name`'s initial value as torch made it (f32).
  const Tensor& init(const std::string& name) const;
  const FixtureFile& file() const { return file_; }

 private:
  FixtureFile file_;
  Tensor tokens_;  // i64 [windows, sequences, seq_len + 1]
  int64_t seq_len_ = 0, micro_batch_ = 0, micro_steps_ = 0;
};

// optim::WarmupCosine's arguments, from a run's fixture metadata.
struct Schedule {
  int64_t warmup = 0;
  int64_t total = 1;
  double min_factor = 0.0;
};
Schedule schedule_of(const FixtureFile& run);

// GPT-2's decay rule: weight decay on the Linear weights (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj), none on biases, LayerNorm, wte, wpe.
bool is_decayed(const std::string& name);

struct RunOptions {
  Device device = Device::cpu();
  DType master_dtype = DType::f64;
  DType compute_dtype = DType::f64;  // bf16: a compute copy the model computes in
  int64_t micro_steps = 4;           // K: each window's sequences split K ways
  Schedule schedule;
};

// nn::GPT2 with the fixture's initial weights, in a GradArena, under AdamW
// and a clipping Window configured from the fixture's metadata.
class Gpt2Run {
 public:
  Gpt2Run(const Gpt2Fixture& fixture, const RunOptions& options);

  // Window w of the fixture's batches: its sequences in K micro-batches,
  // backward on each, close(). Returns the window's report.
  optim::WindowReport window(int64_t w);

  optim::ParamStore& arena() { return *arena_; }
  const nn::GPT2& model() const { return *model_; }
  // Parameter `name`'s master weights (f64 on the host, row-major).
  std::vector<double> master(const std::string& name) const;

 private:
  const Gpt2Fixture& fixture_;
  RunOptions options_;
  std::unique_ptr<nn::GPT2> model_;  // destroyed last: the arena re-points its parameters
  std::unique_ptr<optim::ParamStore> arena_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::Window> window_;
  std::map<std::string, size_t> slot_;
};

// Builds the fixture's model and copies its initial weights in, by name; a
// missing or misshapen weight throws, naming it.
std::unique_ptr<nn::GPT2> make_model(const Gpt2Fixture& fixture, Device device, DType dtype);

}  // namespace accrue::golden
