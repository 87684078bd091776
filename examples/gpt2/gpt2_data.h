// Where accrue_train_gpt2's micro-batches come from: this rank's part of the
// token shards (Note [Loader positions] in data/token_shards.h), or synthetic
// tokens; and the validation shards.
#pragma once

#include <memory>
#include <utility>

#include "accrue.h"
#include "accrue/data/token_shards.h"
#include "examples/common/launch.h"
#include "examples/gpt2/gpt2_options.h"

namespace accrue::examples {

class BatchSource {
 public:
  // Shards: `shards` must outlive the source.
  BatchSource(const data::TokenShards& shards, const data::LoaderOptions& options, Device device)
      : loader_(std::make_unique<data::DataLoader>(shards, options)), device_(device) {}
  // Synthetic: tokens uniform on [1, vocab) (never the all-zero batch), drawn on the device.
  BatchSource(int64_t B, int64_t T, int64_t vocab, uint64_t seed, Device device)
      : B_(B), T_(T), vocab_(vocab), gen_(seed), device_(device) {}

  // One micro-batch: inputs and targets, [B, T] each, on the device.
  std::pair<Tensor, Tensor> next();
  data::DataLoader* loader() const { return loader_.get(); }
  Generator& generator() { return gen_; }

 private:
  std::unique_ptr<data::DataLoader> loader_;
  int64_t B_ = 0, T_ = 0, vocab_ = 0;
  Generator gen_{0};
  Device device_;
};

struct TrainingData {
  std::unique_ptr<data::TokenShards> train_shards, val_shards;
  std::unique_ptr<BatchSource> source;
  std::unique_ptr<data::DataLoader> val_loader;  // null without --val-data
};

// Opens --train-data (or the synthetic source) and --val-data for this rank.
TrainingData open_data(const Gpt2Options& o, const nn::GPT2Config& config, const BatchPlan& plan,
                       const Launch& where);

// The mean validation loss over `batches` micro-batches from the start of the
// validation shards, summed over every rank (dropout off, no graph).
double validation_loss(nn::GPT2& model, data::DataLoader& loader, int64_t batches,
                       dist::Communicator* comm, Device device);

}  // namespace accrue::examples
