// accrue_train's data (examples/train/train_data.h).
#include "examples/train/train_data.h"

#include <algorithm>
#include <vector>

#include "examples/common/checkpoint_file.h"

namespace accrue::examples {

namespace {

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

// --synthetic-documents full: random tokens drawn on the device (no host copy
// to wait for, Note [Trainer synchronization]), each row one causal sequence;
// no offsets, so attention takes its plain causal path.
Batch synthetic_full_batch(int64_t B, int64_t T, int64_t vocab, const SyntheticRows& rows,
                           Generator& gen, Device device) {
  const Tensor t = randint(rows.low, vocab, {B, T + 1}, rows.dtype, device, &gen);
  return {t.narrow(1, 0, T).contiguous(), t.narrow(1, 1, T).contiguous(), Tensor(), Tensor()};
}

}  // namespace

nn::BatchLayout layout_of(const Batch& b) {
  if (b.within_rows) return nn::BatchLayout::documents_within_rows(b.positions);
  return b.cu_seqlens.defined() ? nn::BatchLayout::packed(b.cu_seqlens, b.positions)
                                : nn::BatchLayout::full();
}

TrainData::TrainData(const TrainDataOptions& o) : o_(o), synth_(o.synthetic_seed) {
  if (o.path.empty()) return;
  if (!o.packed) {
    shards_ = std::make_unique<data::TokenShards>(o.path);
    loader_ = std::make_unique<data::DataLoader>(*shards_, data::LoaderOptions()
                                                               .batch(o.batch)
                                                               .seq_len(o.seq_len)
                                                               .rank(o.rank)
                                                               .world_size(o.world_size)
                                                               .vocab_size(o.vocab));
  } else {
    docs_ = std::make_unique<data::DocumentBatches>(o.path, data::DocumentOptions()
                                                                .batch(o.batch)
                                                                .seq_len(o.seq_len)
                                                                .eos_id(o.eos_id)
                                                                .vocab_size(o.vocab)
                                                                .rank(o.rank)
                                                                .world_size(o.world_size)
                                                                .device(o.device));
  }
}

Batch TrainData::next() {
  if (docs_) {
    data::DocumentBatch b = docs_->next_batch();
    return {b.inputs, b.targets, b.cu_seqlens, b.positions, /*within_rows=*/true};
  }
  if (loader_) {
    data::Batch b = loader_->next_batch();
    return {b.inputs.to(o_.device), b.targets.to(o_.device), Tensor(), Tensor()};
  }
  if (o_.full_rows)
    return synthetic_full_batch(o_.batch, o_.seq_len, o_.vocab, o_.rows, synth_, o_.device);
  return synthetic_batch(o_.batch, o_.seq_len, o_.vocab, synth_, o_.device);
}

void TrainData::reset() {
  if (loader_) loader_->reset();
  if (docs_) docs_->reset();
}

void TrainData::write_position(std::map<std::string, std::string>* meta) const {
  auto put = [&](int64_t shard, int64_t offset, int64_t epoch) {
    (*meta)["data.shard"] = std::to_string(shard);
    (*meta)["data.offset"] = std::to_string(offset);
    (*meta)["data.epoch"] = std::to_string(epoch);
  };
  if (docs_) {
    put(docs_->position().shard, docs_->position().offset, docs_->position().epoch);
  } else if (loader_) {
    put(loader_->position().shard, loader_->position().offset, loader_->position().epoch);
  } else {
    (*meta)["synthetic.offset"] = std::to_string(synth_.offset());
  }
}

void TrainData::read_position(const std::map<std::string, std::string>& meta,
                              const std::string& file) {
  if (docs_ || loader_) {
    const int64_t shard = meta_int(meta, "data.shard", file),
                  offset = meta_int(meta, "data.offset", file),
                  epoch = meta_int(meta, "data.epoch", file);
    if (docs_) docs_->set_position({shard, offset, epoch});
    if (loader_) loader_->set_position({shard, offset, epoch});
  } else {
    // Every rank draws as many numbers per batch, so rank 0's offset is every rank's.
    synth_.set_state(synth_.seed(),
                     static_cast<uint64_t>(meta_int(meta, "synthetic.offset", file)));
  }
}

}  // namespace accrue::examples
