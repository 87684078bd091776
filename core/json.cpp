#include "accrue/core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <limits>
#include <system_error>
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
  if (pos_ < s_.size()) fail("trailing characters after the top-level object: ", describe_next());
}

std::string JsonReader::describe_next() {
  const char c = peek();
  if (pos_ >= s_.size())
    return std::string_view(what_).starts_with("header") ? "the end of the header"
                                                         : "the end of the text";
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

std::string_view JsonReader::scan_number(const std::string& what) {
  const size_t start = pos_;
  if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
  if (pos_ >= s_.size() || !is_digit(s_[pos_])) fail("malformed number for ", what);
  if (s_[pos_] == '0' && pos_ + 1 < s_.size() && is_digit(s_[pos_ + 1]))
    fail("number with a leading zero for ", what);
  while (pos_ < s_.size() && is_digit(s_[pos_]))
    ++pos_;
  if (pos_ < s_.size() && s_[pos_] == '.') {
    ++pos_;
    if (pos_ >= s_.size() || !is_digit(s_[pos_]))
      fail("malformed number for ", what, ": no digit after the decimal point");
    while (pos_ < s_.size() && is_digit(s_[pos_]))
      ++pos_;
  }
  if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
    if (pos_ >= s_.size() || !is_digit(s_[pos_]))
      fail("malformed number for ", what, ": no digit in the exponent");
    while (pos_ < s_.size() && is_digit(s_[pos_]))
      ++pos_;
  }
  return std::string_view(s_).substr(start, pos_ - start);
}

double JsonReader::parse_number(const std::string& what) {
  if (peek() != '-' && !(peek() >= '0' && peek() <= '9'))
    fail("expected a number for ", what, ", found ", describe_next());
  const std::string_view text = scan_number(what);
  double value = 0;
  // The grammar was checked above; from_chars is locale-independent and
  // rounds to nearest. Underflow to zero or a subnormal is a value; overflow is not.
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) {
    // Overflow or underflow: out of range only far beyond 1e300 or below
    // 1e-300, so the sign of the decimal order tells which. The order is the
    // exponent plus the place of the first nonzero digit.
    const size_t e = text.find_first_of("eE");
    const std::string_view mantissa = text.substr(0, e);
    int64_t order = 0;
    const size_t point = std::min(mantissa.find('.'), mantissa.size());
    const size_t first = mantissa.find_first_of("123456789");
    if (first != std::string_view::npos)
      order = first < point ? static_cast<int64_t>(point - first)
                            : -static_cast<int64_t>(first - point - 1);
    int64_t exponent = 0;
    if (e != std::string_view::npos) {
      const char* p = text.data() + e + 1;
      if (*p == '+') ++p;
      const auto parsed = std::from_chars(p, text.data() + text.size(), exponent);
      if (parsed.ec != std::errc()) exponent = (*p == '-') ? -1'000'000 : 1'000'000;
    }
    if (first != std::string_view::npos && order + exponent > 0)
      fail("number ", text.substr(0, 40), " for ", what, " is out of the range of a double");
    value = text[0] == '-' ? -0.0 : 0.0;  // underflow: as strtod, a zero of the sign
  } else if (ec != std::errc() || end != text.data() + text.size()) {
    fail("malformed number ", text.substr(0, 40), " for ", what);
  }
  return value;
}

bool JsonReader::parse_bool(const std::string& what) {
  const char c = peek();
  if (c == 't' && s_.compare(pos_, 4, "true") == 0) {
    pos_ += 4;
    return true;
  }
  if (c == 'f' && s_.compare(pos_, 5, "false") == 0) {
    pos_ += 5;
    return false;
  }
  fail("expected true or false for ", what, ", found ", describe_next());
}

void JsonReader::skip_value() {
  // Note [Schema-driven JSON]: an explicit stack of the open containers, so
  // depth costs no recursion. Each entry is '{' or '['.
  std::string open;
  while (true) {
    const char c = peek();
    if (c == '{' || c == '[') {
      if (open.size() == static_cast<size_t>(kMaxJsonDepth))
        fail("objects and arrays nested deeper than ", kMaxJsonDepth, " levels");
      ++pos_;
      open += c;
      if (consume(c == '{' ? '}' : ']')) {
        open.pop_back();
      } else if (c == '{') {
        if (peek() != '"') fail("expected a key in an object, found ", describe_next());
        parse_string();
        expect(':', "after a key");
        continue;  // the cursor is on the key's value
      } else {
        continue;  // the cursor is on the first item
      }
    } else if (c == '"') {
      parse_string();
    } else if (c == '-' || is_digit(c)) {
      scan_number("a skipped value");
    } else if (c == 't' || c == 'f') {
      parse_bool("a skipped value");
    } else if (!consume_null()) {
      fail("expected a value, found ", describe_next());
    }
    // One value is complete: close containers until one has another item.
    while (!open.empty()) {
      const char closer = open.back() == '{' ? '}' : ']';
      if (consume(closer)) {
        open.pop_back();
        continue;
      }
      expect(',', open.back() == '{' ? "or '}' after a value in an object"
                                     : "or ']' after an item of an array");
      if (open.back() == '{') {
        if (peek() != '"') fail("expected a key in an object, found ", describe_next());
        parse_string();
        expect(':', "after a key");
      }
      break;
    }
    if (open.empty()) return;
  }
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

void append_json_double(std::string& out, double value) {
  ACCRUE_CHECK(std::isfinite(value), "JSON: ", value,
               " is not a finite number, which JSON cannot hold");
  if (value == 0) {
    out += std::signbit(value) ? "-0.0" : "0.0";
    return;
  }
  // The shortest digits that read back as `value`, as d.ddde[+-]XX.
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  ACCRUE_CHECK(ec == std::errc(), "JSON: cannot format ", value);
  const std::string_view text(buf, static_cast<size_t>(end - buf));
  const size_t e = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (const char c : text.substr(negative ? 1 : 0, e - (negative ? 1 : 0)))
    if (c != '.') digits += c;
  int exponent = 0;
  std::from_chars(text.data() + e + (text[e + 1] == '+' ? 2 : 1), text.data() + text.size(),
                  exponent);
  if (negative) out += '-';
  // Python's repr: positional for exponents -4 .. 15, scientific otherwise.
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(exponent) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1);
      out += '.';
      out += digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  out += 'e';
  out += exponent < 0 ? '-' : '+';
  const int magnitude = exponent < 0 ? -exponent : exponent;
  if (magnitude < 10) out += '0';
  out += std::to_string(magnitude);
}

}  // namespace accrue::detail
