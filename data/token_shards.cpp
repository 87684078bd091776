#include "accrue/data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

namespace accrue::data {

// The format is little-endian and so is every host accrue builds for: header
// ints and tokens are read and written as raw bytes.
static_assert(std::endian::native == std::endian::little,
              "token_shards.cpp assumes a little-endian host");

namespace {

namespace fs = std::filesystem;

// "token shard 'path'": the prefix of every per-file error.
std::string shard_ref(const std::string& path) {
  return "token shard '" + path + "'";
}

uint64_t regular_file_size(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  ACCRUE_CHECK(!ec && fs::exists(status), shard_ref(path), ": no such file");
  ACCRUE_CHECK(fs::is_regular_file(status), shard_ref(path), ": not a regular file");
  const uint64_t size = fs::file_size(path, ec);
  ACCRUE_CHECK(!ec, shard_ref(path), ": cannot read the file size: ", ec.message());
  return size;
}

}  // namespace

ShardInfo read_shard_header(const std::string& path, bool allow_u32) {
  const uint64_t size = regular_file_size(path);
  ACCRUE_CHECK(size >= static_cast<uint64_t>(kShardHeaderBytes), shard_ref(path),
               ": truncated header: the file has ", size, " bytes, the header alone needs ",
               kShardHeaderBytes);
  std::ifstream in(path, std::ios::binary);
  ACCRUE_CHECK(in.is_open(), shard_ref(path), ": cannot open the file for reading");
  int32_t header[kShardHeaderBytes / 4];
  in.read(reinterpret_cast<char*>(header), kShardHeaderBytes);
  ACCRUE_CHECK(in.good(), shard_ref(path), ": cannot read the ", kShardHeaderBytes, "-byte header");
  ACCRUE_CHECK(header[0] == kShardMagic, shard_ref(path), ": bad magic: expected ", kShardMagic,
               ", found ", header[0], " (not an llm.c token shard)");
  const bool u32 = allow_u32 && header[1] == kShardVersionU32;
  ACCRUE_CHECK(header[1] == kShardVersion || u32, shard_ref(path),
               ": unsupported version: expected ", kShardVersion, " (uint16 tokens)",
               allow_u32 ? " or 2 (uint32 tokens)" : "", ", found ", header[1]);
  const int bytes = u32 ? 4 : 2;
  const int64_t count = header[2];
  ACCRUE_CHECK(count >= 0, shard_ref(path), ": negative token count ", count, " in the header");
  const uint64_t data_bytes = size - kShardHeaderBytes;
  ACCRUE_CHECK(data_bytes % bytes == 0, shard_ref(path), ": odd byte count: ", data_bytes,
               " bytes after the header are not a whole number of uint", 8 * bytes, " tokens");
  const uint64_t expected = kShardHeaderBytes + bytes * static_cast<uint64_t>(count);
  ACCRUE_CHECK(size == expected, shard_ref(path), ": the header says ", count,
               " tokens, so the file should be ", kShardHeaderBytes, " + ", bytes, " * ", count,
               " = ", expected, " bytes, but it has ", size, " (", data_bytes / bytes, " tokens; ",
               size < expected ? "truncated" : "trailing bytes", ")");
  return {path, count, bytes};
}

namespace {

template <class Token>
void write_shard(const char* what, const std::string& path, int32_t version,
                 const std::vector<Token>& tokens) {
  ACCRUE_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), what,
               "('", path, "'): ", tokens.size(), " tokens do not fit the header's int32 count");
  int32_t header[kShardHeaderBytes / 4] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ACCRUE_CHECK(out.is_open(), what, "('", path, "'): cannot open the file for writing");
  out.write(reinterpret_cast<const char*>(header), kShardHeaderBytes);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(Token)));
  out.close();
  ACCRUE_CHECK(out.good(), what, "('", path, "'): writing ",
               kShardHeaderBytes + sizeof(Token) * tokens.size(), " bytes failed");
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard("write_token_shard", path, kShardVersion, tokens);
}

void write_token_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_shard("write_token_shard_u32", path, kShardVersionU32, tokens);
}

std::vector<std::string> glob_files(const std::string& pattern) {
  ACCRUE_CHECK(!pattern.empty(), "glob_files: the pattern is empty");
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i)
      files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  ACCRUE_CHECK(rc != GLOB_NOMATCH, "glob_files: no file matches '", pattern, "'");
  ACCRUE_CHECK(rc == 0, "glob_files: '", pattern,
               "': ", rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory");
  // glob(3) sorts by the locale's collation; byte order is the same everywhere.
  std::sort(files.begin(), files.end());
  return files;
}

TokenShards::TokenShards(const std::string& pattern) : source_("'" + pattern + "'") {
  validate(glob_files(pattern));
}

TokenShards::TokenShards(const std::vector<std::string>& files)
    : source_(std::to_string(files.size()) + " files") {
  ACCRUE_CHECK(!files.empty(), "TokenShards: the list of files is empty");
  validate(files);
}

void TokenShards::validate(const std::vector<std::string>& files) {
  for (const std::string& f : files)
    shards_.push_back(read_shard_header(f));
  max_token_.assign(shards_.size(), -1);
}

namespace {

// Calls visit(block, first_token_index) over the shard's tokens in blocks.
template <class Visit>
void for_each_block(const ShardInfo& shard, Visit&& visit) {
  constexpr int64_t kBlock = int64_t{1} << 21;  // tokens: 4 MiB a read
  std::ifstream in(shard.path, std::ios::binary);
  ACCRUE_CHECK(in.is_open(), shard_ref(shard.path), ": cannot open the file for reading");
  in.seekg(static_cast<std::streamoff>(kShardHeaderBytes));
  std::vector<uint16_t> block(static_cast<size_t>(std::min(kBlock, shard.tokens)));
  for (int64_t at = 0; at < shard.tokens; at += kBlock) {
    const int64_t n = std::min(kBlock, shard.tokens - at);
    in.read(reinterpret_cast<char*>(block.data()), static_cast<std::streamsize>(2 * n));
    ACCRUE_CHECK(in.good(), shard_ref(shard.path), ": short read of tokens [", at, ", ", at + n,
                 "); was the file changed after it was validated?");
    if (!visit(block.data(), n, at)) return;
  }
}

}  // namespace

void TokenShards::check_tokens_below(int64_t vocab_size) const {
  for (size_t s = 0; s < shards_.size(); ++s) {
    const ShardInfo& shard = shards_[s];
    if (max_token_[s] < 0) {
      uint16_t largest = 0;
      for_each_block(shard, [&](const uint16_t* t, int64_t n, int64_t) {
        uint16_t m = 0;
        for (int64_t i = 0; i < n; ++i)  // vectorized: a max over uint16 lanes
          m = std::max(m, t[i]);
        largest = std::max(largest, m);
        return true;
      });
      max_token_[s] = largest;
    }
    if (max_token_[s] < vocab_size) continue;
    // Note [Tokens checked at open]: the first bad token, named with its position.
    for_each_block(shard, [&](const uint16_t* t, int64_t n, int64_t at) {
      for (int64_t i = 0; i < n; ++i)
        ACCRUE_CHECK(t[i] < vocab_size, shard_ref(shard.path), ": token ", t[i], " at position ",
                     at + i, " is not below the vocabulary size ", vocab_size,
                     " (checked before the first step)");
      return true;
    });
  }
}

int64_t TokenShards::total_tokens() const {
  int64_t n = 0;
  for (const ShardInfo& s : shards_)
    n += s.tokens;
  return n;
}

int64_t TokenShards::min_tokens() const {
  int64_t n = std::numeric_limits<int64_t>::max();
  for (const ShardInfo& s : shards_)
    n = std::min(n, s.tokens);
  return n;
}

std::string TokenShards::describe() const {
  std::ostringstream os;
  os << shards_.size() << (shards_.size() == 1 ? " shard" : " shards") << " ("
     << (source_[0] == '\'' ? "matching " : "") << source_ << "), " << total_tokens() << " tokens";
  return os.str();
}

DataLoader::DataLoader(const TokenShards& shards, const LoaderOptions& options)
    : shards_(shards), options_(options) {
  const LoaderOptions& o = options_;
  ACCRUE_CHECK(o.batch() > 0 && o.seq_len() > 0, "DataLoader: batch (", o.batch(),
               ") and seq_len (", o.seq_len(), ") must be positive");
  ACCRUE_CHECK(o.world_size() >= 1 && o.rank() >= 0 && o.rank() < o.world_size(),
               "DataLoader: rank ", o.rank(), " of world_size ", o.world_size(),
               " is not a valid rank");
  ACCRUE_CHECK(o.vocab_size() >= 0 && o.vocab_size() <= 65536, "DataLoader: vocab_size ",
               o.vocab_size(), " must be in [1, 65536] for uint16 tokens (0: no check)");
  ACCRUE_CHECK(o.batch() <= std::numeric_limits<int32_t>::max() / o.seq_len() / o.world_size(),
               "DataLoader: world_size * B * T = ", o.world_size(), " * ", o.batch(), " * ",
               o.seq_len(), " is larger than any shard can be");
  // Note [Loader positions]: every shard must hold one whole step.
  for (const ShardInfo& s : shards_.shards())
    ACCRUE_CHECK(s.tokens >= step_tokens() + 1, shard_ref(s.path), " has ", s.tokens,
                 " tokens, fewer than the ", step_tokens() + 1,
                 " (world_size * B * T + 1 = ", o.world_size(), " * ", o.batch(), " * ",
                 o.seq_len(), " + 1) one step reads");
  if (o.vocab_size() > 0) shards_.check_tokens_below(o.vocab_size());
  buffer_.resize(static_cast<size_t>(o.batch() * o.seq_len() + 1));
}

int64_t DataLoader::step_tokens() const {
  return options_.world_size() * options_.batch() * options_.seq_len();
}

void DataLoader::set_position(const LoaderPosition& p) {
  const int64_t n_shards = static_cast<int64_t>(shards_.size());
  ACCRUE_CHECK(p.shard >= 0 && p.shard < n_shards, "DataLoader::set_position: shard ", p.shard,
               " is out of range (", n_shards, " shards)");
  const int64_t tokens = shards_.shards()[p.shard].tokens;
  ACCRUE_CHECK(p.offset >= 0 && p.offset + step_tokens() + 1 <= tokens,
               "DataLoader::set_position: offset ", p.offset, " in ",
               shard_ref(shards_.shards()[p.shard].path), " (", tokens,
               " tokens) leaves no room for a step of ", step_tokens() + 1, " tokens");
  ACCRUE_CHECK(p.epoch >= 0, "DataLoader::set_position: negative epoch ", p.epoch);
  position_ = p;
}

void DataLoader::advance() {
  position_.offset += step_tokens();
  const int64_t tokens = shards_.shards()[position_.shard].tokens;
  if (position_.offset + step_tokens() + 1 > tokens) {
    position_.offset = 0;
    if (++position_.shard == static_cast<int64_t>(shards_.size())) {
      position_.shard = 0;
      ++position_.epoch;
    }
  }
}

Batch DataLoader::next_batch() {
  const LoaderOptions& o = options_;
  const ShardInfo& shard = shards_.shards()[position_.shard];
  if (open_shard_ != position_.shard) {
    file_.close();
    file_.clear();
    file_.open(shard.path, std::ios::binary);
    ACCRUE_CHECK(file_.is_open(), shard_ref(shard.path), ": cannot open the file for reading");
    open_shard_ = position_.shard;
  }
  // This rank's window: B * T + 1 tokens from offset + rank * B * T.
  const int64_t bt = o.batch() * o.seq_len();
  const int64_t first = position_.offset + o.rank() * bt;
  file_.seekg(static_cast<std::streamoff>(kShardHeaderBytes + 2 * first));
  file_.read(reinterpret_cast<char*>(buffer_.data()),
             static_cast<std::streamsize>(buffer_.size() * sizeof(uint16_t)));
  if (!file_.good()) {
    // Drop the handle so a later call reopens the file rather than reusing a failed stream.
    file_.close();
    open_shard_ = -1;
    ACCRUE_FAIL(shard_ref(shard.path), ": short read of tokens [", first, ", ", first + bt + 1,
                "); was the file changed after it was validated?");
  }
  if (o.vocab_size() > 0)
    for (size_t i = 0; i < buffer_.size(); ++i)
      ACCRUE_CHECK(buffer_[i] < o.vocab_size(), shard_ref(shard.path), ": token ", buffer_[i],
                   " at position ", first + static_cast<int64_t>(i),
                   " is not below the vocabulary size ", o.vocab_size());
  std::vector<int32_t> inputs(buffer_.begin(), buffer_.end() - 1);
  std::vector<int32_t> targets(buffer_.begin() + 1, buffer_.end());
  advance();
  return {from_vector(inputs, {o.batch(), o.seq_len()}, DType::i32),
          from_vector(targets, {o.batch(), o.seq_len()}, DType::i32)};
}

}  // namespace accrue::data
