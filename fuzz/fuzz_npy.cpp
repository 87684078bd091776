// libFuzzer target: load_npy on arbitrary bytes (core/tensor_io.h). A
// malformed file must throw accrue::Error, never crash, over-read or trip
// UBSan; a file it accepts (f16 and f32 and the rest) must survive save_npy
// and load again as the same tensor.
#include <string>

#include "accrue/core/error.h"
#include "accrue/core/tensor_io.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  const fuzz::ScratchFile& file = fuzz::write_input("npy", data, size);
  const std::string& path = file.path();
  Tensor t;
  try {
    t = load_npy(path);
  } catch (const Error&) {
    return 0;
  }
  fuzz::require(t.is_contiguous(), "load_npy returned a non-contiguous tensor");
  const std::string again = file.again();
  save_npy(again, t);
  fuzz::require(fuzz::same_tensor(t, load_npy(again)), "npy tensor changed in a round trip");
  return 0;
}
