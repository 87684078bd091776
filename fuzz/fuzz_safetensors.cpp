// libFuzzer target: load_safetensors on arbitrary bytes (core/tensor_io.h).
// A malformed file must throw accrue::Error, never crash, over-read or trip
// UBSan; a file it accepts must survive save_safetensors and load again as
// the same tensors and metadata (the checksum entries of Note [Tensor
// checksums] neither leak into the metadata nor pile up); and the re-saved
// file with one bit of its data flipped must be refused by its checksum.
#include <cstdio>
#include <map>
#include <string>

#include "accrue/core/error.h"
#include "accrue/core/tensor_io.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  const fuzz::ScratchFile& file = fuzz::write_input("safetensors", data, size);
  const std::string& path = file.path();
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;
  try {
    tensors = load_safetensors(path, &metadata);
  } catch (const Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }
  // Accepted: the writer must reproduce it.
  const std::string again = file.again();
  save_safetensors(again, tensors, metadata);
  std::map<std::string, std::string> metadata2;
  const std::map<std::string, Tensor> tensors2 = load_safetensors(again, &metadata2);
  fuzz::require(metadata2 == metadata, "safetensors metadata changed in a round trip");
  fuzz::require(tensors2.size() == tensors.size(), "safetensors tensor count changed");
  for (const auto& [name, t] : tensors) {
    auto it = tensors2.find(name);
    fuzz::require(it != tensors2.end() && fuzz::same_tensor(t, it->second),
                  "safetensors tensor changed in a round trip");
  }
  for (const auto& [key, value] : metadata) {
    const std::string prefix = "accrue.crc32c";
    fuzz::require(key != prefix && key.rfind(prefix + ".", 0) != 0,
                  "a checksum entry was returned as metadata");
  }
  // The data section ends the file: a bit flipped in its last byte is in a
  // tensor whenever there is any data.
  int64_t data_bytes = 0;
  for (const auto& [name, t] : tensors)
    data_bytes += static_cast<int64_t>(t.nbytes());
  if (data_bytes > 0) {
    std::FILE* f = std::fopen(again.c_str(), "r+b");
    fuzz::require(f != nullptr && std::fseek(f, -1, SEEK_END) == 0, "cannot reopen the saved file");
    const int last = std::fgetc(f);
    fuzz::require(last != EOF && std::fseek(f, -1, SEEK_END) == 0 &&
                      std::fputc(last ^ 0x04, f) != EOF && std::fclose(f) == 0,
                  "cannot rewrite the saved file");
    bool refused = false;
    try {
      load_safetensors(again);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("fails its checksum") != std::string::npos;
    }
    fuzz::require(refused, "a flipped data bit in a file accrue wrote was not refused");
  }
  return 0;
}
