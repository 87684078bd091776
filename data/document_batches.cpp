#include "accrue/data/document_batches.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>

#include "accrue/data/token_shards.h"

namespace accrue::data {

static_assert(std::endian::native == std::endian::little,
              "document_batches.cpp assumes a little-endian host");

namespace {

namespace fs = std::filesystem;

std::string shard_ref(const std::string& path) {
  return "token shard '" + path + "'";
}

// Token i of a block of raw little-endian tokens.
inline int64_t token_at(const unsigned char* raw, int bytes, int64_t i) {
  if (bytes == 2) {
    uint16_t t;
    std::memcpy(&t, raw + 2 * i, 2);
    return t;
  }
  uint32_t t;
  std::memcpy(&t, raw + 4 * i, 4);
  return t;
}

}  // namespace

DocumentShard read_document_shard_header(const std::string& path) {
  const ShardInfo info = read_shard_header(path, /*allow_u32=*/true);
  DocumentShard s;
  s.path = info.path;
  s.tokens = info.tokens;
  s.token_bytes = info.token_bytes;
  return s;
}

DocumentBatches::DocumentBatches(const std::string& pattern, const DocumentOptions& options)
    : options_(options) {
  open(glob_files(pattern));
}

DocumentBatches::DocumentBatches(const std::vector<std::string>& files,
                                 const DocumentOptions& options)
    : options_(options) {
  ACCRUE_CHECK(!files.empty(), "DocumentBatches: the list of files is empty");
  open(files);
}

void DocumentBatches::open(const std::vector<std::string>& files) {
  const DocumentOptions& o = options_;
  ACCRUE_CHECK(o.batch() > 0 && o.seq_len() > 0, "DocumentBatches: batch (", o.batch(),
               ") and seq_len (", o.seq_len(), ") must be positive");
  ACCRUE_CHECK(o.world_size() >= 1 && o.rank() >= 0 && o.rank() < o.world_size(),
               "DocumentBatches: rank ", o.rank(), " of world_size ", o.world_size(),
               " is not a valid rank");
  ACCRUE_CHECK(o.vocab_size() >= 1 && o.vocab_size() <= std::numeric_limits<int32_t>::max(),
               "DocumentBatches: vocab_size ", o.vocab_size(), " must be in [1, 2^31 - 1]");
  ACCRUE_CHECK(o.eos_id() >= 0 && o.eos_id() < o.vocab_size(), "DocumentBatches: eos_id ",
               o.eos_id(), " is not in the vocabulary [0, ", o.vocab_size(), ")");
  ACCRUE_CHECK(o.pad_id() >= 0 && o.pad_id() < o.vocab_size(), "DocumentBatches: pad_id ",
               o.pad_id(), " is not in the vocabulary [0, ", o.vocab_size(), ")");
  ACCRUE_CHECK(o.batch() <= std::numeric_limits<int32_t>::max() / o.seq_len() / o.world_size(),
               "DocumentBatches: world_size * B * T = ", o.world_size(), " * ", o.batch(), " * ",
               o.seq_len(), " is larger than any shard can be");
  const bool padded = o.layout() == DocumentLayout::padded;
  // Note [Tokens checked at open]: every token of every shard, once, in blocks.
  constexpr int64_t kBlock = int64_t{1} << 20;
  for (const std::string& f : files) {
    DocumentShard s = read_document_shard_header(f);
    std::ifstream in(s.path, std::ios::binary);
    ACCRUE_CHECK(in.is_open(), shard_ref(s.path), ": cannot open the file for reading");
    in.seekg(static_cast<std::streamoff>(kShardHeaderBytes));
    std::vector<unsigned char> block(static_cast<size_t>(std::min(kBlock, s.tokens) * 4));
    if (padded && s.tokens > 0) s.doc_starts.push_back(0);
    for (int64_t at = 0; at < s.tokens; at += kBlock) {
      const int64_t n = std::min(kBlock, s.tokens - at);
      in.read(reinterpret_cast<char*>(block.data()),
              static_cast<std::streamsize>(n * s.token_bytes));
      ACCRUE_CHECK(in.good(), shard_ref(s.path), ": short read of tokens [", at, ", ", at + n, ")");
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = token_at(block.data(), s.token_bytes, i);
        ACCRUE_CHECK(t < o.vocab_size(), shard_ref(s.path), ": token ", t, " at position ", at + i,
                     " is not below the vocabulary size ", o.vocab_size(),
                     " (checked before the first step)");
        if (t == o.eos_id()) {
          ++s.eos_count;
          if (padded && at + i + 1 < s.tokens) s.doc_starts.push_back(at + i + 1);
        }
      }
    }
    ACCRUE_CHECK(s.eos_count > 0, shard_ref(s.path), ": no EOS token (id ", o.eos_id(), ") in its ",
                 s.tokens,
                 " tokens: documents need boundaries (was it written with an EOS per document?)");
    shards_.push_back(std::move(s));
  }
  // Note [Document batches]: every shard holds one whole step.
  for (size_t i = 0; i < shards_.size(); ++i) {
    const DocumentShard& s = shards_[i];
    if (padded)
      ACCRUE_CHECK(units(static_cast<int64_t>(i)) >= step_size(), shard_ref(s.path), " has ",
                   s.doc_starts.size(), " documents, fewer than the ", step_size(),
                   " (world_size * B = ", o.world_size(), " * ", o.batch(), ") one step reads");
    else
      ACCRUE_CHECK(s.tokens >= step_size() + 1, shard_ref(s.path), " has ", s.tokens,
                   " tokens, fewer than the ", step_size() + 1,
                   " (world_size * B * T + 1 = ", o.world_size(), " * ", o.batch(), " * ",
                   o.seq_len(), " + 1) one step reads");
  }
}

int64_t DocumentBatches::step_size() const {
  const DocumentOptions& o = options_;
  return o.layout() == DocumentLayout::padded ? o.world_size() * o.batch()
                                              : o.world_size() * o.batch() * o.seq_len();
}

int64_t DocumentBatches::units(int64_t shard) const {
  const DocumentShard& s = shards_[static_cast<size_t>(shard)];
  return options_.layout() == DocumentLayout::padded ? static_cast<int64_t>(s.doc_starts.size())
                                                     : s.tokens;
}

void DocumentBatches::set_position(const DocumentPosition& p) {
  const int64_t n_shards = static_cast<int64_t>(shards_.size());
  ACCRUE_CHECK(p.shard >= 0 && p.shard < n_shards, "DocumentBatches::set_position: shard ", p.shard,
               " is out of range (", n_shards, " shards)");
  const bool padded = options_.layout() == DocumentLayout::padded;
  const int64_t need = step_size() + (padded ? 0 : 1);
  ACCRUE_CHECK(p.offset >= 0 && p.offset + need <= units(p.shard),
               "DocumentBatches::set_position: offset ", p.offset, " in ",
               shard_ref(shards_[static_cast<size_t>(p.shard)].path), " (", units(p.shard),
               padded ? " documents" : " tokens", ") leaves no room for a step of ", need);
  ACCRUE_CHECK(p.epoch >= 0, "DocumentBatches::set_position: negative epoch ", p.epoch);
  position_ = p;
}

void DocumentBatches::advance() {
  const bool padded = options_.layout() == DocumentLayout::padded;
  position_.offset += step_size();
  if (position_.offset + step_size() + (padded ? 0 : 1) > units(position_.shard)) {
    position_.offset = 0;
    if (++position_.shard == static_cast<int64_t>(shards_.size())) {
      position_.shard = 0;
      ++position_.epoch;
    }
  }
}

void DocumentBatches::read_tokens(int64_t first, int64_t n, std::vector<int64_t>& out) {
  const DocumentShard& s = shards_[static_cast<size_t>(position_.shard)];
  if (open_shard_ != position_.shard) {
    file_.close();
    file_.clear();
    file_.open(s.path, std::ios::binary);
    ACCRUE_CHECK(file_.is_open(), shard_ref(s.path), ": cannot open the file for reading");
    open_shard_ = position_.shard;
  }
  raw_.resize(static_cast<size_t>(n * s.token_bytes));
  file_.seekg(static_cast<std::streamoff>(kShardHeaderBytes + s.token_bytes * first));
  file_.read(reinterpret_cast<char*>(raw_.data()), static_cast<std::streamsize>(raw_.size()));
  if (!file_.good()) {
    file_.close();
    open_shard_ = -1;
    ACCRUE_FAIL(shard_ref(s.path), ": short read of tokens [", first, ", ", first + n,
                "); was the file changed after it was validated?");
  }
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = token_at(raw_.data(), s.token_bytes, i);
    ACCRUE_CHECK(out[static_cast<size_t>(i)] < options_.vocab_size(), shard_ref(s.path), ": token ",
                 out[static_cast<size_t>(i)], " at position ", first + i,
                 " is not below the vocabulary size ", options_.vocab_size());
  }
}

DocumentBatch DocumentBatches::next_batch() {
  DocumentBatch b = options_.layout() == DocumentLayout::padded ? padded_batch() : packed_batch();
  advance();
  const Device d = options_.device();
  if (!d.is_cpu()) {
    for (Tensor* t : {&b.inputs, &b.targets, &b.cu_seqlens, &b.positions, &b.seq_lens})
      if (t->defined()) *t = t->to(d);
  }
  return b;
}

DocumentBatch DocumentBatches::packed_batch() {
  const int64_t B = options_.batch(), T = options_.seq_len(), bt = B * T;
  const int64_t eos = options_.eos_id();
  std::vector<int64_t> tok;
  read_tokens(position_.offset + options_.rank() * bt, bt + 1, tok);
  std::vector<int32_t> inputs(static_cast<size_t>(bt)), targets(static_cast<size_t>(bt));
  std::vector<int64_t> positions(static_cast<size_t>(bt)), cu{0};
  int64_t pos = 0, count = 0;
  for (int64_t i = 0; i < bt; ++i) {
    const size_t k = static_cast<size_t>(i);
    if (i > 0 && (i % T == 0 || tok[k - 1] == eos)) {
      cu.push_back(i);
      pos = 0;
    }
    inputs[k] = static_cast<int32_t>(tok[k]);
    targets[k] = tok[k] == eos ? -100 : static_cast<int32_t>(tok[k + 1]);
    count += targets[k] != -100;
    positions[k] = pos++;
  }
  cu.push_back(bt);
  DocumentBatch b;
  b.inputs = from_vector(inputs, {B, T}, DType::i32);
  b.targets = from_vector(targets, {B, T}, DType::i32);
  b.cu_seqlens = from_vector(cu, {static_cast<int64_t>(cu.size())}, DType::i64);
  b.positions = from_vector(positions, {B, T}, DType::i64);
  b.target_tokens = count;
  return b;
}

DocumentBatch DocumentBatches::padded_batch() {
  const int64_t B = options_.batch(), T = options_.seq_len();
  const DocumentShard& s = shards_[static_cast<size_t>(position_.shard)];
  std::vector<int32_t> inputs(static_cast<size_t>(B * T), static_cast<int32_t>(options_.pad_id()));
  std::vector<int32_t> targets(static_cast<size_t>(B * T), -100);
  std::vector<int64_t> lens(static_cast<size_t>(B)), tok;
  int64_t count = 0;
  for (int64_t r = 0; r < B; ++r) {
    const size_t d = static_cast<size_t>(position_.offset + options_.rank() * B + r);
    const int64_t start = s.doc_starts[d];
    const int64_t end = d + 1 < s.doc_starts.size() ? s.doc_starts[d + 1] : s.tokens;
    // The row's tokens and, when the document has one, the token after them.
    const int64_t n = std::min(end - start, T), m = std::min(end - start, T + 1);
    read_tokens(start, m, tok);
    for (int64_t j = 0; j < n; ++j) {
      inputs[static_cast<size_t>(r * T + j)] = static_cast<int32_t>(tok[static_cast<size_t>(j)]);
      if (j + 1 < m) {
        targets[static_cast<size_t>(r * T + j)] =
            static_cast<int32_t>(tok[static_cast<size_t>(j + 1)]);
        ++count;
      }
    }
    lens[static_cast<size_t>(r)] = n;
  }
  DocumentBatch b;
  b.inputs = from_vector(inputs, {B, T}, DType::i32);
  b.targets = from_vector(targets, {B, T}, DType::i32);
  b.seq_lens = from_vector(lens, {B}, DType::i64);
  b.target_tokens = count;
  return b;
}

}  // namespace accrue::data
