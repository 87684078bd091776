// Batches of whole documents from token shards: packed (documents laid end
// to end, with the layout attention and rotary embeddings need) or
// right-padded (one document per row).
//
//   data::DocumentBatches docs("data/train_*.bin", data::DocumentOptions()
//                                  .batch(8).seq_len(2048).eos_id(128001).vocab_size(128256));
//   data::DocumentBatch b = docs.next_batch();
//   auto layout = nn::BatchLayout::packed(b.cu_seqlens.to(dev), b.positions.to(dev));
//   Loss l = model.loss(b.inputs.to(dev), b.targets.to(dev), layout);
//
// tools/make_shards.py writes such shards (an EOS after every document).
//
// Note [Token shard versions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The header of Note [Token shard format] with version 1 holds uint16
// tokens, with version 2 (llm.c's choice for Llama 3) little-endian uint32
// tokens: the file is then 1024 + 4n bytes. A vocabulary over 65536 needs
// version 2. DocumentBatches reads both; DataLoader (GPT-2) reads version 1
// only and refuses a version 2 file by its version.
//
// Note [Document batches]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A document ends after each EOS token (the EOS is its last token); the
// tokens after a shard's last EOS are one more document, cut short by the
// shard's end. Every shard must hold an EOS (checked at open, with every
// token below vocab_size: Note [Tokens checked at open]).
//  - packed: a step reads world_size * B * T consecutive tokens, rank r
//    B * T + 1 of them from offset + r * B * T, walking the shards as Note
//    [Loader positions] says (position = shard, token offset, epoch). Row b
//    holds tokens [b * T, (b + 1) * T): the pieces of documents it contains
//    are its documents for attention: cu_seqlens (i64 [N + 1]) is 0, every
//    row start, every token after an EOS, and B * T, and positions (i64
//    [B, T]) restart at 0 at each of them (Note [Llama batch layouts]). A
//    document cut by a row or window boundary continues as a new piece from
//    position 0. The target of token i is token i + 1 of the stream unless
//    token i is an EOS: then -100, so no target crosses into another
//    document (a piece cut by a row end still predicts its own document's
//    next token).
//  - padded: a step reads world_size * B documents (position = shard,
//    document index, epoch; a shard with fewer documents left moves on to
//    the next, as above). Row b of rank r is document r * B + b, its first
//    min(length, T) tokens, then pad_id; seq_lens (i64 [B]) holds those
//    counts; token j's target is the document's token j + 1 while the
//    document has one, -100 otherwise (the EOS, padding).
// The order depends only on the files and the options; restoring a position
// replays the batches that followed it. Batches are built on the host and
// copied to the options' device once per tensor: nothing is read back.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"
#include "accrue/data/token_shards.h"

namespace accrue::data {

// A validated shard of either version (Note [Token shard versions]).
struct DocumentShard {
  std::string path;
  int64_t tokens = 0;
  int token_bytes = 2;  // 2 (version 1) or 4 (version 2)
  int64_t eos_count = 0;
  std::vector<int64_t> doc_starts;  // padded layout only: every document's first token
};

// Reads a version 1 or 2 header and checks it against the file's size.
DocumentShard read_document_shard_header(const std::string& path);

enum class DocumentLayout { packed, padded };

class DocumentOptions {
 public:
  DocumentOptions& batch(int64_t b) {
    batch_ = b;
    return *this;
  }
  DocumentOptions& seq_len(int64_t t) {
    seq_len_ = t;
    return *this;
  }
  // Required: a document ends after each token eos_id.
  DocumentOptions& eos_id(int64_t id) {
    eos_id_ = id;
    return *this;
  }
  // Required: every token must be below it (checked at open).
  DocumentOptions& vocab_size(int64_t v) {
    vocab_size_ = v;
    return *this;
  }
  // Padded layout: the token past a document's end (default: eos_id).
  DocumentOptions& pad_id(int64_t id) {
    pad_id_ = id;
    return *this;
  }
  DocumentOptions& layout(DocumentLayout l) {
    layout_ = l;
    return *this;
  }
  DocumentOptions& rank(int r) {
    rank_ = r;
    return *this;
  }
  DocumentOptions& world_size(int w) {
    world_size_ = w;
    return *this;
  }
  // Where the batch's tensors are copied (default: the CPU).
  DocumentOptions& device(Device d) {
    device_ = d;
    return *this;
  }
  int64_t batch() const { return batch_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t pad_id() const { return pad_id_ < 0 ? eos_id_ : pad_id_; }
  DocumentLayout layout() const { return layout_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Device device() const { return device_; }

 private:
  int64_t batch_ = 1, seq_len_ = 1, eos_id_ = -1, vocab_size_ = 0, pad_id_ = -1;
  DocumentLayout layout_ = DocumentLayout::packed;
  int rank_ = 0, world_size_ = 1;
  Device device_ = Device::cpu();
};

// Note [Document batches]: the step about to be read.
struct DocumentPosition {
  int64_t shard = 0;
  int64_t offset = 0;  // packed: the step's first token; padded: its first document
  int64_t epoch = 0;
  bool operator==(const DocumentPosition&) const = default;
};

// inputs, targets: i32 [B, T]. Packed: cu_seqlens i64 [N + 1], positions i64
// [B, T] (as BatchLayout::packed takes them). Padded: seq_lens i64 [B] (as
// BatchLayout::padded). target_tokens: the targets that are not -100, counted
// on the host.
struct DocumentBatch {
  Tensor inputs;
  Tensor targets;
  Tensor cu_seqlens;
  Tensor positions;
  Tensor seq_lens;
  int64_t target_tokens = 0;
};

class DocumentBatches {
 public:
  // The files matching `pattern` (sorted), or these files in order. Checks
  // the options, every shard's header, tokens and EOS, and that every shard
  // holds one step (Note [Document batches]).
  DocumentBatches(const std::string& pattern, const DocumentOptions& options);
  DocumentBatches(const std::vector<std::string>& files, const DocumentOptions& options);

  // This rank's batch at the current position, then one step on.
  DocumentBatch next_batch();

  const DocumentPosition& position() const { return position_; }
  void set_position(const DocumentPosition& position);
  void reset() { set_position({}); }

  const DocumentOptions& options() const { return options_; }
  const std::vector<DocumentShard>& shards() const { return shards_; }
  // What one step covers over all ranks: tokens (packed) or documents (padded).
  int64_t step_size() const;

 private:
  void open(const std::vector<std::string>& files);
  int64_t units(int64_t shard) const;  // tokens or documents of a shard
  void advance();
  // n tokens of the current shard from `first`, as int64.
  void read_tokens(int64_t first, int64_t n, std::vector<int64_t>& out);
  DocumentBatch packed_batch();
  DocumentBatch padded_batch();

  DocumentOptions options_;
  std::vector<DocumentShard> shards_;
  DocumentPosition position_;
  std::ifstream file_;
  int64_t open_shard_ = -1;
  std::vector<unsigned char> raw_;
};

}  // namespace accrue::data
