// accrue_train: one trainer for every model (examples/common/train_model.h):
// GPT-2 (gpt2-tiny, gpt2-d12 .. gpt2-d48) and the Llama family (Llama 2/3/3.2,
// Qwen3, or a Hugging Face directory). The Llama family trains on packed
// documents from token shards (or synthetic documents of random lengths);
// GPT-2 on full rows (Note [GPT-2 rows]). K micro-batches per optimizer step in one
// accumulation Window, AdamW with a warmup + cosine schedule, optional CUDA
// graphs, checkpoints that resume bit-exactly, data parallelism under
// torchrun/mpirun (with ZeRO-1), and --bench's JSON line of timings.
// `accrue_train --help` lists every option.
//
//   accrue_train --model llama-tiny --synthetic --cpu --windows 20
//   accrue_train --model llama-125m --train-data '/data/fw_train_*.bin' --eos-id 2
//   accrue_train --model gpt2-d12 --train-data '/data/fineweb_train_*.bin' --seq-len 1024
//                --micro-batch 16 --total-batch-tokens 524288 --dtype bf16
//   accrue_train --model llama-125m --synthetic --synthetic-documents full
//                --dtype bf16 --micro-batch 8 --seq-len 2048 --accum 8 --bench
//
// The pieces: train_options (the command line and its checks), train_data
// (shards, packed or as rows, or the synthetic stream), and here the setup,
// the checkpoint, --bench's line and the window loop (train()).
//
// Data parallel, one process per GPU (examples/common/launch.h):
//   torchrun --nproc-per-node=2 --no-python build/ci/examples/accrue_train ...
// Each rank reads its own part of every step (DocumentBatches' rank split, or
// its own synthetic stream); the Window's count of real tokens is summed over
// the ranks at close (Note [Normalization]), so the loss is the mean over the
// whole window's tokens, however they fell.
//
// Note [Llama trainer checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The checkpoint of every model accrue_train trains (the name is older than
// its GPT-2 models). As Note [Trainer checkpoint] for accrue_train_gpt2: one
// safetensors file with model.<name> (the fp32/f64 master weights under the
// model's parameter names: Hugging Face's for Llama, nn::GPT2's for GPT-2)
// and optim.<key> (Window::state_dict() but its flat master), and in the
// metadata the run record (Note [Run record]), the windows closed, the
// skipped windows in a row (Note [Honest exit codes]), GPT-2's dropout
// generator offset, and where the data continues: the DocumentBatches
// position (Note [Document batches]), the DataLoader position (Note [GPT-2
// rows]) or the synthetic generator's offset. Checkpoints are written between
// windows, or with --stop-micro-steps after a micro-step (then with the
// window's partial gradients, Note [Mid-window checkpoints]), so the resumed
// run draws exactly the batches the uninterrupted run would have, and its
// final checkpoint equals that run's byte for byte.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue.h"
#include "accrue/core/nvtx.h"
#include "accrue/data/document_batches.h"
#include "accrue/data/token_shards.h"
#include "accrue/nn/llama.h"
#include "examples/common/bench_line.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/json.h"
#include "examples/common/launch.h"
#include "examples/common/layer_metrics.h"
#include "examples/common/loss_scaling.h"
#include "examples/common/options.h"
#include "examples/common/run_guard.h"
#include "examples/common/run_main.h"
#include "examples/common/timing.h"
#include "examples/common/train_model.h"
#include "examples/common/validation.h"
#include "examples/common/window_reporter.h"
#include "examples/train/train_data.h"
#include "examples/train/train_options.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_train";
constexpr const char* kFormat = "accrue_train checkpoint v1";

JsonObject memory_json(const optim::StoreMemory& m) {
  JsonObject j;
  j.integer("master", m.master)
      .integer("grads", m.grads)
      .integer("compute", m.compute)
      .integer("moments", m.moments)
      .integer("fp8", m.fp8)
      .integer("total", m.total())
      .boolean("master_sharded", m.master_sharded)
      .boolean("moments_sharded", m.moments_sharded);
  return j;
}

TrainModelOptions model_options_of(const TrainOptions& opt, int rank) {
  TrainModelOptions o;
  o.name = opt.model;
  o.seq_len = opt.seq_len;
  o.activation_checkpointing = opt.activation_checkpointing;
  o.dropout = opt.dropout;
  o.dropout_seed = static_cast<uint64_t>(opt.seed) + 1 + static_cast<uint64_t>(rank);
  o.n_layer = opt.n_layer;
  o.n_head = opt.n_head;
  o.n_embd = opt.n_embd;
  o.vocab_size = opt.vocab_size;
  o.block_size = opt.block_size;
  o.composed = opt.composed;
  return o;
}

// The model, with its weights drawn from --seed (every rank the same weights;
// rank 0's are broadcast anyway) or copied from --init-from.
std::unique_ptr<TrainModel> build_model(const TrainOptions& opt, const Launch& where,
                                        DType master) {
  Generator init(static_cast<uint64_t>(opt.seed));
  const TrainModelOptions model_options = model_options_of(opt, where.rank.rank);
  std::unique_ptr<TrainModel> model =
      make_train_model(model_options, {where.device, master, &init});
  if (!opt.init_from.empty()) {  // before the store is built: the master weights copy them
    model->init_from(opt.init_from);
    std::printf("initialized from %s\n", opt.init_from.c_str());
  }
  return model;
}

// Note [Run record]: what a resume must match (or --allow-changed lets differ).
RunRecord run_record(const TrainOptions& opt, const TrainModel& model, int ranks,
                     const LossScaling& scaling) {
  RunRecord record;
  record.text("model", opt.model.rfind("hf:", 0) == 0 ? "hf:" + absolute_path(opt.model.substr(3))
                                                      : opt.model);
  record.integer("parameters", model.parameter_count());
  JsonObject sizes;  // the model's configuration, overrides included
  model.describe_json(sizes);
  record.text("model_config", sizes.str());
  record.text("init_from", absolute_path(opt.init_from));
  record.number("dropout", opt.dropout);
  record.text("dtype", dtype_name(opt.dtype));
  record.text("fp8", opt.fp8.record());
  record.integer("micro_batch", opt.micro_batch);
  record.integer("seq_len", opt.seq_len);
  record.integer("micro_steps", opt.accum);
  record.integer("world_size", ranks);
  record.text("grad_transport", opt.grad_sync.transport_name());
  record.integer("seed", opt.seed);
  record.text("data", opt.synthetic ? "synthetic" : absolute_path(opt.train_data));
  if (opt.synthetic_documents != SyntheticDocuments::random)
    record.text("synthetic_documents", documents_name(opt));
  record.integer("eos_id", opt.eos_id);
  if (opt.contiguous_rows) record.text("train_rows", "contiguous");
  record.number("weight_decay", opt.weight_decay);
  record.number("max_grad_norm", opt.max_grad_norm);
  record.text("loss_scaler", loss_scaler_text(scaling));
  record.number("beta1", opt.beta1);
  record.number("beta2", opt.beta2);
  record.number("eps", opt.eps);
  record.number("min_lr_factor", opt.min_lr_factor, "lr");
  record.number("lr", opt.lr, "lr");
  record.integer("warmup_windows", opt.warmup_windows, "lr");
  record.integer("windows", opt.windows, "windows");
  return record;
}

// The checkpoint --resume names, as read: its tensors and its metadata.
struct Resumed {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
};

// Reads --resume's checkpoint (nothing without --resume); another program's
// checkpoint is refused, and so is another run's (Note [Run record]), but for
// what --allow-changed lets differ, which is printed.
Resumed read_resumed(const TrainOptions& opt, const RunRecord& record) {
  Resumed resumed;
  if (opt.resume.empty()) return resumed;
  resumed.tensors = load_safetensors(opt.resume, &resumed.meta);
  const auto f = resumed.meta.find("format");
  ACCRUE_CHECK(f != resumed.meta.end() && f->second == kFormat, opt.resume,
               " is not an accrue_train checkpoint (format '",
               f == resumed.meta.end() ? "" : f->second, "', expected '", kFormat, "')");
  for (const std::string& line : record.compare(opt.resume, resumed.meta, opt.allowed_changes))
    std::printf("%s\n", line.c_str());
  return resumed;
}

// Note [GPT-2 rows]
// ~~~~~~~~~~~~~~~~~
// nn::GPT2 has no document offsets nor position ids: each row is one sequence
// from position 0. So for a GPT-2 model accrue_train reads --train-data as
// accrue_train_gpt2 does, contiguous rows of the shards (data::DataLoader,
// this rank's own rows of each step) that run across document boundaries, and
// takes no --eos-id; --synthetic draws full rows (--synthetic-documents full,
// its default there, Note [Synthetic rows]). A packed layout
// (--synthetic-documents random) is refused for GPT-2, not approximated.
// --contiguous-rows makes a Llama model read its shards the same way, with
// BatchLayout::full(): plain causal attention within each row, as llm.c and
// most pretraining runs do. Without it, a Llama model reads the shards as
// packed documents, each row starting one (data::DocumentBatches), and
// attends within each document of each row through a bias (Note [Documents
// within rows] in nn/llama.h). Before that path, the packed offsets on the
// device sent attention to the composed path over the whole packed
// micro-batch: llama-125m at 8 x 2048 under --cuda-graphs trained at 13.8k
// tok/s with a 37 GiB peak on an H200, against about 500k with full rows.

// Where this rank's micro-batches come from. Note [Document batches]: rank r
// reads its own B rows of every step; GPT-2 reads contiguous rows instead
// (Note [GPT-2 rows]), rank r its own too.
TrainDataOptions train_data_options(const TrainOptions& opt, const TrainModel& model,
                                    const Launch& where) {
  // Each rank its own synthetic stream (Note [Synthetic rows]).
  const SyntheticRows rows = model.synthetic_rows();
  TrainDataOptions data_options;
  data_options.path = opt.synthetic ? "" : opt.train_data;
  data_options.packed = model.packed_documents() && !opt.contiguous_rows;
  data_options.full_rows = opt.synthetic_documents == SyntheticDocuments::full;
  data_options.batch = opt.micro_batch;
  data_options.seq_len = opt.seq_len;
  data_options.eos_id = opt.eos_id;
  data_options.vocab = model.vocab_size();
  data_options.rank = where.rank.rank;
  data_options.world_size = where.world_size();
  data_options.device = where.device;
  data_options.rows = rows;
  data_options.synthetic_seed =
      static_cast<uint64_t>(opt.seed) + rows.seed_offset + static_cast<uint64_t>(where.rank.rank);
  return data_options;
}

// Validation, read as the training data is (this rank's part of each step);
// null without --val-data.
std::unique_ptr<TrainData> open_validation(const TrainOptions& opt, TrainDataOptions options) {
  if (opt.val_data.empty()) return nullptr;
  options.path = opt.val_data;
  return std::make_unique<TrainData>(options);
}

// The banner: where the run is, the model, the batch and the data.
void print_setup(const TrainOptions& opt, const Launch& where, const TrainModel& model,
                 int64_t window_tokens) {
  std::printf("%s on %s: %s%s\n", kProgram, where.describe().c_str(), model.describe().c_str(),
              model.activation_checkpointing() ? ", activation checkpointing" : "");
  const std::string data =
      !opt.synthetic ? opt.train_data + (model.packed_documents() && !opt.contiguous_rows
                                             ? " (packed documents)"
                                             : " (contiguous rows)")
      : opt.synthetic_documents == SyntheticDocuments::full ? "synthetic, one sequence per row"
                                                            : "synthetic packed documents";
  std::printf(
      "batch: micro-batch %lld x seq %lld x %d rank(s) x K=%lld = %lld tokens per window; "
      "data: %s\n",
      (long long)opt.micro_batch, (long long)opt.seq_len, where.world_size(), (long long)opt.accum,
      (long long)window_tokens, data.c_str());
}

// AdamW; the model says which parameters decay (never norms and biases).
optim::Optimizer make_optimizer(const TrainOptions& opt, const TrainModel& model) {
  optim::Optimizer optimizer(optim::AdamWOptions(opt.lr)
                                 .betas(opt.beta1, opt.beta2)
                                 .eps(opt.eps)
                                 .weight_decay(opt.weight_decay));
  std::vector<Tensor> no_decay;
  for (const nn::NamedParameter& p : model.named_parameters())
    if (!model.decays(p)) no_decay.push_back(p.tensor);
  optimizer.add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
  optimizer.set_schedule(
      std::make_shared<optim::WarmupCosine>(opt.warmup_windows, opt.windows, opt.min_lr_factor));
  return optimizer;
}

optim::ParamStoreOptions store_options(const TrainOptions& opt, const Launch& where, DType master,
                                       const optim::Optimizer& optimizer) {
  optim::ParamStoreOptions o = optim::ParamStoreOptions()
                                   .device(where.device)
                                   .master_dtype(master)
                                   .compute_dtype(opt.dtype)
                                   .moments(optimizer.moments_needed());
  // Note [ZeRO-1]: slots padded so that every bucket splits evenly over the ranks.
  if (opt.zero1) o.shard_ranks(where.world_size());
  return o;
}

optim::WindowOptions window_options(const TrainOptions& opt, const LossScaling& scaling) {
  return optim::WindowOptions()
      .micro_steps(opt.accum)
      .max_grad_norm(opt.max_grad_norm)
      .scaler(loss_scaler_options(scaling))
      .norm_under_backward(opt.norm_under_backward)
      .noise_scale(opt.noise_scale_every)
      .close_under_forward(opt.close_under_forward.on, opt.close_under_forward.layer_elements,
                           opt.close_under_forward.max_blocks);
}

// Restores a run from its checkpoint (already read and checked against the
// run record): the master weights, the window's state, the data's and the
// dropout's positions; the windows it had closed.
int64_t resume_run(const TrainOptions& opt, std::map<std::string, Tensor>& resumed,
                   const std::map<std::string, std::string>& resumed_meta, optim::ParamStore& store,
                   optim::Window& window, TrainData& train_data, TrainModel& model) {
  Tensor flat = zeros({store.padded_numel()}, store.master().dtype());
  for (const optim::ParamStore::Slot& slot : store.slots()) {
    auto it = resumed.find("model." + slot.name);
    ACCRUE_CHECK(it != resumed.end(), "checkpoint ", opt.resume, " has no 'model.", slot.name, "'");
    ACCRUE_CHECK(it->second.shape() == slot.shape, "checkpoint ", opt.resume, ": 'model.",
                 slot.name, "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(slot.shape));
    flat.narrow(0, slot.offset, slot.numel).copy_(it->second.reshape({slot.numel}));
  }
  std::map<std::string, Tensor> state{{"master", flat}};
  for (const auto& [key, t] : resumed)
    if (key.rfind("optim.", 0) == 0) state[key.substr(6)] = t;
  window.load_state_dict(state);
  const int64_t start = meta_int(resumed_meta, "windows_closed", opt.resume);
  // A mid-window checkpoint (--stop-micro-steps) resumes at its micro-step.
  ACCRUE_CHECK(start == window.windows_closed(), "checkpoint ", opt.resume, ": windows_closed ",
               start, " disagrees with its window state");
  train_data.read_position(resumed_meta, opt.resume);
  if (Generator* g = model.dropout_generator())
    g->set_state(g->seed(),
                 static_cast<uint64_t>(meta_int(resumed_meta, "dropout.offset", opt.resume)));
  resumed.clear();
  std::printf("resumed %s at window %lld%s\n", opt.resume.c_str(), (long long)start,
              window.micro_step() > 0 ? (", inside window " + std::to_string(start + 1) +
                                         " after micro-step " + std::to_string(window.micro_step()))
                                            .c_str()
                                      : "");
  return start;
}

// The run's pieces, built by train(), that the micro-steps, the checkpoints,
// --bench and the window loop work on.
struct Run {
  const TrainOptions& opt;
  const Launch& where;
  TrainModel& model;
  TrainData& train_data;
  TrainData* val_data;  // null without --val-data
  optim::ParamStore& store;
  optim::Window& window;
  const DataParallel& dp;
  const RunRecord& record;
  RunGuard& guard;
  optim::GraphedWindow* graphed;  // null without --cuda-graphs
  optim::LayerMonitor* layers;    // null without --layer-metrics-every
};

// The checkpoint (Note [Llama trainer checkpoint]), `at` naming where in the
// run it is taken. Rank 0 writes it: without ZeRO-1 every rank holds the same state.
void save_checkpoint(const Run& run, const std::string& at) {
  if (!run.where.main_rank()) return;
  const std::string& path = run.opt.checkpoint;
  const auto t0 = std::chrono::steady_clock::now();
  const std::map<std::string, Tensor> tensors = training_tensors(run.store, run.window);
  std::map<std::string, std::string> meta;
  run.record.write(&meta);
  meta["format"] = kFormat;
  meta["windows_closed"] = std::to_string(run.window.windows_closed());
  meta["skipped_in_a_row"] = std::to_string(run.guard.skipped_in_a_row());
  if (Generator* g = run.model.dropout_generator())
    meta["dropout.offset"] = std::to_string(g->offset());
  run.train_data.write_position(&meta);
  save_checkpoint_file(path, tensors, meta);
  std::printf("checkpoint: %s (%s; %s)\n", path.c_str(), at.c_str(), file_report(path, t0).c_str());
}

// --cuda-graphs; on the CPU it runs eagerly, with the same padded offsets
// (Note [Graphed window]). Null without --cuda-graphs.
std::unique_ptr<optim::GraphedWindow> make_graphed_window(const TrainOptions& opt,
                                                          const Launch& where,
                                                          optim::Window& window,
                                                          const TrainModel& model) {
  if (!opt.cuda_graphs) return nullptr;
  auto graphed =
      std::make_unique<optim::GraphedWindow>(window, [&model](const std::vector<Tensor>& in) {
        // Note [Documents within rows]: (tokens, targets, positions) from shards.
        if (in.size() == 3)
          return model.loss(in[0], in[1], nn::BatchLayout::documents_within_rows(in[2]));
        return model.loss(
            in[0], in[1],
            in.size() == 4 ? nn::BatchLayout::packed(in[2], in[3]) : nn::BatchLayout::full());
      });
  graphed->set_concurrent_micro_batches(static_cast<int>(opt.concurrent_micro_batches));
  graphed->set_weight_grad_branch(static_cast<int>(opt.weight_grad_branch));
  if (where.gpu)
    std::printf(
        "cuda graphs: micro-steps and close captured after one eager warm-up each; %lld "
        "micro-step(s) in flight\n",
        (long long)opt.concurrent_micro_batches);
  else
    std::printf("--cuda-graphs on the CPU: run eagerly, with the graphs' inputs\n");
  return graphed;
}

// Note [Graphed window]: the graphs read fixed-shape buffers, so the
// documents' offsets are padded to B * T + 1 entries with B * T (empty
// documents at the end, which attend to nothing).
Tensor padded_offsets(const Run& run, const Tensor& cu) {
  const int64_t BT = run.opt.micro_batch * run.opt.seq_len;
  const int64_t n = cu.numel();
  Tensor out = full({BT + 1}, static_cast<double>(BT), DType::i64, run.where.device);
  out.narrow(0, 0, n).copy_(cu.to(DType::i64));
  return out;
}

// One micro-batch: the next batch's loss, and its backward into the window.
void micro_step(Run& run) {
  Batch b = run.train_data.next();
  if (run.graphed && b.within_rows) {
    run.graphed->backward({b.inputs, b.targets, b.positions});
  } else if (run.graphed && b.cu_seqlens.defined()) {
    run.graphed->backward({b.inputs, b.targets, padded_offsets(run, b.cu_seqlens), b.positions});
  } else if (run.graphed) {
    run.graphed->backward({b.inputs, b.targets});
  } else {
    run.window.backward(run.model.loss(b.inputs, b.targets, layout_of(b)));
  }
}

// Whether the layer monitor measures window w (--layer-metrics-every).
bool measures_layers(const Run& run, int64_t w) {
  return run.layers && w % run.opt.layer_metrics_every == 0;
}

// One window: its remaining micro-steps and its close (examples/common/layer_metrics.h).
void run_window(Run& run) {
  run_one_window(run.window, run.graphed, run.layers,
                 measures_layers(run, run.window.windows_closed() + 1), run.opt.accum,
                 [&run] { micro_step(run); });
}

// The "config" object of --bench's JSON line.
JsonObject bench_config(const Run& run, int64_t window_tokens) {
  const TrainOptions& opt = run.opt;
  const bool graphs = run.graphed != nullptr && run.where.gpu;
  JsonObject c;
  c.text("model", opt.model);
  run.model.describe_json(c);
  c.integer("parameters", run.model.parameter_count())
      .integer("micro_batch", opt.micro_batch)
      .integer("seq_len", opt.seq_len)
      .integer("micro_steps", opt.accum)
      .integer("tokens_per_window", window_tokens)
      .text("dtype", dtype_name(opt.dtype))
      .text("documents", documents_name(opt))
      .boolean("activation_checkpointing", run.model.activation_checkpointing())
      .boolean("zero1", opt.zero1)
      .number("bucket_mb", opt.grad_sync.bucket_mib())
      .text("grad_transport", opt.grad_sync.transport_name())
      .boolean("close_under_forward", opt.close_under_forward.on);
  opt.fp8.describe_json(c);
  c.integer("warmup_windows", opt.bench_warmup)
      .integer("timed_windows", opt.bench_windows)
      .boolean("cuda_graphs", graphs)
      .integer("concurrent_micro_batches", opt.concurrent_micro_batches)
      .integer("weight_grad_branch", opt.weight_grad_branch);
  if (graphs) {
    c.integer("graph_memory_bytes", graph_memory(run.where.device.index).reserved_high_bytes);
  } else {
    c.null("graph_memory_bytes");
  }
  return c;
}

// --bench: warm-up windows, then timed windows, then one JSON line of timings.
void run_bench(Run& run, int64_t window_tokens, double flops_per_token, double peak) {
  const Device device = run.where.device;
  BenchTiming t;
  t.window_ms = time_windows(device, run.opt.bench_warmup, run.opt.bench_windows,
                             [&run] { run_window(run); });
  const optim::WindowReport r = run.window.report();
  t.window_tokens = window_tokens;
  t.flops_per_token = flops_per_token;
  t.peak_flops = peak;
  t.world_size = run.where.world_size();
  t.final_loss = r.loss;
  JsonObject line = bench_summary(kProgram, device, t);
  line.object("store_memory_bytes", memory_json(run.store.memory()))
      .object("config", bench_config(run, window_tokens));
  std::printf("%s\n", line.str().c_str());
  std::fflush(stdout);
  run.guard.finish(r);
}

// --metrics: rank 0 writes, appending when the run resumes, after the rows of
// the windows it computes again (Note [Metrics after resume]); the other
// ranks get a log that writes nothing.
optim::MetricsLog open_metrics(const TrainOptions& opt, int64_t start, bool main_rank) {
  if (opt.metrics.empty() || !main_rank) return {};
  if (!opt.resume.empty()) truncate_metrics_log(opt.metrics, start);
  return optim::MetricsLog(opt.metrics, !opt.resume.empty());
}

// The validation loss after window w where one is due (every --val-every
// windows, and after the last), printed; NaN where none is.
double validate(Run& run, int64_t w, int64_t end) {
  const TrainOptions& opt = run.opt;
  if (!run.val_data || !((opt.val_every > 0 && w % opt.val_every == 0) || w == end)) return NAN;
  run.val_data->reset();
  run.model.set_training(false);  // no dropout
  const double val = validation_loss(
      [&run] {
        const Batch b = run.val_data->next();
        return run.model.loss(b.inputs, b.targets, layout_of(b));
      },
      opt.val_batches, run.dp.comm.get(), run.where.device);
  run.model.set_training(true);
  std::printf("window %lld/%lld | val loss %.4f\n", (long long)w, (long long)opt.windows, val);
  return val;
}

// --checkpoint-every: due at window w before the last (whose checkpoint waits
// for the run's verdict), and never at a window whose loss is not finite.
bool periodic_checkpoint_due(const TrainOptions& opt, int64_t w, int64_t end,
                             const optim::WindowReport& r) {
  return !opt.checkpoint.empty() && opt.checkpoint_every > 0 && w % opt.checkpoint_every == 0 &&
         w < end && std::isfinite(r.loss);
}

int train(int argc, char** argv) {
  TrainOptions opt;
  if (!parse_train_options(kProgram, argc, argv, opt)) return 0;
  const Launch where = launch(opt.force_cpu);
  if (where.main_rank()) probe_train_outputs(opt);
  const Device device = where.device;
  const int ranks = where.world_size();
  resolve_window(opt, ranks);
  const DType master = opt.dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::unique_ptr<TrainModel> model = build_model(opt, where, master);
  ACCRUE_CHECK(opt.synthetic || opt.eos_id < model->vocab_size(), "--eos-id ", opt.eos_id,
               " is outside the vocabulary [0, ", model->vocab_size(), ")");
  const int64_t B = opt.micro_batch, T = opt.seq_len;
  const int64_t window_tokens = checked_product(
      {{"--micro-batch", B}, {"--seq-len", T}, {"--accum", opt.accum}, {"ranks", ranks}});

  const LossScaling scaling{opt.dtype, B * T, opt.init_scale, opt.calibrate_scale};
  const RunRecord record = run_record(opt, *model, ranks, scaling);
  Resumed resumed = read_resumed(opt, record);

  const TrainDataOptions data_options = train_data_options(opt, *model, where);
  TrainData train_data(data_options);
  const std::unique_ptr<TrainData> val_data = open_validation(opt, data_options);
  print_setup(opt, where, *model, window_tokens);

  optim::Optimizer optimizer = make_optimizer(opt, *model);
  optim::ParamStore store(model->named_parameters(), store_options(opt, where, master, optimizer));
  // Note [Window FP8 weights]: kept before the Window, whose close recasts them.
  if (opt.fp8.on) opt.fp8.keep_in(store, model->use_fp8(opt.fp8.options()));
  const DataParallel dp =
      connect_data_parallel(where, store,
                            {.zero1 = opt.zero1,
                             .bucket_mb = opt.grad_sync.bucket_mb,
                             .transport = opt.grad_sync.transport,
                             .gemm_sm_margin = static_cast<int>(opt.grad_sync.gemm_sm_margin),
                             .nccl_max_ctas = static_cast<int>(opt.grad_sync.nccl_max_ctas)});
  if (opt.grad_sync.given() && !dp.reducer)
    std::printf(
        "--bucket-mb, --grad-transport, --gemm-sm-margin, --nccl-max-ctas: one process, no "
        "gradients to sum across GPUs\n");
  optim::Window window(store, optimizer, window_options(opt, scaling), dp.reducer.get());
  std::printf("memory per rank: %s\n", store.memory().describe().c_str());

  // Note [Honest exit codes]: skips in a row are bounded, and counted across a resume.
  RunGuard guard(opt.max_skipped_windows,
                 resumed.meta.count("skipped_in_a_row")
                     ? meta_int(resumed.meta, "skipped_in_a_row", opt.resume)
                     : 0);
  const int64_t start = opt.resume.empty() ? 0
                                           : resume_run(opt, resumed.tensors, resumed.meta, store,
                                                        window, train_data, *model);

  if (!opt.gemm_tuning.empty())
    kernels::set_gemm_tuning_file(opt.gemm_tuning);  // Note [GEMM autotuning]
  // Note [Trainer synchronization]: DocumentBatches checked every token against the
  // vocabulary at open (Note [Tokens checked at open]); synthetic tokens are drawn in it.
  kernels::set_check_indices(false);
  if (opt.nvtx) set_nvtx(true);  // Note [NVTX ranges]
  const std::unique_ptr<optim::GraphedWindow> graphed =
      make_graphed_window(opt, where, window, *model);
  const std::unique_ptr<optim::LayerMonitor> layers =
      make_layer_monitor(opt.layer_metrics_every, store, optimizer, graphed != nullptr);
  Run run{.opt = opt,
          .where = where,
          .model = *model,
          .train_data = train_data,
          .val_data = val_data.get(),
          .store = store,
          .window = window,
          .dp = dp,
          .record = record,
          .guard = guard,
          .graphed = graphed.get(),
          .layers = layers.get()};
  reset_peak_memory(device);
  const double flops_per_token = model->flops_per_token(T);
  const double peak = peak_flops(opt.peak_tflops, device, device_name(device));

  if (opt.bench) {  // timing mode: the host reads nothing back until the last window
    run_bench(run, window_tokens, flops_per_token, peak);
    return 0;
  }

  optim::MetricsLog metrics = open_metrics(opt, start, where.main_rank());
  const int64_t end = opt.stop_after.value_or(opt.windows);
  optim::WindowReport last;
  double first_loss = NAN;
  WindowReporter reporter(opt.windows, window_tokens, opt.dtype, device, flops_per_token, peak,
                          ranks);
  for (int64_t w = start + 1; w <= end; ++w) {
    run_window(run);
    const optim::WindowReport r = window.report();  // the window's one host synchronization
    if (w == start + 1) first_loss = r.loss;
    last = r;
    reporter.print(w, r, optimizer.config_at(r.window - 1).groups[0].lr);
    const double val = validate(run, w, end);
    std::vector<std::pair<std::string, double>> extras = reporter.extras(val);
    if (measures_layers(run, r.window))
      add_layer_extras(*layers, r, optimizer.slot_groups(store), &extras);
    metrics.write(r, extras);
    guard.after_window(r);
    if (periodic_checkpoint_due(opt, w, end, r))
      save_checkpoint(run, "window " + std::to_string(w));
    std::fflush(stdout);
  }
  if (end <= start) {
    std::printf("nothing to do: the run is already at window %lld\n", (long long)start);
    return 0;
  }
  std::printf("loss %.4f -> %.4f over windows %lld..%lld\n", first_loss, last.loss,
              (long long)start + 1, (long long)end);
  // All digits: a resumed run must print exactly the uninterrupted run's line.
  std::printf("final: window %lld loss %.17g\n", (long long)end, last.loss);
  std::fflush(stdout);
  // Note [Honest exit codes]: a failed run keeps its last checkpoint.
  guard.finish(last, {}, end == opt.windows);
  if (!opt.checkpoint.empty()) save_checkpoint(run, "window " + std::to_string(end));
  if (opt.stop_micro_steps > 0) {  // preempted inside the next window
    for (int64_t k = window.micro_step(); k < opt.stop_micro_steps; ++k)
      micro_step(run);
    if (run.graphed) run.graphed->flush();  // Note [Concurrent micro-batches]: a group not whole
    save_checkpoint(run, "window " + std::to_string(end + 1) + ", micro-step " +
                             std::to_string(window.micro_step()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return train(argc, argv); });
}
