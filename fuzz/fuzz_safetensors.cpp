// libFuzzer target: load_safetensors on arbitrary bytes (core/tensor_io.h).
// A malformed file must throw accrue::Error, never crash, over-read or trip
// UBSan; a file it accepts must survive save_safetensors and load again as
// the same tensors and metadata.
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
  return 0;
}
