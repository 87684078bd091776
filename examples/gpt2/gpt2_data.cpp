#include "examples/gpt2/gpt2_data.h"

#include <vector>

#include "examples/common/validation.h"

namespace accrue::examples {

std::pair<Tensor, Tensor> BatchSource::next() {
  if (loader_) {
    data::Batch b = loader_->next_batch();
    return {b.inputs.to(device_), b.targets.to(device_)};
  }
  const Tensor tokens = randint(1, vocab_, {B_, T_ + 1}, DType::i32, device_, &gen_);
  return {tokens.narrow(1, 0, T_).contiguous(), tokens.narrow(1, 1, T_).contiguous()};
}

TrainingData open_data(const Gpt2Options& o, const nn::GPT2Config& config, const BatchPlan& plan,
                       const Launch& where) {
  TrainingData d;
  const data::LoaderOptions loader_options = data::LoaderOptions()
                                                 .batch(plan.B)
                                                 .seq_len(plan.T)
                                                 .rank(where.rank.rank)
                                                 .world_size(where.world_size())
                                                 .vocab_size(config.vocab_size);
  if (o.synthetic) {
    // Each rank its own synthetic tokens.
    d.source = std::make_unique<BatchSource>(plan.B, plan.T, config.vocab_size,
                                             o.seed + 1000 + where.rank.rank, where.device);
  } else {
    d.train_shards = std::make_unique<data::TokenShards>(o.train_data);
    d.source = std::make_unique<BatchSource>(*d.train_shards, loader_options, where.device);
  }
  if (!o.val_data.empty()) {
    d.val_shards = std::make_unique<data::TokenShards>(o.val_data);
    d.val_loader = std::make_unique<data::DataLoader>(*d.val_shards, loader_options);
  }
  return d;
}

double validation_loss(nn::GPT2& model, data::DataLoader& loader, int64_t batches,
                       dist::Communicator* comm, Device device) {
  model.eval();
  loader.reset();  // the same tokens every time, so the numbers compare
  const double loss = examples::validation_loss(
      [&] {
        data::Batch b = loader.next_batch();
        return model.loss(b.inputs.to(device), b.targets.to(device));
      },
      batches, comm, device);
  model.train();
  return loss;
}

}  // namespace accrue::examples
