#include "examples/common/run_main.h"

#include <cstdio>
#include <new>
#include <regex>

#include "accrue/core/error.h"
#include "examples/common/options.h"

namespace accrue::examples {

std::string user_message(const std::exception& e) {
  // ACCRUE_CHECK's suffix (core/error.cpp): " (" __FILE__ ":" __LINE__ ")",
  // once per check the message passed through.
  static const std::regex location(
      R"( \((?:[^()\s]*/)?[\w.+-]+\.(?:cpp|cc|cu|cuh|h|hpp|inc):\d+\))");
  std::string message = std::regex_replace(e.what(), location, "");
  std::string line;
  for (char c : message) {
    if (c == '\n') {
      if (!line.empty() && line.back() != ' ') line += "; ";
    } else {
      line += c;
    }
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == ';'))
    line.pop_back();
  return line.empty() ? "unknown error" : line;
}

int run_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s (see --help)\n", program, user_message(e).c_str());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: out of host memory (std::bad_alloc)\n", program);
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", program, user_message(e).c_str());
    return 1;
  } catch (...) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: an unknown exception ended the run\n", program);
    return 1;
  }
}

}  // namespace accrue::examples
