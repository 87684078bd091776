// Tensor files: safetensors and .npy round trips, byte-exact layouts written
// from the formats' specs, one test per kind of malformed file, and a fuzz
// pass proving that damaged files throw accrue::Error rather than crash.
#include "accrue/core/tensor_io.h"

#include "accrue/core/crc32c.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include <unistd.h>

#include "tests/test_util.h"

namespace accrue {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory per test, removed afterwards.
class TensorIO : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("accrue_tensor_io_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string le_bytes(uint64_t v, int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file from its parts: u64 LE header length, header, data.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return le_bytes(header.size(), 8) + header + data;
}

template <class T>
std::string raw(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The contiguous host bytes of a tensor.
std::string tensor_bytes(const Tensor& t) {
  Tensor h = t.to(Device::cpu()).contiguous();
  return std::string(static_cast<const char*>(h.data_ptr()), h.nbytes());
}

// Random bit patterns (NaN payloads and all) for every dtype but bool, which
// gets random 0/1: a round trip must preserve bytes, not just values.
Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng) {
  Tensor t = empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<unsigned char>(dtype == DType::boolean ? rng() & 1 : rng());
  return t;
}

::testing::AssertionResult bitwise_equal(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " vs " << dtype_name(expected.dtype());
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.shape()) << " vs " << shape_str(expected.shape());
  // Compares strides rather than is_contiguous(), which (in core today) answers
  // false for a fresh tensor with a zero dim between non-zero ones, e.g. [3, 0, 2].
  if (!actual.device().is_cpu() || actual.strides() != contiguous_strides(actual.shape()))
    return ::testing::AssertionFailure() << "loaded tensor is not contiguous on the CPU";
  if (tensor_bytes(actual) != tensor_bytes(expected))
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// Passes when f throws accrue::Error whose message contains every fragment.
::testing::AssertionResult throws_error(const std::function<void()>& f,
                                        const std::vector<std::string>& fragments) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& part : fragments)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no accrue::Error thrown";
}

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::bf16,   DType::f16,
                                       DType::i32, DType::i64, DType::boolean};

// ---------------------------------------------------------------------------
// safetensors: round trips

TEST_F(TensorIO, safetensors_round_trips_every_dtype_bitwise) {
  std::mt19937_64 rng(1);
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < kAllDTypes.size(); ++i) {
    std::string name = dtype_name(kAllDTypes[i]);
    name += ".t" + std::to_string(i);
    tensors[name] = random_tensor({3, static_cast<int64_t>(i) + 2, 5}, kAllDTypes[i], rng);
  }
  save_safetensors(path("all.safetensors"), tensors);
  const auto loaded = load_safetensors(path("all.safetensors"));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(loaded.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(loaded.at(name), t)) << name;
  }
}

TEST_F(TensorIO, safetensors_round_trips_zero_dim_and_empty_tensors) {
  std::mt19937_64 rng(2);
  const std::map<std::string, Tensor> tensors = {
      {"scalar", random_tensor({}, DType::f64, rng)},
      {"empty", empty({0}, DType::f32)},
      {"empty3d", empty({3, 0, 2}, DType::i64)},
      {"bool_scalar", random_tensor({}, DType::boolean, rng)},
  };
  save_safetensors(path("e.safetensors"), tensors);
  const auto loaded = load_safetensors(path("e.safetensors"));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors)
    EXPECT_TRUE(bitwise_equal(loaded.at(name), t)) << name;
  EXPECT_EQ(loaded.at("scalar").dim(), 0);
}

TEST_F(TensorIO, safetensors_writes_non_contiguous_views_in_logical_order) {
  std::mt19937_64 rng(3);
  Tensor base = random_tensor({4, 6}, DType::f32, rng);
  Tensor transposed = base.transpose(0, 1);
  Tensor narrowed = base.narrow(1, 1, 3);
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_FALSE(narrowed.is_contiguous());
  save_safetensors(path("v.safetensors"), {{"t", transposed}, {"n", narrowed}});
  const auto loaded = load_safetensors(path("v.safetensors"));
  EXPECT_TRUE(bitwise_equal(loaded.at("t"), transposed.contiguous()));
  EXPECT_TRUE(bitwise_equal(loaded.at("n"), narrowed.contiguous()));
  EXPECT_EQ(loaded.at("t").to_vector<float>(), transposed.to_vector<float>());
}

TEST_F(TensorIO, safetensors_metadata_round_trips_with_escapes) {
  const std::map<std::string, std::string> metadata = {
      {"framework", "accrue"},
      {"quote\"back\\slash", "line\nbreak\ttab\x01 ctrl"},
      {"unicode", "caf\xc3\xa9 \xf0\x9f\x98\x80"},
      {"empty", ""},
  };
  std::mt19937_64 rng(4);
  save_safetensors(path("m.safetensors"), {{"w", random_tensor({2}, DType::f32, rng)}}, metadata);
  std::map<std::string, std::string> read;
  load_safetensors(path("m.safetensors"), &read);
  EXPECT_EQ(read, metadata);
  // Control characters are escaped the way serde_json escapes them.
  EXPECT_THAT(read_bytes(path("m.safetensors")), HasSubstr("\\n"));
  EXPECT_THAT(read_bytes(path("m.safetensors")), HasSubstr("\\u0001"));

  // No metadata: "__metadata__" holds only the checksums, which reading leaves
  // out (Note [Tensor checksums]), so it gives an empty map.
  save_safetensors(path("n.safetensors"), {{"w", random_tensor({2}, DType::f32, rng)}});
  EXPECT_THAT(read_bytes(path("n.safetensors")), HasSubstr(R"({"__metadata__":{"accrue.crc32c":)"));
  read = {{"stale", "x"}};
  load_safetensors(path("n.safetensors"), &read);
  EXPECT_TRUE(read.empty());
}

// The checksum metadata of Note [Tensor checksums], computed here from the
// Note's definition (independently of core/safetensors.cpp): the "__metadata__"
// object the writer puts first, for the caller's metadata `user` (plain ASCII
// keys and values) and the tensors `entries`.
struct ExpectedEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t begin, end;
  std::string data;
};
std::string hex8(uint32_t v) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", v);
  return s;
}
void add_to(std::string& out, const std::string& a, const char* b) {
  out += a;
  out += b;
}
std::string expected_metadata(std::map<std::string, std::string> user,
                              std::vector<ExpectedEntry> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::string canonical;
  const auto add = [&](const std::string& part, char end) {
    canonical += part;
    canonical += end;
  };
  for (const auto& [k, v] : user) {
    canonical += 'm';
    add(k, '\0');
    add(v, '\0');
  }
  for (const auto& e : entries) {
    canonical += 't';
    add(e.name, '\0');
    add(e.dtype, '\0');
    for (size_t i = 0; i < e.shape.size(); ++i)
      add(std::to_string(e.shape[i]), i + 1 < e.shape.size() ? ',' : '\0');
    if (e.shape.empty()) canonical += '\0';
    add(std::to_string(e.begin), ',');
    add(std::to_string(e.end), '\0');
  }
  std::map<std::string, std::string> all = user;
  all["accrue.crc32c"] = hex8(crc32c(canonical.data(), canonical.size()));
  for (const auto& e : entries)
    all["accrue.crc32c." + e.name] = hex8(crc32c(e.data.data(), e.data.size()));
  std::string out = R"({"__metadata__":{)";
  for (const auto& [k, v] : all) {
    if (out.back() != '{') out += ',';
    out += '"';
    add_to(out, k, "\":\"");
    add_to(out, v, "\"");
  }
  return out + "}";
}
std::string padded(std::string header) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// The expected layout is the reference implementation's own serialization
// tests' (safetensors/src/tensor.rs), given the same metadata: accrue writes the
// same files, with the checksums as metadata.
TEST_F(TensorIO, safetensors_writer_matches_the_reference_bytes) {
  const std::string data = raw<float>({0, 1, 2, 3, 4, 5});
  Tensor t = from_vector<float>({0, 1, 2, 3, 4, 5}, {1, 2, 3});

  save_safetensors(path("a.safetensors"), {{"attn.0", t}});
  const std::string header1 = expected_metadata({}, {{"attn.0", "F32", {1, 2, 3}, 0, 24, data}}) +
                              R"(,"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  EXPECT_EQ(read_bytes(path("a.safetensors")), safetensors_bytes(padded(header1), data));

  save_safetensors(path("b.safetensors"), {{"attn0", t.reshape({1, 1, 2, 3})}});
  const std::string header2 =
      expected_metadata({}, {{"attn0", "F32", {1, 1, 2, 3}, 0, 24, data}}) +
      R"(,"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  EXPECT_EQ(read_bytes(path("b.safetensors")), safetensors_bytes(padded(header2), data));

  // No tensors: the header checksum alone, of the empty canonical form (CRC 0).
  save_safetensors(path("c.safetensors"), {});
  EXPECT_EQ(read_bytes(path("c.safetensors")),
            safetensors_bytes(padded(R"({"__metadata__":{"accrue.crc32c":"00000000"}})"), ""));

  save_safetensors(path("d.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(path("d.safetensors")),
            safetensors_bytes(padded(expected_metadata({{"framework", "pt"}}, {}) + "}"), ""));
  EXPECT_TRUE(load_safetensors(path("d.safetensors")).empty());
}

TEST_F(TensorIO, safetensors_writer_orders_by_dtype_then_name_so_data_is_aligned) {
  std::mt19937_64 rng(5);
  save_safetensors(path("o.safetensors"), {{"a", random_tensor({3}, DType::boolean, rng)},
                                           {"b", random_tensor({1}, DType::f16, rng)},
                                           {"c", random_tensor({2}, DType::f64, rng)},
                                           {"d", random_tensor({1}, DType::f32, rng)},
                                           {"e", random_tensor({1}, DType::i64, rng)}});
  const std::string header = R"("e":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                             R"("c":{"dtype":"F64","shape":[2],"data_offsets":[8,24]},)"
                             R"("d":{"dtype":"F32","shape":[1],"data_offsets":[24,28]},)"
                             R"("b":{"dtype":"F16","shape":[1],"data_offsets":[28,30]},)"
                             R"("a":{"dtype":"BOOL","shape":[3],"data_offsets":[30,33]}})";
  const std::string bytes = read_bytes(path("o.safetensors"));
  EXPECT_EQ(le_bytes(bytes.size() - 8 - 33, 8), bytes.substr(0, 8));
  // The tensor entries follow the metadata (the checksums) and end the header.
  const std::string text = bytes.substr(8, bytes.size() - 8 - 33);
  const size_t entries = text.find("}," + header.substr(0, 4));
  ASSERT_NE(entries, std::string::npos);
  EXPECT_EQ(text.substr(entries + 2, header.size()), header);
  EXPECT_EQ(text.find_first_not_of(' ', entries + 2 + header.size()), std::string::npos);
  EXPECT_EQ((bytes.size() - 8 - 33) % 8, 0u);
}

// A file written by hand from the spec: whitespace, escapes, keys in an
// arbitrary order, data offsets not in key order, metadata present.
TEST_F(TensorIO, safetensors_hand_written_file_parses) {
  const std::string header =
      " {\n  \"w\\u00e9ight\" : {\"shape\": [2, 2], \"dtype\": \"I32\",\n"
      "     \"data_offsets\": [4, 20]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"n\\\"ote\": \"a\\/b\"},\n"
      "  \"bias\": {\"data_offsets\": [0, 4], \"dtype\": \"F16\", "
      "\"shape\": [2]}\n} \t\r\n ";
  const std::string data =
      raw<uint16_t>({0x3c00, 0xc000}) /* f16 1.0, -2.0 */ + raw<int32_t>({7, -8, 9, 2000000000});
  write_bytes(path("h.safetensors"), safetensors_bytes(header, data));
  std::map<std::string, std::string> metadata;
  const auto t = load_safetensors(path("h.safetensors"), &metadata);
  ASSERT_EQ(t.size(), 2u);
  const Tensor& w = t.at("w\xc3\xa9ight");
  EXPECT_EQ(w.dtype(), DType::i32);
  EXPECT_EQ(w.shape(), (Shape{2, 2}));
  EXPECT_EQ(w.to_vector<int32_t>(), (std::vector<int32_t>{7, -8, 9, 2000000000}));
  EXPECT_EQ(t.at("bias").dtype(), DType::f16);
  EXPECT_EQ(t.at("bias").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"n\"ote", "a/b"}}));
}

TEST_F(TensorIO, safetensors_accepts_surrogate_pairs_and_null_metadata) {
  const std::string header =
      R"({"__metadata__":null,"\ud83d\ude00":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}})";
  write_bytes(path("s.safetensors"), safetensors_bytes(header, std::string(1, '\1')));
  const auto t = load_safetensors(path("s.safetensors"));
  ASSERT_TRUE(t.count("\xf0\x9f\x98\x80"));
  EXPECT_EQ(t.at("\xf0\x9f\x98\x80").item(), 1.0);
}

// ---------------------------------------------------------------------------
// safetensors: malformed files, one problem each

class SafetensorsMalformed : public TensorIO {
 protected:
  // Writes the file and expects load_safetensors to name it and the problem.
  ::testing::AssertionResult rejects(const std::string& bytes, std::vector<std::string> fragments) {
    const std::string p = path("bad.safetensors");
    write_bytes(p, bytes);
    fragments.push_back("load_safetensors('" + p + "')");
    return throws_error([&] { load_safetensors(p); }, fragments);
  }
  ::testing::AssertionResult rejects_header(const std::string& header, const std::string& data,
                                            std::vector<std::string> fragments) {
    return rejects(safetensors_bytes(header, data), std::move(fragments));
  }
  // One F32 tensor "a" with the given fields.
  static std::string one(const std::string& fields) { return R"({"a":{)" + fields + "}}"; }
  const std::string four_floats_ = raw<float>({1.5f, -2.5f, 3.25f, 4.0f});
};

TEST_F(SafetensorsMalformed, missing_file) {
  EXPECT_TRUE(throws_error([&] { load_safetensors(path("nope.safetensors")); },
                           {"no such file", "nope.safetensors"}));
  EXPECT_TRUE(throws_error([&] { load_safetensors(dir_.string()); }, {"not a regular file"}));
}

TEST_F(SafetensorsMalformed, file_shorter_than_8_bytes) {
  EXPECT_TRUE(rejects("", {"0 bytes, shorter than the 8-byte header length"}));
  EXPECT_TRUE(rejects(std::string("\x02\0\0\0\0\0\0", 7),
                      {"7 bytes, shorter than the 8-byte header length"}));
}

TEST_F(SafetensorsMalformed, header_length_larger_than_the_file) {
  EXPECT_TRUE(rejects(le_bytes(100, 8) + "{}", {"header length 100 is larger than the 2 bytes"}));
  EXPECT_TRUE(rejects(le_bytes(~0ull, 8) + "{}", {"exceeds the cap"}));
}

TEST_F(SafetensorsMalformed, header_length_above_the_cap) {
  EXPECT_TRUE(
      rejects(le_bytes(100'000'001, 8) + "{}", {"header length 100000001 exceeds the cap"}));
}

TEST_F(SafetensorsMalformed, header_not_json) {
  EXPECT_TRUE(rejects_header(
      R"({"a":)", "",
      {"header JSON at byte 5", "tensor 'a' must be an object, found the end of the header"}));
  EXPECT_TRUE(rejects_header(R"({"a" {}})", "", {"expected ':'"}));
  EXPECT_TRUE(rejects_header(R"({"a)", "", {"unterminated string"}));
  EXPECT_TRUE(rejects_header("", "", {"must be a JSON object", "the end of the header"}));
  EXPECT_TRUE(rejects_header(R"({"a\q":1})", "", {"invalid escape"}));
  EXPECT_TRUE(rejects_header(R"({"\udc00":1})", "", {"lone low surrogate"}));
  EXPECT_TRUE(rejects_header(R"({"\ud800x":1})", "", {"high surrogate"}));
  EXPECT_TRUE(rejects_header("{\"a\nb\":1}", "", {"unescaped control character"}));
  EXPECT_TRUE(rejects_header(R"({,})", "", {"expected a string"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,16],)"),
                             four_floats_, {"expected a string"}));
}

TEST_F(SafetensorsMalformed, header_not_an_object) {
  EXPECT_TRUE(rejects_header("[1, 2]  ", "", {"the header must be a JSON object, found an array"}));
  EXPECT_TRUE(rejects_header(R"("x")", "", {"must be a JSON object, found a string"}));
  EXPECT_TRUE(rejects_header(R"({"a":[1]})", "", {"tensor 'a' must be an object, found an array"}));
}

TEST_F(SafetensorsMalformed, header_with_trailing_garbage) {
  EXPECT_TRUE(rejects_header("{}x", "", {"trailing characters", "'x'"}));
  EXPECT_TRUE(rejects_header("{}{}", "", {"trailing characters"}));
  EXPECT_TRUE(rejects_header(std::string("{}\0\0\0\0\0\0", 8), "", {"trailing characters"}));
}

TEST_F(SafetensorsMalformed, header_not_utf8) {
  EXPECT_TRUE(rejects_header("{\"\xff\":1}", "", {"not valid UTF-8 (byte 2)"}));
  EXPECT_TRUE(rejects_header("{\"\xc0\xaf\":1}", "", {"not valid UTF-8"}));  // overlong '/'
}

TEST_F(SafetensorsMalformed, tensor_entry_missing_a_field) {
  EXPECT_TRUE(rejects_header(one(R"("shape":[4],"data_offsets":[0,16])"), four_floats_,
                             {"tensor 'a' is missing 'dtype'"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","data_offsets":[0,16])"), four_floats_,
                             {"tensor 'a' is missing 'shape'"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4])"), four_floats_,
                             {"tensor 'a' is missing 'data_offsets'"}));
  EXPECT_TRUE(rejects_header(R"({"a":{}})", "", {"tensor 'a' is missing 'dtype'"}));
}

TEST_F(SafetensorsMalformed, tensor_entry_with_wrong_types) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":32,"shape":[4],"data_offsets":[0,16])"), four_floats_,
                             {"'dtype' of tensor 'a' must be a string, found a number"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":"4","data_offsets":[0,16])"),
                             four_floats_,
                             {"expected an array of integers for 'shape' of tensor 'a'"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":{"b":0})"),
                             four_floats_, {"'data_offsets' of tensor 'a'", "found an object"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[true],"data_offsets":[0,16])"),
                             four_floats_, {"expected an integer", "found a boolean"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1)"),
                             four_floats_, {"unknown field 'x'"}));
  EXPECT_TRUE(rejects_header(R"({"__metadata__":{"k":1}})", "",
                             {"'__metadata__' value of 'k' must be a string"}));
  EXPECT_TRUE(rejects_header(R"({"__metadata__":[]})", "", {"'__metadata__' must be an object"}));
}

TEST_F(SafetensorsMalformed, unsupported_dtype_names_dtype_and_tensor) {
  for (const char* dtype : {"I8", "U8", "F8_E8M0", "U64", "f32"})
    EXPECT_TRUE(rejects_header(
        one(std::string(R"("dtype":")") + dtype + R"(","shape":[4],"data_offsets":[0,4])"),
        raw<uint8_t>({1, 2, 3, 4}),
        {"tensor 'a' has dtype '" + std::string(dtype) + "'", "not support"}));
}

TEST_F(SafetensorsMalformed, negative_or_non_integer_dims) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[-4],"data_offsets":[0,16])"),
                             four_floats_, {"tensor 'a' has a negative dim in shape [-4]"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4.0],"data_offsets":[0,16])"),
                             four_floats_, {"non-integer number 4.0"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4e0],"data_offsets":[0,16])"),
                             four_floats_, {"non-integer number"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[04],"data_offsets":[0,16])"),
                             four_floats_, {"leading zero"}));
  EXPECT_TRUE(
      rejects_header(one(R"("dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,16])"),
                     four_floats_, {"out of the 64-bit range"}));
}

TEST_F(SafetensorsMalformed, shape_product_overflow) {
  EXPECT_TRUE(rejects_header(
      one(R"("dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16])"), four_floats_,
      {"tensor 'a'", "element count overflows 64 bits"}));
  EXPECT_TRUE(
      rejects_header(one(R"("dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,16])"),
                     four_floats_, {"tensor 'a'", "byte size overflows 64 bits"}));
  // A zero dim makes numel 0 but the other dims still size the strides.
  EXPECT_TRUE(
      rejects_header(one(R"("dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0])"),
                     "", {"overflows 64 bits"}));
}

TEST_F(SafetensorsMalformed, rank_above_eight) {
  EXPECT_TRUE(
      rejects_header(one(R"("dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4])"),
                     raw<float>({1.f}), {"'shape' of tensor 'a' has more than 8 dims"}));
}

TEST_F(SafetensorsMalformed, data_offsets_not_begin_end) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[0])"), four_floats_,
                             {"must be [begin, end], found 1 items"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,8,16])"),
                             four_floats_, {"must be [begin, end]: too many items"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[0],"data_offsets":[16,0])"),
                             four_floats_, {"data_offsets [16, 0]", "begin <= end"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[-16,0])"),
                             four_floats_, {"data_offsets [-16, 0]", "0 <= begin"}));
}

TEST_F(SafetensorsMalformed, data_offsets_end_beyond_the_data_section) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])"),
                             raw<float>({1.f, 2.f}),
                             {"end is beyond the data section of 8 bytes"}));
  EXPECT_TRUE(
      rejects_header(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,9223372036854775807])"),
                     four_floats_, {"beyond the data section"}));
}

TEST_F(SafetensorsMalformed, byte_length_differs_from_shape_and_dtype) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[3],"data_offsets":[0,16])"),
                             four_floats_,
                             {"spanning 16 bytes", "shape [3] of f32 needs 12 bytes"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F64","shape":[4],"data_offsets":[0,16])"),
                             four_floats_, {"needs 32 bytes"}));
}

TEST_F(SafetensorsMalformed, overlapping_tensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  EXPECT_TRUE(rejects_header(header, four_floats_, {"tensors 'a' and 'b' overlap"}));
  // Two tensors on the same bytes.
  const std::string same = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_TRUE(rejects_header(same, four_floats_, {"overlap"}));
  // An empty tensor inside another one's bytes.
  const std::string inside = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  EXPECT_TRUE(rejects_header(inside, four_floats_, {"overlap"}));
}

TEST_F(SafetensorsMalformed, holes_in_the_data_section) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  EXPECT_TRUE(rejects_header(header, four_floats_, {"hole in the data section: bytes [4, 8)"}));
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[3],"data_offsets":[4,16])"),
                             four_floats_, {"hole", "[0, 4)"}));
}

TEST_F(SafetensorsMalformed, trailing_bytes_after_the_last_tensor) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":"F32","shape":[3],"data_offsets":[0,12])"),
                             four_floats_, {"trailing bytes", "[12, 16)"}));
  EXPECT_TRUE(rejects_header("{}", "x", {"trailing bytes"}));
}

TEST_F(SafetensorsMalformed, duplicate_keys) {
  const std::string entry = R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})";
  EXPECT_TRUE(rejects_header(R"({"a":)" + entry + R"(,"a":)" + entry + "}", four_floats_,
                             {"duplicate key 'a'"}));
  // Equal after unescaping is still a duplicate.
  EXPECT_TRUE(rejects_header(R"({"a":)" + entry + R"(,"\u0061":)" + entry + "}", four_floats_,
                             {"duplicate key 'a'"}));
  EXPECT_TRUE(rejects_header(R"({"__metadata__":{},"__metadata__":{}})", "",
                             {"duplicate key '__metadata__'"}));
  EXPECT_TRUE(rejects_header(R"({"__metadata__":{"k":"1","k":"2"}})", "",
                             {"duplicate key 'k' in '__metadata__'"}));
  EXPECT_TRUE(
      rejects_header(one(R"("dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16])"),
                     four_floats_, {"tensor 'a' has a duplicate key 'dtype'"}));
}

TEST_F(SafetensorsMalformed, bool_bytes_other_than_zero_or_one) {
  EXPECT_TRUE(rejects_header(one(R"("dtype":"BOOL","shape":[3],"data_offsets":[0,3])"),
                             raw<uint8_t>({1, 0, 2}),
                             {"tensor 'a' is boolean but element 2 holds the byte value 2"}));
}

TEST_F(TensorIO, save_safetensors_rejects_bad_names_and_tensors) {
  std::mt19937_64 rng(6);
  Tensor t = random_tensor({2}, DType::f32, rng);
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors(path("x"), {{"__metadata__", t}});
      },
      {"save_safetensors", "'__metadata__' is reserved"}));
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors(path("x"), {{"\xff", t}});
      },
      {"tensor name", "not valid UTF-8"}));
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors(path("x"), {{"u", Tensor()}});
      },
      {"tensor 'u' is undefined"}));
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors(path("x"), {{"t", t}}, {{"k", "\xc3"}});
      },
      {"metadata value", "not valid UTF-8"}));
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors(path("no_dir/x"), {{"t", t}});
      },
      {"cannot open the file for writing"}));
}

// ---------------------------------------------------------------------------
// .npy: round trips

TEST_F(TensorIO, npy_round_trips_every_numpy_dtype_bitwise) {
  std::mt19937_64 rng(7);
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::bf16) continue;
    for (const Shape& shape :
         {Shape{}, Shape{0}, Shape{7}, Shape{3, 4}, Shape{2, 0, 5}, Shape{2, 3, 1, 2}}) {
      Tensor t = random_tensor(shape, dtype, rng);
      save_npy(path("t.npy"), t);
      EXPECT_TRUE(bitwise_equal(load_npy(path("t.npy")), t))
          << dtype_name(dtype) << " " << shape_str(shape);
    }
  }
}

TEST_F(TensorIO, npy_writes_non_contiguous_views_in_logical_order) {
  std::mt19937_64 rng(8);
  Tensor base = random_tensor({3, 5}, DType::f64, rng);
  Tensor t = base.transpose(0, 1);
  ASSERT_FALSE(t.is_contiguous());
  save_npy(path("t.npy"), t);
  EXPECT_TRUE(bitwise_equal(load_npy(path("t.npy")), t.contiguous()));
}

// The header from the .npy spec, padded by hand.
std::string npy_v1(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header += std::string(64 - (10 + header.size() + 1) % 64, ' ') + "\n";
  return std::string("\x93NUMPY\x01\x00", 8) + le_bytes(header.size(), 2) + header + data;
}

// The header numpy.save writes (numpy >= 1.23): sorted keys, 21 - digits(shape[0])
// spare spaces, then spaces and '\n' up to a 64-byte boundary.
TEST_F(TensorIO, npy_writer_matches_numpy_bytes) {
  const auto expected = [](const std::string& dict, size_t spare, const std::string& data) {
    return npy_v1(dict + std::string(spare, ' '), data);
  };
  Tensor t = from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  save_npy(path("a.npy"), t);
  const std::string bytes = read_bytes(path("a.npy"));
  EXPECT_EQ(bytes, expected("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20,
                            raw<float>({0, 1, 2, 3, 4, 5})));
  EXPECT_EQ(bytes.size(), 128u + 24u);  // what numpy 2.x writes for this array

  save_npy(path("b.npy"), from_vector<int64_t>({5, -6, 7}, {3}));
  EXPECT_EQ(read_bytes(path("b.npy")),
            expected("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", 20,
                     raw<int64_t>({5, -6, 7})));

  save_npy(path("c.npy"), scalar_tensor(2.5, DType::f64));
  EXPECT_EQ(
      read_bytes(path("c.npy")),
      expected("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 0, raw<double>({2.5})));

  save_npy(path("d.npy"), empty({0, 3}, DType::boolean));
  EXPECT_EQ(read_bytes(path("d.npy")),
            expected("{'descr': '|b1', 'fortran_order': False, 'shape': (0, 3), }", 20, ""));
}

TEST_F(TensorIO, npy_hand_written_v1_file_parses) {
  const std::vector<float> values = {1.5f, -2.25f, 3.0f, 4.5f, -5.0f, 6.75f};
  write_bytes(path("h.npy"),
              npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw(values)));
  Tensor t = load_npy(path("h.npy"));
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_vector<float>(), values);

  // Double quotes, other key order, no trailing comma, a 1-tuple.
  write_bytes(path("q.npy"),
              npy_v1("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<i4\"}",
                     raw<int32_t>({-3, 4})));
  EXPECT_EQ(load_npy(path("q.npy")).to_vector<int32_t>(), (std::vector<int32_t>{-3, 4}));
}

TEST_F(TensorIO, npy_reads_versions_2_and_3) {
  const std::string dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }";
  for (char version : {'\x02', '\x03'}) {
    std::string header = dict + std::string(64 - (12 + dict.size() + 1) % 64, ' ') + "\n";
    write_bytes(path("v.npy"), std::string("\x93NUMPY", 6) + version + '\0' +
                                   le_bytes(header.size(), 4) + header +
                                   raw<uint16_t>({0x3c00, 0xc400}));
    EXPECT_EQ(load_npy(path("v.npy")).to_vector<float>(), (std::vector<float>{1.0f, -4.0f}))
        << int(version);
  }
}

TEST_F(TensorIO, npy_fortran_order_is_transposed_into_c_order) {
  // The 2x3 matrix [[1, 2, 3], [4, 5, 6]] stored column by column.
  write_bytes(path("f.npy"), npy_v1("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }",
                                    raw<double>({1, 4, 2, 5, 3, 6})));
  Tensor t = load_npy(path("f.npy"));
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));

  // Rank 3: element (i, j, k) sits at i + 2 j + 6 k.
  std::vector<int32_t> column_major(24);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        column_major[i + 2 * j + 6 * k] = 100 * i + 10 * j + k;
  write_bytes(path("g.npy"), npy_v1("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }",
                                    raw(column_major)));
  const auto v = load_npy(path("g.npy")).to_vector<int32_t>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(v[i * 12 + j * 4 + k], 100 * i + 10 * j + k);
}

// ---------------------------------------------------------------------------
// .npy: malformed files

class NpyMalformed : public TensorIO {
 protected:
  ::testing::AssertionResult rejects(const std::string& bytes, std::vector<std::string> fragments) {
    const std::string p = path("bad.npy");
    write_bytes(p, bytes);
    fragments.push_back("load_npy('" + p + "')");
    return throws_error([&] { load_npy(p); }, fragments);
  }
  ::testing::AssertionResult rejects_dict(const std::string& dict, const std::string& data,
                                          std::vector<std::string> fragments) {
    return rejects(npy_v1(dict, data), std::move(fragments));
  }
  const std::string six_floats_ = raw<float>({1, 2, 3, 4, 5, 6});
};

TEST_F(NpyMalformed, bad_magic) {
  std::string bytes = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
                             raw<float>({1, 2, 3, 4, 5, 6}));
  bytes[1] = 'n';
  EXPECT_TRUE(rejects(bytes, {"bad magic"}));
  EXPECT_TRUE(rejects("PK\x03\x04 zip archive", {"bad magic"}));
  EXPECT_TRUE(rejects("\x93NUMPY", {"6 bytes, too short"}));
}

TEST_F(NpyMalformed, bad_version) {
  std::string bytes = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
                             raw<float>({1, 2, 3, 4, 5, 6}));
  bytes[6] = 4;
  EXPECT_TRUE(rejects(bytes, {"unsupported .npy format version 4.0"}));
  bytes[6] = 1;
  bytes[7] = 1;
  EXPECT_TRUE(rejects(bytes, {"unsupported .npy format version 1.1"}));
  bytes[6] = 0;
  bytes[7] = 0;
  EXPECT_TRUE(rejects(bytes, {"version 0.0"}));
}

TEST_F(NpyMalformed, header_length_past_end_of_file) {
  EXPECT_TRUE(rejects(std::string("\x93NUMPY\x01\x00", 8) + le_bytes(500, 2) + "{'descr'",
                      {"header length 500 runs past the end of the file (8 bytes follow it)"}));
  EXPECT_TRUE(rejects(std::string("\x93NUMPY\x02\x00", 8) + le_bytes(0xffffffffu, 4) + "{}",
                      {"header length 4294967295 runs past the end of the file"}));
  // Version 2 needs 4 length bytes; this file has 2.
  EXPECT_TRUE(rejects(std::string("\x93NUMPY\x02\x00", 8) + std::string("\x10\x00", 2),
                      {"reading the header length needs bytes [8, 12)"}));
}

TEST_F(NpyMalformed, unparsable_header_dict) {
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False}", six_floats_,
                           {"header is missing 'shape'"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}",
                           six_floats_, {"unexpected key 'x'"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}", six_floats_,
                           {"expected True or False for 'fortran_order'"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': [6]}", six_floats_,
                           {"expected '(' to open the shape tuple"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", six_floats_,
                           {"is not a tuple"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", six_floats_,
                           {"expected ',' or ')'"}));
  EXPECT_TRUE(
      rejects_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                   "'shape': (6,)}",
                   six_floats_, {"duplicate key 'descr'"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", six_floats_,
                           {"trailing characters"}));
  EXPECT_TRUE(rejects_dict("{'descr' '<f4', 'fortran_order': False, 'shape': (6,)}", six_floats_,
                           {".npy header at byte 9", "expected ':' after a key"}));
  EXPECT_TRUE(rejects_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,)}",
                           six_floats_, {"structured dtypes are not supported"}));
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", six_floats_,
                           {"negative dim"}));
  EXPECT_TRUE(
      rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': "
                   "(4294967296, 4294967296, 4)}",
                   six_floats_, {"overflows 64 bits"}));
  EXPECT_TRUE(
      rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': "
                   "(1, 1, 1, 1, 1, 1, 1, 1, 1)}",
                   six_floats_, {"more than 8 dims"}));
  EXPECT_TRUE(rejects_dict("", six_floats_, {"expected '{'"}));
}

TEST_F(NpyMalformed, big_endian_and_unsupported_dtypes) {
  EXPECT_TRUE(rejects_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", six_floats_,
                           {"big-endian dtype '>f4' is not supported"}));
  for (const char* descr : {"<i2", "|u1", "<c8", "|O", "=f4", "<f16"})
    EXPECT_TRUE(rejects_dict(
        std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (6,), }",
        six_floats_, {"dtype '" + std::string(descr) + "' is not supported"}));
}

TEST_F(NpyMalformed, data_shorter_than_shape_and_dtype) {
  EXPECT_TRUE(rejects_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", six_floats_,
                           {"file too short", "needs 48 data bytes but only 24"}));
}

TEST_F(NpyMalformed, trailing_bytes_after_the_data) {
  EXPECT_TRUE(rejects_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", six_floats_,
                           {"4 trailing bytes after the 20 data bytes"}));
}

TEST_F(NpyMalformed, bool_bytes_other_than_zero_or_one) {
  EXPECT_TRUE(rejects_dict("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
                           raw<uint8_t>({1, 255}), {"element 1 holds the byte value 255"}));
}

TEST_F(TensorIO, save_npy_of_bf16_throws_a_clear_error) {
  std::mt19937_64 rng(9);
  EXPECT_TRUE(throws_error([&] { save_npy(path("b.npy"), random_tensor({2}, DType::bf16, rng)); },
                           {"save_npy", "bf16 has no numpy dtype", ".to(DType::f32)"}));
  EXPECT_FALSE(fs::exists(path("b.npy")));
}

// ---------------------------------------------------------------------------
// safetensors: checksums (Note [Tensor checksums] in core/safetensors.cpp)

class SafetensorsChecksums : public TensorIO {
 protected:
  // Two tensors of random bits and one metadata entry, saved to "c.safetensors".
  void SetUp() override {
    TensorIO::SetUp();
    std::mt19937_64 rng(20);
    w_ = random_tensor({64, 8}, DType::f32, rng);
    b_ = random_tensor({5}, DType::i64, rng);
    save_safetensors(file(), {{"wte", w_}, {"b", b_}}, {{"step", "12"}});
    bytes_ = read_bytes(file());
  }
  std::string file() const { return path("c.safetensors"); }
  std::string header() const { return bytes_.substr(8, bytes_.size() - 8 - data_size()); }
  size_t data_size() const { return w_.nbytes() + b_.nbytes(); }
  // Replaces the header (the data offsets are relative to the data section,
  // so a header of another length is still a well-formed file).
  void write_header(const std::string& h) const {
    write_bytes(file(), safetensors_bytes(h, bytes_.substr(bytes_.size() - data_size())));
  }
  // The offset in the file of the value of metadata key `key`.
  size_t value_at(const std::string& key) const {
    const std::string quoted = "\"" + key + "\":\"";
    const size_t at = bytes_.find(quoted);
    EXPECT_NE(at, std::string::npos) << key;
    return at + quoted.size();
  }
  ::testing::AssertionResult refused(const std::vector<std::string>& fragments) const {
    std::vector<std::string> all = fragments;
    all.push_back("load_safetensors('" + file() + "')");
    return throws_error([&] { load_safetensors(file()); }, all);
  }

  Tensor w_, b_;
  std::string bytes_;
};

TEST_F(SafetensorsChecksums, every_save_records_them_and_a_load_verifies_them_transparently) {
  // Each tensor's recorded checksum is the CRC32C of its bytes.
  EXPECT_EQ(bytes_.substr(value_at("accrue.crc32c.wte"), 8),
            hex8(crc32c(w_.data_ptr(), w_.nbytes())));
  EXPECT_EQ(bytes_.substr(value_at("accrue.crc32c.b"), 8),
            hex8(crc32c(b_.data_ptr(), b_.nbytes())));
  EXPECT_NE(bytes_.find(R"("accrue.crc32c":")"), std::string::npos);
  std::map<std::string, std::string> metadata;
  const auto t = load_safetensors(file(), &metadata);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"step", "12"}}));
  EXPECT_TRUE(bitwise_equal(t.at("wte"), w_));
  EXPECT_TRUE(bitwise_equal(t.at("b"), b_));
  // Saving what was loaded writes the same file again.
  save_safetensors(path("again.safetensors"), t, metadata);
  EXPECT_EQ(read_bytes(path("again.safetensors")), bytes_);
  // The canonical form ignores JSON spacing: the header re-spaced still verifies.
  std::string spaced = header();
  for (size_t at = spaced.find("\":"); at != std::string::npos; at = spaced.find("\":", at + 3))
    spaced.insert(at + 2, 1, ' ');
  write_header(spaced);
  EXPECT_NO_THROW(load_safetensors(file()));
}

TEST_F(SafetensorsChecksums, one_flipped_bit_in_a_tensor_is_refused_naming_it) {
  const size_t data = bytes_.find(tensor_bytes(w_));
  ASSERT_NE(data, std::string::npos);
  for (size_t bit : {size_t{0}, size_t{1000}, w_.nbytes() * 8 - 1}) {
    std::string damaged = bytes_;
    damaged[data + bit / 8] ^= static_cast<char>(1 << (bit % 8));
    write_bytes(file(), damaged);
    const std::string recorded = bytes_.substr(value_at("accrue.crc32c.wte"), 8);
    const Tensor expected_damage = [&] {
      Tensor d = w_.clone();
      static_cast<unsigned char*>(d.data_ptr())[bit / 8] ^=
          static_cast<unsigned char>(1 << (bit % 8));
      return d;
    }();
    EXPECT_TRUE(refused({"tensor 'wte' fails its checksum",
                         "gives CRC32C " + hex8(crc32c(expected_damage.data_ptr(), w_.nbytes())),
                         "the file records " + recorded}))
        << "bit " << bit;
  }
}

TEST_F(SafetensorsChecksums, a_hundred_flipped_bits_in_a_tensor_are_refused_naming_it) {
  const size_t data = bytes_.find(tensor_bytes(b_));
  ASSERT_NE(data, std::string::npos);
  std::string damaged = bytes_;
  std::mt19937_64 rng(21);
  for (int i = 0; i < 100; ++i) {
    const size_t bit = rng() % (b_.nbytes() * 8);
    damaged[data + bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
  ASSERT_NE(damaged, bytes_);
  write_bytes(file(), damaged);
  EXPECT_TRUE(refused({"tensor 'b' fails its checksum", "accrue.crc32c.b"}));
}

TEST_F(SafetensorsChecksums, a_flipped_bit_in_a_recorded_checksum_is_refused) {
  // A flip that keeps a hex digit a hex digit: the checksums disagree.
  const size_t at = value_at("accrue.crc32c.wte");
  std::string damaged = bytes_;
  const char c = damaged[at];
  damaged[at] = static_cast<char>(c ^ ((c == 'a' || c == 'f') ? 4 : 1));
  write_bytes(file(), damaged);
  EXPECT_TRUE(
      refused({"tensor 'wte' fails its checksum", "the file records " + damaged.substr(at, 8)}));
  // One that does not ('0' ^ 0x40 is 'p'): a malformed entry.
  damaged = bytes_;
  damaged[at] = static_cast<char>(damaged[at] ^ 0x40);
  write_bytes(file(), damaged);
  EXPECT_TRUE(refused({"metadata 'accrue.crc32c.wte'", "is not a CRC32C"}));
  // In the header's own checksum.
  damaged = bytes_;
  const size_t h = value_at("accrue.crc32c");
  damaged[h + 7] = static_cast<char>(damaged[h + 7] == '0' ? '1' : '0');
  write_bytes(file(), damaged);
  EXPECT_TRUE(refused({"the header fails its checksum"}));
}

TEST_F(SafetensorsChecksums, a_flipped_bit_in_a_metadata_value_or_shape_is_refused) {
  std::string damaged = bytes_;
  damaged[value_at("step") + 1] ^= 1;  // "12" -> "13"
  write_bytes(file(), damaged);
  EXPECT_TRUE(refused({"the header fails its checksum", "('accrue.crc32c')"}));
  // [64,8] -> [8,64]: the same byte count, another tensor.
  std::string h = header();
  const size_t shape = h.find("[64,8]");
  ASSERT_NE(shape, std::string::npos);
  h.replace(shape, 6, "[8,64]");
  write_header(h);
  EXPECT_TRUE(refused({"the header fails its checksum"}));
}

TEST_F(SafetensorsChecksums, a_file_without_checksums_loads) {
  // The metadata without the checksums: what PyTorch or transformers would
  // have written (the metadata object is the header's first "}").
  const std::string h = header();
  write_header(R"({"__metadata__":{"step":"12"})" + h.substr(h.find('}') + 1));
  ASSERT_EQ(read_bytes(file()).find("crc32c"), std::string::npos);
  std::map<std::string, std::string> metadata;
  const auto t = load_safetensors(file(), &metadata);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"step", "12"}}));
  EXPECT_TRUE(bitwise_equal(t.at("wte"), w_));
}

TEST_F(SafetensorsChecksums, entries_that_do_not_match_the_tensors_are_refused) {
  const std::string h = header();
  const std::string open = R"({"__metadata__":{)";
  ASSERT_EQ(h.substr(0, open.size()), open);
  // A checksum for a tensor the file does not hold.
  write_header(open + R"("accrue.crc32c.nope":"00000000",)" + h.substr(open.size()));
  EXPECT_TRUE(
      refused({"'accrue.crc32c.nope' is the checksum of tensor 'nope', which the file "
               "does not hold"}));
  // Malformed values.
  for (const std::string bad : {"E3069283", "e306928", "e30692830", "e306928g", ""}) {
    std::string m = h;
    const size_t at = value_at("accrue.crc32c.b") - 8;
    m.replace(at, 8, bad);
    write_header(m);
    EXPECT_TRUE(refused({"metadata 'accrue.crc32c.b' = '" + bad + "' is not a CRC32C"})) << bad;
  }
  // A tensor without its checksum, and tensor checksums without the header's.
  const auto without = [&](const std::string& key) {
    std::string m = h;
    const size_t at = m.find("\"" + key + "\":");
    m.erase(at, key.size() + 2 + 1 + 10 + 1);  // "key":"xxxxxxxx",
    return m;
  };
  write_header(without("accrue.crc32c.b"));
  EXPECT_TRUE(refused({"tensor 'b' has no checksum ('accrue.crc32c.b')"}));
  write_header(without("accrue.crc32c"));
  EXPECT_TRUE(refused({"carries tensor checksums but not the header's"}));
}

TEST_F(SafetensorsChecksums, the_writer_refuses_the_reserved_keys) {
  for (const std::string key : {"accrue.crc32c", "accrue.crc32c.wte", "accrue.crc32c."})
    EXPECT_TRUE(throws_error(
        [&] {
          save_safetensors(path("x"), {{"wte", w_}}, {{key, "0"}});
        },
        {"save_safetensors", "metadata key '" + key + "' is reserved"}));
  // Keys that merely start alike are the caller's.
  save_safetensors(path("x"), {{"wte", w_}}, {{"accrue.crc32cx", "1"}});
  std::map<std::string, std::string> metadata;
  load_safetensors(path("x"), &metadata);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"accrue.crc32cx", "1"}}));
}

// ---------------------------------------------------------------------------
// Fuzz: damaged files either load or throw accrue::Error, never anything else.

// Runs load on the file and reports a crash-free outcome: true if it loaded.
// Any exception other than accrue::Error fails the test.
bool loads_or_throws_error(const std::function<void()>& load, const std::string& variant) {
  try {
    load();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << variant << ": threw a non-accrue exception: " << e.what();
  } catch (...) {
    ADD_FAILURE() << variant << ": threw a non-std exception";
  }
  return false;
}

void fuzz(const std::string& valid, const std::string& p, size_t header_end,
          const std::function<void()>& load, uint64_t seed) {
  // Every strict prefix of a valid file is invalid in both formats.
  for (size_t len = 0; len < valid.size(); ++len) {
    write_bytes(p, valid.substr(0, len));
    EXPECT_FALSE(loads_or_throws_error(load, "truncated to " + std::to_string(len)))
        << "a file truncated to " << len << " of " << valid.size() << " bytes loaded";
  }
  // Random byte flips in the prefix and header (the part that is parsed).
  std::mt19937_64 rng(seed);
  int loaded = 0;
  const int variants = 400;
  for (int v = 0; v < variants; ++v) {
    std::string bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      // Mostly single-bit flips (near-valid files reach deeper checks), some random bytes.
      const size_t at = rng() % header_end;
      const unsigned bit = 1u << (rng() % 8);
      bytes[at] = static_cast<char>(rng() % 4 == 0 ? rng() : bytes[at] ^ bit);
    }
    write_bytes(p, bytes);
    loaded += loads_or_throws_error(load, "variant " + std::to_string(v));
  }
  // Sanity: most flips break the file, and the unflipped file loads.
  EXPECT_LT(loaded, variants);
  write_bytes(p, valid);
  EXPECT_TRUE(loads_or_throws_error(load, "valid"));
}

TEST_F(TensorIO, fuzz_damaged_safetensors_throw_errors_never_crash) {
  std::mt19937_64 rng(10);
  const std::string p = path("f.safetensors");
  save_safetensors(p,
                   {{"w", random_tensor({3, 4}, DType::f32, rng)},
                    {"flag", random_tensor({5}, DType::boolean, rng)},
                    {"idx", random_tensor({2}, DType::i64, rng)},
                    {"h", random_tensor({3}, DType::bf16, rng)}},
                   {{"step", "12"}, {"note", "fuzz \xc3\xa9"}});
  const std::string valid = read_bytes(p);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(valid[i]);
  fuzz(
      valid, p, 8 + header_len, [&] { load_safetensors(p); }, 11);
}

TEST_F(TensorIO, fuzz_damaged_npy_throw_errors_never_crash) {
  std::mt19937_64 rng(12);
  const std::string p = path("f.npy");
  save_npy(p, random_tensor({3, 4}, DType::f32, rng));
  const std::string valid = read_bytes(p);
  fuzz(
      valid, p, 128, [&] { load_npy(p); }, 13);
}

}  // namespace
}  // namespace accrue
