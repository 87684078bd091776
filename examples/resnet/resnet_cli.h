// Command-line pieces shared by the two ResNet binaries (train_resnet.cpp,
// bench_resnet.cpp): a usage error (exit 2 with "see --help") and the
// integer-option parser that raises it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

namespace accrue::examples {

struct UsageError : std::exception {
  std::string message;
  explicit UsageError(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

// `v` as an integer >= lo, or a UsageError naming `flag`.
inline int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo)
    throw UsageError(flag + " needs an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  return x;
}

}  // namespace accrue::examples
