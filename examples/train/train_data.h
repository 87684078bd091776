// Where accrue_train's micro-batches come from, for training and validation:
// token shards read as packed documents (the Llama family, Note [Document
// batches]) or as contiguous rows (GPT-2, Note [GPT-2 rows]), or a synthetic
// stream; and their position, which a checkpoint keeps.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "accrue.h"
#include "accrue/data/document_batches.h"
#include "accrue/data/token_shards.h"
#include "examples/common/train_model.h"

namespace accrue::examples {

// One micro-batch: inputs and targets [B, T], and for packed documents their
// offsets and positions (Note [Llama batch layouts]); undefined for full rows.
struct Batch {
  Tensor inputs, targets, cu_seqlens, positions;
  // Note [Documents within rows] (nn/llama.h): every row starts a document
  // (data::DocumentBatches), so attention needs only the positions.
  bool within_rows = false;
};

nn::BatchLayout layout_of(const Batch& b);

struct TrainDataOptions {
  std::string path;        // token shards; empty: the synthetic stream
  bool packed = true;      // the model reads packed documents (else full rows)
  bool full_rows = false;  // synthetic: one causal sequence per row (else packed documents)
  int64_t batch = 1, seq_len = 2, eos_id = 0, vocab = 1;
  int rank = 0, world_size = 1;
  Device device = Device::cpu();
  SyntheticRows rows;           // the synthetic tokens' range and dtype
  uint64_t synthetic_seed = 0;  // each rank its own (Note [Synthetic rows])
};

class TrainData {
 public:
  explicit TrainData(const TrainDataOptions& o);
  Batch next();
  // Shards from their start again (validation reads the same batches each time).
  void reset();
  // The position a checkpoint keeps, and restores.
  void write_position(std::map<std::string, std::string>* meta) const;
  void read_position(const std::map<std::string, std::string>& meta, const std::string& file);

 private:
  TrainDataOptions o_;
  std::unique_ptr<data::TokenShards> shards_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<data::DocumentBatches> docs_;
  Generator synth_;
};

}  // namespace accrue::examples
