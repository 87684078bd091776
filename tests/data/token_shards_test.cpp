// Token shards: files written here are read back exactly; ranks read disjoint
// tokens; order is deterministic, resumable from a saved position and wraps
// around into the next epoch; every malformed file is an error naming it.
#include "accrue/data/token_shards.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "tests/test_util.h"

namespace accrue::data {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TokenShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("accrue_token_shards_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Shards whose tokens are first, first + 1, ...: every token names its
  // position in the data set, so a batch shows exactly where it was read.
  std::vector<std::string> write_counting_shards(const std::vector<int64_t>& sizes, int first = 0) {
    std::vector<std::string> files;
    int next = first;
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<uint16_t> tokens;
      for (int64_t i = 0; i < sizes[s]; ++i)
        tokens.push_back(static_cast<uint16_t>(next++));
      files.push_back(path("train_" + std::to_string(s) + ".bin"));
      write_token_shard(files.back(), tokens);
    }
    return files;
  }

  fs::path dir_;
};

// A header with the given fields followed by `data_bytes` bytes of tokens.
void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                     int64_t data_bytes, int64_t header_bytes = kShardHeaderBytes) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header.data()), header_bytes);
  std::vector<char> data(static_cast<size_t>(data_bytes), 1);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<int32_t> values(const Tensor& t) {
  return t.to_vector<int32_t>();
}

TEST_F(TokenShardsTest, WrittenShardHasTheLlmcLayout) {
  write_token_shard(path("a.bin"), {7, 65535, 0, 300});
  std::ifstream in(path("a.bin"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 1024u + 8u);
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 4);
  for (int i = 3; i < 256; ++i)
    EXPECT_EQ(header[i], 0) << i;
  uint16_t tokens[4];
  std::memcpy(tokens, bytes.data() + 1024, sizeof(tokens));
  EXPECT_EQ(tokens[0], 7);
  EXPECT_EQ(tokens[1], 65535);
  EXPECT_EQ(tokens[2], 0);
  EXPECT_EQ(tokens[3], 300);
  EXPECT_EQ(read_shard_header(path("a.bin")).tokens, 4);
}

TEST_F(TokenShardsTest, GlobIsSortedAndListKeepsItsOrder) {
  write_token_shard(path("s_b.bin"), std::vector<uint16_t>(10, 1));
  write_token_shard(path("s_a.bin"), std::vector<uint16_t>(20, 2));
  write_token_shard(path("s_c.bin"), std::vector<uint16_t>(30, 3));
  fs::create_directories(path("s_dir.bin"));  // a matching directory is not a shard
  const TokenShards shards(path("s_?.bin"));
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards.shards()[0].path, path("s_a.bin"));
  EXPECT_EQ(shards.shards()[1].path, path("s_b.bin"));
  EXPECT_EQ(shards.shards()[2].path, path("s_c.bin"));
  EXPECT_EQ(shards.shards()[0].tokens, 20);
  EXPECT_EQ(shards.total_tokens(), 60);
  EXPECT_EQ(shards.min_tokens(), 10);
  EXPECT_THAT(shards.describe(), ::testing::HasSubstr("3 shards"));
  EXPECT_THAT(shards.describe(), ::testing::HasSubstr("60 tokens"));

  const TokenShards listed({path("s_c.bin"), path("s_a.bin")});
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed.shards()[0].path, path("s_c.bin"));
  EXPECT_EQ(listed.shards()[1].path, path("s_a.bin"));
}

TEST_F(TokenShardsTest, BatchesAreConsecutiveAndTargetsShiftedByOne) {
  const auto files = write_counting_shards({100});
  const TokenShards shards(files);
  DataLoader loader(shards, LoaderOptions().batch(2).seq_len(5));
  for (int step = 0; step < 3; ++step) {
    const Batch b = loader.next_batch();
    ASSERT_EQ(b.inputs.shape(), (Shape{2, 5}));
    ASSERT_EQ(b.targets.shape(), (Shape{2, 5}));
    EXPECT_EQ(b.inputs.dtype(), DType::i32);
    EXPECT_EQ(b.targets.dtype(), DType::i32);
    EXPECT_EQ(b.inputs.device(), Device::cpu());
    const auto in = values(b.inputs), tg = values(b.targets);
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(in[i], step * 10 + i);
      EXPECT_EQ(tg[i], step * 10 + i + 1);
    }
  }
  EXPECT_EQ(loader.position(), (LoaderPosition{0, 30, 0}));
}

// Every step, the ranks' inputs are disjoint, and over an epoch no input
// position is read twice; rank r reads from offset + r * B * T.
void check_disjoint(const std::vector<std::string>& files, int world, int64_t steps) {
  const TokenShards shards(files);
  const int64_t B = 2, T = 4;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::make_unique<DataLoader>(
        shards, LoaderOptions().batch(B).seq_len(T).rank(r).world_size(world)));
  std::set<int32_t> epoch_inputs;
  for (int64_t step = 0; step < steps; ++step) {
    const LoaderPosition p = ranks[0]->position();
    std::set<int32_t> step_inputs;
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(ranks[r]->position(), p) << "rank " << r << " left the common step sequence";
      const auto in = values(ranks[r]->next_batch().inputs);
      // Counting shards: shard s starts at the token value sum of earlier sizes.
      int64_t base = 0;
      for (int64_t s = 0; s < p.shard; ++s)
        base += shards.shards()[s].tokens;
      EXPECT_EQ(in[0], base + p.offset + r * B * T) << "rank " << r << " step " << step;
      for (int32_t v : in) {
        EXPECT_TRUE(step_inputs.insert(v).second)
            << "token " << v << " read by two ranks in step " << step;
        EXPECT_TRUE(epoch_inputs.insert(v).second) << "token " << v << " read twice";
      }
    }
  }
}

TEST_F(TokenShardsTest, RanksReadDisjointTokensWorldTwo) {
  // 2 ranks x 8 tokens = 16 per step: 100 -> 6 steps, 50 -> 3 steps.
  check_disjoint(write_counting_shards({100, 50}), 2, 9);
}

TEST_F(TokenShardsTest, RanksReadDisjointTokensWorldThree) {
  // 3 ranks x 8 tokens = 24 per step: 100 -> 4 steps, 49 -> 2, 73 -> 3.
  check_disjoint(write_counting_shards({100, 49, 73}), 3, 9);
}

TEST_F(TokenShardsTest, DeterministicAcrossLoaders) {
  const auto files = write_counting_shards({90, 70, 55});
  const TokenShards a(path("train_*.bin")), b(files);
  DataLoader la(a, LoaderOptions().batch(3).seq_len(4).rank(1).world_size(2));
  DataLoader lb(b, LoaderOptions().batch(3).seq_len(4).rank(1).world_size(2));
  for (int step = 0; step < 20; ++step) {
    const Batch x = la.next_batch(), y = lb.next_batch();
    EXPECT_EQ(values(x.inputs), values(y.inputs)) << step;
    EXPECT_EQ(values(x.targets), values(y.targets)) << step;
  }
}

TEST_F(TokenShardsTest, ResumesFromASavedPosition) {
  const TokenShards shards(write_counting_shards({60, 45, 80}));
  const LoaderOptions options = LoaderOptions().batch(2).seq_len(3).rank(1).world_size(2);
  DataLoader first(shards, options);
  for (int i = 0; i < 11; ++i)
    first.next_batch();
  const LoaderPosition saved = first.position();
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 15; ++i)
    expected.push_back(values(first.next_batch().targets));

  DataLoader resumed(shards, options);
  resumed.set_position(saved);
  EXPECT_EQ(resumed.position(), saved);
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(values(resumed.next_batch().targets), expected[i]) << i;
  EXPECT_EQ(resumed.position(), first.position());

  resumed.reset();
  EXPECT_EQ(resumed.position(), LoaderPosition{});
}

TEST_F(TokenShardsTest, WrapsToTheFirstShardWithTheNextEpoch) {
  // B*T = 6, world 1: shard 0 (20 tokens) gives steps at 0, 6, 12 (12 + 6 + 1 > 20 ends it
  // after that); shard 1 (13 tokens) gives 0, 6.
  const TokenShards shards(write_counting_shards({20, 13}));
  DataLoader loader(shards, LoaderOptions().batch(2).seq_len(3));
  const std::vector<LoaderPosition> expected = {{0, 0, 0}, {0, 6, 0}, {0, 12, 0}, {1, 0, 0},
                                                {1, 6, 0}, {0, 0, 1}, {0, 6, 1}};
  std::vector<int32_t> first_batch;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(loader.position(), expected[i]) << "step " << i;
    const auto in = values(loader.next_batch().inputs);
    if (i == 0) first_batch = in;
    if (i == 3) {
      EXPECT_EQ(in[0], 20);  // shard 1's first token
    }
    if (i == 5) {
      EXPECT_EQ(in, first_batch);
    }
  }
}

// Note [Tokens checked at open]: the loader refuses the shards at construction,
// naming the first bad token, not at the step that would read it.
TEST_F(TokenShardsTest, TokensAtOrAboveTheVocabularyAreErrorsBeforeTheFirstStep) {
  std::vector<uint16_t> tokens(40, 5);
  tokens[13] = 256;
  tokens[30] = 300;
  write_token_shard(path("v.bin"), tokens);
  const TokenShards shards({path("v.bin")});
  DataLoader ok(shards, LoaderOptions().batch(1).seq_len(8).vocab_size(301));
  ok.next_batch();
  ok.next_batch();
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().batch(1).seq_len(8).vocab_size(256)), "v.bin",
               "token 256", "position 13", "vocabulary size 256", "before the first step");
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().batch(1).seq_len(8).vocab_size(300)), "v.bin",
               "token 300", "position 30", "vocabulary size 300");
  DataLoader unchecked(shards, LoaderOptions().batch(1).seq_len(8));  // vocab_size 0: no check
  unchecked.next_batch();
}

// A bad token deep in the second of several shards, past a block boundary of
// the scan, is found at construction too, with its position in its shard.
TEST_F(TokenShardsTest, ABadTokenDeepInALaterShardIsFoundAtConstruction) {
  const std::vector<std::string> files = {path("a.bin"), path("b.bin"), path("c.bin")};
  std::vector<uint16_t> tokens(5'000'000, 7);
  write_token_shard(files[0], tokens);
  tokens[4'321'987] = 50257;
  write_token_shard(files[1], tokens);
  tokens[4'321'987] = 7;
  write_token_shard(files[2], tokens);
  const TokenShards shards(files);
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().batch(4).seq_len(64).vocab_size(50257)), "b.bin",
               "token 50257", "position 4321987", "vocabulary size 50257");
  DataLoader fine(shards, LoaderOptions().batch(4).seq_len(64).vocab_size(50258));
  fine.next_batch();
}

// The scan reads at well over a gigabyte a second on one core (Note [Tokens
// checked at open]); the bound here is loose, for a loaded CI machine.
TEST_F(TokenShardsTest, CheckingEveryTokenOfA256MiBShardIsFast) {
  std::vector<uint16_t> tokens(int64_t{128} << 20);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>((i * 2654435761u) % 50257);
  write_token_shard(path("big.bin"), tokens);
  const TokenShards shards({path("big.bin")});
  const auto begin = std::chrono::steady_clock::now();
  DataLoader loader(shards, LoaderOptions().batch(8).seq_len(1024).vocab_size(50257));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::printf("[tokens] 256 MiB checked in %.3f s (%.2f GB/s)\n", seconds,
              static_cast<double>(tokens.size()) * 2 / seconds / 1e9);
  EXPECT_LT(seconds, 5.0);
}

TEST_F(TokenShardsTest, MalformedFilesNameTheFileAndTheProblem) {
  write_raw_shard(path("magic.bin"), 1234, 1, 4, 8);
  EXPECT_ERROR(read_shard_header(path("magic.bin")), "magic.bin", "bad magic", "20240520", "1234");

  write_raw_shard(path("version.bin"), kShardMagic, 2, 4, 8);
  EXPECT_ERROR(read_shard_header(path("version.bin")), "version.bin", "version", "expected 1",
               "found 2");

  // The header claims more tokens than the file holds.
  write_raw_shard(path("larger.bin"), kShardMagic, 1, 10, 8);
  EXPECT_ERROR(read_shard_header(path("larger.bin")), "larger.bin", "10 tokens", "1044", "has 1032",
               "truncated");

  // The header claims fewer tokens than the file holds.
  write_raw_shard(path("smaller.bin"), kShardMagic, 1, 2, 8);
  EXPECT_ERROR(read_shard_header(path("smaller.bin")), "smaller.bin", "2 tokens", "1028",
               "has 1032", "trailing bytes");

  write_raw_shard(path("header.bin"), kShardMagic, 1, 0, 0, /*header_bytes=*/600);
  EXPECT_ERROR(read_shard_header(path("header.bin")), "header.bin", "truncated header", "600",
               "1024");

  write_raw_shard(path("odd.bin"), kShardMagic, 1, 4, 9);
  EXPECT_ERROR(read_shard_header(path("odd.bin")), "odd.bin", "odd byte count", "9 bytes");

  write_raw_shard(path("negative.bin"), kShardMagic, 1, -3, 0);
  EXPECT_ERROR(read_shard_header(path("negative.bin")), "negative.bin", "negative token count",
               "-3");

  EXPECT_ERROR(read_shard_header(path("missing.bin")), "missing.bin", "no such file");
  fs::create_directories(path("dir.bin"));
  EXPECT_ERROR(read_shard_header(path("dir.bin")), "dir.bin", "not a regular file");

  // TokenShards validates every file up front: one bad file among good ones fails it.
  write_token_shard(path("good.bin"), std::vector<uint16_t>(50, 1));
  EXPECT_ERROR(TokenShards({path("good.bin"), path("version.bin")}), "version.bin", "found 2");
  EXPECT_ERROR(TokenShards(path("*.bin")), "bin", "token shard");
}

TEST_F(TokenShardsTest, EmptyGlobAndEmptyListAreErrors) {
  EXPECT_ERROR(TokenShards(path("nothing_*.bin")), "no file matches", "nothing_*.bin");
  EXPECT_ERROR(TokenShards(std::vector<std::string>{}), "TokenShards", "empty");
  EXPECT_ERROR(glob_files(""), "glob_files", "empty");
}

TEST_F(TokenShardsTest, ShardsTooSmallForOneStepAreErrors) {
  write_token_shard(path("big.bin"), std::vector<uint16_t>(100, 1));
  write_token_shard(path("small.bin"), std::vector<uint16_t>(16, 1));
  const TokenShards shards({path("big.bin"), path("small.bin")});
  // World 2, B*T = 8: a step reads 17 tokens.
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().batch(2).seq_len(4).world_size(2)), "small.bin",
               "16 tokens", "17", "2 * 2 * 4 + 1");
  DataLoader fits(shards, LoaderOptions().batch(3).seq_len(5));  // 16 tokens: exactly one step
  fits.next_batch();
  fits.next_batch();  // big.bin's second step
}

TEST_F(TokenShardsTest, BadOptionsAndPositionsAreErrors) {
  const TokenShards shards(write_counting_shards({50, 30}));
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().batch(0).seq_len(4)), "DataLoader", "batch (0)");
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().batch(2).seq_len(-1)), "seq_len (-1)");
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().rank(2).world_size(2)), "rank 2", "world_size 2");
  EXPECT_ERROR(DataLoader(shards, LoaderOptions().vocab_size(70000)), "vocab_size 70000");
  DataLoader loader(shards, LoaderOptions().batch(2).seq_len(4));
  EXPECT_ERROR(loader.set_position({2, 0, 0}), "set_position", "shard 2", "2 shards");
  EXPECT_ERROR(loader.set_position({1, 25, 0}), "set_position", "offset 25", "train_1.bin");
  EXPECT_ERROR(loader.set_position({0, -1, 0}), "offset -1");
  EXPECT_ERROR(loader.set_position({0, 0, -1}), "negative epoch -1");
  EXPECT_EQ(loader.position(), LoaderPosition{});  // a rejected position changes nothing
}

TEST_F(TokenShardsTest, AFileChangedAfterValidationIsAnError) {
  const auto files = write_counting_shards({40});
  const TokenShards shards(files);
  DataLoader loader(shards, LoaderOptions().batch(1).seq_len(8));
  fs::resize_file(files[0], kShardHeaderBytes + 2 * 9);
  loader.next_batch();  // tokens [0, 9) are still there
  EXPECT_ERROR(loader.next_batch(), "train_0.bin", "short read", "[8, 17)");
}

}  // namespace
}  // namespace accrue::data
