// Safetensors: the reader and the writer of core/tensor_io.h. The header's
// JSON is core/json.h's; see Note [Untrusted tensor files] for the reader's rules.
#include <algorithm>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include "accrue/core/json.h"
#include "accrue/core/tensor_file.h"
#include "accrue/core/tensor_io.h"
#include "accrue/core/utf8.h"

namespace accrue {

namespace {

using detail::append_json_int_array;
using detail::append_json_string;
using detail::check_bool_bytes;
using detail::checked_nbytes;
using detail::FileRef;
using detail::find_invalid_utf8;
using detail::host_contiguous;
using detail::InputFile;
using detail::JsonReader;
using detail::kMaxRank;
using detail::OutputFile;

constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;  // the reference implementation's cap

// Safetensors dtype names, and the rank of each in the reference
// implementation's Dtype enum, whose order the writer sorts by.
struct SafetensorsDType {
  const char* name;
  DType dtype;
  int reference_rank;
};
constexpr SafetensorsDType kSafetensorsDTypes[] = {
    {"BOOL", DType::boolean, 0}, {"F16", DType::f16, 7},  {"BF16", DType::bf16, 8},
    {"I32", DType::i32, 9},      {"F32", DType::f32, 11}, {"F64", DType::f64, 12},
    {"I64", DType::i64, 13},
};

const SafetensorsDType& safetensors_dtype(DType t) {
  for (const auto& d : kSafetensorsDTypes)
    if (d.dtype == t) return d;
  ACCRUE_FAIL("save_safetensors: dtype ", dtype_name(t), " has no safetensors name");
}

struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  int64_t begin = 0, end = 0;
};

TensorEntry parse_tensor_entry(JsonReader& json, const std::string& name, const FileRef& file) {
  TensorEntry entry;
  entry.name = name;
  const std::string quoted = "'" + name + "'";
  if (json.peek() != '{')
    json.fail("tensor ", quoted, " must be an object, found ", json.describe_next());
  json.expect('{', "");
  bool has_dtype = false, has_shape = false, has_offsets = false;
  if (!json.consume('}')) {
    while (true) {
      const std::string key = json.parse_string();
      json.expect(':', "after a key");
      bool* seen = nullptr;
      if (key == "dtype") {
        seen = &has_dtype;
        if (json.peek() != '"')
          json.fail("'dtype' of tensor ", quoted, " must be a string, found ",
                    json.describe_next());
        const std::string dtype = json.parse_string();
        const auto* found =
            std::find_if(std::begin(kSafetensorsDTypes), std::end(kSafetensorsDTypes),
                         [&](const auto& d) { return dtype == d.name; });
        ACCRUE_CHECK(found != std::end(kSafetensorsDTypes), file, ": tensor ", quoted,
                     " has dtype '", dtype,
                     "', which accrue does not support (supported: F32, F64, BF16, F16, I32, "
                     "I64, BOOL)");
        entry.dtype = found->dtype;
      } else if (key == "shape") {
        seen = &has_shape;
        entry.shape = json.parse_integer_array(
            "'shape' of tensor " + quoted, kMaxRank,
            detail::str_cat("has more than ", kMaxRank, " dims, the most accrue supports"));
      } else if (key == "data_offsets") {
        seen = &has_offsets;
        const auto offsets = json.parse_integer_array("'data_offsets' of tensor " + quoted, 2,
                                                      "must be [begin, end]: too many items");
        if (offsets.size() != 2)
          json.fail("'data_offsets' of tensor ", quoted, " must be [begin, end], found ",
                    offsets.size(), " items");
        entry.begin = offsets[0];
        entry.end = offsets[1];
      } else {
        json.fail("tensor ", quoted, " has the unknown field '", key,
                  "' (expected dtype, shape, data_offsets)");
      }
      if (*seen) json.fail("tensor ", quoted, " has a duplicate key '", key, "'");
      *seen = true;
      if (json.consume('}')) break;
      json.expect(',', "or '}' after a field of a tensor");
    }
  }
  ACCRUE_CHECK(has_dtype, file, ": tensor ", quoted, " is missing 'dtype'");
  ACCRUE_CHECK(has_shape, file, ": tensor ", quoted, " is missing 'shape'");
  ACCRUE_CHECK(has_offsets, file, ": tensor ", quoted, " is missing 'data_offsets'");
  return entry;
}

void parse_metadata(JsonReader& json, std::map<std::string, std::string>& metadata) {
  if (json.consume_null()) return;  // the reference reader accepts null as "no metadata"
  if (json.peek() != '{')
    json.fail("'__metadata__' must be an object of strings, found ", json.describe_next());
  json.expect('{', "");
  if (json.consume('}')) return;
  while (true) {
    std::string key = json.parse_string();
    json.expect(':', "after a key");
    if (json.peek() != '"')
      json.fail("'__metadata__' value of '", key, "' must be a string, found ",
                json.describe_next());
    std::string value = json.parse_string();
    if (!metadata.emplace(key, std::move(value)).second)
      json.fail("duplicate key '", key, "' in '__metadata__'");
    if (json.consume('}')) return;
    json.expect(',', "or '}' after a metadata value");
  }
}

void check_utf8(const std::string& s, const FileRef& file, const char* what) {
  const size_t bad = find_invalid_utf8(s);
  ACCRUE_CHECK(bad == std::string::npos, file, ": ", what, " '", s, "' is not valid UTF-8 (byte ",
               bad, ")");
}

}  // namespace

std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  const FileRef file{"load_safetensors", path};
  InputFile in(file);
  ACCRUE_CHECK(in.size() >= 8, file, ": the file is ", in.size(),
               " bytes, shorter than the 8-byte header length");
  unsigned char prefix[8];
  in.read_at(0, prefix, 8, "the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | prefix[i];
  ACCRUE_CHECK(header_len <= kMaxSafetensorsHeader, file, ": header length ", header_len,
               " exceeds the cap of ", kMaxSafetensorsHeader, " bytes");
  ACCRUE_CHECK(header_len <= in.size() - 8, file, ": header length ", header_len,
               " is larger than the ", in.size() - 8, " bytes that follow it in the file");
  std::string text(header_len, '\0');
  in.read_at(8, text.data(), header_len, "the header");
  const size_t bad = find_invalid_utf8(text);
  ACCRUE_CHECK(bad == std::string::npos, file, ": header is not valid UTF-8 (byte ", bad, ")");

  // Parse: one object of tensor entries and an optional "__metadata__".
  JsonReader json(text, file);
  std::map<std::string, TensorEntry> entries;
  std::map<std::string, std::string> meta;
  bool has_metadata = false;
  if (json.peek() != '{')
    json.fail("the header must be a JSON object, found ", json.describe_next());
  json.expect('{', "");
  if (!json.consume('}')) {
    while (true) {
      std::string key = json.parse_string();
      json.expect(':', "after a key");
      if (key == "__metadata__") {
        if (has_metadata) json.fail("duplicate key '__metadata__'");
        has_metadata = true;
        parse_metadata(json, meta);
      } else {
        if (entries.count(key)) json.fail("duplicate key '", key, "'");
        TensorEntry entry = parse_tensor_entry(json, key, file);
        entries.emplace(std::move(key), std::move(entry));
      }
      if (json.consume('}')) break;
      json.expect(',', "or '}' after a tensor entry");
    }
  }
  json.expect_end();

  // Validate every entry against the data section, then check that the
  // entries tile it exactly (the format allows no overlap, hole or tail).
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = in.size() - data_start;
  std::vector<const TensorEntry*> by_offset;
  for (const auto& [name, e] : entries) {
    const std::string what = "tensor '" + name + "'";
    const uint64_t nbytes = checked_nbytes(e.shape, e.dtype, file, what);
    ACCRUE_CHECK(e.begin >= 0 && e.end >= 0 && e.begin <= e.end, file, ": ", what,
                 " has data_offsets [", e.begin, ", ", e.end,
                 "]; they must be [begin, end] with 0 <= begin <= end");
    ACCRUE_CHECK(static_cast<uint64_t>(e.end) <= data_size, file, ": ", what, " has data_offsets [",
                 e.begin, ", ", e.end, "] whose end is beyond the data section of ", data_size,
                 " bytes");
    ACCRUE_CHECK(static_cast<uint64_t>(e.end - e.begin) == nbytes, file, ": ", what,
                 " has data_offsets [", e.begin, ", ", e.end, "] spanning ", e.end - e.begin,
                 " bytes, but shape ", shape_str(e.shape), " of ", dtype_name(e.dtype), " needs ",
                 nbytes, " bytes");
    by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  int64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry* e : by_offset) {
    ACCRUE_CHECK(e->begin >= covered, file, ": tensors '", previous ? previous->name : "",
                 "' and '", e->name, "' overlap (data_offsets end ", covered, " > begin ", e->begin,
                 ")");
    ACCRUE_CHECK(e->begin == covered, file, ": hole in the data section: bytes [", covered, ", ",
                 e->begin, ") belong to no tensor");
    covered = e->end;
    previous = e;
  }
  ACCRUE_CHECK(static_cast<uint64_t>(covered) == data_size, file,
               ": trailing bytes: the tensors cover ", covered, " bytes but the data section has ",
               data_size, " (bytes [", covered, ", ", data_size, ") belong to no tensor)");

  // Everything fits the file: read. Allocations total at most the file size.
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, e] : entries) {
    Tensor t = empty(e.shape, e.dtype);
    const std::string what = "tensor '" + name + "'";
    in.read_at(data_start + static_cast<uint64_t>(e.begin), t.data_ptr(),
               static_cast<uint64_t>(e.end - e.begin), what.c_str());
    if (e.dtype == DType::boolean) check_bool_bytes(t, file, what);
    tensors.emplace(name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return tensors;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  return load_safetensors(path, nullptr);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const FileRef file{"save_safetensors", path};
  struct Item {
    const std::string* name;
    Tensor host;
    const SafetensorsDType* dtype;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    ACCRUE_CHECK(t.defined(), file, ": tensor '", name, "' is undefined");
    ACCRUE_CHECK(name != "__metadata__", file,
                 ": '__metadata__' is reserved by the format and cannot name a tensor");
    check_utf8(name, file, "tensor name");
    items.push_back({&name, host_contiguous(t), &safetensors_dtype(t.dtype())});
  }
  for (const auto& [key, value] : metadata) {
    check_utf8(key, file, "metadata key");
    check_utf8(value, file, "metadata value");
  }
  // The reference implementation's order: largest dtype first (by its enum
  // order), then by name. Every tensor then starts at a multiple of its
  // element size, and files are byte-identical to the reference's.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.dtype->reference_rank != b.dtype->reference_rank)
      return a.dtype->reference_rank > b.dtype->reference_rank;
    return *a.name < *b.name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  int64_t offset = 0;
  for (const Item& item : items) {
    if (header.size() > 1) header += ',';
    append_json_string(header, *item.name);
    header += ":{\"dtype\":\"";
    header += item.dtype->name;
    header += "\",\"shape\":";
    append_json_int_array(header, item.host.shape());
    header += ",\"data_offsets\":";
    const int64_t end = offset + static_cast<int64_t>(item.host.nbytes());
    append_json_int_array(header, {offset, end});
    header += '}';
    offset = end;
  }
  header += '}';
  // Pad with spaces to a multiple of 8 so that the data section starts aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  ACCRUE_CHECK(header.size() <= kMaxSafetensorsHeader, file, ": header of ", header.size(),
               " bytes exceeds the ", kMaxSafetensorsHeader, "-byte cap that readers enforce");

  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  OutputFile out(file);
  out.write(prefix, 8);
  out.write(header);
  for (const Item& item : items)
    out.write(item.host.data_ptr(), item.host.nbytes());
  out.close();
}

}  // namespace accrue
