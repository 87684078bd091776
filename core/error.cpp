#include "accrue/core/error.h"

namespace accrue {
namespace detail {

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(str_cat(message, " (", file, ":", line, ")"));
}

}  // namespace detail

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i)
    os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

}  // namespace accrue
