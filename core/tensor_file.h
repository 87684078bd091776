// The checked file access and shape arithmetic that accrue's tensor-file
// readers and writers share (core/safetensors.cpp, core/npy.cpp). Internal to
// core/: the public API is core/tensor_io.h.
#pragma once

#include <bit>
#include <cstdint>
#include <fstream>
#include <ostream>
#include <string>

#include "accrue/core/tensor.h"

namespace accrue::detail {

// Both formats store little-endian bytes and the readers and writers copy them verbatim.
static_assert(std::endian::native == std::endian::little,
              "accrue's tensor files assume a little-endian host");

// Note [Untrusted tensor files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor file may come from anywhere, so the readers trust nothing in it:
//  * every length read from the file is compared with the file's real size
//    (and header lengths with a fixed cap) before it is used to allocate or
//    seek, so memory use is bounded by the file's size;
//  * shape products are computed with overflow checks (of the element count,
//    the byte count and the largest stride accrue will derive from the shape);
//  * the header parsers are hand-written cursors over exactly the grammar each
//    format needs: no recursion depth to exhaust, no generic value trees to
//    build, and shapes capped at kMaxRank items while they are parsed;
//  * bool bytes are checked to be 0 or 1 (any other byte is not a valid bool).
// Every failure throws accrue::Error naming the function, the file and the
// problem.

constexpr int kMaxRank = 8;  // see core/strided_index.h

// "load_npy('x.npy')": the prefix of every error message.
struct FileRef {
  const char* op;
  const std::string& path;
};
inline std::ostream& operator<<(std::ostream& os, const FileRef& f) {
  return os << f.op << "('" << f.path << "')";
}

inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// Returns numel * element_size(dtype) for a shape read from a file, after
// checking its rank, its signs and that nothing derived from it overflows
// (including the strides contiguous_strides computes, which skip zero dims).
uint64_t checked_nbytes(const Shape& shape, DType dtype, const FileRef& file,
                        const std::string& what);

// Throws unless every byte of the boolean tensor t is 0 or 1.
void check_bool_bytes(const Tensor& t, const FileRef& file, const std::string& what);

// A regular file opened for reading whose size is known up front; every read
// is checked against that size before it happens.
class InputFile {
 public:
  explicit InputFile(const FileRef& file);

  uint64_t size() const { return size_; }

  void read_at(uint64_t offset, void* dst, uint64_t n, const char* what);

 private:
  FileRef file_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

// Note [Crash-safe saves]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A save never leaves a half-written file under the target name, whatever
// kills the process and whenever: the bytes go to "<path>.tmp", which close()
// flushes to disk (fsync), then renames over the target in one atomic step,
// and the directory is synced so the new name survives a power loss too.
// Until that rename the previous file at <path> stays whole; after it, the
// new one is. A writer destroyed before close() (an exception) removes its
// temporary file; a killed one leaves it, and the next save truncates it.
// tests/core/crash_safe_save_test.cpp kills a process mid-save many times.
class OutputFile {
 public:
  explicit OutputFile(const FileRef& file);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  // Syncs the temporary file and renames it over the target.
  void close();

 private:
  FileRef file_;
  std::string temporary_;
  int fd_ = -1;
};

// Host, contiguous: what both writers copy bytes from.
Tensor host_contiguous(const Tensor& t);

}  // namespace accrue::detail
