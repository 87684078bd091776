#include "core/tensor_file.h"

#include <algorithm>
#include <filesystem>

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

OutputFile::OutputFile(const FileRef& file)
    : file_(file), out_(file.path, std::ios::binary | std::ios::trunc) {
  ACCRUE_CHECK(out_.is_open(), file, ": cannot open the file for writing");
}

void OutputFile::close() {
  out_.flush();
  ACCRUE_CHECK(out_.good(), file_, ": writing the file failed (disk full?)");
  out_.close();
  ACCRUE_CHECK(!out_.fail(), file_, ": closing the file failed");
}

Tensor host_contiguous(const Tensor& t) {
  return t.to(Device::cpu()).contiguous();
}

}  // namespace accrue::detail
