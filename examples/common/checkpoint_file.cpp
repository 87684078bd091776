#include "examples/common/checkpoint_file.h"

#include <cstdio>
#include <filesystem>

namespace accrue::examples {

void save_checkpoint_file(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  const std::string tmp = path + ".tmp";
  save_safetensors(tmp, tensors, metadata);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ACCRUE_CHECK(!ec, "cannot move the checkpoint ", tmp, " to ", path, ": ", ec.message());
}

std::string file_report(const std::string& path, std::chrono::steady_clock::time_point since) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  char s[64];
  std::snprintf(s, sizeof s, "%s in %.2f s", ec ? "?" : mib(static_cast<int64_t>(bytes)).c_str(),
                seconds);
  return s;
}

}  // namespace accrue::examples
