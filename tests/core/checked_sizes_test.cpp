// Note [Checked sizes] in core/tensor.cpp: every entry point that forms a
// product of sizes refuses one that overflows int64 or exceeds the device's
// memory, naming the op, the shape and the bytes, before any allocation. The
// shapes here sit near 2^63; none of these calls may crash or allocate.
#include <gmock/gmock.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <string>

#include <unistd.h>

#include "accrue/core/tensor.h"
#include "accrue/core/tensor_io.h"
#include "accrue/data/token_shards.h"
#include "accrue/nn/gpt2.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t k2_62 = int64_t{1} << 62;  // 4611686018427387904
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The accrue::Error `statement` throws (a test failure when none is thrown);
// its text must contain every fragment and no wrapped count ("-123") or
// "negative stride".
#define EXPECT_SIZE_ERROR(statement, ...)                                \
  do {                                                                   \
    try {                                                                \
      statement;                                                         \
      ADD_FAILURE() << "expected accrue::Error from " #statement;        \
    } catch (const ::accrue::Error& e) {                                 \
      for (const char* part : {__VA_ARGS__})                             \
        EXPECT_THAT(e.what(), HasSubstr(part));                          \
      EXPECT_FALSE(std::regex_search(e.message(), std::regex("-[0-9]"))) \
          << "a negative count in: " << e.message();                     \
      EXPECT_THAT(e.what(), Not(HasSubstr("negative stride")));          \
    }                                                                    \
  } while (0)

TEST(CheckedSizes, empty_refuses_an_element_count_past_int64) {
  EXPECT_SIZE_ERROR(empty({k2_62, 2}), "empty: shape [4611686018427387904, 2]",
                    "more than 2^63 - 1 elements");
  EXPECT_SIZE_ERROR(empty({int64_t{1} << 31, int64_t{1} << 31, 4}),
                    "empty: shape [2147483648, 2147483648, 4]", "more than 2^63 - 1 elements");
  EXPECT_SIZE_ERROR(empty({kMax, kMax}, DType::i64), "empty", "overflows int64");
}

TEST(CheckedSizes, empty_refuses_bytes_past_int64) {
  // 2^61 elements fit; their 2^63 bytes of f32 do not.
  EXPECT_SIZE_ERROR(empty({int64_t{1} << 60, 2}), "empty: shape [1152921504606846976, 2] of f32",
                    "needs more than 2^63 - 1 bytes", "2305843009213693952 elements of 4 bytes");
  // The same count in one-byte booleans fits int64 but no host's memory.
  EXPECT_SIZE_ERROR(empty({int64_t{1} << 60, 2}, DType::boolean), "empty",
                    "2305843009213693952 bytes");
}

TEST(CheckedSizes, a_zero_size_shape_still_needs_strides_that_fit) {
  // No element, but the strides of [0, 2^62, 4] would wrap.
  EXPECT_SIZE_ERROR(empty({0, k2_62, 4}), "empty: shape [0, 4611686018427387904, 4]",
                    "spans more than 2^63 - 1 elements");
  // A zero-size shape whose strides fit is a tensor of no bytes.
  EXPECT_EQ(empty({0, int64_t{1} << 40}).nbytes(), 0u);
}

TEST(CheckedSizes, more_than_the_device_memory_is_out_of_memory_before_allocating) {
  const int64_t before = memory_stats(Device::cpu()).allocations;
  // 2^52 bytes (4 PiB): representable, beyond any host.
  try {
    empty({int64_t{1} << 50});
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_THAT(e.what(), HasSubstr("empty: shape [1125899906842624] of f32 needs "
                                    "4503599627370496 bytes"));
    EXPECT_THAT(e.what(), HasSubstr("out of memory on cpu, where one allocation may have at most"));
    EXPECT_EQ(e.requested_bytes(), int64_t{1} << 52);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).allocations, before) << "allocated before refusing";
  EXPECT_LT(max_allocation_bytes(Device::cpu()), int64_t{1} << 52);
  EXPECT_GT(max_allocation_bytes(Device::cpu()), int64_t{1} << 20);
}

TEST(CheckedSizes, every_factory_names_itself) {
  EXPECT_SIZE_ERROR(zeros({k2_62, 4}), "zeros: shape [4611686018427387904, 4]");
  EXPECT_SIZE_ERROR(ones({k2_62, 4}), "ones: shape [4611686018427387904, 4]");
  EXPECT_SIZE_ERROR(full({k2_62, 4}, 1.0), "full: shape [4611686018427387904, 4]");
  EXPECT_SIZE_ERROR(full({int64_t{1} << 50}, 1.0), "full: shape [1125899906842624] of f32",
                    "4503599627370496 bytes");
  EXPECT_SIZE_ERROR(from_vector<float>({1.f, 2.f}, {k2_62, k2_62}),
                    "from_vector: shape [4611686018427387904, 4611686018427387904]",
                    "more than 2^63 - 1 elements");
  EXPECT_SIZE_ERROR(from_vector<float>({1.f, 2.f}, {int64_t{1} << 40}), "from_vector",
                    "2 values do not fill shape [1099511627776]");
  EXPECT_SIZE_ERROR(from_vector<float>({1.f, 2.f}, {k2_62}), "from_vector",
                    "needs more than 2^63 - 1 bytes");
  EXPECT_SIZE_ERROR(arange(0, 1e19), "arange", "more than 2^63 - 1");
  EXPECT_SIZE_ERROR(arange(0, 1e18, 1.0, DType::f32), "arange: shape [1000000000000000000]",
                    "4000000000000000000 bytes");
}

TEST(CheckedSizes, shape_numel_and_contiguous_strides_refuse_overflow) {
  EXPECT_SIZE_ERROR(shape_numel({k2_62, 2}), "shape_numel: shape [4611686018427387904, 2]",
                    "more than 2^63 - 1 elements");
  EXPECT_SIZE_ERROR(contiguous_strides({0, k2_62, k2_62}), "contiguous_strides",
                    "[0, 4611686018427387904, 4611686018427387904]");
  EXPECT_EQ(shape_numel({k2_62, 1}), k2_62);
  EXPECT_EQ(contiguous_strides({2, k2_62}), (Shape{k2_62, 1}));
}

TEST(CheckedSizes, view_and_reshape_refuse_a_product_that_wraps) {
  Tensor t = zeros({6});
  // 2^62 * 4 wraps to 0, and 0 * anything passed the old check of a -1.
  EXPECT_ERROR(t.view({k2_62, 4, -1}), "view: shape [4611686018427387904, 4, -1]",
               "invalid for 6 elements", "overflows int64");
  EXPECT_SIZE_ERROR(t.reshape({k2_62, 4, 2}), "reshape", "invalid for 6 elements");
  EXPECT_SIZE_ERROR(t.view({2, 3, k2_62, k2_62}), "view", "invalid for 6 elements");
  Tensor none = zeros({0});
  EXPECT_SIZE_ERROR(none.view({0, k2_62, 4}), "view: shape [0, 4611686018427387904, 4]",
                    "spans more than 2^63 - 1 elements");
  EXPECT_SIZE_ERROR(none.reshape({0, k2_62, 4}), "reshape", "spans more than");
  EXPECT_EQ(none.reshape({0, int64_t{1} << 40}).shape(), (Shape{0, int64_t{1} << 40}));
}

TEST(CheckedSizes, expand_refuses_a_shape_whose_count_or_bytes_wrap) {
  Tensor one = full({1}, 3.0);
  EXPECT_SIZE_ERROR(one.expand({k2_62, k2_62}),
                    "expand: shape [4611686018427387904, 4611686018427387904]",
                    "more than 2^63 - 1 elements");
  // 2^62 f32 elements: the count fits, nbytes() would wrap.
  EXPECT_SIZE_ERROR(one.expand({k2_62}), "expand: shape [4611686018427387904] of f32",
                    "needs more than 2^63 - 1 bytes");
  // A broadcast view of 2^40 elements allocates nothing and is fine.
  Tensor wide = one.expand({int64_t{1} << 40});
  EXPECT_EQ(wide.numel(), int64_t{1} << 40);
  EXPECT_EQ(wide.nbytes(), size_t{1} << 42);
  EXPECT_EQ(wide.narrow(0, (int64_t{1} << 40) - 1, 1).item(), 3.0);
  EXPECT_SIZE_ERROR(wide.contiguous(), "contiguous: shape [1099511627776] of f32",
                    "4398046511104 bytes");
}

TEST(CheckedSizes, narrow_near_int64_max_is_out_of_bounds_not_wrapped) {
  Tensor t = zeros({10});
  EXPECT_SIZE_ERROR(t.narrow(0, k2_62, k2_62),
                    "narrow: start 4611686018427387904 and length 4611686018427387904",
                    "out of bounds for dim 0 of shape [10]");
  EXPECT_SIZE_ERROR(t.narrow(0, 2, kMax), "narrow: start 2 and length 9223372036854775807");
  EXPECT_SIZE_ERROR(t.narrow(0, kMax, 1), "narrow: start 9223372036854775807 and length 1");
  EXPECT_SIZE_ERROR(t.narrow(0, 9, 2), "narrow: range [9, 11)");
  // A negative start counts from the end only when it lies within the dim.
  EXPECT_ERROR(t.narrow(0, std::numeric_limits<int64_t>::min(), 1),
               "narrow: start -9223372036854775808 and length 1", "out of bounds");
  EXPECT_EQ(t.narrow(0, -3, 3).offset(), 7);
}

TEST(CheckedSizes, make_view_checks_the_largest_offset_without_wrapping) {
  Tensor base = zeros({8});
  // The extent (2 - 1) * 2^62 + (2 - 1) * 2^62 = 2^63 wraps to a negative
  // offset, which the old check took for a stride below zero.
  EXPECT_SIZE_ERROR(make_view(base, {2, 2}, {k2_62, k2_62}, 0),
                    "make_view: view of shape [2, 2] and strides [4611686018427387904, "
                    "4611686018427387904] at offset 0",
                    "reaches past element 2^63 - 1", "exceeds the 8 elements of its storage");
  EXPECT_SIZE_ERROR(make_view(base, {2, 2}, {k2_62, 1}, 1), "make_view",
                    "reaches element 4611686018427387906", "exceeds the 8 elements");
  EXPECT_SIZE_ERROR(make_view(base, {k2_62, 4}, {4, 1}, 0),
                    "make_view: shape [4611686018427387904, 4]", "more than 2^63 - 1 elements");
  EXPECT_SIZE_ERROR(make_view(base, {1}, {1}, kMax), "make_view: offset 9223372036854775807",
                    "exceeds the 8 elements");
  try {
    make_view(base, {2}, {-1}, 4);
    ADD_FAILURE() << "a negative stride was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("make_view: strides [-1] for shape [2] have -1 at dim 0"));
  }
  EXPECT_EQ(make_view(base, {0, int64_t{1} << 40}, {1, 1}, 8).numel(), 0);
}

TEST(CheckedSizes, storage_refuses_a_size_whose_rounding_would_wrap) {
  const int64_t before = memory_stats(Device::cpu()).allocations;
  try {
    Storage s(std::numeric_limits<size_t>::max() - 3, Device::cpu());
    ADD_FAILURE() << "allocated " << s.nbytes() << " bytes";
  } catch (const OutOfMemoryError& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory on cpu: asked for 18446744073709551612 bytes"));
    EXPECT_EQ(e.requested_bytes(), kMax);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).allocations, before);
}

// The loaders check a header's shape against 64 bits and against the file
// before allocating (Note [Untrusted tensor files]).
class CheckedSizesFiles : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("accrue_checked_sizes_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    dirs_.push_back(dir);
    return (dir / name).string();
  }
  void TearDown() override {
    for (const auto& d : dirs_)
      std::filesystem::remove_all(d);
  }
  static void write(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  // A version 1.0 .npy file of `dict`, padded as numpy pads it, then `data`.
  static std::string npy(const std::string& dict, const std::string& data) {
    std::string header = dict;
    while ((10 + header.size() + 1) % 64 != 0)
      header += ' ';
    header += '\n';
    std::string out = "\x93NUMPY";
    out += '\x01';
    out += '\x00';
    out += static_cast<char>(header.size() & 0xff);
    out += static_cast<char>(header.size() >> 8);
    return out + header + data;
  }
  static std::string safetensors(const std::string& json, const std::string& data) {
    std::string out;
    for (int i = 0; i < 8; ++i)
      out += static_cast<char>((json.size() >> (8 * i)) & 0xff);
    return out + json + data;
  }

 private:
  std::vector<std::filesystem::path> dirs_;
};

TEST_F(CheckedSizesFiles, npy_header_shapes_near_2_63) {
  const std::string p = path("huge.npy");
  write(p, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 2), }",
               std::string(16, '\0')));
  EXPECT_SIZE_ERROR(load_npy(p), "huge.npy", "[4611686018427387904, 2]", "overflows 64 bits");
  write(p, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2147483648, 2147483648, 4), }",
               std::string(16, '\0')));
  EXPECT_SIZE_ERROR(load_npy(p), "huge.npy", "[2147483648, 2147483648, 4]", "overflows 64 bits");
  // Representable, but far more than the file holds: refused before allocating.
  write(p, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1125899906842624,), }",
               std::string(16, '\0')));
  EXPECT_SIZE_ERROR(load_npy(p), "huge.npy", "[1125899906842624]", "4503599627370496");
}

TEST_F(CheckedSizesFiles, safetensors_header_shapes_near_2_63) {
  const std::string p = path("huge.safetensors");
  write(p, safetensors(
               R"({"a":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,16]}})",
               std::string(16, '\0')));
  EXPECT_SIZE_ERROR(load_safetensors(p), "huge.safetensors", "[4611686018427387904, 2]",
                    "overflows 64 bits");
  write(p, safetensors(
               R"({"a":{"dtype":"F32","shape":[1152921504606846976,2],"data_offsets":[0,16]}})",
               std::string(16, '\0')));
  EXPECT_SIZE_ERROR(load_safetensors(p), "huge.safetensors", "[1152921504606846976, 2]",
                    "overflows 64 bits");
}

// A token shard's count is an int32, its bytes 2 per token: the largest
// count a header can hold is refused against the file, not allocated.
TEST_F(CheckedSizesFiles, token_shard_header_with_the_largest_count) {
  const std::string p = path("huge.bin");
  std::string header(static_cast<size_t>(data::kShardHeaderBytes), '\0');
  const int32_t fields[3] = {data::kShardMagic, data::kShardVersion,
                             std::numeric_limits<int32_t>::max()};
  std::memcpy(header.data(), fields, sizeof fields);
  write(p, header + std::string(8, '\0'));
  EXPECT_SIZE_ERROR(data::read_shard_header(p), "huge.bin", "the header says 2147483647 tokens",
                    "2 * 2147483647 = 4294968318 bytes", "truncated");
}

// A model config's parameter count is a product of user-given sizes too.
TEST(CheckedSizes, gpt2_config_refuses_a_parameter_count_past_int64) {
  nn::GPT2Config c = nn::GPT2Config::d12();
  c.n_head = 1;
  c.n_embd = int64_t{1} << 31;
  c.n_layer = int64_t{1} << 20;  // 12 * 2^62 * 2^20 parameters in the blocks
  EXPECT_SIZE_ERROR(c.validate(), "GPT2Config: n_layer 1048576, n_embd 2147483648",
                    "the parameter count overflows int64");
  EXPECT_SIZE_ERROR(c.parameter_count(), "GPT2Config", "overflows int64");
  c = nn::GPT2Config::d12();
  c.vocab_size = kMax;
  EXPECT_SIZE_ERROR(c.validate(), "vocab_size 9223372036854775807", "overflows int64");
  EXPECT_EQ(nn::GPT2Config::d12().parameter_count(), 124439808 + 47 * 768);
}

// Note [Error locations]: the message and the location apart; what() has both.
TEST(ErrorLocation, message_and_where_are_kept_apart) {
  try {
    ACCRUE_CHECK(false, "op: bad value ", 3);
    ADD_FAILURE() << "ACCRUE_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "op: bad value 3");
    EXPECT_THAT(e.where(), HasSubstr("checked_sizes_test.cpp:"));
    EXPECT_EQ(std::string(e.what()), e.message() + " (" + e.where() + ")");
    EXPECT_EQ(error_message(e), "op: bad value 3");
  }
  EXPECT_EQ(Error("plain").message(), "plain");
  EXPECT_EQ(Error("plain").where(), "");
  EXPECT_EQ(std::string(Error("plain").what()), "plain");
  EXPECT_EQ(error_message(std::runtime_error("other (x.cpp:1)")), "other (x.cpp:1)");
  // The allocator's refusals carry their location apart too.
  try {
    empty({int64_t{1} << 50});
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_THAT(e.where(), HasSubstr("tensor.cpp:"));
    EXPECT_THAT(e.message(), Not(HasSubstr(".cpp:")));
  }
}

}  // namespace
}  // namespace accrue
