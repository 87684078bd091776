// The JSON of safetensors headers (core/safetensors.cpp): a reader for exactly
// the values a header holds, and the writer's pieces, formatted as serde_json
// (the reference implementation's) formats them. Internal to core/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/core/tensor_file.h"

namespace accrue::detail {

// A cursor over the header text. Values are parsed where the schema expects
// them, so there is no generic value tree and no nesting beyond two objects
// (see Note [Untrusted tensor files]). The text must be valid UTF-8 (checked
// by the caller, for the whole header, up front).
class JsonReader {
 public:
  JsonReader(const std::string& text, const FileRef& file) : s_(text), file_(file) {}

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    ACCRUE_FAIL(file_, ": header JSON at byte ", pos_, ": ", parts...);
  }

  void skip_whitespace();
  // The next non-whitespace character, or '\0' at the end of the text.
  char peek();
  bool consume(char c);
  void expect(char c, const char* context);
  void expect_end();
  // What comes next, for "expected X, found Y" messages.
  std::string describe_next();

  std::string parse_string();
  // A JSON number that must be an integer representable in int64 (the sign is
  // the caller's to check, so that its message can name the field).
  int64_t parse_integer(const std::string& what);
  // [int, int, ...] with at most max_items items (more fail with too_many).
  std::vector<int64_t> parse_integer_array(const std::string& what, size_t max_items,
                                           const std::string& too_many);
  // Parses the literal `null` if it comes next.
  bool consume_null();

 private:
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  uint32_t parse_hex4();
  // After "\u": one code point, combining a UTF-16 surrogate pair.
  uint32_t parse_unicode_escape();

  const std::string& s_;
  FileRef file_;
  size_t pos_ = 0;
};

// Appends s as a JSON string, escaped as serde_json escapes it.
void append_json_string(std::string& out, const std::string& s);

// Appends [1,2,3] (compact, as serde_json writes it).
void append_json_int_array(std::string& out, const std::vector<int64_t>& values);

}  // namespace accrue::detail
