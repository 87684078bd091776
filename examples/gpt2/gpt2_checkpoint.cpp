#include "examples/gpt2/gpt2_checkpoint.h"

#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>

#include "examples/common/checkpoint_file.h"

namespace accrue::examples {

namespace {

constexpr const char* kCheckpointFormat = "accrue_train_gpt2 checkpoint v2";

std::map<std::string, std::string> config_metadata(const nn::GPT2Config& c) {
  return {{"config.n_layer", std::to_string(c.n_layer)},
          {"config.n_head", std::to_string(c.n_head)},
          {"config.n_embd", std::to_string(c.n_embd)},
          {"config.block_size", std::to_string(c.block_size)},
          {"config.vocab_size", std::to_string(c.vocab_size)},
          {"config.padded_vocab_size", std::to_string(c.padded_vocab())},
          {"config.bias", c.bias ? "1" : "0"}};
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key,
                 const std::string& path) {
  auto it = meta.find(key);
  ACCRUE_CHECK(it != meta.end(), "checkpoint ", path, " has no '", key, "' in its metadata");
  int64_t v = 0;
  const std::string& s = it->second;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  ACCRUE_CHECK(ec == std::errc() && ptr == s.data() + s.size() && !s.empty(), "checkpoint ", path,
               ": metadata '", key, "' = '", s, "' is not an integer");
  return v;
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainState& s) {
  ACCRUE_CHECK(s.window.micro_step() == 0 || s.world_size == 1,
               "a checkpoint inside a window holds this rank's own gradients; with ", s.world_size,
               " ranks save between windows");
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < s.arena.size(); ++i)
    tensors["model." + s.arena.slots()[i].name] = s.arena.master_view(i);
  for (const auto& [key, t] : s.window.state_dict())
    if (key != "master") tensors["optim." + key] = t;
  std::map<std::string, std::string> meta = config_metadata(s.model.config());
  meta["format"] = kCheckpointFormat;
  meta["dtype"] = s.dtype;
  meta["world_size"] = std::to_string(s.world_size);
  meta["windows_closed"] = std::to_string(s.window.windows_closed());
  meta["micro_step"] = std::to_string(s.window.micro_step());
  meta["dropout.offset"] = std::to_string(s.model.dropout_generator().offset());
  meta["synthetic.offset"] = std::to_string(s.source.generator().offset());
  if (const data::DataLoader* l = s.source.loader()) {
    meta["loader.shard"] = std::to_string(l->position().shard);
    meta["loader.offset"] = std::to_string(l->position().offset);
    meta["loader.epoch"] = std::to_string(l->position().epoch);
  }
  // For the reader: how the run was set up (not needed to resume).
  meta["micro_batch"] = std::to_string(s.micro_batch);
  save_checkpoint_file(path, tensors, meta);
}

int64_t load_checkpoint(const std::string& path, const TrainState& s) {
  std::map<std::string, std::string> meta;
  const std::map<std::string, Tensor> tensors = load_safetensors(path, &meta);
  ACCRUE_CHECK(meta["format"] == kCheckpointFormat, path, " is not a trainer checkpoint (format '",
               meta["format"], "', expected '", kCheckpointFormat, "')");
  std::map<std::string, std::string> expected = config_metadata(s.model.config());
  expected["dtype"] = s.dtype;
  expected["world_size"] = std::to_string(s.world_size);
  for (const auto& [key, value] : expected)
    ACCRUE_CHECK(meta[key] == value, "checkpoint ", path, " has ", key, " = ", meta[key],
                 " but this run has ", value);
  // The flat master, rebuilt slot by slot (alignment padding stays 0, Note [Grad arena]).
  Tensor master = zeros({s.arena.padded_numel()}, s.arena.master().dtype());
  for (const optim::ParamStore::Slot& slot : s.arena.slots()) {
    auto it = tensors.find("model." + slot.name);
    ACCRUE_CHECK(it != tensors.end(), "checkpoint ", path, " has no 'model.", slot.name, "'");
    ACCRUE_CHECK(it->second.shape() == slot.shape, "checkpoint ", path, ": 'model.", slot.name,
                 "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(slot.shape));
    master.narrow(0, slot.offset, slot.numel).copy_(it->second.reshape({slot.numel}));
  }
  std::map<std::string, Tensor> state{{"master", master}};
  for (const auto& [key, t] : tensors)
    if (key.rfind("optim.", 0) == 0) state[key.substr(6)] = t;
  s.window.load_state_dict(state);
  Generator& dropout = s.model.dropout_generator();
  dropout.set_state(dropout.seed(), static_cast<uint64_t>(meta_int(meta, "dropout.offset", path)));
  Generator& synthetic = s.source.generator();
  synthetic.set_state(synthetic.seed(),
                      static_cast<uint64_t>(meta_int(meta, "synthetic.offset", path)));
  if (data::DataLoader* l = s.source.loader()) {
    ACCRUE_CHECK(meta.count("loader.shard"), "checkpoint ", path,
                 " was written by a run on synthetic data; resume it with --synthetic");
    l->set_position({meta_int(meta, "loader.shard", path), meta_int(meta, "loader.offset", path),
                     meta_int(meta, "loader.epoch", path)});
  }
  const int64_t windows = meta_int(meta, "windows_closed", path);
  ACCRUE_CHECK(windows == s.window.windows_closed(), "checkpoint ", path,
               ": metadata windows_closed ", windows, " disagrees with its window state (",
               s.window.windows_closed(), ")");
  return windows;
}

int64_t resume_checkpoint(const std::string& path, const TrainState& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t start = load_checkpoint(path, s);
  std::printf("resumed %s at window %lld", path.c_str(), (long long)start);
  if (s.window.micro_step() > 0)
    std::printf(", micro-step %lld of window %lld", (long long)s.window.micro_step(),
                (long long)start + 1);
  std::printf(" (%s)\n", file_report(path, t0).c_str());
  return start;
}

void save_checkpoint_reported(const std::string& path, const TrainState& s, bool main_rank,
                              const std::string& at) {
  const auto t0 = std::chrono::steady_clock::now();
  if (main_rank) save_checkpoint(path, s);
  std::printf("checkpoint: %s (%s; %s)\n", path.c_str(), at.c_str(), file_report(path, t0).c_str());
}

}  // namespace accrue::examples
