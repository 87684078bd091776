#include "tests/golden/gpt2_golden.h"

#include <cmath>
#include <filesystem>

#include "accrue/core/grad_mode.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor_io.h"

namespace accrue::golden {

// ---- fixture files --------------------------------------------------------------------------

bool FixtureFile::exists(const std::string& path) {
  return std::filesystem::is_regular_file(path);
}

FixtureFile::FixtureFile(const std::string& path) : path_(path) {
  ACCRUE_CHECK(exists(path_), "GPT-2 golden fixture ", path_,
               " is missing: regenerate the fixtures with tests/golden/make_gpt2_golden.py");
  tensors_ = load_safetensors(path_, &meta_);
}

const Tensor& FixtureFile::tensor(const std::string& key) const {
  auto it = tensors_.find(key);
  ACCRUE_CHECK(it != tensors_.end(), path_, ": no tensor '", key, "'");
  return it->second;
}

const std::string& FixtureFile::str(const std::string& key) const {
  auto it = meta_.find(key);
  ACCRUE_CHECK(it != meta_.end(), path_, ": no metadata '", key, "'");
  return it->second;
}

double FixtureFile::number(const std::string& key) const {
  const std::string& s = str(key);
  size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ACCRUE_CHECK(used == s.size() && used > 0, path_, ": metadata '", key, "' = '", s,
               "' is not a number");
  return v;
}

int64_t FixtureFile::integer(const std::string& key) const {
  const double v = number(key);
  ACCRUE_CHECK(v >= 0 && v == std::floor(v) && v < 9.0e15, path_, ": metadata '", key, "' = ", v,
               " is not a non-negative integer");
  return static_cast<int64_t>(v);
}

// ---- the model fixture ----------------------------------------------------------------------

Gpt2Fixture::Gpt2Fixture(const std::string& path) : file_(path) {
  tokens_ = file_.tensor("tokens");
  seq_len_ = file_.integer("seq_len");
  micro_batch_ = file_.integer("micro_batch");
  micro_steps_ = file_.integer("micro_steps");
  ACCRUE_CHECK(seq_len_ >= 1 && micro_batch_ >= 1 && micro_steps_ >= 1, path, ": invalid seq_len ",
               seq_len_, ", micro_batch ", micro_batch_, ", micro_steps ", micro_steps_);
  ACCRUE_CHECK(tokens_.dtype() == DType::i64 && tokens_.dim() == 3 &&
                   tokens_.size(1) == sequences() && tokens_.size(2) == seq_len_ + 1,
               path, ": tokens ", dtype_name(tokens_.dtype()), " ", shape_str(tokens_.shape()),
               ", expected i64 [windows, ", sequences(), ", ", seq_len_ + 1, "]");
}

nn::GPT2Config Gpt2Fixture::config() const {
  nn::GPT2Config c;
  c.n_layer = file_.integer("n_layer");
  c.n_head = file_.integer("n_head");
  c.n_embd = file_.integer("n_embd");
  c.block_size = file_.integer("block_size");
  c.vocab_size = file_.integer("vocab_size");
  c.padded_vocab_size = file_.integer("padded_vocab_size");
  c.dropout = file_.number("dropout");
  c.layer_norm_eps = file_.number("ln_eps");
  return c;
}

Tensor Gpt2Fixture::inputs(int64_t w) const {
  ACCRUE_CHECK(w >= 0 && w < token_windows(), file_.path(), ": window ", w, " of ",
               token_windows());
  return tokens_.select(0, w).narrow(1, 0, seq_len_).contiguous();
}

Tensor Gpt2Fixture::targets(int64_t w) const {
  ACCRUE_CHECK(w >= 0 && w < token_windows(), file_.path(), ": window ", w, " of ",
               token_windows());
  return tokens_.select(0, w).narrow(1, 1, seq_len_).contiguous();
}

const Tensor& Gpt2Fixture::init(const std::string& name) const {
  return file_.tensor("init." + name);
}

Schedule schedule_of(const FixtureFile& run) {
  return {run.integer("warmup"), run.integer("total"), run.number("min_factor")};
}

bool is_decayed(const std::string& name) {
  const auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const bool in_block =
      name.find(".attn.") != std::string::npos || name.find(".mlp.") != std::string::npos;
  return in_block && ends_with(".weight");
}

std::unique_ptr<nn::GPT2> make_model(const Gpt2Fixture& fixture, Device device, DType dtype) {
  // Every value the generator draws is overwritten below.
  Generator gen(0);
  auto model = std::make_unique<nn::GPT2>(fixture.config(), nn::ParamOptions{device, dtype, &gen});
  NoGradGuard no_grad;  // a raw copy into leaves that require grad
  for (const nn::NamedParameter& p : model->named_parameters()) {
    ACCRUE_CHECK(fixture.file().has_tensor("init." + p.name), fixture.file().path(),
                 ": no initial weights 'init.", p.name, "' for the model's parameter ", p.name, " ",
                 shape_str(p.tensor.shape()));
    const Tensor& init = fixture.init(p.name);
    ACCRUE_CHECK(init.shape() == p.tensor.shape(), fixture.file().path(), ": 'init.", p.name,
                 "' has shape ", shape_str(init.shape()), ", the model's parameter ",
                 shape_str(p.tensor.shape()));
    p.tensor.copy_(init);
  }
  return model;
}

// ---- one run --------------------------------------------------------------------------------

Gpt2Run::Gpt2Run(const Gpt2Fixture& fixture, const RunOptions& options)
    : fixture_(fixture), options_(options) {
  ACCRUE_CHECK(options.micro_steps >= 1 && fixture.sequences() % options.micro_steps == 0,
               "Gpt2Run: ", fixture.sequences(), " sequences per window do not split into ",
               options.micro_steps, " micro-batches");
  model_ = make_model(fixture, options.device, options.master_dtype);

  std::vector<Tensor> no_decay;
  const std::vector<nn::NamedParameter> params = model_->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    slot_[params[i].name] = i;
    if (!is_decayed(params[i].name)) no_decay.push_back(params[i].tensor);
  }
  const FixtureFile& f = fixture.file();
  optimizer_ = std::make_unique<optim::Optimizer>(optim::AdamWOptions(f.number("lr"))
                                                      .betas(f.number("beta1"), f.number("beta2"))
                                                      .eps(f.number("eps"))
                                                      .weight_decay(f.number("weight_decay")));
  optimizer_->add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optimizer_->set_schedule(std::make_shared<optim::WarmupCosine>(
      options.schedule.warmup, options.schedule.total, options.schedule.min_factor));

  arena_ = std::make_unique<optim::ParamStore>(params, optim::ParamStoreOptions()
                                                           .device(options.device)
                                                           .master_dtype(options.master_dtype)
                                                           .compute_dtype(options.compute_dtype)
                                                           .moments(optimizer_->moments_needed()));
  window_ = std::make_unique<optim::Window>(*arena_, *optimizer_,
                                            optim::WindowOptions()
                                                .micro_steps(options.micro_steps)
                                                .max_grad_norm(f.number("max_grad_norm")));
}

optim::WindowReport Gpt2Run::window(int64_t w) {
  const Tensor inputs = fixture_.inputs(w).to(options_.device);
  const Tensor targets = fixture_.targets(w).to(options_.device);
  const int64_t K = options_.micro_steps, b = fixture_.sequences() / K;
  for (int64_t k = 0; k < K; ++k) {
    const Tensor idx = inputs.narrow(0, k * b, b).contiguous();
    const Tensor tgt = targets.narrow(0, k * b, b).contiguous();
    window_->backward(model_->loss(idx, tgt));
  }
  window_->close();
  return window_->report();
}

std::vector<double> Gpt2Run::master(const std::string& name) const {
  auto it = slot_.find(name);
  ACCRUE_CHECK(it != slot_.end(), "Gpt2Run: no parameter '", name, "'");
  return arena_->master_view(it->second).to_vector<double>();
}

}  // namespace accrue::golden
