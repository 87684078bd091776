// Philox draws on the CPU: reproducibility and distribution sanity.
#include <cmath>

#include "accrue/core/philox.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(Philox, matches_the_published_known_answer) {
  // Random123's kat_vectors for philox4x32_10: counter 0, key 0.
  const philox::Block b = philox::generate(0, 0);
  EXPECT_EQ(b.x[0], 0x6627e8d5u);
  EXPECT_EQ(b.x[1], 0xe169c58du);
  EXPECT_EQ(b.x[2], 0xbc57ac4cu);
  EXPECT_EQ(b.x[3], 0x9b00dbd8u);
}

TEST(Random, same_seed_same_numbers) {
  Generator a(42), b(42), c(43);
  EXPECT_EQ(randn({100}, DType::f32, Device::cpu(), &a).to_vector<float>(),
            randn({100}, DType::f32, Device::cpu(), &b).to_vector<float>());
  EXPECT_NE(rand({100}, DType::f32, Device::cpu(), &a).to_vector<float>(),
            rand({100}, DType::f32, Device::cpu(), &c).to_vector<float>());
}

TEST(Random, successive_draws_differ) {
  Generator g(7);
  EXPECT_NE(rand({64}, DType::f32, Device::cpu(), &g).to_vector<float>(),
            rand({64}, DType::f32, Device::cpu(), &g).to_vector<float>());
}

TEST(Random, uniform_and_normal_moments) {
  Generator g(3);
  const std::vector<double> u = rand({200000}, DType::f64, Device::cpu(), &g).to_vector<double>();
  double mean = 0, lo = 1, hi = 0;
  for (double x : u) {
    mean += x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  mean /= u.size();
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_GE(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  const std::vector<double> n = randn({200000}, DType::f64, Device::cpu(), &g).to_vector<double>();
  double m = 0, v = 0;
  for (double x : n)
    m += x;
  m /= n.size();
  for (double x : n)
    v += (x - m) * (x - m);
  v /= n.size();
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.02);
}

TEST(Random, randint_stays_in_range) {
  Generator g(5);
  for (int64_t x : randint(-3, 4, {1000}, DType::i64, Device::cpu(), &g).to_vector<int64_t>()) {
    EXPECT_GE(x, -3);
    EXPECT_LT(x, 4);
  }
  EXPECT_THROW(randint(2, 2, {1}), Error);
  EXPECT_THROW(rand({2}, DType::i32), Error);
}

}  // namespace
}  // namespace accrue
