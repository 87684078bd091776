// accrue_train: one trainer for the Llama family (Llama 2/3/3.2, Qwen3, or a
// Hugging Face directory): packed documents from token shards (or synthetic
// documents of random lengths), K micro-batches per optimizer step in one
// accumulation Window, AdamW with a warmup + cosine schedule, optional CUDA
// graphs, checkpoints that resume bit-exactly. `accrue_train --help` lists
// every option.
//
//   accrue_train --model llama-tiny --synthetic --cpu --windows 20
//   accrue_train --model llama-125m --train-data '/data/fw_train_*.bin' --eos-id 2
//
// Note [Llama trainer checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As Note [Trainer checkpoint] for GPT-2: one safetensors file with
// model.<name> (the fp32/f64 master weights, Hugging Face names) and
// optim.<key> (Window::state_dict() but its flat master), and in the metadata
// the run record (Note [Run record]), the windows closed, the skipped windows
// in a row (Note [Honest exit codes]) and where the data continues: the
// DocumentBatches position (Note [Document batches]) or the synthetic
// generator's offset. Checkpoints are written between windows only, so the
// resumed run draws exactly the batches the uninterrupted run would have, and
// its final checkpoint equals that run's byte for byte.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/data/document_batches.h"
#include "accrue/nn/llama.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/launch.h"
#include "examples/common/options.h"
#include "examples/common/run_guard.h"
#include "examples/common/run_main.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_train";
constexpr const char* kFormat = "accrue_train checkpoint v1";

struct Options {
  std::string model = "llama-tiny", train_data, checkpoint, resume, metrics;
  bool synthetic = false, cuda_graphs = false, force_cpu = false;
  int64_t eos_id = -1, micro_batch = 4, seq_len = 64, accum = 4, windows = 20, warmup_windows = 0;
  int64_t seed = 1, checkpoint_every = 0, max_skipped_windows = 32;
  std::optional<int64_t> stop_after;
  double lr = 3e-4, weight_decay = 0.1, max_grad_norm = 1.0, min_lr_factor = 0.1;
  DType dtype = DType::f32;
};

bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Trains a Llama-family model (Llama 2/3, Qwen3, or a Hugging Face directory) on "
                  "packed documents, K micro-batches per optimizer step.");
  cli.section("model and data");
  cli.text("--model", &o.model, "NAME",
           "a preset (llama-tiny, qwen3-tiny, llama-125m, llama3.2-1b, qwen3-0.6b) or hf:DIR");
  cli.path("--train-data", &o.train_data, "GLOB", "token shards (tools/make_shards.py)");
  cli.integer("--eos-id", &o.eos_id, "ID", "the token that ends a document in the shards")
      .min(0)
      .default_text("required with --train-data");
  cli.flag("--synthetic", &o.synthetic, "random documents of random lengths, packed");
  cli.section("batch and optimizer");
  cli.integer("--micro-batch", &o.micro_batch, "B", "rows per micro-batch").min(1);
  cli.integer("--seq-len", &o.seq_len, "T", "tokens per row").min(2);
  cli.integer("--accum", &o.accum, "K", "micro-batches per window").min(1);
  cli.integer("--windows", &o.windows, "W", "windows (optimizer steps) to train").min(1);
  cli.integer("--stop-after", &o.stop_after, "N", "stop after window N (to resume later)").min(1);
  cli.number("--lr", &o.lr, "LR", "AdamW peak learning rate").above(0);
  cli.integer("--warmup-windows", &o.warmup_windows, "N", "linear warmup, then cosine").min(0);
  cli.number("--weight-decay", &o.weight_decay, "WD", "decay of 2-D weights (not norms)").min(0);
  cli.number("--max-grad-norm", &o.max_grad_norm, "C", "clip the global norm (0: off)").min(0);
  cli.choice<DType>("--dtype", &o.dtype,
                    {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f64", DType::f64}},
                    "compute dtype (bf16 over f32 master weights)");
  cli.integer("--seed", &o.seed, "S", "seed of the weights and the synthetic data").min(0);
  cli.section("run");
  cli.flag("--cuda-graphs", &o.cuda_graphs, "replay micro-steps and close as CUDA graphs (GPU)");
  cli.flag("--cpu", &o.force_cpu, "run on the CPU even when a GPU is present");
  cli.path("--checkpoint", &o.checkpoint, "FILE", "write a checkpoint at the end (and every N)");
  cli.integer("--checkpoint-every", &o.checkpoint_every, "N", "also every N windows (0: end only)")
      .min(0);
  cli.path("--resume", &o.resume, "FILE", "continue the run a checkpoint holds");
  cli.path("--metrics", &o.metrics, "FILE", "one JSON line per window");
  cli.integer("--max-skipped-windows", &o.max_skipped_windows, "N",
              "fail after more than N skipped windows in a row")
      .min(0);
  if (!cli.parse(argc, argv)) return false;
  if (o.synthetic == !o.train_data.empty())
    usage_error("give exactly one of --train-data and --synthetic");
  if (!o.train_data.empty() && o.eos_id < 0) usage_error("--train-data needs --eos-id");
  if (o.stop_after && *o.stop_after > o.windows)
    usage_error("--stop-after ", *o.stop_after, " is past --windows ", o.windows);
  if (o.model.rfind("hf:", 0) != 0) {
    bool known = false;
    for (const std::string& n : nn::LlamaConfig::preset_names())
      known = known || n == o.model;
    if (!known) usage_error("--model '", o.model, "' is not a preset or hf:DIR");
  }
  checked_product({{"--micro-batch", o.micro_batch}, {"--seq-len", o.seq_len}});
  if (!o.checkpoint.empty()) probe_output_file("--checkpoint", o.checkpoint);
  if (!o.metrics.empty()) probe_output_file("--metrics", o.metrics);
  return true;
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

// One packed micro-batch: inputs and targets [B, T], the documents' offsets
// and positions (Note [Llama batch layouts]).
struct Batch {
  Tensor inputs, targets, cu_seqlens, positions;
};

// The synthetic documents: random lengths in [1, T], laid end to end over the
// B rows; within a document every other token repeats the one before it, so
// the loss can fall. A document's last token has no target.
Batch synthetic_batch(int64_t B, int64_t T, int64_t vocab, Generator& gen, Device device) {
  const int64_t n = B * T;
  const std::vector<int64_t> tok =
      randint(0, vocab, {n}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  const std::vector<int64_t> draws =
      randint(1, T + 1, {n}, DType::i64, Device::cpu(), &gen).to_vector<int64_t>();
  std::vector<int64_t> lengths;
  for (int64_t used = 0, i = 0; used < n; ++i) {
    const int64_t len = std::min(draws[static_cast<size_t>(i)], n - used);
    lengths.push_back(len);
    used += len;
  }
  std::vector<int64_t> inputs(static_cast<size_t>(n)), targets(static_cast<size_t>(n), -100);
  int64_t start = 0;
  for (int64_t len : lengths) {
    for (int64_t j = 0; j < len; ++j) {
      const size_t t = static_cast<size_t>(start + j);
      inputs[t] = (j % 2 == 1) ? inputs[t - 1] : tok[t];
    }
    for (int64_t j = 0; j + 1 < len; ++j)
      targets[static_cast<size_t>(start + j)] = inputs[static_cast<size_t>(start + j + 1)];
    start += len;
  }
  const nn::BatchLayout layout = nn::BatchLayout::packed_documents(lengths, B, T, device);
  return {from_vector<int64_t>(inputs, {B, T}, DType::i64, device),
          from_vector<int64_t>(targets, {B, T}, DType::i64, device), layout.cu_seqlens,
          layout.positions.defined() ? layout.positions
                                     : nn::positions_from_cu_seqlens(layout.cu_seqlens, B, T)};
}

std::string describe_model(const nn::LlamaConfig& c) {
  char s[256];
  std::snprintf(s, sizeof s,
                "%lld layers, hidden %lld, %lld query / %lld kv heads, head_dim %lld, ffn %lld, "
                "vocab %lld%s%s, %lld parameters",
                (long long)c.layers, (long long)c.hidden, (long long)c.heads, (long long)c.kv_heads,
                (long long)c.head_dim, (long long)c.intermediate, (long long)c.vocab_size,
                c.tie_word_embeddings ? ", tied" : "", c.qk_norm ? ", QK-norm" : "",
                (long long)c.parameter_count());
  return s;
}

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

int train(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  const Launch where = launch(opt.force_cpu);
  ACCRUE_CHECK(where.world_size() == 1, kProgram, " runs on one process for now; got a launch of ",
               where.world_size(), " ranks");
  const Device device = where.device;
  const DType master = opt.dtype == DType::f64 ? DType::f64 : DType::f32;
  Generator init(static_cast<uint64_t>(opt.seed)), synth(static_cast<uint64_t>(opt.seed) + 1);

  std::unique_ptr<nn::Llama> model;
  if (opt.model.rfind("hf:", 0) == 0) {
    model = nn::Llama::from_hf(opt.model.substr(3), {device, master, &init});
  } else {
    const nn::LlamaConfig config = nn::LlamaConfig::from_name(opt.model);
    if (opt.seq_len > config.max_positions)
      usage_error("--seq-len ", opt.seq_len, " is longer than ", opt.model,
                  "'s max_position_embeddings ", config.max_positions);
    model = std::make_unique<nn::Llama>(config, nn::ParamOptions{device, master, &init});
  }
  const nn::LlamaConfig& config = model->config();
  ACCRUE_CHECK(opt.seq_len <= config.max_positions, "--seq-len ", opt.seq_len,
               " is longer than the model's max_position_embeddings ", config.max_positions);
  ACCRUE_CHECK(opt.synthetic || opt.eos_id < config.vocab_size, "--eos-id ", opt.eos_id,
               " is outside the vocabulary [0, ", config.vocab_size, ")");

  RunRecord record;
  record.text("model", opt.model.rfind("hf:", 0) == 0 ? "hf:" + absolute_path(opt.model.substr(3))
                                                      : opt.model);
  record.integer("parameters", config.parameter_count());
  record.text("dtype", dtype_name(opt.dtype));
  record.integer("micro_batch", opt.micro_batch);
  record.integer("seq_len", opt.seq_len);
  record.integer("micro_steps", opt.accum);
  record.integer("seed", opt.seed);
  record.text("data", opt.synthetic ? "synthetic" : absolute_path(opt.train_data));
  record.integer("eos_id", opt.eos_id);
  record.number("weight_decay", opt.weight_decay);
  record.number("max_grad_norm", opt.max_grad_norm);
  record.number("lr", opt.lr, "lr");
  record.integer("warmup_windows", opt.warmup_windows, "lr");
  record.integer("windows", opt.windows, "windows");

  std::map<std::string, Tensor> resumed;
  std::map<std::string, std::string> resumed_meta;
  if (!opt.resume.empty()) {
    resumed = load_safetensors(opt.resume, &resumed_meta);
    const auto f = resumed_meta.find("format");
    ACCRUE_CHECK(f != resumed_meta.end() && f->second == kFormat, opt.resume,
                 " is not an accrue_train checkpoint (format '",
                 f == resumed_meta.end() ? "" : f->second, "', expected '", kFormat, "')");
    for (const std::string& line : record.compare(opt.resume, resumed_meta, {}))
      std::printf("%s\n", line.c_str());
  }

  std::unique_ptr<data::DocumentBatches> docs;
  if (!opt.synthetic)
    docs =
        std::make_unique<data::DocumentBatches>(opt.train_data, data::DocumentOptions()
                                                                    .batch(opt.micro_batch)
                                                                    .seq_len(opt.seq_len)
                                                                    .eos_id(opt.eos_id)
                                                                    .vocab_size(config.vocab_size)
                                                                    .device(device));

  std::printf("%s on %s: %s\n", kProgram, where.describe().c_str(), describe_model(config).c_str());
  std::printf("batch: micro-batch %lld x seq %lld x K=%lld = %lld tokens per window; data: %s\n",
              (long long)opt.micro_batch, (long long)opt.seq_len, (long long)opt.accum,
              (long long)(opt.micro_batch * opt.seq_len * opt.accum),
              opt.synthetic ? "synthetic packed documents" : opt.train_data.c_str());

  // AdamW; no decay on norms and biases (fewer than 2 dimensions).
  optim::Optimizer optimizer(
      optim::AdamWOptions(opt.lr).betas(0.9, 0.95).eps(1e-8).weight_decay(opt.weight_decay));
  std::vector<Tensor> no_decay;
  for (const nn::NamedParameter& p : model->named_parameters())
    if (p.tensor.dim() < 2) no_decay.push_back(p.tensor);
  optimizer.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optimizer.set_schedule(
      std::make_shared<optim::WarmupCosine>(opt.warmup_windows, opt.windows, opt.min_lr_factor));
  optim::ParamStore store(model->named_parameters(), optim::ParamStoreOptions()
                                                         .device(device)
                                                         .master_dtype(master)
                                                         .compute_dtype(opt.dtype)
                                                         .moments(optimizer.moments_needed()));
  optim::Window window(
      store, optimizer,
      optim::WindowOptions().micro_steps(opt.accum).max_grad_norm(opt.max_grad_norm));

  RunGuard guard(opt.max_skipped_windows,
                 resumed_meta.count("skipped_in_a_row")
                     ? meta_int(resumed_meta, "skipped_in_a_row", opt.resume)
                     : 0);
  int64_t start = 0;
  if (!opt.resume.empty()) {
    Tensor flat = zeros({store.padded_numel()}, store.master().dtype());
    for (const optim::ParamStore::Slot& slot : store.slots()) {
      auto it = resumed.find("model." + slot.name);
      ACCRUE_CHECK(it != resumed.end(), "checkpoint ", opt.resume, " has no 'model.", slot.name,
                   "'");
      ACCRUE_CHECK(it->second.shape() == slot.shape, "checkpoint ", opt.resume, ": 'model.",
                   slot.name, "' has shape ", shape_str(it->second.shape()), ", expected ",
                   shape_str(slot.shape));
      flat.narrow(0, slot.offset, slot.numel).copy_(it->second.reshape({slot.numel}));
    }
    std::map<std::string, Tensor> state{{"master", flat}};
    for (const auto& [key, t] : resumed)
      if (key.rfind("optim.", 0) == 0) state[key.substr(6)] = t;
    window.load_state_dict(state);
    start = meta_int(resumed_meta, "windows_closed", opt.resume);
    ACCRUE_CHECK(start == window.windows_closed() && window.micro_step() == 0, "checkpoint ",
                 opt.resume, ": windows_closed ", start, " disagrees with its window state");
    if (docs) {
      docs->set_position({meta_int(resumed_meta, "data.shard", opt.resume),
                          meta_int(resumed_meta, "data.offset", opt.resume),
                          meta_int(resumed_meta, "data.epoch", opt.resume)});
    } else {
      synth.set_state(synth.seed(), static_cast<uint64_t>(
                                        meta_int(resumed_meta, "synthetic.offset", opt.resume)));
    }
    resumed.clear();
    std::printf("resumed %s at window %lld\n", opt.resume.c_str(), (long long)start);
  }

  auto save = [&](int64_t w) {
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, Tensor> tensors;
    for (size_t i = 0; i < store.size(); ++i)
      tensors["model." + store.slots()[i].name] = store.master_view(i);
    for (const auto& [key, t] : window.state_dict())
      if (key != "master") tensors["optim." + key] = t;
    std::map<std::string, std::string> meta;
    record.write(&meta);
    meta["format"] = kFormat;
    meta["windows_closed"] = std::to_string(window.windows_closed());
    meta["skipped_in_a_row"] = std::to_string(guard.skipped_in_a_row());
    if (docs) {
      meta["data.shard"] = std::to_string(docs->position().shard);
      meta["data.offset"] = std::to_string(docs->position().offset);
      meta["data.epoch"] = std::to_string(docs->position().epoch);
    } else {
      meta["synthetic.offset"] = std::to_string(synth.offset());
    }
    save_checkpoint_file(opt.checkpoint, tensors, meta);
    std::printf("checkpoint: %s (window %lld; %s)\n", opt.checkpoint.c_str(), (long long)w,
                file_report(opt.checkpoint, t0).c_str());
  };

  const int64_t B = opt.micro_batch, T = opt.seq_len;
  auto next_batch = [&]() -> Batch {
    if (!docs) return synthetic_batch(B, T, config.vocab_size, synth, device);
    data::DocumentBatch b = docs->next_batch();
    return {b.inputs, b.targets, b.cu_seqlens, b.positions};
  };
  // Note [Graphed window]: the graphs read fixed-shape buffers, so the
  // documents' offsets are padded to B * T + 1 entries with B * T (empty
  // documents at the end, which attend to nothing).
  std::unique_ptr<optim::GraphedWindow> graphed;
  if (opt.cuda_graphs) {  // on the CPU it runs eagerly, with the same padded offsets
    graphed = std::make_unique<optim::GraphedWindow>(window, [&](const std::vector<Tensor>& in) {
      return model->loss(in[0], in[1], nn::BatchLayout::packed(in[2], in[3]));
    });
    std::printf("%s\n", where.gpu
                            ? "cuda graphs: micro-steps and close captured after one eager "
                              "warm-up each"
                            : "--cuda-graphs on the CPU: run eagerly, with the graphs' inputs");
  }
  auto padded_offsets = [&](const Tensor& cu) {
    const int64_t n = cu.numel();
    Tensor out = full({B * T + 1}, static_cast<double>(B * T), DType::i64, device);
    out.narrow(0, 0, n).copy_(cu.to(DType::i64));
    return out;
  };

  optim::MetricsLog metrics;
  if (!opt.metrics.empty()) {
    if (!opt.resume.empty()) truncate_metrics_log(opt.metrics, start);
    metrics = optim::MetricsLog(opt.metrics, !opt.resume.empty());
  }
  const int64_t end = opt.stop_after.value_or(opt.windows);
  const double window_tokens = static_cast<double>(B * T * opt.accum);
  optim::WindowReport last;
  double first_loss = NAN;
  for (int64_t w = start + 1; w <= end; ++w) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < opt.accum; ++k) {
      Batch b = next_batch();
      if (graphed) {
        graphed->backward({b.inputs, b.targets, padded_offsets(b.cu_seqlens), b.positions});
      } else {
        window.backward(
            model->loss(b.inputs, b.targets, nn::BatchLayout::packed(b.cu_seqlens, b.positions)));
      }
    }
    if (graphed) {
      graphed->close();
    } else {
      window.close();
    }
    const optim::WindowReport r = window.report();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (w == start + 1) first_loss = r.loss;
    last = r;
    const double lr = optimizer.config_at(r.window - 1).groups[0].lr;
    std::printf("window %lld/%lld | loss %.6f | grad-norm %.4f | lr %.3e | %.0f tok/s%s\n",
                (long long)w, (long long)opt.windows, r.loss, r.grad_norm, lr, window_tokens / secs,
                r.skipped ? " | skipped" : "");
    metrics.write(r, {{"lr", lr}, {"tokens_per_s", window_tokens / secs}});
    guard.after_window(r);
    if (!opt.checkpoint.empty() && opt.checkpoint_every > 0 && w % opt.checkpoint_every == 0 &&
        w < end && std::isfinite(r.loss))
      save(w);
    std::fflush(stdout);
  }
  if (end <= start) {
    std::printf("nothing to do: the run is already at window %lld\n", (long long)start);
    return 0;
  }
  std::printf("loss %.4f -> %.4f over windows %lld..%lld\n", first_loss, last.loss,
              (long long)start + 1, (long long)end);
  std::printf("final: window %lld loss %.17g\n", (long long)end, last.loss);
  std::fflush(stdout);
  guard.finish(last, {}, end == opt.windows);
  if (!opt.checkpoint.empty()) save(end);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
