#include "examples/common/json.h"

#include <cmath>
#include <cstdio>

namespace accrue::examples {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

JsonObject& JsonObject::raw(const std::string& key, const std::string& value) {
  if (!body_.empty()) body_ += ", ";
  body_ += json_string(key) + ": " + value;
  return *this;
}

JsonObject& JsonObject::number(const std::string& key, double v, int significant) {
  if (!std::isfinite(v)) return null(key);
  char s[48];
  std::snprintf(s, sizeof s, "%.*g", significant, v);
  return raw(key, s);
}

JsonObject& JsonObject::integer(const std::string& key, int64_t v) {
  return raw(key, std::to_string(v));
}

JsonObject& JsonObject::text(const std::string& key, const std::string& v) {
  return raw(key, json_string(v));
}

JsonObject& JsonObject::boolean(const std::string& key, bool v) {
  return raw(key, v ? "true" : "false");
}

JsonObject& JsonObject::null(const std::string& key) {
  return raw(key, "null");
}

JsonObject& JsonObject::object(const std::string& key, const JsonObject& v) {
  return raw(key, v.str());
}

}  // namespace accrue::examples
