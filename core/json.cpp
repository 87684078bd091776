#include "accrue/core/json.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "accrue/core/utf8.h"

namespace accrue::detail {

namespace {

// JSON's two-character escapes: the letter after the backslash, and what it stands for.
constexpr std::pair<char, char> kJsonEscapes[] = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},
                                                  {'b', '\b'}, {'f', '\f'},  {'n', '\n'},
                                                  {'r', '\r'}, {'t', '\t'}};

}  // namespace

// ---------------------------------------------------------------------------
// The reader

void JsonReader::skip_whitespace() {
  while (pos_ < s_.size() &&
         (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
    ++pos_;
}

char JsonReader::peek() {
  skip_whitespace();
  return pos_ < s_.size() ? s_[pos_] : '\0';
}

bool JsonReader::consume(char c) {
  if (peek() != c) return false;
  ++pos_;
  return true;
}

void JsonReader::expect(char c, const char* context) {
  if (!consume(c)) fail("expected '", c, "' ", context, ", found ", describe_next());
}

void JsonReader::expect_end() {
  skip_whitespace();
  if (pos_ < s_.size()) fail("trailing characters after the header object: ", describe_next());
}

std::string JsonReader::describe_next() {
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

std::string JsonReader::parse_string() {
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

int64_t JsonReader::parse_integer(const std::string& what) {
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

std::vector<int64_t> JsonReader::parse_integer_array(const std::string& what, size_t max_items,
                                                     const std::string& too_many) {
  if (peek() != '[') fail("expected an array of integers for ", what, ", found ", describe_next());
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

bool JsonReader::consume_null() {
  if (peek() != 'n' || s_.compare(pos_, 4, "null") != 0) return false;
  pos_ += 4;
  return true;
}

uint32_t JsonReader::parse_hex4() {
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

uint32_t JsonReader::parse_unicode_escape() {
  const uint32_t first = parse_hex4();
  if (first >= 0xdc00 && first <= 0xdfff) fail("lone low surrogate in a \\u escape");
  if (first < 0xd800 || first > 0xdbff) return first;
  if (s_.compare(pos_, 2, "\\u") != 0) fail("high surrogate not followed by a low surrogate");
  pos_ += 2;
  const uint32_t second = parse_hex4();
  if (second < 0xdc00 || second > 0xdfff) fail("high surrogate not followed by a low surrogate");
  return 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
}

// ---------------------------------------------------------------------------
// The writer, formatted as serde_json formats it

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

}  // namespace accrue::detail
