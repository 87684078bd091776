// One JSON object on one line: the benchmarks' summary line that
// bench/*.py parse. Keys keep their insertion order; a number that is not
// finite is written as null (as the metrics log does, Note [Metrics log]).
//
//   JsonObject config;
//   config.integer("micro_batch", 4).text("dtype", "bf16");
//   std::printf("%s\n", JsonObject().text("bench", "x").object("config", config).str().c_str());
#pragma once

#include <cstdint>
#include <string>

namespace accrue::examples {

class JsonObject {
 public:
  // `significant`: the significant digits written (printf's %.*g).
  JsonObject& number(const std::string& key, double v, int significant = 6);
  JsonObject& integer(const std::string& key, int64_t v);
  JsonObject& text(const std::string& key, const std::string& v);
  JsonObject& boolean(const std::string& key, bool v);
  JsonObject& null(const std::string& key);
  JsonObject& object(const std::string& key, const JsonObject& v);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  JsonObject& raw(const std::string& key, const std::string& value);
  std::string body_;
};

// `s` as a JSON string literal, quotes included.
std::string json_string(const std::string& s);

}  // namespace accrue::examples
