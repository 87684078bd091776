#include "accrue/core/error.h"

namespace accrue {
namespace detail {

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(message, str_cat(file, ":", line));
}

}  // namespace detail

std::string error_message(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->message();
  return e.what();
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i)
    os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

}  // namespace accrue
