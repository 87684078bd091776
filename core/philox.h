// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
// written once for host and device so that CPU and GPU draw the same bits.
#pragma once

#include <cstdint>

#include "accrue/core/strided_index.h"  // ACCRUE_HD

namespace accrue::philox {

struct Block {
  uint32_t x[4];
};

ACCRUE_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Ten rounds over counter `ctr` with key `seed`.
ACCRUE_HD Block generate(uint64_t seed, uint64_t ctr) {
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Note [Philox element mapping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Element i of a draw that starts at counter `base` uses block base + i/2 and
// its two lanes 2*(i%2), 2*(i%2)+1: 64 random bits per element, whatever the
// dtype or device. Uniform floats take 24 bits, doubles 53; normals use
// Box-Muller on the two lanes, evaluated in double on both devices, so CPU and
// GPU agree to the last bit of the float result except in the vanishingly rare
// case that libm and CUDA's double functions round a value that sits on a
// float rounding boundary differently.
ACCRUE_HD void element_bits(uint64_t seed, uint64_t base, int64_t i, uint32_t* a, uint32_t* b) {
  const Block blk = generate(seed, base + static_cast<uint64_t>(i) / 2);
  const int lane = static_cast<int>(i % 2) * 2;
  *a = blk.x[lane];
  *b = blk.x[lane + 1];
}

ACCRUE_HD float uniform_float(uint32_t a) {
  return static_cast<float>(a >> 8) * (1.0f / 16777216.0f);
}

ACCRUE_HD double uniform_double(uint32_t a, uint32_t b) {
  const uint64_t bits = (static_cast<uint64_t>(a) << 32) | b;
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

ACCRUE_HD uint64_t blocks_for(int64_t n) {
  return static_cast<uint64_t>((n + 1) / 2);
}

}  // namespace accrue::philox
