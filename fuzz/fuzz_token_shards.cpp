// libFuzzer target: an llm.c token shard (data/token_shards.h) of arbitrary
// bytes. A malformed header or size must throw accrue::Error; a shard it
// accepts must then load batches (B = 1, T = 1, two ranks' worth when it is
// long enough) whose targets are the inputs shifted by one token.
#include <cstdint>
#include <string>

#include "accrue/core/error.h"
#include "accrue/data/token_shards.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  const fuzz::ScratchFile& file = fuzz::write_input("bin", data, size);
  const std::string& path = file.path();
  data::ShardInfo info;
  try {
    info = data::read_shard_header(path);
  } catch (const Error&) {
    return 0;
  }
  fuzz::require(data::kShardHeaderBytes + 2 * info.tokens == static_cast<int64_t>(size),
                "accepted shard's size is not 1024 + 2 * tokens");
  auto token = [&](int64_t k) {
    const uint8_t* p = data + data::kShardHeaderBytes + 2 * k;
    return static_cast<int32_t>(p[0] | (p[1] << 8));
  };
  const data::TokenShards shards(std::vector<std::string>{path});
  // Note [Loader positions] with B = T = 1: a step covers `world` tokens.
  const int world = info.tokens >= 3 ? 2 : 1;
  if (info.tokens < world + 1) {  // too short for one step: a clear error
    bool threw = false;
    try {
      data::DataLoader loader(shards, data::LoaderOptions().world_size(world));
    } catch (const Error&) {
      threw = true;
    }
    fuzz::require(threw, "a shard shorter than one step was accepted");
    return 0;
  }
  for (int rank = 0; rank < world; ++rank) {
    data::DataLoader loader(shards,
                            data::LoaderOptions().batch(1).seq_len(1).rank(rank).world_size(world));
    int64_t offset = 0;
    for (int step = 0; step < 4; ++step) {
      const data::Batch b = loader.next_batch();
      fuzz::require(b.inputs.numel() == 1 && b.targets.numel() == 1, "batch shape");
      fuzz::require(b.inputs.data<int32_t>()[0] == token(offset + rank) &&
                        b.targets.data<int32_t>()[0] == token(offset + rank + 1),
                    "batch is not the file's tokens at the loader's position");
      offset += world;
      if (offset + world + 1 > info.tokens) offset = 0;
    }
  }
  return 0;
}
