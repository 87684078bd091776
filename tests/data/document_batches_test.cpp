// Document batches (Note [Document batches]): packed batches reproduce the
// documents, positions restart at every document and row, no target crosses
// a document; padded rows are whole documents; positions resume exactly;
// bad options and files are refused by name; and a packed batch through
// nn::Llama gives the loss of its documents run one by one.
#include "accrue/data/document_batches.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "accrue/autograd/ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/data/token_shards.h"
#include "accrue/nn/llama.h"
#include "tests/test_util.h"

namespace accrue::data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 50, kEos = 49;

class DocumentBatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("accrue_document_batches_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Random documents (1 .. max_len tokens, none EOS, then the EOS) until a
  // shard holds at least `tokens`; returns the documents of each shard.
  std::vector<std::vector<std::vector<int64_t>>> write_documents(const std::vector<int64_t>& tokens,
                                                                 uint32_t seed,
                                                                 int64_t max_len = 12) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int64_t> len(1, max_len), tok(0, kVocab - 2);
    std::vector<std::vector<std::vector<int64_t>>> all;
    for (size_t s = 0; s < tokens.size(); ++s) {
      std::vector<std::vector<int64_t>> docs;
      std::vector<uint16_t> flat;
      while (static_cast<int64_t>(flat.size()) < tokens[s]) {
        std::vector<int64_t> d(static_cast<size_t>(len(rng)));
        for (int64_t& t : d)
          t = tok(rng);
        d.push_back(kEos);
        for (int64_t t : d)
          flat.push_back(static_cast<uint16_t>(t));
        docs.push_back(d);
      }
      // Appended piece by piece: g++ 12 warns (-Wrestrict) on "s" + to_string(s).
      std::string name = "s";
      name += std::to_string(s);
      name += ".bin";
      write_token_shard(path(name), flat);
      files_.push_back(path(name));
      all.push_back(docs);
    }
    return all;
  }

  fs::path dir_;
  std::vector<std::string> files_;
};

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& docs) {
  std::vector<int64_t> f;
  for (const auto& d : docs)
    f.insert(f.end(), d.begin(), d.end());
  return f;
}

std::vector<int64_t> ints(const Tensor& t) {
  return t.to(DType::i64).contiguous().to_vector<int64_t>();
}

TEST_F(DocumentBatchesTest, packed_batches_reproduce_documents_with_restarting_positions) {
  const auto docs = write_documents({400}, 1);
  const std::vector<int64_t> source = flat(docs[0]);
  const int64_t B = 3, T = 16;
  DocumentBatches batches(files_,
                          DocumentOptions().batch(B).seq_len(T).eos_id(kEos).vocab_size(kVocab));
  // The pieces of consecutive steps, joined where a piece does not end with
  // an EOS, are the source documents in order (the shard's tail excepted).
  std::vector<std::vector<int64_t>> rebuilt(1);
  int64_t steps = 0;
  for (int64_t offset = 0; offset + B * T + 1 <= static_cast<int64_t>(source.size());
       offset += B * T, ++steps) {
    ASSERT_EQ(batches.position().offset, offset);
    const DocumentBatch b = batches.next_batch();
    const std::vector<int64_t> in = ints(b.inputs), tg = ints(b.targets), cu = ints(b.cu_seqlens),
                               pos = ints(b.positions);
    ASSERT_EQ(b.cu_seqlens.dtype(), DType::i64);
    ASSERT_EQ(b.positions.shape(), (Shape{B, T}));
    ASSERT_EQ(cu.front(), 0);
    ASSERT_EQ(cu.back(), B * T);
    for (int64_t r = 0; r < B; ++r)  // every row boundary is a boundary
      EXPECT_NE(std::find(cu.begin(), cu.end(), r * T), cu.end()) << "row " << r;
    int64_t count = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      ASSERT_LT(cu[n], cu[n + 1]);
      for (int64_t i = cu[n]; i < cu[n + 1]; ++i) {
        const size_t k = static_cast<size_t>(i);
        EXPECT_EQ(in[k], source[static_cast<size_t>(offset + i)]);
        EXPECT_EQ(pos[k], i - cu[n]) << "position of token " << i;
        // An EOS only ends a piece; the target is the next token, never across a document.
        if (i + 1 < cu[n + 1]) {
          EXPECT_NE(in[k], kEos);
        }
        const int64_t want = in[k] == kEos ? -100 : source[static_cast<size_t>(offset + i + 1)];
        EXPECT_EQ(tg[k], want) << "target of token " << i;
        count += want != -100;
        rebuilt.back().push_back(in[k]);
      }
      if (rebuilt.back().back() == kEos)
        rebuilt.emplace_back();
      else  // a piece cut by a row end: the next starts at a row boundary
        EXPECT_EQ(cu[n + 1] % T, 0);
    }
    EXPECT_EQ(b.target_tokens, count);
  }
  ASSERT_GT(steps, 5);
  ASSERT_GT(rebuilt.size(), 20u);
  rebuilt.pop_back();
  for (size_t d = 0; d < rebuilt.size(); ++d)
    ASSERT_EQ(rebuilt[d], docs[0][d]) << "document " << d;
}

TEST_F(DocumentBatchesTest, padded_rows_are_whole_documents_truncated_at_T) {
  const auto docs = write_documents({300, 200}, 2, 20);
  const int64_t B = 4, T = 10;
  DocumentBatches batches(
      files_,
      DocumentOptions().batch(B).seq_len(T).eos_id(kEos).pad_id(7).vocab_size(kVocab).layout(
          DocumentLayout::padded));
  int64_t truncated = 0;
  for (size_t s = 0; s < docs.size(); ++s)
    for (size_t first = 0; first + B <= docs[s].size(); first += B) {
      ASSERT_EQ(batches.position(),
                (DocumentPosition{static_cast<int64_t>(s), static_cast<int64_t>(first), 0}));
      const DocumentBatch b = batches.next_batch();
      EXPECT_FALSE(b.cu_seqlens.defined());
      const std::vector<int64_t> in = ints(b.inputs), tg = ints(b.targets), lens = ints(b.seq_lens);
      for (int64_t r = 0; r < B; ++r) {
        const std::vector<int64_t>& d = docs[s][first + static_cast<size_t>(r)];
        const int64_t L = static_cast<int64_t>(d.size()), n = std::min(L, T);
        truncated += L > T;
        EXPECT_EQ(lens[static_cast<size_t>(r)], n);
        for (int64_t j = 0; j < T; ++j) {
          const size_t k = static_cast<size_t>(r * T + j);
          EXPECT_EQ(in[k], j < n ? d[static_cast<size_t>(j)] : 7);
          EXPECT_EQ(tg[k], j + 1 < L && j < T ? d[static_cast<size_t>(j + 1)] : -100);
        }
      }
    }
  EXPECT_GT(truncated, 0);
  EXPECT_EQ(batches.position(), (DocumentPosition{0, 0, 1}));
}

TEST_F(DocumentBatchesTest, resumed_position_equals_an_uninterrupted_run_and_ranks_are_disjoint) {
  write_documents({150, 120}, 3);
  for (DocumentLayout layout : {DocumentLayout::packed, DocumentLayout::padded}) {
    const auto opts = [&](int rank) {
      return DocumentOptions()
          .batch(2)
          .seq_len(8)
          .eos_id(kEos)
          .vocab_size(kVocab)
          .layout(layout)
          .rank(rank)
          .world_size(2);
    };
    DocumentBatches a(files_, opts(0)), other(files_, opts(1));
    std::vector<std::vector<int64_t>> run;
    DocumentPosition saved;
    for (int i = 0; i < 20; ++i) {  // past an epoch
      if (i == 7) saved = a.position();
      const DocumentBatch b = a.next_batch(), c = other.next_batch();
      run.push_back(ints(b.inputs));
      const std::vector<int64_t> t = ints(b.targets);
      run.back().insert(run.back().end(), t.begin(), t.end());
      // The two ranks read different tokens (packed) or documents (padded).
      EXPECT_NE(ints(b.inputs), ints(c.inputs)) << "step " << i;
      if (layout == DocumentLayout::packed)
        EXPECT_EQ(c.positions.defined(), true);
      else
        EXPECT_EQ(ints(c.seq_lens).size(), 2u);
    }
    EXPECT_GT(a.position().epoch, 0);
    DocumentBatches resumed(files_, opts(0));
    resumed.set_position(saved);
    for (int i = 7; i < 20; ++i) {
      const DocumentBatch b = resumed.next_batch();
      std::vector<int64_t> got = ints(b.inputs);
      const std::vector<int64_t> t = ints(b.targets);
      got.insert(got.end(), t.begin(), t.end());
      EXPECT_EQ(got, run[static_cast<size_t>(i)]) << "step " << i;
    }
    EXPECT_EQ(resumed.position(), a.position());
  }
}

TEST_F(DocumentBatchesTest, uint32_shards_hold_a_large_vocabulary) {
  const int64_t V = 128256, eos = 128001;
  std::vector<uint32_t> t = {
      70000, 5, 128255, static_cast<uint32_t>(eos), 65536, 1, 2, static_cast<uint32_t>(eos), 3};
  write_token_shard_u32(path("big.bin"), t);
  EXPECT_EQ(fs::file_size(path("big.bin")), static_cast<uint64_t>(kShardHeaderBytes + 4 * 9));
  DocumentBatches b({path("big.bin")},
                    DocumentOptions().batch(2).seq_len(4).eos_id(eos).vocab_size(V));
  const DocumentBatch x = b.next_batch();
  EXPECT_EQ(ints(x.inputs), (std::vector<int64_t>{70000, 5, 128255, eos, 65536, 1, 2, eos}));
  EXPECT_EQ(ints(x.targets), (std::vector<int64_t>{5, 128255, eos, -100, 1, 2, eos, -100}));
  EXPECT_EQ(ints(x.cu_seqlens), (std::vector<int64_t>{0, 4, 8}));
  // The GPT-2 loader reads uint16 shards only, and says so.
  EXPECT_ERROR(TokenShards(std::vector<std::string>{path("big.bin")}), "unsupported version",
               "found 2");
  EXPECT_ERROR(
      DocumentBatches({path("big.bin")},
                      DocumentOptions().batch(2).seq_len(4).eos_id(eos).vocab_size(128255)),
      "token 128255 at position 2", "vocabulary size 128255");
}

TEST_F(DocumentBatchesTest, bad_options_and_files_are_refused_by_value) {
  write_documents({100}, 4);
  const auto ok = [] {
    return DocumentOptions().batch(2).seq_len(8).eos_id(kEos).vocab_size(kVocab);
  };
  EXPECT_ERROR(DocumentBatches(files_, ok().eos_id(kVocab)), "eos_id 50", "[0, 50)");
  EXPECT_ERROR(DocumentBatches(files_, ok().eos_id(-1)), "eos_id -1");
  EXPECT_ERROR(DocumentBatches(files_, ok().seq_len(0)), "seq_len (0)");
  EXPECT_ERROR(DocumentBatches(files_, ok().batch(-2)), "batch (-2)");
  EXPECT_ERROR(DocumentBatches(files_, ok().vocab_size(0)), "vocab_size 0");
  EXPECT_ERROR(DocumentBatches(files_, ok().pad_id(50)), "pad_id 50");
  EXPECT_ERROR(DocumentBatches(files_, ok().rank(2).world_size(2)), "rank 2 of world_size 2");
  EXPECT_ERROR(DocumentBatches(files_, ok().vocab_size(20).eos_id(5)), "s0.bin",
               "not below the vocabulary size 20");
  EXPECT_ERROR(DocumentBatches(files_, ok().seq_len(100)), "fewer than the 201");
  EXPECT_ERROR(DocumentBatches(files_, ok().batch(100).layout(DocumentLayout::padded)),
               "documents, fewer than the 100");
  write_token_shard(path("no_eos.bin"), std::vector<uint16_t>(64, 3));
  EXPECT_ERROR(DocumentBatches({path("no_eos.bin")}, ok()), "no_eos.bin", "no EOS token (id 49)",
               "64 tokens");
  {
    std::ofstream f(path("short.bin"), std::ios::binary);
    f << "abc";
  }
  EXPECT_ERROR(DocumentBatches({path("short.bin")}, ok()), "short.bin", "truncated header");
  EXPECT_ERROR(DocumentBatches(path("nothing_*.bin"), ok()), "no file matches");
  DocumentBatches b(files_, ok());
  EXPECT_ERROR(b.set_position({1, 0, 0}), "shard 1 is out of range");
  EXPECT_ERROR(b.set_position({0, 95, 0}), "offset 95", "step of 17");
}

// The summed loss of a packed batch is the sum of its documents' losses, each
// run alone from position 0 with the targets the batch gives it.
TEST_F(DocumentBatchesTest, packed_batch_through_llama_equals_documents_one_by_one) {
  write_documents({200}, 5, 9);
  const int64_t B = 2, T = 24;
  DocumentBatches batches(files_,
                          DocumentOptions().batch(B).seq_len(T).eos_id(kEos).vocab_size(kVocab));
  batches.next_batch();
  const DocumentBatch b = batches.next_batch();
  nn::LlamaConfig c = nn::LlamaConfig::llama_tiny();
  c.vocab_size = kVocab;
  Generator gen(11);
  nn::Llama model(c, nn::ParamOptions{Device::cpu(), DType::f64, &gen});
  NoGradGuard no_grad;
  const Loss packed =
      model.loss(b.inputs, b.targets, nn::BatchLayout::packed(b.cu_seqlens, b.positions));
  const std::vector<int64_t> in = ints(b.inputs), tg = ints(b.targets), cu = ints(b.cu_seqlens);
  ASSERT_GT(cu.size(), 5u);
  double sum = 0, count = 0;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    const int64_t L = cu[n + 1] - cu[n];
    const std::vector<int64_t> x(in.begin() + cu[n], in.begin() + cu[n + 1]),
        y(tg.begin() + cu[n], tg.begin() + cu[n + 1]);
    const Loss one = model.loss(from_vector<int64_t>(x, {1, L}), from_vector<int64_t>(y, {1, L}));
    sum += one.sum.item();
    count += one.count.item();
  }
  EXPECT_EQ(packed.count.item(), count);
  EXPECT_EQ(count, static_cast<double>(b.target_tokens));
  EXPECT_LE(std::fabs(packed.sum.item() - sum), 1e-12 * std::fabs(sum));
  // The check sees the layout: attending across documents changes the loss.
  const Loss crossing = model.loss(b.inputs, b.targets);
  EXPECT_GT(std::fabs(crossing.sum.item() - sum), 1e-6 * std::fabs(sum));
}

// Right-padded rows through nn::Llama: the summed loss is that of every row's
// document run alone over its seq_lens tokens.
TEST_F(DocumentBatchesTest, padded_batch_through_llama_equals_documents_one_by_one) {
  write_documents({200}, 6, 14);
  const int64_t B = 4, T = 10;
  DocumentBatches batches(
      files_, DocumentOptions().batch(B).seq_len(T).eos_id(kEos).vocab_size(kVocab).layout(
                  DocumentLayout::padded));
  const DocumentBatch b = batches.next_batch();
  nn::LlamaConfig c = nn::LlamaConfig::llama_tiny();
  c.vocab_size = kVocab;
  Generator gen(12);
  nn::Llama model(c, nn::ParamOptions{Device::cpu(), DType::f64, &gen});
  NoGradGuard no_grad;
  const Loss padded = model.loss(b.inputs, b.targets, nn::BatchLayout::padded(b.seq_lens));
  const std::vector<int64_t> in = ints(b.inputs), tg = ints(b.targets), lens = ints(b.seq_lens);
  double sum = 0, count = 0;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t L = lens[static_cast<size_t>(r)];
    const std::vector<int64_t> x(in.begin() + r * T, in.begin() + r * T + L),
        y(tg.begin() + r * T, tg.begin() + r * T + L);
    const Loss one = model.loss(from_vector<int64_t>(x, {1, L}), from_vector<int64_t>(y, {1, L}));
    sum += one.sum.item();
    count += one.count.item();
  }
  EXPECT_EQ(padded.count.item(), count);
  EXPECT_EQ(count, static_cast<double>(b.target_tokens));
  EXPECT_LE(std::fabs(padded.sum.item() - sum), 1e-12 * std::fabs(sum));
}

// tools/make_shards.py's document shards (one document per line, an EOS id
// after each; uint16 and uint32) read back as the lines of the input.
TEST_F(DocumentBatchesTest, make_shards_documents_read_back_as_the_input_lines) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  std::vector<std::string> lines;
  {
    std::ofstream f(path("in.txt"));
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> len(1, 30), ch('a', 'z');
    for (int i = 0; i < 60; ++i) {
      std::string l;
      for (int j = len(rng); j > 0; --j)
        l += static_cast<char>(ch(rng));
      lines.push_back(l);
      f << l << "\n";
    }
  }
  for (const int64_t eos : {256, 70000}) {
    const std::string prefix = path("out" + std::to_string(eos));
    const std::string cmd = "python3 " ACCRUE_SOURCE_DIR "/tools/make_shards.py '" +
                            path("in.txt") + "' --output-prefix '" + prefix +
                            "' --documents lines --val-fraction 0 --eos-id " + std::to_string(eos) +
                            " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const int64_t T = 31;
    DocumentBatches batches(
        prefix + "_train_*.bin",
        DocumentOptions().batch(2).seq_len(T).eos_id(eos).vocab_size(eos + 1).layout(
            DocumentLayout::padded));
    EXPECT_EQ(batches.shards()[0].token_bytes, eos < 65536 ? 2 : 4);
    ASSERT_EQ(batches.shards()[0].doc_starts.size(), lines.size());
    for (size_t d = 0; d < lines.size(); d += 2) {
      const DocumentBatch b = batches.next_batch();
      const std::vector<int64_t> in = ints(b.inputs), lens = ints(b.seq_lens);
      for (size_t r = 0; r < 2; ++r) {
        std::vector<int64_t> want(lines[d + r].begin(), lines[d + r].end());
        want.push_back(eos);
        ASSERT_EQ(lens[r], static_cast<int64_t>(want.size()));
        EXPECT_EQ(std::vector<int64_t>(in.begin() + static_cast<int64_t>(r) * T,
                                       in.begin() + static_cast<int64_t>(r) * T + lens[r]),
                  want)
            << "line " << d + r;
      }
    }
  }
}

}  // namespace
}  // namespace accrue::data
