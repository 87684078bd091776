// Token shards in llm.c's .bin format, and the data loader that reads
// training batches from them, rank by rank.
//
//   data::TokenShards shards("data/fineweb_train_*.bin");  // validated up front
//   data::DataLoader loader(shards, data::LoaderOptions().batch(8).seq_len(1024)
//                                       .rank(rank).world_size(world).vocab_size(50257));
//   data::Batch b = loader.next_batch();           // inputs, targets: [8, 1024] i32 on the CPU
//   data::LoaderPosition saved = loader.position();  // into a checkpoint
//   ...
//   loader.set_position(saved);                      // the same batches again, in order
//
// tools/make_shards.py writes such shards from text files (byte-level tokens).
//
// Note [Token shard format]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A shard is a header of 256 little-endian int32 — [0] the magic 20240520,
// [1] the version 1, [2] the token count n, the rest unused (written as 0) —
// followed by exactly n little-endian uint16 tokens: the file is 1024 + 2n
// bytes, no more, no less. TokenShards checks every file against this before
// any batch is read, so a bad file fails at start-up, not hours into a run,
// with an error naming the file, the field, and the expected and found values.
//
// Note [Loader positions]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every rank walks the same sequence of positions (shard, offset), one per
// step: a step covers world_size * B * T consecutive tokens of the shard and
// rank r reads B * T + 1 of them from offset + r * B * T (inputs are tokens
// [0, B*T), targets [1, B*T + 1), the one extra token overlapping the next
// rank's first input only as a target). The next step starts world_size * B
// * T tokens later; when its window (+1 token) would run past the end of the
// shard, it moves to offset 0 of the next shard, and after the last shard to
// the first again with the epoch counter + 1. So within a step no two ranks
// read the same input token, across an epoch no input position is read twice,
// and the order depends only on the files, B, T and world_size. The position
// is three integers (shard, offset, epoch): restoring it replays exactly the
// batches that followed it.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
// Version 2 holds uint32 tokens (vocabularies over 65536: Note [Token shard versions]).
inline constexpr int32_t kShardVersionU32 = 2;
inline constexpr int64_t kShardHeaderBytes = 256 * 4;

// One validated shard file.
struct ShardInfo {
  std::string path;
  int64_t tokens = 0;
  int token_bytes = 2;  // 2 (version 1) or 4 (version 2)
};

// Reads one shard's header and checks it against the file's size (Note
// [Token shard format]); throws accrue::Error naming the file otherwise.
// Version 2 (uint32 tokens) only when allow_u32.
ShardInfo read_shard_header(const std::string& path, bool allow_u32 = false);

// Writes `tokens` as one shard (Note [Token shard format]), overwriting `path`:
// version 1 (uint16 tokens) or version 2 (uint32 tokens).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);
void write_token_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens);

// The regular files matching a shell glob pattern, sorted by name (byte
// order, independent of the locale). No match is an error naming the pattern.
std::vector<std::string> glob_files(const std::string& pattern);

// A fixed, validated list of shards, in order.
class TokenShards {
 public:
  // The files matching `pattern` (glob_files: sorted).
  explicit TokenShards(const std::string& pattern);
  // These files, in the given order.
  explicit TokenShards(const std::vector<std::string>& files);

  const std::vector<ShardInfo>& shards() const { return shards_; }
  size_t size() const { return shards_.size(); }
  int64_t total_tokens() const;
  // The smallest shard's token count.
  int64_t min_tokens() const;
  // "3 shards matching 'x_*.bin', 1234567 tokens"
  std::string describe() const;

  // Note [Tokens checked at open]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A token outside the vocabulary must fail the run before its first step,
  // not when a window hundreds of steps in reads it (or, from a validation
  // shard, at the final validation, before the final save). So the
  // DataLoader asks, at construction, for every token of every shard to be
  // below its vocab_size: each shard is read once, in large blocks, keeping
  // only its largest token (a loop the compiler vectorizes: well under a
  // second for a 1 GB shard on one core), and the largest is cached, so
  // further loaders over the same shards cost nothing. A shard whose largest
  // token is too large is read again to name the first bad token and its
  // position. Throws accrue::Error naming the shard, the token, its position
  // and the vocabulary size.
  void check_tokens_below(int64_t vocab_size) const;

 private:
  void validate(const std::vector<std::string>& files);

  std::string source_;  // the pattern, or "N files"
  std::vector<ShardInfo> shards_;
  // Note [Tokens checked at open]: each shard's largest token, -1 until read.
  mutable std::vector<int32_t> max_token_;
};

class LoaderOptions {
 public:
  LoaderOptions& batch(int64_t b) {
    batch_ = b;
    return *this;
  }
  LoaderOptions& seq_len(int64_t t) {
    seq_len_ = t;
    return *this;
  }
  LoaderOptions& rank(int r) {
    rank_ = r;
    return *this;
  }
  LoaderOptions& world_size(int w) {
    world_size_ = w;
    return *this;
  }
  // Every token must be < v: checked over all shards at the loader's
  // construction (Note [Tokens checked at open]) and per batch; 0: no check.
  LoaderOptions& vocab_size(int64_t v) {
    vocab_size_ = v;
    return *this;
  }
  int64_t batch() const { return batch_; }
  int64_t seq_len() const { return seq_len_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  int64_t batch_ = 1, seq_len_ = 1, vocab_size_ = 0;
  int rank_ = 0, world_size_ = 1;
};

// Note [Loader positions]: the step about to be read.
struct LoaderPosition {
  int64_t shard = 0;
  int64_t offset = 0;  // in tokens, the step's first token (rank 0's)
  int64_t epoch = 0;   // completed passes over all shards
  bool operator==(const LoaderPosition&) const = default;
};

// inputs and targets [B, T], i32, on the CPU; targets are inputs shifted by one token.
struct Batch {
  Tensor inputs;
  Tensor targets;
};

class DataLoader {
 public:
  // Checks the options, that every shard holds at least one step
  // (world_size * B * T + 1 tokens) and, with a vocab_size, that every token
  // of every shard is below it (Note [Tokens checked at open]). `shards` must
  // outlive the loader.
  DataLoader(const TokenShards& shards, const LoaderOptions& options);

  // This rank's batch at the current position, then advances it by one step.
  // Reads only the B * T + 1 tokens it needs.
  Batch next_batch();

  const LoaderPosition& position() const { return position_; }
  // Validated against these shards and options (shard index, offset in range).
  void set_position(const LoaderPosition& position);
  // Back to the first step of the first shard, epoch 0.
  void reset() { set_position({}); }

  const LoaderOptions& options() const { return options_; }
  // Tokens one step covers over all ranks: world_size * B * T.
  int64_t step_tokens() const;

 private:
  void advance();

  const TokenShards& shards_;
  LoaderOptions options_;
  LoaderPosition position_;
  std::ifstream file_;  // the shard last read from, kept open between batches
  int64_t open_shard_ = -1;
  std::vector<uint16_t> buffer_;
};

}  // namespace accrue::data
