// accrue::Error and the checks that throw it.
//
// A library never exits or aborts on bad input: every failed check throws
// accrue::Error with a message naming the operation and the offending values.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace accrue {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The allocator could not get `requested_bytes` (core/allocator.cpp); what()
// says how much was free and held. optim::run_window catches it to retry.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& message, int64_t requested_bytes)
      : Error(message), requested_bytes_(requested_bytes) {}
  int64_t requested_bytes() const { return requested_bytes_; }

 private:
  int64_t requested_bytes_;
};

namespace detail {

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace detail

// "[2, 3, 4]": shapes appear in almost every error message.
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace accrue

// ACCRUE_CHECK(cond, parts...): throws accrue::Error("parts... (file:line)") when cond is false.
#define ACCRUE_CHECK(cond, ...)                                                                  \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      ::accrue::detail::throw_error(__FILE__, __LINE__, ::accrue::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define ACCRUE_FAIL(...) \
  ::accrue::detail::throw_error(__FILE__, __LINE__, ::accrue::detail::str_cat(__VA_ARGS__))
