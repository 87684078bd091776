// accrue._accrue.data: llm.c-format token shards and the rank-aware data
// loader (data/token_shards.h), so that a Python training loop reads its
// batches as the C++ trainers do (Note [Token shard format], Note [Loader
// positions]).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/data/token_shards.h"
#include "bindings.h"

namespace accrue::python {

namespace {

using data::DataLoader;
using data::LoaderOptions;
using data::LoaderPosition;
using data::TokenShards;

// write_shard's tokens: version 1 (uint16) when every token fits, else
// version 2 (uint32); negative or too large tokens are refused by position.
void write_shard(const std::string& path, const std::vector<int64_t>& tokens) {
  int64_t largest = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    ACCRUE_CHECK(tokens[i] >= 0 && tokens[i] <= std::numeric_limits<uint32_t>::max(),
                 "data.write_shard: token ", tokens[i], " at position ", i, " of '", path,
                 "' is outside [0, 2^32)");
    largest = std::max(largest, tokens[i]);
  }
  if (largest <= std::numeric_limits<uint16_t>::max()) {
    data::write_token_shard(path, std::vector<uint16_t>(tokens.begin(), tokens.end()));
  } else {
    data::write_token_shard_u32(path, std::vector<uint32_t>(tokens.begin(), tokens.end()));
  }
}

}  // namespace

void bind_data(nb::module_& m) {
  m.def("write_shard", &write_shard, nb::arg("path"), nb::arg("tokens"),
        "Writes the tokens (ints) as one llm.c-format shard at `path` "
        "(Note [Token shard format]): uint16 when every token is below 65536, else the uint32 "
        "version (which the Llama trainer's document batches read; TokenShards reads uint16 "
        "shards).");
  m.def("glob_files", &data::glob_files, nb::arg("pattern"),
        "The regular files matching a shell glob, sorted by name; no match is an error.");

  nb::class_<TokenShards>(m, "TokenShards",
                          "A fixed list of shards, every file validated when built (an error "
                          "names the file, the field and the values).")
      .def(nb::init<const std::string&>(), nb::arg("pattern"),
           "The files matching a shell glob `pattern`, sorted by name.")
      .def(nb::init<const std::vector<std::string>&>(), nb::arg("files"),
           "These files, in this order.")
      .def("__len__", &TokenShards::size, "How many shards.")
      .def_prop_ro(
          "paths",
          [](const TokenShards& s) {
            std::vector<std::string> paths;
            for (const data::ShardInfo& i : s.shards())
              paths.push_back(i.path);
            return paths;
          },
          "The shards' files, in order.")
      .def_prop_ro(
          "tokens",
          [](const TokenShards& s) {
            std::vector<int64_t> counts;
            for (const data::ShardInfo& i : s.shards())
              counts.push_back(i.tokens);
            return counts;
          },
          "Each shard's token count, in order.")
      .def_prop_ro("total_tokens", &TokenShards::total_tokens, "Tokens over every shard.")
      .def("describe", &TokenShards::describe, "One line: how many shards, from where, tokens.")
      .def("check_tokens_below", &TokenShards::check_tokens_below, nb::arg("vocab_size"),
           "Errors, naming the shard, the token and its position, unless every token is below "
           "vocab_size (Note [Tokens checked at open]).");

  nb::class_<DataLoader>(m, "DataLoader",
                         "This rank's batches of B sequences of T tokens from the shards, in "
                         "the order every rank walks (Note [Loader positions]).")
      .def(
          "__init__",
          [](DataLoader* self, const TokenShards& shards, int64_t batch, int64_t seq_len, int rank,
             int world_size, int64_t vocab_size) {
            new (self) DataLoader(shards, LoaderOptions()
                                              .batch(batch)
                                              .seq_len(seq_len)
                                              .rank(rank)
                                              .world_size(world_size)
                                              .vocab_size(vocab_size));
          },
          nb::arg("shards"), nb::arg("batch"), nb::arg("seq_len"), nb::kw_only(),
          nb::arg("rank") = 0, nb::arg("world_size") = 1, nb::arg("vocab_size") = 0,
          nb::keep_alive<1, 2>(),
          "batch sequences of seq_len tokens a step for rank `rank` of `world_size`; with a "
          "vocab_size every token of every shard is checked below it now.")
      .def(
          "next_batch",
          [](DataLoader& l) {
            data::Batch b = l.next_batch();
            return std::make_tuple(b.inputs, b.targets);
          },
          "(inputs, targets), each [batch, seq_len] i32 on the CPU (targets: the inputs "
          "shifted by one token), then one step on.")
      .def_prop_ro(
          "position",
          [](const DataLoader& l) {
            const LoaderPosition& p = l.position();
            return std::make_tuple(p.shard, p.offset, p.epoch);
          },
          "(shard, offset, epoch) of the step about to be read, for a checkpoint.")
      .def(
          "set_position",
          [](DataLoader& l, const std::tuple<int64_t, int64_t, int64_t>& p) {
            l.set_position(LoaderPosition{std::get<0>(p), std::get<1>(p), std::get<2>(p)});
          },
          nb::arg("position"),
          "Back to a saved (shard, offset, epoch): the same batches follow, in order.")
      .def("reset", &DataLoader::reset, "The first step of the first shard, epoch 0.")
      .def_prop_ro("step_tokens", &DataLoader::step_tokens,
                   "Tokens one step covers over all ranks: world_size * batch * seq_len.");
}

}  // namespace accrue::python
