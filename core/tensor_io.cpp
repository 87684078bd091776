#include "core/tensor_io.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace accrue {

// Both formats store little-endian bytes and this file copies them verbatim.
static_assert(std::endian::native == std::endian::little,
              "tensor_io.cpp assumes a little-endian host");

namespace {

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

constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;  // the reference implementation's cap
constexpr uint64_t kMaxNpyHeader = 1 << 20;  // ours are < 256 bytes; numpy reads <= 10000
constexpr int kMaxRank = 8;                  // see core/strided_index.h

// "load_npy('x.npy')": the prefix of every error message.
struct FileRef {
  const char* op;
  const std::string& path;
};
std::ostream& operator<<(std::ostream& os, const FileRef& f) {
  return os << f.op << "('" << f.path << "')";
}

bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// Returns numel * element_size(dtype) for a shape read from a file, after
// checking its rank, its signs and that nothing derived from it overflows
// (including the strides contiguous_strides computes, which skip zero dims).
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

// A regular file opened for reading whose size is known up front; every read
// is checked against that size before it happens.
class InputFile {
 public:
  explicit InputFile(const FileRef& file) : file_(file) {
    std::error_code ec;
    const auto status = std::filesystem::status(file.path, ec);
    ACCRUE_CHECK(!ec && std::filesystem::exists(status), file, ": no such file");
    ACCRUE_CHECK(std::filesystem::is_regular_file(status), file, ": not a regular file");
    size_ = std::filesystem::file_size(file.path, ec);
    ACCRUE_CHECK(!ec, file, ": cannot read the file size: ", ec.message());
    in_.open(file.path, std::ios::binary);
    ACCRUE_CHECK(in_.is_open(), file, ": cannot open the file for reading");
  }

  uint64_t size() const { return size_; }

  void read_at(uint64_t offset, void* dst, uint64_t n, const char* what) {
    ACCRUE_CHECK(offset <= size_ && n <= size_ - offset, file_, ": reading ", what,
                 " needs bytes [", offset, ", ", offset + n, ") but the file has ", size_);
    if (n == 0) return;
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    ACCRUE_CHECK(in_.good() && static_cast<uint64_t>(in_.gcount()) == n, file_, ": short read of ",
                 what, " (", in_.gcount(), " of ", n, " bytes at offset ", offset,
                 "); was the file changed while reading?");
  }

 private:
  FileRef file_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

// Writes a file and checks, at the end, that every byte made it to disk.
class OutputFile {
 public:
  explicit OutputFile(const FileRef& file)
      : file_(file), out_(file.path, std::ios::binary | std::ios::trunc) {
    ACCRUE_CHECK(out_.is_open(), file, ": cannot open the file for writing");
  }
  void write(const void* data, size_t n) {
    if (n > 0) out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  void close() {
    out_.flush();
    ACCRUE_CHECK(out_.good(), file_, ": writing the file failed (disk full?)");
    out_.close();
    ACCRUE_CHECK(!out_.fail(), file_, ": closing the file failed");
  }

 private:
  FileRef file_;
  std::ofstream out_;
};

// Host, contiguous: what both writers copy bytes from.
Tensor host_contiguous(const Tensor& t) {
  return t.to(Device::cpu()).contiguous();
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 if there is none
// (overlong forms, surrogates and code points past U+10FFFF are invalid).
size_t utf8_sequence_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  if ((c & 0xe0) == 0xc0) {
    len = 2, cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3, cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

// Offset of the first byte that is not valid UTF-8, or npos.
size_t find_invalid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// ---------------------------------------------------------------------------
// The safetensors header: a JSON reader for exactly the values it holds.

// JSON's two-character escapes: the letter after the backslash, and what it stands for.
constexpr std::pair<char, char> kJsonEscapes[] = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},
                                                  {'b', '\b'}, {'f', '\f'},  {'n', '\n'},
                                                  {'r', '\r'}, {'t', '\t'}};

// A cursor over the header text. Values are parsed where the schema expects
// them, so there is no generic value tree and no nesting beyond two objects.
class JsonReader {
 public:
  JsonReader(const std::string& text, const FileRef& file) : s_(text), file_(file) {}

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    ACCRUE_FAIL(file_, ": header JSON at byte ", pos_, ": ", parts...);
  }

  void skip_whitespace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  // The next non-whitespace character, or '\0' at the end of the text.
  char peek() {
    skip_whitespace();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool consume(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c, const char* context) {
    if (!consume(c)) fail("expected '", c, "' ", context, ", found ", describe_next());
  }
  void expect_end() {
    skip_whitespace();
    if (pos_ < s_.size()) fail("trailing characters after the header object: ", describe_next());
  }
  // What comes next, for "expected X, found Y" messages.
  std::string describe_next() {
    const char c = peek();
    if (pos_ >= s_.size()) return "the end of the header";
    if (c == '"') return "a string";
    if (c == '{') return "an object";
    if (c == '[') return "an array";
    if (c == '-' || (c >= '0' && c <= '9')) return "a number";
    if (c == 't' || c == 'f') return "a boolean";
    if (c == 'n') return "null";
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return detail::str_cat("the byte ", static_cast<int>(static_cast<unsigned char>(c)));
    return detail::str_cat("'", c, "'");
  }

  std::string parse_string() {
    if (peek() != '"') fail("expected a string, found ", describe_next());
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in a string");
      if (c != '\\') {
        out += c;  // multi-byte UTF-8 was validated for the whole header up front
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape in a string");
      const char e = s_[pos_++];
      if (e == 'u') {
        append_utf8(out, parse_unicode_escape());
        continue;
      }
      const auto* escape = std::find_if(std::begin(kJsonEscapes), std::end(kJsonEscapes),
                                        [&](const auto& x) { return x.first == e; });
      if (escape == std::end(kJsonEscapes)) fail("invalid escape '\\", e, "' in a string");
      out += escape->second;
    }
  }

  // A JSON number that must be an integer representable in int64 (the sign is
  // the caller's to check, so that its message can name the field).
  int64_t parse_integer(const std::string& what) {
    if (peek() != '-' && !(peek() >= '0' && peek() <= '9'))
      fail("expected an integer for ", what, ", found ", describe_next());
    const size_t start = pos_;
    const bool negative = s_[pos_] == '-';
    if (negative) ++pos_;
    if (pos_ >= s_.size() || !is_digit(s_[pos_])) fail("malformed number for ", what);
    if (s_[pos_] == '0' && pos_ + 1 < s_.size() && is_digit(s_[pos_ + 1]))
      fail("number with a leading zero for ", what);
    uint64_t magnitude = 0;
    bool overflow = false;
    while (pos_ < s_.size() && is_digit(s_[pos_])) {
      const uint64_t digit = static_cast<uint64_t>(s_[pos_++] - '0');
      if (magnitude > (std::numeric_limits<uint64_t>::max() - digit) / 10) overflow = true;
      magnitude = magnitude * 10 + digit;
    }
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      fail("expected an integer for ", what, ", found the non-integer number ",
           s_.substr(start, std::min<size_t>(pos_ - start + 8, 40)));
    const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (overflow || magnitude > limit)
      fail("integer ", s_.substr(start, std::min<size_t>(pos_ - start, 40)), " for ", what,
           " is out of the 64-bit range");
    return negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  }

  // [int, int, ...] with at most max_items items (more fail with too_many).
  std::vector<int64_t> parse_integer_array(const std::string& what, size_t max_items,
                                           const std::string& too_many) {
    if (peek() != '[')
      fail("expected an array of integers for ", what, ", found ", describe_next());
    ++pos_;
    std::vector<int64_t> out;
    if (consume(']')) return out;
    while (true) {
      if (out.size() == max_items) fail(what, " ", too_many);
      out.push_back(parse_integer(what));
      if (consume(']')) return out;
      expect(',', ("between the items of " + what).c_str());
    }
  }

  // Parses the literal `null` if it comes next.
  bool consume_null() {
    if (peek() != 'n' || s_.compare(pos_, 4, "null") != 0) return false;
    pos_ += 4;
    return true;
  }

 private:
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  uint32_t parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail("invalid hex digit in a \\u escape");
      }
    }
    return v;
  }

  // After "\u": one code point, combining a UTF-16 surrogate pair.
  uint32_t parse_unicode_escape() {
    const uint32_t first = parse_hex4();
    if (first >= 0xdc00 && first <= 0xdfff) fail("lone low surrogate in a \\u escape");
    if (first < 0xd800 || first > 0xdbff) return first;
    if (s_.compare(pos_, 2, "\\u") != 0) fail("high surrogate not followed by a low surrogate");
    pos_ += 2;
    const uint32_t second = parse_hex4();
    if (second < 0xdc00 || second > 0xdfff) fail("high surrogate not followed by a low surrogate");
    return 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
  }

  const std::string& s_;
  FileRef file_;
  size_t pos_ = 0;
};

// Safetensors dtype names, and the rank of each in the reference
// implementation's Dtype enum, whose order the writer sorts by.
struct SafetensorsDType {
  const char* name;
  DType dtype;
  int reference_rank;
};
constexpr SafetensorsDType kSafetensorsDTypes[] = {
    {"BOOL", DType::boolean, 0}, {"F16", DType::f16, 7},  {"BF16", DType::bf16, 8},
    {"I32", DType::i32, 9},      {"F32", DType::f32, 11}, {"F64", DType::f64, 12},
    {"I64", DType::i64, 13},
};

const SafetensorsDType& safetensors_dtype(DType t) {
  for (const auto& d : kSafetensorsDTypes)
    if (d.dtype == t) return d;
  ACCRUE_FAIL("save_safetensors: dtype ", dtype_name(t), " has no safetensors name");
}

struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  int64_t begin = 0, end = 0;
};

TensorEntry parse_tensor_entry(JsonReader& json, const std::string& name, const FileRef& file) {
  TensorEntry entry;
  entry.name = name;
  const std::string quoted = "'" + name + "'";
  if (json.peek() != '{')
    json.fail("tensor ", quoted, " must be an object, found ", json.describe_next());
  json.expect('{', "");
  bool has_dtype = false, has_shape = false, has_offsets = false;
  if (!json.consume('}')) {
    while (true) {
      const std::string key = json.parse_string();
      json.expect(':', "after a key");
      bool* seen = nullptr;
      if (key == "dtype") {
        seen = &has_dtype;
        if (json.peek() != '"')
          json.fail("'dtype' of tensor ", quoted, " must be a string, found ",
                    json.describe_next());
        const std::string dtype = json.parse_string();
        const auto* found =
            std::find_if(std::begin(kSafetensorsDTypes), std::end(kSafetensorsDTypes),
                         [&](const auto& d) { return dtype == d.name; });
        ACCRUE_CHECK(found != std::end(kSafetensorsDTypes), file, ": tensor ", quoted,
                     " has dtype '", dtype,
                     "', which accrue does not support (supported: F32, F64, BF16, F16, I32, "
                     "I64, BOOL)");
        entry.dtype = found->dtype;
      } else if (key == "shape") {
        seen = &has_shape;
        entry.shape = json.parse_integer_array(
            "'shape' of tensor " + quoted, kMaxRank,
            detail::str_cat("has more than ", kMaxRank, " dims, the most accrue supports"));
      } else if (key == "data_offsets") {
        seen = &has_offsets;
        const auto offsets = json.parse_integer_array("'data_offsets' of tensor " + quoted, 2,
                                                      "must be [begin, end]: too many items");
        if (offsets.size() != 2)
          json.fail("'data_offsets' of tensor ", quoted, " must be [begin, end], found ",
                    offsets.size(), " items");
        entry.begin = offsets[0];
        entry.end = offsets[1];
      } else {
        json.fail("tensor ", quoted, " has the unknown field '", key,
                  "' (expected dtype, shape, data_offsets)");
      }
      if (*seen) json.fail("tensor ", quoted, " has a duplicate key '", key, "'");
      *seen = true;
      if (json.consume('}')) break;
      json.expect(',', "or '}' after a field of a tensor");
    }
  }
  ACCRUE_CHECK(has_dtype, file, ": tensor ", quoted, " is missing 'dtype'");
  ACCRUE_CHECK(has_shape, file, ": tensor ", quoted, " is missing 'shape'");
  ACCRUE_CHECK(has_offsets, file, ": tensor ", quoted, " is missing 'data_offsets'");
  return entry;
}

void parse_metadata(JsonReader& json, std::map<std::string, std::string>& metadata) {
  if (json.consume_null()) return;  // the reference reader accepts null as "no metadata"
  if (json.peek() != '{')
    json.fail("'__metadata__' must be an object of strings, found ", json.describe_next());
  json.expect('{', "");
  if (json.consume('}')) return;
  while (true) {
    std::string key = json.parse_string();
    json.expect(':', "after a key");
    if (json.peek() != '"')
      json.fail("'__metadata__' value of '", key, "' must be a string, found ",
                json.describe_next());
    std::string value = json.parse_string();
    if (!metadata.emplace(key, std::move(value)).second)
      json.fail("duplicate key '", key, "' in '__metadata__'");
    if (json.consume('}')) return;
    json.expect(',', "or '}' after a metadata value");
  }
}

// ---------------------------------------------------------------------------
// The safetensors writer's JSON, formatted as serde_json formats it.

void append_json_string(std::string& out, const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    const auto* escape = std::find_if(std::begin(kJsonEscapes), std::end(kJsonEscapes),
                                      [&](const auto& x) { return x.second == c; });
    if (c != '/' && escape != std::end(kJsonEscapes)) {  // serde_json leaves '/' alone
      out += '\\';
      out += escape->first;
    } else if (u < 0x20) {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
}

void append_json_int_array(std::string& out, const std::vector<int64_t>& values) {
  out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(values[i]);
  }
  out += ']';
}

void check_utf8(const std::string& s, const FileRef& file, const char* what) {
  const size_t bad = find_invalid_utf8(s);
  ACCRUE_CHECK(bad == std::string::npos, file, ": ", what, " '", s, "' is not valid UTF-8 (byte ",
               bad, ")");
}

// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// safetensors

std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  const FileRef file{"load_safetensors", path};
  InputFile in(file);
  ACCRUE_CHECK(in.size() >= 8, file, ": the file is ", in.size(),
               " bytes, shorter than the 8-byte header length");
  unsigned char prefix[8];
  in.read_at(0, prefix, 8, "the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | prefix[i];
  ACCRUE_CHECK(header_len <= kMaxSafetensorsHeader, file, ": header length ", header_len,
               " exceeds the cap of ", kMaxSafetensorsHeader, " bytes");
  ACCRUE_CHECK(header_len <= in.size() - 8, file, ": header length ", header_len,
               " is larger than the ", in.size() - 8, " bytes that follow it in the file");
  std::string text(header_len, '\0');
  in.read_at(8, text.data(), header_len, "the header");
  const size_t bad = find_invalid_utf8(text);
  ACCRUE_CHECK(bad == std::string::npos, file, ": header is not valid UTF-8 (byte ", bad, ")");

  // Parse: one object of tensor entries and an optional "__metadata__".
  JsonReader json(text, file);
  std::map<std::string, TensorEntry> entries;
  std::map<std::string, std::string> meta;
  bool has_metadata = false;
  if (json.peek() != '{')
    json.fail("the header must be a JSON object, found ", json.describe_next());
  json.expect('{', "");
  if (!json.consume('}')) {
    while (true) {
      std::string key = json.parse_string();
      json.expect(':', "after a key");
      if (key == "__metadata__") {
        if (has_metadata) json.fail("duplicate key '__metadata__'");
        has_metadata = true;
        parse_metadata(json, meta);
      } else {
        if (entries.count(key)) json.fail("duplicate key '", key, "'");
        TensorEntry entry = parse_tensor_entry(json, key, file);
        entries.emplace(std::move(key), std::move(entry));
      }
      if (json.consume('}')) break;
      json.expect(',', "or '}' after a tensor entry");
    }
  }
  json.expect_end();

  // Validate every entry against the data section, then check that the
  // entries tile it exactly (the format allows no overlap, hole or tail).
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = in.size() - data_start;
  std::vector<const TensorEntry*> by_offset;
  for (const auto& [name, e] : entries) {
    const std::string what = "tensor '" + name + "'";
    const uint64_t nbytes = checked_nbytes(e.shape, e.dtype, file, what);
    ACCRUE_CHECK(e.begin >= 0 && e.end >= 0 && e.begin <= e.end, file, ": ", what,
                 " has data_offsets [", e.begin, ", ", e.end,
                 "]; they must be [begin, end] with 0 <= begin <= end");
    ACCRUE_CHECK(static_cast<uint64_t>(e.end) <= data_size, file, ": ", what, " has data_offsets [",
                 e.begin, ", ", e.end, "] whose end is beyond the data section of ", data_size,
                 " bytes");
    ACCRUE_CHECK(static_cast<uint64_t>(e.end - e.begin) == nbytes, file, ": ", what,
                 " has data_offsets [", e.begin, ", ", e.end, "] spanning ", e.end - e.begin,
                 " bytes, but shape ", shape_str(e.shape), " of ", dtype_name(e.dtype), " needs ",
                 nbytes, " bytes");
    by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  int64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry* e : by_offset) {
    ACCRUE_CHECK(e->begin >= covered, file, ": tensors '", previous ? previous->name : "",
                 "' and '", e->name, "' overlap (data_offsets end ", covered, " > begin ", e->begin,
                 ")");
    ACCRUE_CHECK(e->begin == covered, file, ": hole in the data section: bytes [", covered, ", ",
                 e->begin, ") belong to no tensor");
    covered = e->end;
    previous = e;
  }
  ACCRUE_CHECK(static_cast<uint64_t>(covered) == data_size, file,
               ": trailing bytes: the tensors cover ", covered, " bytes but the data section has ",
               data_size, " (bytes [", covered, ", ", data_size, ") belong to no tensor)");

  // Everything fits the file: read. Allocations total at most the file size.
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, e] : entries) {
    Tensor t = empty(e.shape, e.dtype);
    const std::string what = "tensor '" + name + "'";
    in.read_at(data_start + static_cast<uint64_t>(e.begin), t.data_ptr(),
               static_cast<uint64_t>(e.end - e.begin), what.c_str());
    if (e.dtype == DType::boolean) check_bool_bytes(t, file, what);
    tensors.emplace(name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return tensors;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  return load_safetensors(path, nullptr);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const FileRef file{"save_safetensors", path};
  struct Item {
    const std::string* name;
    Tensor host;
    const SafetensorsDType* dtype;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    ACCRUE_CHECK(t.defined(), file, ": tensor '", name, "' is undefined");
    ACCRUE_CHECK(name != "__metadata__", file,
                 ": '__metadata__' is reserved by the format and cannot name a tensor");
    check_utf8(name, file, "tensor name");
    items.push_back({&name, host_contiguous(t), &safetensors_dtype(t.dtype())});
  }
  for (const auto& [key, value] : metadata) {
    check_utf8(key, file, "metadata key");
    check_utf8(value, file, "metadata value");
  }
  // The reference implementation's order: largest dtype first (by its enum
  // order), then by name. Every tensor then starts at a multiple of its
  // element size, and files are byte-identical to the reference's.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.dtype->reference_rank != b.dtype->reference_rank)
      return a.dtype->reference_rank > b.dtype->reference_rank;
    return *a.name < *b.name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  int64_t offset = 0;
  for (const Item& item : items) {
    if (header.size() > 1) header += ',';
    append_json_string(header, *item.name);
    header += ":{\"dtype\":\"";
    header += item.dtype->name;
    header += "\",\"shape\":";
    append_json_int_array(header, item.host.shape());
    header += ",\"data_offsets\":";
    const int64_t end = offset + static_cast<int64_t>(item.host.nbytes());
    append_json_int_array(header, {offset, end});
    header += '}';
    offset = end;
  }
  header += '}';
  // Pad with spaces to a multiple of 8 so that the data section starts aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  ACCRUE_CHECK(header.size() <= kMaxSafetensorsHeader, file, ": header of ", header.size(),
               " bytes exceeds the ", kMaxSafetensorsHeader, "-byte cap that readers enforce");

  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  OutputFile out(file);
  out.write(prefix, 8);
  out.write(header);
  for (const Item& item : items)
    out.write(item.host.data_ptr(), item.host.nbytes());
  out.close();
}

// ---------------------------------------------------------------------------
// .npy

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
