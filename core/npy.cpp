// NumPy .npy: the reader and the writer of core/tensor_io.h. See Note
// [Untrusted tensor files] for the reader's rules.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <set>
#include <string>

#include "accrue/core/tensor_file.h"
#include "accrue/core/tensor_io.h"

namespace accrue {

namespace {

using detail::check_bool_bytes;
using detail::checked_mul;
using detail::checked_nbytes;
using detail::FileRef;
using detail::host_contiguous;
using detail::InputFile;
using detail::kMaxRank;
using detail::OutputFile;

constexpr uint64_t kMaxNpyHeader = 1 << 20;  // ours are < 256 bytes; numpy reads <= 10000

// .npy header: a Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }

struct NpyDType {
  const char* descr;
  DType dtype;
};
constexpr NpyDType kNpyDTypes[] = {
    {"<f4", DType::f32}, {"<f8", DType::f64}, {"<f2", DType::f16},
    {"<i4", DType::i32}, {"<i8", DType::i64}, {"|b1", DType::boolean},
};

struct NpyHeader {
  DType dtype = DType::f32;
  bool fortran_order = false;
  Shape shape;
};

class PyLiteralReader {
 public:
  PyLiteralReader(const std::string& text, const FileRef& file) : s_(text), file_(file) {}

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    ACCRUE_FAIL(file_, ": .npy header at byte ", pos_, ": ", parts...,
                " (header: ", s_.substr(0, 120), ")");
  }
  char peek() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool consume(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c, const char* context) {
    if (!consume(c)) fail("expected '", c, "' ", context);
  }
  bool at_end() { return peek() == '\0' && pos_ == s_.size(); }

  std::string parse_string(const char* what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a string for ", what);
    ++pos_;
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n') fail("unsupported character in a string");
      ++pos_;
    }
    if (pos_ >= s_.size()) fail("unterminated string");
    return s_.substr(start, pos_++ - start);
  }

  bool parse_bool(const char* what) {
    peek();
    for (const bool value : {true, false}) {
      const std::string literal = value ? "True" : "False";
      if (s_.compare(pos_, literal.size(), literal) == 0) {
        pos_ += literal.size();
        return value;
      }
    }
    fail("expected True or False for ", what);
  }

  int64_t parse_int(const char* what) {
    peek();
    const bool negative = pos_ < s_.size() && s_[pos_] == '-';
    if (negative) ++pos_;
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9')
      fail("expected an integer in ", what);
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (!checked_mul(v, 10, &v) || __builtin_add_overflow(v, s_[pos_] - '0', &v))
        fail("integer out of the 64-bit range in ", what);
      ++pos_;
    }
    return negative ? -v : v;
  }

  // (), (3,), (2, 3) or (2, 3,): a tuple of at most kMaxRank integers.
  Shape parse_shape() {
    expect('(', "to open the shape tuple");
    Shape shape;
    bool trailing_comma = false;
    while (!consume(')')) {
      if (static_cast<int>(shape.size()) == kMaxRank)
        fail("shape has more than ", kMaxRank, " dims, the most accrue supports");
      shape.push_back(parse_int("shape"));
      trailing_comma = consume(',');
      if (!trailing_comma && peek() != ')') fail("expected ',' or ')' in the shape tuple");
    }
    if (shape.size() == 1 && !trailing_comma) fail("shape (n) is not a tuple: write (n,)");
    return shape;
  }

 private:
  const std::string& s_;
  FileRef file_;
  size_t pos_ = 0;
};

NpyHeader parse_npy_header(const std::string& text, const FileRef& file) {
  PyLiteralReader py(text, file);
  NpyHeader header;
  std::set<std::string> seen;
  py.expect('{', "to open the header dict");
  while (!py.consume('}')) {
    const std::string key = py.parse_string("a key");
    py.expect(':', "after a key");
    if (!seen.insert(key).second) py.fail("duplicate key '", key, "'");
    if (key == "descr") {
      if (py.peek() == '[') py.fail("structured dtypes are not supported");
      const std::string descr = py.parse_string("'descr'");
      const auto* found = std::find_if(std::begin(kNpyDTypes), std::end(kNpyDTypes),
                                       [&](const auto& d) { return descr == d.descr; });
      if (found == std::end(kNpyDTypes)) {
        ACCRUE_CHECK(descr.empty() || descr[0] != '>', file, ": big-endian dtype '", descr,
                     "' is not supported; save it little-endian (arr.astype(arr.dtype."
                     "newbyteorder('<')))");
        ACCRUE_FAIL(file, ": dtype '", descr,
                    "' is not supported (supported: '<f4', '<f8', '<f2', '<i4', '<i8', '|b1')");
      }
      header.dtype = found->dtype;
    } else if (key == "fortran_order") {
      header.fortran_order = py.parse_bool("'fortran_order'");
    } else if (key == "shape") {
      header.shape = py.parse_shape();
    } else {
      py.fail("unexpected key '", key, "' (expected descr, fortran_order, shape)");
    }
    if (!py.consume(',') && py.peek() != '}') py.fail("expected ',' or '}' after a value");
  }
  if (!py.at_end()) py.fail("trailing characters after the header dict");
  for (const char* key : {"descr", "fortran_order", "shape"})
    ACCRUE_CHECK(seen.count(key), file, ": .npy header is missing '", key, "'");
  return header;
}

}  // namespace

Tensor load_npy(const std::string& path) {
  const FileRef file{"load_npy", path};
  InputFile in(file);
  static constexpr char kMagic[] = "\x93NUMPY";
  ACCRUE_CHECK(in.size() >= 10, file, ": the file is ", in.size(),
               " bytes, too short for the .npy magic, version and header length");
  unsigned char start[12] = {};
  in.read_at(0, start, 8, "the magic and version");
  ACCRUE_CHECK(std::memcmp(start, kMagic, 6) == 0, file,
               ": bad magic: not a .npy file (it must start with \\x93NUMPY)");
  const int major = start[6], minor = start[7];
  ACCRUE_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, file,
               ": unsupported .npy format version ", major, ".", minor,
               " (supported: 1.0, 2.0, 3.0)");
  // Version 1.0 has a 2-byte header length, 2.0 and 3.0 (UTF-8 header) 4 bytes.
  const uint64_t len_bytes = major == 1 ? 2 : 4;
  in.read_at(8, start + 8, len_bytes, "the header length");
  uint64_t header_len = 0;
  for (int i = static_cast<int>(len_bytes) - 1; i >= 0; --i)
    header_len = (header_len << 8) | start[8 + i];
  const uint64_t header_start = 8 + len_bytes;
  ACCRUE_CHECK(header_len <= in.size() - header_start, file, ": header length ", header_len,
               " runs past the end of the file (", in.size() - header_start, " bytes follow it)");
  ACCRUE_CHECK(header_len <= kMaxNpyHeader, file, ": header length ", header_len,
               " exceeds the cap of ", kMaxNpyHeader, " bytes");
  std::string text(header_len, '\0');
  in.read_at(header_start, text.data(), header_len, "the header");
  const NpyHeader header = parse_npy_header(text, file);

  const uint64_t nbytes = checked_nbytes(header.shape, header.dtype, file, "the array");
  const uint64_t data_start = header_start + header_len;
  const uint64_t available = in.size() - data_start;
  ACCRUE_CHECK(available >= nbytes, file, ": file too short: shape ", shape_str(header.shape),
               " of ", dtype_name(header.dtype), " needs ", nbytes, " data bytes but only ",
               available, " follow the header");
  ACCRUE_CHECK(available == nbytes, file, ": ", available - nbytes, " trailing bytes after the ",
               nbytes, " data bytes of shape ", shape_str(header.shape), " of ",
               dtype_name(header.dtype));

  Tensor raw = empty(header.shape, header.dtype);
  in.read_at(data_start, raw.data_ptr(), nbytes, "the data");
  if (header.dtype == DType::boolean) check_bool_bytes(raw, file, "the array");
  if (!header.fortran_order || header.shape.size() < 2) return raw;
  // Column-major bytes: view them with Fortran strides, then copy to C order.
  Shape fortran_strides(header.shape.size());
  int64_t stride = 1;
  for (size_t d = 0; d < header.shape.size(); ++d) {
    fortran_strides[d] = stride;
    stride *= std::max<int64_t>(header.shape[d], 1);
  }
  Tensor out = empty(header.shape, header.dtype);
  out.copy_(make_view(raw, header.shape, fortran_strides, 0));
  return out;
}

void save_npy(const std::string& path, const Tensor& t) {
  const FileRef file{"save_npy", path};
  ACCRUE_CHECK(t.defined(), file, ": the tensor is undefined");
  ACCRUE_CHECK(t.dtype() != DType::bf16, file,
               ": bf16 has no numpy dtype; convert with .to(DType::f32) first, or use "
               "save_safetensors, which stores BF16");
  const auto* dtype = std::find_if(std::begin(kNpyDTypes), std::end(kNpyDTypes),
                                   [&](const auto& d) { return d.dtype == t.dtype(); });
  ACCRUE_CHECK(dtype != std::end(kNpyDTypes), file, ": dtype ", dtype_name(t.dtype()),
               " has no .npy descr");
  const Tensor host = host_contiguous(t);

  // The dict exactly as numpy.save writes it: sorted keys, Python reprs, then
  // spare spaces so numpy can grow the first axis in place.
  std::string dict = "{'descr': '";
  dict += dtype->descr;
  dict += "', 'fortran_order': False, 'shape': (";
  for (int64_t d = 0; d < host.dim(); ++d) {
    if (d) dict += ", ";
    dict += std::to_string(host.size(d));
  }
  dict += host.dim() == 1 ? ",), }" : "), }";
  constexpr size_t kGrowthAxisMaxDigits = 21;
  if (host.dim() > 0) dict.append(kGrowthAxisMaxDigits - std::to_string(host.size(0)).size(), ' ');

  // Pad with spaces and a final newline so the data starts at a multiple of 64.
  constexpr size_t kAlign = 64;
  const auto padded_length = [&](size_t prefix_len) {
    const size_t with_newline = dict.size() + 1;
    return with_newline + (kAlign - (prefix_len + with_newline) % kAlign);
  };
  const bool v1 = padded_length(10) <= 0xffff;
  const size_t header_len = padded_length(v1 ? 10 : 12);
  std::string prefix = "\x93NUMPY";
  prefix += static_cast<char>(v1 ? 1 : 2);
  prefix += '\0';
  for (size_t i = 0; i < (v1 ? 2u : 4u); ++i)
    prefix += static_cast<char>((header_len >> (8 * i)) & 0xff);
  std::string header = dict;
  header.append(header_len - dict.size() - 1, ' ');
  header += '\n';

  OutputFile out(file);
  out.write(prefix);
  out.write(header);
  out.write(host.data_ptr(), host.nbytes());
  out.close();
}

}  // namespace accrue
