// CRC32C (core/crc32c.h): the standard check values, chaining, and the
// instruction path agreeing with the portable table-driven loop.
#include "accrue/core/crc32c.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace accrue {
namespace {

uint32_t crc_of(const std::vector<unsigned char>& v) {
  return crc32c(v.data(), v.size());
}

TEST(CRC32C, standard_check_values) {
  // The catalogue check value (reveng CRC-32/ISCSI) and RFC 3720 B.4's vectors.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc_of(std::vector<unsigned char>(32, 0x00)), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::vector<unsigned char>(32, 0xFF)), 0x62A8AB43u);
  std::vector<unsigned char> up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
  // An iSCSI read command PDU (RFC 3720 B.4).
  std::vector<unsigned char> pdu(48, 0);
  pdu[0] = 0x01;
  pdu[1] = 0xC0;
  pdu[16] = 0x14;
  pdu[22] = 0x04;
  pdu[27] = 0x14;
  pdu[31] = 0x18;
  pdu[32] = 0x28;
  pdu[40] = 0x02;
  EXPECT_EQ(crc_of(pdu), 0xD9963A56u);
}

TEST(CRC32C, the_instruction_and_the_tables_agree_at_every_length_and_alignment) {
  std::mt19937_64 rng(1);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf)
    b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 9; ++offset)
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 63, 64, 65, 1000, 4096}) {
      const unsigned char* p = buf.data() + offset;
      EXPECT_EQ(crc32c(p, n), crc32c_portable(p, n)) << offset << " " << n;
    }
}

TEST(CRC32C, chains_across_pieces) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), whole) << cut;
    EXPECT_EQ(crc32c_portable(s.data() + cut, s.size() - cut, crc32c_portable(s.data(), cut)),
              whole)
        << cut;
  }
}

TEST(CRC32C, every_single_bit_flip_changes_it) {
  std::vector<unsigned char> v(256);
  std::mt19937_64 rng(2);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  const uint32_t base = crc_of(v);
  for (size_t bit = 0; bit < v.size() * 8; ++bit) {
    v[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(crc_of(v), base) << bit;
    v[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

// Not a pass/fail timing (machines differ): prints the throughput, and checks
// that the result over a large buffer agrees between the two paths.
TEST(CRC32C, throughput_on_64_MiB) {
  std::vector<unsigned char> v(size_t{64} << 20);
  std::mt19937_64 rng(3);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  const auto time = [&](uint32_t (*f)(const void*, size_t, uint32_t), uint32_t* out) {
    const auto t0 = std::chrono::steady_clock::now();
    *out = f(v.data(), v.size(), 0);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  uint32_t a = 0, b = 0;
  const double fast = time(&crc32c, &a), portable = time(&crc32c_portable, &b);
  EXPECT_EQ(a, b);
  std::printf("crc32c (%s): %.2f GB/s; slicing-by-8: %.2f GB/s\n", crc32c_implementation(),
              v.size() / fast / 1e9, v.size() / portable / 1e9);
}

}  // namespace
}  // namespace accrue
