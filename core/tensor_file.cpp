#include "accrue/core/tensor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "accrue/core/grad_mode.h"

namespace accrue::detail {

// See Note [Untrusted tensor files].
uint64_t checked_nbytes(const Shape& shape, DType dtype, const FileRef& file,
                        const std::string& what) {
  ACCRUE_CHECK(static_cast<int>(shape.size()) <= kMaxRank, file, ": ", what, " has shape ",
               shape_str(shape), " of rank ", shape.size(), "; accrue supports at most ", kMaxRank,
               " dims");
  int64_t numel = 1, span = 1;
  for (int64_t d : shape) {
    ACCRUE_CHECK(d >= 0, file, ": ", what, " has a negative dim in shape ", shape_str(shape));
    ACCRUE_CHECK(checked_mul(numel, d, &numel) && checked_mul(span, std::max<int64_t>(d, 1), &span),
                 file, ": ", what, " has shape ", shape_str(shape),
                 " whose element count overflows 64 bits");
  }
  int64_t nbytes = 0;
  ACCRUE_CHECK(checked_mul(span, static_cast<int64_t>(element_size(dtype)), &nbytes), file, ": ",
               what, " has shape ", shape_str(shape), " whose byte size overflows 64 bits");
  return static_cast<uint64_t>(numel) * element_size(dtype);
}

void check_bool_bytes(const Tensor& t, const FileRef& file, const std::string& what) {
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i)
    ACCRUE_CHECK(bytes[i] <= 1, file, ": ", what, " is boolean but element ", i,
                 " holds the byte value ", static_cast<int>(bytes[i]), " (must be 0 or 1)");
}

InputFile::InputFile(const FileRef& file) : file_(file) {
  std::error_code ec;
  const auto status = std::filesystem::status(file.path, ec);
  ACCRUE_CHECK(!ec && std::filesystem::exists(status), file, ": no such file");
  ACCRUE_CHECK(std::filesystem::is_regular_file(status), file, ": not a regular file");
  size_ = std::filesystem::file_size(file.path, ec);
  ACCRUE_CHECK(!ec, file, ": cannot read the file size: ", ec.message());
  in_.open(file.path, std::ios::binary);
  ACCRUE_CHECK(in_.is_open(), file, ": cannot open the file for reading");
}

void InputFile::read_at(uint64_t offset, void* dst, uint64_t n, const char* what) {
  ACCRUE_CHECK(offset <= size_ && n <= size_ - offset, file_, ": reading ", what, " needs bytes [",
               offset, ", ", offset + n, ") but the file has ", size_);
  if (n == 0) return;
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(offset));
  in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  ACCRUE_CHECK(in_.good() && static_cast<uint64_t>(in_.gcount()) == n, file_, ": short read of ",
               what, " (", in_.gcount(), " of ", n, " bytes at offset ", offset,
               "); was the file changed while reading?");
}

OutputFile::OutputFile(const FileRef& file) : file_(file), temporary_(file.path + ".tmp") {
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ACCRUE_CHECK(fd_ >= 0, file, ": cannot open the file for writing (as '", temporary_,
               "' first, Note [Crash-safe saves]): ", std::strerror(errno));
}

OutputFile::~OutputFile() {
  if (fd_ < 0) return;  // closed: the file has its name
  ::close(fd_);
  ::unlink(temporary_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    ACCRUE_CHECK(w > 0, file_, ": writing failed (disk full?): ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputFile::close() {
  ACCRUE_CHECK(::fsync(fd_) == 0, file_, ": flushing to disk failed: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  ACCRUE_CHECK(::close(fd) == 0, file_, ": closing failed: ", std::strerror(errno));
  if (::rename(temporary_.c_str(), file_.path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    ACCRUE_FAIL(file_, ": renaming '", temporary_, "' over it failed: ", std::strerror(error));
  }
  // The rename itself is durable once the directory is synced (best effort:
  // some filesystems refuse to open a directory for that).
  std::filesystem::path dir = std::filesystem::path(file_.path).parent_path();
  if (dir.empty()) dir = std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Tensor host_contiguous(const Tensor& t) {
  // Writing a file is data handling (Note [Raw views]): a parameter saves as its values.
  NoGradGuard no_grad;
  return t.to(Device::cpu()).contiguous();
}

}  // namespace accrue::detail
