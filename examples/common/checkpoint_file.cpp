#include "examples/common/checkpoint_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "examples/common/options.h"

namespace accrue::examples {

void probe_output_file(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) usage_error(option, " ", path, " is a directory");
    if (!fs::is_regular_file(status))
      usage_error(option, " ", path, " is not a regular file (a FIFO, socket or device)");
    if (::access(path.c_str(), W_OK) != 0) usage_error(option, " ", path, " is not writable");
    return;
  }
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  if (!fs::is_directory(folder, ec))
    usage_error(option, " ", path, ": no folder ", folder.string());
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    usage_error(option, " ", path, ": the folder ", folder.string(), " is not writable");
}

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
