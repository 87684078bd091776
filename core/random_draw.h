// One element of a draw, for host and device alike.
#pragma once

#include <cmath>

#include "accrue/core/philox.h"
#include "accrue/core/random.h"

namespace accrue::detail {

// Returns element i of the draw as a double; the caller rounds it to the dtype.
// f64 uniforms use 53 bits, every other float dtype rounds a 24-bit uniform.
ACCRUE_HD double draw_element(const DrawSpec& s, int64_t i, bool want_double) {
  uint32_t a, b;
  philox::element_bits(s.seed, s.base, i, &a, &b);
  switch (s.dist) {
    case Distribution::Uniform:
      return want_double ? philox::uniform_double(a, b) : philox::uniform_float(a);
    case Distribution::Normal: {
      const double u1 = (static_cast<double>(a >> 8) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
      const double u2 = static_cast<double>(b >> 8) * (1.0 / 16777216.0);
      return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
    case Distribution::Integer: {
      const uint64_t bits = (static_cast<uint64_t>(a) << 32) | b;
      const uint64_t range = static_cast<uint64_t>(s.high - s.low);
      return static_cast<double>(s.low + static_cast<int64_t>(bits % range));
    }
  }
  return 0.0;
}

}  // namespace accrue::detail
