// The JSON of the files accrue reads and writes: safetensors headers
// (core/safetensors.cpp) and Hugging Face config.json and
// model.safetensors.index.json (nn/llama_config.cpp, nn/hf_checkpoint.cpp). A
// cursor for exactly the values each schema expects, and the writer's pieces,
// formatted as serde_json (the safetensors reference implementation's)
// formats them. Not a public API: include it from accrue's own readers only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/core/tensor_file.h"

namespace accrue::detail {

// Note [Schema-driven JSON]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// JSON from a file is untrusted (Note [Untrusted tensor files]), so it is
// read by a cursor that parses each value where the schema expects it: no
// generic value tree is built, and nothing recurses. A value the schema does
// not know (an unknown key of a config.json) is skipped by skip_value, which
// walks nested objects and arrays with an explicit stack of at most
// kMaxJsonDepth levels and checks every string and number as it passes, so a
// malformed or absurdly nested value is an error, not a crash. Numbers that
// the schema reads as integers must be integers in int64; numbers read as
// doubles must be finite after rounding (1e999 is refused). Keys are not
// unique by JSON's grammar: each schema refuses a duplicate of a key it
// reads. The text must be valid UTF-8 (checked by the caller, for the whole
// text, up front).
constexpr int kMaxJsonDepth = 64;

class JsonReader {
 public:
  // `what` starts every error after the file: "header JSON", "config JSON".
  JsonReader(const std::string& text, const FileRef& file, const char* what = "header JSON")
      : s_(text), file_(file), what_(what) {}

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    ACCRUE_FAIL(file_, ": ", what_, " at byte ", pos_, ": ", parts...);
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

  // A JSON number (integer or not) as the nearest double; refuses one whose
  // magnitude rounds to infinity.
  double parse_number(const std::string& what);
  // `true` or `false`.
  bool parse_bool(const std::string& what);
  // Skips one value of any type (Note [Schema-driven JSON]), checking it as
  // it goes; nesting deeper than kMaxJsonDepth fails.
  void skip_value();

  // Reads an object: `on_key(key)` is called with the cursor on each key's
  // value and must consume it. `what` names the object in errors.
  template <class OnKey>
  void parse_object(const std::string& what, OnKey&& on_key) {
    if (peek() != '{') fail("expected an object for ", what, ", found ", describe_next());
    ++pos_;
    if (consume('}')) return;
    while (true) {
      if (peek() != '"') fail("expected a key in ", what, ", found ", describe_next());
      const std::string key = parse_string();
      expect(':', "after a key");
      on_key(key);
      if (consume('}')) return;
      expect(',', ("or '}' after a value in " + what).c_str());
    }
  }
  // Reads an array: `on_item(index)` is called with the cursor on each item
  // and must consume it.
  template <class OnItem>
  void parse_array(const std::string& what, OnItem&& on_item) {
    if (peek() != '[') fail("expected an array for ", what, ", found ", describe_next());
    ++pos_;
    if (consume(']')) return;
    for (size_t i = 0;; ++i) {
      on_item(i);
      if (consume(']')) return;
      expect(',', ("or ']' after an item of " + what).c_str());
    }
  }

 private:
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  uint32_t parse_hex4();
  // After "\u": one code point, combining a UTF-16 surrogate pair.
  uint32_t parse_unicode_escape();

  // Checks the grammar of a number at the cursor and moves past it; returns its text.
  std::string_view scan_number(const std::string& what);

  const std::string& s_;
  FileRef file_;
  const char* what_;
  size_t pos_ = 0;
};

// Appends s as a JSON string, escaped as serde_json escapes it.
void append_json_string(std::string& out, const std::string& s);

// Appends [1,2,3] (compact, as serde_json writes it).
void append_json_int_array(std::string& out, const std::vector<int64_t>& values);

// Appends a finite double as Python's json.dumps writes a float: the shortest
// text that reads back as the same double, with ".0" when it would otherwise
// read as an integer (500000.0, 1e-05, 1e+20). Throws for NaN and infinities,
// which JSON cannot hold.
void append_json_double(std::string& out, double value);

}  // namespace accrue::detail
