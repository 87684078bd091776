// Counter-based random tensors: the same seed gives the same numbers on the
// CPU and on every GPU (see Note [Philox element mapping]).
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"

namespace accrue {

// A seed plus a running counter. Each draw reserves the counters it uses, so
// successive draws are independent and a run is reproducible from the seed.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Returns the first counter of a draw of n elements and advances past it.
  uint64_t reserve(int64_t n);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator used when none is passed.
Generator& default_generator();
void manual_seed(uint64_t seed);

// Uniform on [0, 1).
Tensor rand(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
            Generator* gen = nullptr);
// Standard normal.
Tensor randn(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
             Generator* gen = nullptr);
// Integers uniform on [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = DType::i64,
               Device device = Device::cpu(), Generator* gen = nullptr);

namespace detail {
enum class Distribution { Uniform, Normal, Integer };
struct DrawSpec {
  Distribution dist;
  uint64_t seed;
  uint64_t base;
  int64_t low = 0;   // Integer only
  int64_t high = 0;  // Integer only
};
void draw_cpu(const Tensor& out, const DrawSpec& spec);
void draw_cuda(const Tensor& out, const DrawSpec& spec);
}  // namespace detail

}  // namespace accrue
