// accrue::Error and the checks that throw it.
//
// A library never exits or aborts on bad input: every failed check throws
// accrue::Error with a message naming the operation and the offending values.
#pragma once

#include <cstdint>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace accrue {

// Note [Error locations]
// ~~~~~~~~~~~~~~~~~~~~~~
// An Error carries its message and, apart, the source location of the check
// that threw it ("core/tensor.cpp:123", or "" when none). what() is
// "message (where)" for library users, logs and tests; message() is the text
// alone, for a program's user, who has no use for the build tree's paths
// (examples/common/run_main.cpp prints it). A message that quotes another
// error must quote error_message(e), not e.what(), or the inner location
// travels inside the outer message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : Error(message, std::string()) {}
  explicit Error(const char* message) : Error(std::string(message)) {}
  Error(const std::string& message, const std::string& where)
      : std::runtime_error(where.empty() ? message : message + " (" + where + ")"),
        message_(message),
        where_(where) {}

  // The message without the source location.
  const std::string& message() const { return message_; }
  // "path/file.cpp:123" (__FILE__:__LINE__) of the check that threw, or "".
  const std::string& where() const { return where_; }

 private:
  std::string message_, where_;
};

// The allocator could not get `requested_bytes` (core/allocator.cpp), or a
// tensor asked for more than the device has (Note [Checked sizes] in
// core/tensor.cpp); what() says how much was free and held. optim::run_window
// catches it to retry.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& message, int64_t requested_bytes,
                   const std::string& where = std::string())
      : Error(message, where), requested_bytes_(requested_bytes) {}
  int64_t requested_bytes() const { return requested_bytes_; }

 private:
  int64_t requested_bytes_;
};

// An exception's message for a person: Error::message() for an accrue::Error
// (Note [Error locations]), what() for any other exception.
std::string error_message(const std::exception& e);

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

// ACCRUE_CHECK(cond, parts...): throws accrue::Error(message "parts...", where "file:line")
// when cond is false (Note [Error locations]).
#define ACCRUE_CHECK(cond, ...)                                                                  \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      ::accrue::detail::throw_error(__FILE__, __LINE__, ::accrue::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define ACCRUE_FAIL(...) \
  ::accrue::detail::throw_error(__FILE__, __LINE__, ::accrue::detail::str_cat(__VA_ARGS__))
