// libFuzzer target: truncate_metrics_log (Note [Metrics after resume] in
// examples/common/checkpoint_file.h), the one text file a resumed trainer
// rewrites, on arbitrary bytes. The first 8 bytes are the checkpoint's window
// count (little-endian), the rest the metrics file. The cut file must be a
// prefix of the old one made of whole rows, each starting {"window": N with
// N <= the window count; the rows removed must be the old file's rows past
// the cut; a second cut must remove nothing.
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "accrue/core/error.h"
#include "examples/common/checkpoint_file.h"
#include "fuzz/fuzz_util.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  int64_t windows = 0;
  if (size >= 8) {
    std::memcpy(&windows, data, 8);
    data += 8;
    size -= 8;
  }
  const fuzz::ScratchFile& file = fuzz::write_input("jsonl", data, size);
  const std::string before(reinterpret_cast<const char*>(data), size);
  int64_t removed = 0;
  try {
    removed = examples::truncate_metrics_log(file.path(), windows);
  } catch (const Error&) {
    return 0;  // a file it cannot cut is refused with a message
  }
  const std::string after = read_all(file.path());
  fuzz::require(before.compare(0, after.size(), after) == 0, "the cut file is not a prefix");
  fuzz::require(after.empty() || after.back() == '\n', "the cut file ends inside a row");
  static const std::string kRowStart = "{\"window\": ";
  size_t kept_rows = 0;
  for (size_t at = 0; at < after.size(); ++kept_rows) {
    const size_t end = after.find('\n', at);
    fuzz::require(after.compare(at, kRowStart.size(), kRowStart) == 0,
                  "a kept row does not start with {\"window\": ");
    const std::string number = after.substr(at + kRowStart.size(), 20);
    int64_t w = -1;
    try {
      w = std::stoll(number);
    } catch (const std::exception&) {
      fuzz::require(false, "a kept row has no window number");
    }
    fuzz::require(w >= 0 && w <= windows, "a kept row is of a window after the checkpoint");
    at = end + 1;
  }
  // The rows removed: getline's lines of the old file past the cut.
  int64_t rest = 0;
  for (size_t at = after.size(); at < before.size(); ++rest) {
    const size_t end = before.find('\n', at);
    at = end == std::string::npos ? before.size() : end + 1;
  }
  fuzz::require(removed == rest, "truncate_metrics_log miscounted the rows it removed");
  fuzz::require(examples::truncate_metrics_log(file.path(), windows) == 0,
                "a second cut removed rows");
  return 0;
}
