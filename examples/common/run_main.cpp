#include "examples/common/run_main.h"

#include <cstdio>
#include <new>

#include "accrue/core/error.h"
#include "examples/common/options.h"

namespace accrue::examples {

std::string user_message(const std::exception& e) {
  // Note [Error locations] in core/error.h: an accrue::Error's message()
  // carries no source location; other exceptions have only what().
  std::string line;
  for (char c : error_message(e)) {
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
