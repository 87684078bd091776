#include "accrue/core/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define ACCRUE_CRC32C_SSE42 1
#endif

namespace accrue {

namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kPolynomial = 0x82F63B78u;

// Slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes, so
// eight bytes are folded per step with eight independent lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i)
      c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b)
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

constexpr Tables kTables = make_tables();

static_assert(std::endian::native == std::endian::little,
              "the slicing-by-8 loop reads 8 bytes as a little-endian word");

uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // unaligned and UBSan-clean
  return v;
}

uint32_t portable_update(uint32_t crc, const unsigned char* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFFu];
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t v = load64(p) ^ crc;
    crc = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^ kTables[5][(v >> 16) & 0xFF] ^
          kTables[4][(v >> 24) & 0xFF] ^ kTables[3][(v >> 32) & 0xFF] ^
          kTables[2][(v >> 40) & 0xFF] ^ kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
  }
  while (n-- > 0)
    crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

#ifdef ACCRUE_CRC32C_SSE42
// The CRC32 instruction: one 8-byte step per instruction, compiled for SSE4.2
// only here and called only after the CPU says it has it, so the rest of the
// build keeps the baseline x86-64 target.
__attribute__((target("sse4.2"))) uint32_t sse42_update(uint32_t crc, const unsigned char* p,
                                                        size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8)
    c = _mm_crc32_u64(c, load64(p));
  crc = static_cast<uint32_t>(c);
  while (n-- > 0)
    crc = _mm_crc32_u8(crc, *p++);
  return crc;
}

bool have_sse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t n, uint32_t previous) {
  return ~portable_update(~previous, static_cast<const unsigned char*>(data), n);
}

uint32_t crc32c(const void* data, size_t n, uint32_t previous) {
#ifdef ACCRUE_CRC32C_SSE42
  if (have_sse42()) return ~sse42_update(~previous, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_portable(data, n, previous);
}

const char* crc32c_implementation() {
#ifdef ACCRUE_CRC32C_SSE42
  if (have_sse42()) return "sse4.2";
#endif
  return "slicing-by-8";
}

}  // namespace accrue
