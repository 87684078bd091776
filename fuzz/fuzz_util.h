// Shared by the fuzz targets: the readers under test take a path, so each
// input is written to one scratch file per process (in /dev/shm when there is
// one: no disk I/O per execution), and a broken invariant aborts, which
// libFuzzer reports as a crash with the input that caused it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "accrue/core/tensor.h"

namespace accrue::fuzz {

// One file per process, `<dir>/accrue_fuzz_<pid>.<ext>`, removed at exit
// together with its round-trip copy `<path>.again` (written by the targets).
class ScratchFile {
 public:
  explicit ScratchFile(const char* ext) {
    const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    path_ = std::string(dir) + "/accrue_fuzz_" + std::to_string(::getpid()) + "." + ext;
  }
  ~ScratchFile() {
    std::remove(path_.c_str());
    std::remove(again().c_str());
  }
  const std::string& path() const { return path_; }
  std::string again() const { return path_ + ".again"; }

 private:
  std::string path_;
};

// Replaces the scratch file's bytes with the input; returns it.
inline const ScratchFile& write_input(const char* ext, const uint8_t* data, size_t size) {
  static const ScratchFile file(ext);
  std::FILE* f = std::fopen(file.path().c_str(), "wb");
  if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(file.path().c_str());
    std::abort();  // not a finding: the scratch file itself failed
  }
  return file;
}

// Aborts with `what` when `ok` is false: libFuzzer keeps the input as a crash.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

// Same dtype, shape and bytes (both contiguous CPU tensors).
inline bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

}  // namespace accrue::fuzz
