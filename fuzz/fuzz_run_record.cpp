// libFuzzer target: what a resumed trainer reads from a checkpoint beyond its
// tensors, the run record (Note [Run record] in examples/common/checkpoint_file.h):
// load_safetensors on arbitrary bytes for the metadata, then RunRecord::compare
// against a record shaped like the GPT-2 trainer's (fields with and without a
// change word, fields with an older key). A malformed file must throw
// accrue::Error; for a file that loads, compare's verdict must be the one the
// Note states, worked out here independently: refused exactly when a
// recorded field differs and its change word is not allowed, the message
// naming every such field; otherwise one line for the allowed changes and
// one for the fields the file does not record.
#include <map>
#include <string>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/core/tensor_io.h"
#include "examples/common/checkpoint_file.h"
#include "fuzz/fuzz_util.h"

namespace {

struct Field {
  const char* name;
  const char* value;
  const char* change;
  const char* legacy_key;
};

// As gpt2_run_record's (examples/gpt2/gpt2_checkpoint.cpp), shortened: fields
// an older checkpoint holds under the same key, options with change words.
constexpr Field kFields[] = {
    {"config.n_layer", "2", "", "config.n_layer"},
    {"config.n_embd", "64", "", "config.n_embd"},
    {"dtype", "f32", "", "dtype"},
    {"world_size", "1", "", "world_size"},
    {"micro_batch", "2", "", "micro_batch"},
    {"micro_steps", "4", "", ""},
    {"seed", "11", "", ""},
    {"dropout", "0.10000000000000001", "", ""},
    {"data", "synthetic", "", ""},
    {"lr", "0.0030000000000000001", "lr", ""},
    {"warmup_windows", "2", "lr", ""},
    {"windows", "20", "windows", ""},
    {"val_every", "0", "validation", ""},
    {"metrics", "", "metrics", ""},
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  const fuzz::ScratchFile& file = fuzz::write_input("safetensors", data, size);
  std::map<std::string, std::string> meta;
  try {
    load_safetensors(file.path(), &meta);
  } catch (const Error&) {
    return 0;  // the safetensors target covers these
  }
  examples::RunRecord record;
  for (const Field& f : kFields) {
    record.text(f.name, f.value, f.change, f.legacy_key);
  }
  // The allowed change words: from the last byte, so the fuzzer explores them too.
  static const char* const kWords[] = {"lr", "windows", "validation", "metrics"};
  std::vector<std::string> allowed;
  for (int i = 0; i < 4; ++i)
    if (size > 0 && (data[size - 1] >> i & 1)) allowed.push_back(kWords[i]);

  // The verdict the Note states.
  std::vector<std::string> refused;
  bool changed = false, unrecorded = false;
  for (const Field& f : kFields) {
    auto it = meta.find(std::string("accrue.run.") + f.name);
    if (it == meta.end() && *f.legacy_key) it = meta.find(f.legacy_key);
    if (it == meta.end()) {
      unrecorded = true;
    } else if (it->second != f.value) {
      bool ok = false;
      for (const std::string& w : allowed)
        ok = ok || (*f.change && w == f.change);
      if (ok) {
        changed = true;
      } else {
        refused.push_back(f.name);
      }
    }
  }
  std::vector<std::string> lines;
  try {
    lines = record.compare(file.path(), meta, allowed);
  } catch (const Error& e) {
    fuzz::require(!refused.empty(), "run record refused a checkpoint of the same run");
    const std::string message = e.what();
    for (const std::string& name : refused)
      fuzz::require(message.find(name + " = ") != std::string::npos,
                    "run record refusal does not name a differing field");
    return 0;
  }
  fuzz::require(refused.empty(), "run record accepted a checkpoint of another run");
  fuzz::require(lines.size() == static_cast<size_t>(changed) + static_cast<size_t>(unrecorded),
                "run record printed the wrong lines");
  return 0;
}
