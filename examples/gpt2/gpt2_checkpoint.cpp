#include "examples/gpt2/gpt2_checkpoint.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "examples/common/checkpoint_file.h"

namespace accrue::examples {

namespace {

constexpr const char* kCheckpointFormat = "accrue_train_gpt2 checkpoint v3";
constexpr const char* kCheckpointFormatV2 = "accrue_train_gpt2 checkpoint v2";
constexpr const char* kSkippedInARow = "accrue.state.skipped_in_a_row";

}  // namespace

RunRecord gpt2_run_record(const Gpt2Options& o, const nn::GPT2Config& c, const BatchPlan& plan,
                          DType compute, int world_size, const std::string& loss_scaler) {
  RunRecord r;
  // A v2 checkpoint holds these under the same names (Note [Run record]).
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, int64_t>>{{"config.n_layer", c.n_layer},
                                                    {"config.n_head", c.n_head},
                                                    {"config.n_embd", c.n_embd},
                                                    {"config.block_size", c.block_size},
                                                    {"config.vocab_size", c.vocab_size},
                                                    {"config.padded_vocab_size", c.padded_vocab()},
                                                    {"config.bias", c.bias ? 1 : 0}})
    r.integer(name, value, {}, name);
  r.text("dtype", dtype_name(compute), {}, "dtype");
  r.text("fp8", o.fp8.record());
  r.integer("world_size", world_size, {}, "world_size");
  r.text("grad_transport", o.grad_sync.transport_name());
  r.integer("micro_batch", plan.B, {}, "micro_batch");
  r.integer("seq_len", plan.T);
  r.integer("micro_steps", plan.K);
  r.text("seed", std::to_string(o.seed));
  r.number("dropout", c.dropout);
  r.text("data", o.synthetic ? "synthetic" : absolute_path(o.train_data));
  r.text("model_code", o.composed ? "composed" : "fused");
  r.number("weight_decay", o.weight_decay);
  r.number("beta1", o.beta1);
  r.number("beta2", o.beta2);
  r.number("eps", o.eps);
  r.number("max_grad_norm", o.max_grad_norm);
  r.text("loss_scaler", loss_scaler);
  // Safe at a window boundary: the schedule, the length, what is measured and logged.
  r.number("lr", o.lr, "lr");
  r.integer("warmup_windows", o.warmup_windows, "lr");
  r.number("min_lr_factor", o.min_lr_factor, "lr");
  r.integer("windows", o.windows, "windows");
  r.integer("val_every", o.val_every, "validation");
  r.integer("val_batches", o.val_batches, "validation");
  r.text("val_data", absolute_path(o.val_data), "validation");
  r.text("metrics", absolute_path(o.metrics), "metrics");
  return r;
}

void save_checkpoint(const std::string& path, const TrainState& s) {
  ACCRUE_CHECK(s.window.micro_step() == 0 || s.world_size == 1,
               "a checkpoint inside a window holds this rank's own gradients; with ", s.world_size,
               " ranks save between windows");
  const std::map<std::string, Tensor> tensors = training_tensors(s.arena, s.window);
  std::map<std::string, std::string> meta;
  s.record.write(&meta);
  meta["format"] = kCheckpointFormat;
  meta["windows_closed"] = std::to_string(s.window.windows_closed());
  meta["micro_step"] = std::to_string(s.window.micro_step());
  meta[kSkippedInARow] = std::to_string(s.guard ? s.guard->skipped_in_a_row() : 0);
  meta["dropout.offset"] = std::to_string(s.model.dropout_generator().offset());
  meta["synthetic.offset"] = std::to_string(s.source.generator().offset());
  if (const data::DataLoader* l = s.source.loader()) {
    meta["loader.shard"] = std::to_string(l->position().shard);
    meta["loader.offset"] = std::to_string(l->position().offset);
    meta["loader.epoch"] = std::to_string(l->position().epoch);
  }
  save_checkpoint_file(path, tensors, meta);
}

CheckpointFile read_checkpoint(const std::string& path, const RunRecord& record,
                               const std::vector<std::string>& allowed_changes) {
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointFile f;
  f.path = path;
  f.tensors = load_safetensors(path, &f.metadata);
  f.read_time = std::chrono::steady_clock::now() - t0;
  const std::map<std::string, std::string>& meta = f.metadata;
  const auto format = meta.find("format");
  const std::string found = format == meta.end() ? "" : format->second;
  ACCRUE_CHECK(found == kCheckpointFormat || found == kCheckpointFormatV2, path,
               " is not a trainer checkpoint (format '", found, "', expected '", kCheckpointFormat,
               "')");
  f.windows_closed = meta_int(meta, "windows_closed", path);
  f.micro_step = meta_int(meta, "micro_step", path);
  if (meta.count(kSkippedInARow)) f.skipped_in_a_row = meta_int(meta, kSkippedInARow, path);
  std::string note;
  const auto k = meta.find("accrue.run.micro_steps");
  if (f.micro_step > 0 && k != meta.end() && k->second != record.value("micro_steps"))
    note = "the checkpoint is inside window " + std::to_string(f.windows_closed + 1) +
           ", after micro-step " + std::to_string(f.micro_step) + " of K = " + k->second +
           ": its gradients so far belong to a window of K = " + k->second +
           ", so it resumes with that K only";
  for (const std::string& line : record.compare(path, meta, allowed_changes, note))
    std::printf("%s\n", line.c_str());
  return f;
}

int64_t resume_checkpoint(const CheckpointFile& f, const TrainState& s) {
  const auto since = std::chrono::steady_clock::now() - f.read_time;
  const std::string& path = f.path;
  const std::map<std::string, std::string>& meta = f.metadata;
  // The flat master, rebuilt slot by slot (alignment padding stays 0, Note [Grad arena]).
  Tensor master = zeros({s.arena.padded_numel()}, s.arena.master().dtype());
  for (const optim::ParamStore::Slot& slot : s.arena.slots()) {
    auto it = f.tensors.find("model." + slot.name);
    ACCRUE_CHECK(it != f.tensors.end(), "checkpoint ", path, " has no 'model.", slot.name, "'");
    ACCRUE_CHECK(it->second.shape() == slot.shape, "checkpoint ", path, ": 'model.", slot.name,
                 "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(slot.shape));
    master.narrow(0, slot.offset, slot.numel).copy_(it->second.reshape({slot.numel}));
  }
  std::map<std::string, Tensor> state{{"master", master}};
  for (const auto& [key, t] : f.tensors)
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
  const int64_t windows = f.windows_closed;
  ACCRUE_CHECK(windows == s.window.windows_closed(), "checkpoint ", path,
               ": metadata windows_closed ", windows, " disagrees with its window state (",
               s.window.windows_closed(), ")");
  std::printf("resumed %s at window %lld", path.c_str(), (long long)windows);
  if (s.window.micro_step() > 0)
    std::printf(", micro-step %lld of window %lld", (long long)s.window.micro_step(),
                (long long)windows + 1);
  std::printf(" (%s)\n", file_report(path, since).c_str());
  return windows;
}

void save_checkpoint_reported(const std::string& path, const TrainState& s, bool main_rank,
                              const std::string& at) {
  const auto t0 = std::chrono::steady_clock::now();
  if (main_rank) save_checkpoint(path, s);
  std::printf("checkpoint: %s (%s; %s)\n", path.c_str(), at.c_str(), file_report(path, t0).c_str());
}

}  // namespace accrue::examples
