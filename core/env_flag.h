// Opt-in switches read from the environment (the sanitizer switches of
// Note [Library outputs under initcheck] and Note [Attention paths]).
#pragma once

#include <cstdlib>
#include <cstring>

namespace accrue {

// True when the environment variable `name` is set to exactly "1". Callers
// read it once (a function-local static) so a switch costs nothing per call.
inline bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace accrue
