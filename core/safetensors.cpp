// Safetensors: the reader and the writer of core/tensor_io.h. The header's
// JSON is core/json.h's; see Note [Untrusted tensor files] for the reader's
// rules and Note [Tensor checksums] for what every file accrue writes carries.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "accrue/core/crc32c.h"
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
    {"BOOL", DType::boolean, 0}, {"F8_E5M2", DType::f8e5m2, 3}, {"F8_E4M3", DType::f8e4m3, 4},
    {"F16", DType::f16, 7},      {"BF16", DType::bf16, 8},      {"I32", DType::i32, 9},
    {"F32", DType::f32, 11},     {"F64", DType::f64, 12},       {"I64", DType::i64, 13},
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
                     "', which accrue does not support (supported: F32, F64, BF16, F16, F8_E4M3, "
                     "F8_E5M2, I32, I64, BOOL)");
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

// Note [Tensor checksums]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every safetensors file accrue writes (trainer checkpoints, window states,
// saved models) records CRC32Cs (core/crc32c.h) in its "__metadata__", so a
// flipped bit on disk or in transit is found at load instead of surfacing as
// a NaN loss many windows later:
//  * "accrue.crc32c.<name>" for each tensor: the CRC32C of its raw data bytes
//    (the bytes the file stores, little-endian, data_offsets begin to end);
//  * "accrue.crc32c": the CRC32C of the rest of the header, in a canonical
//    form that does not depend on JSON spacing, escapes or key order: for each
//    other metadata entry in byte order of keys, "m" key NUL value NUL; then
//    for each tensor in byte order of names, "t" name NUL dtype NUL (its
//    safetensors name, e.g. F32) dims NUL begin "," end NUL, numbers in
//    decimal, dims joined by ",". It covers what the tensor checksums cannot:
//    a damaged metadata value (a data position, a window count), name, shape
//    or offset.
// Each value is exactly 8 lowercase hex digits. The keys are reserved: the
// writer refuses them in the caller's metadata, and the reader removes them
// from the metadata it returns, so a load/save round trip is transparent.
//
// A file carries checksums when any reserved key is present; then the header
// checksum and one checksum for every tensor must be there, and no checksum
// may name a tensor the file does not hold. All of that, and the header
// checksum, is checked before any tensor data is read; each tensor's checksum
// after its bytes are read. Any failure is an accrue::Error naming the file,
// the tensor (or the header) and both checksums. A file without any reserved
// key (PyTorch's, transformers', an older accrue's) loads unverified, as
// before; a tool that rewrites an accrue file's tensors but keeps its metadata
// must drop or recompute the entries, or the file is refused. CRC32C detects
// damage (every burst of up to 32 flipped bits, all odd numbers of flips, and
// all but 2^-32 of the rest); it is no defence against a deliberate forgery.
// Cost: one more pass over the bytes, beside the disk write or read: on one
// core about 9 GB/s with the SSE4.2 instruction (55 ms for a 500 MB
// checkpoint) and 2 GB/s with the portable tables.
constexpr const char* kChecksumKey = "accrue.crc32c";

bool is_checksum_key(const std::string& key) {
  const std::string_view prefix = kChecksumKey;
  return key.starts_with(prefix) && (key.size() == prefix.size() || key[prefix.size()] == '.');
}

std::string checksum_key(const std::string& tensor) {
  std::string key = kChecksumKey;
  key += '.';
  key += tensor;
  return key;
}

std::string hex8(uint32_t crc) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", crc);
  return s;
}

uint32_t parse_hex8(const std::string& key, const std::string& value, const FileRef& file) {
  uint32_t crc = 0;
  bool ok = value.size() == 8;
  for (size_t i = 0; ok && i < value.size(); ++i) {
    const char c = value[i];
    if (c >= '0' && c <= '9')
      crc = (crc << 4) | static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      crc = (crc << 4) | static_cast<uint32_t>(c - 'a' + 10);
    else
      ok = false;
  }
  ACCRUE_CHECK(ok, file, ": metadata '", key, "' = '", value,
               "' is not a CRC32C (8 lowercase hex digits; Note [Tensor checksums])");
  return crc;
}

// The canonical header bytes of Note [Tensor checksums], checksummed.
uint32_t header_checksum(const std::map<std::string, std::string>& metadata,
                         const std::map<std::string, TensorEntry>& entries) {
  std::string s;
  for (const auto& [key, value] : metadata) {
    s += 'm';
    s += key;
    s += '\0';
    s += value;
    s += '\0';
  }
  for (const auto& [name, e] : entries) {
    s += 't';
    s += name;
    s += '\0';
    s += safetensors_dtype(e.dtype).name;
    s += '\0';
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i > 0) s += ',';
      s += std::to_string(e.shape[i]);
    }
    s += '\0';
    s += std::to_string(e.begin);
    s += ',';
    s += std::to_string(e.end);
    s += '\0';
  }
  return crc32c(s.data(), s.size());
}

// The checksums a file records, taken out of its metadata.
struct Checksums {
  bool present = false;
  bool has_header = false;
  uint32_t header = 0;
  std::map<std::string, uint32_t> tensors;
};

Checksums take_checksums(std::map<std::string, std::string>& metadata, const FileRef& file) {
  Checksums sums;
  for (auto it = metadata.begin(); it != metadata.end();) {
    if (!is_checksum_key(it->first)) {
      ++it;
      continue;
    }
    sums.present = true;
    const uint32_t crc = parse_hex8(it->first, it->second, file);
    if (it->first.size() == std::string_view(kChecksumKey).size()) {
      sums.has_header = true;
      sums.header = crc;
    } else {
      sums.tensors.emplace(it->first.substr(std::string_view(kChecksumKey).size() + 1), crc);
    }
    it = metadata.erase(it);
  }
  return sums;
}

// Everything about the checksums that can be checked before reading data.
void check_checksums_cover(const Checksums& sums,
                           const std::map<std::string, std::string>& metadata,
                           const std::map<std::string, TensorEntry>& entries, const FileRef& file) {
  if (!sums.present) return;
  for (const auto& [name, crc] : sums.tensors)
    ACCRUE_CHECK(entries.count(name), file, ": metadata '", checksum_key(name),
                 "' is the checksum of tensor '", name,
                 "', which the file does not hold (a damaged name? Note [Tensor checksums])");
  for (const auto& [name, e] : entries)
    ACCRUE_CHECK(
        sums.tensors.count(name), file, ": tensor '", name, "' has no checksum ('",
        checksum_key(name),
        "') though the file carries checksums (a damaged header? Note [Tensor checksums])");
  ACCRUE_CHECK(sums.has_header, file, ": the file carries tensor checksums but not the header's ('",
               kChecksumKey, "', Note [Tensor checksums])");
  const uint32_t actual = header_checksum(metadata, entries);
  ACCRUE_CHECK(actual == sums.header, file,
               ": the header fails its checksum: its metadata and tensor entries give CRC32C ",
               hex8(actual), " but the file records ", hex8(sums.header), " ('", kChecksumKey,
               "'): a metadata value, tensor name, dtype, shape or offset, or the checksum itself, "
               "is damaged");
}

void check_tensor_checksum(const Checksums& sums, const std::string& name, const Tensor& t,
                           const FileRef& file) {
  if (!sums.present) return;
  const uint32_t expected = sums.tensors.at(name);
  const uint32_t actual = crc32c(t.data_ptr(), t.nbytes());
  ACCRUE_CHECK(actual == expected, file, ": tensor '", name,
               "' fails its checksum: its data gives CRC32C ", hex8(actual),
               " but the file records ", hex8(expected), " ('", checksum_key(name), "'): its ",
               t.nbytes(), " bytes, or the checksum itself, are damaged");
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
  const Checksums sums = take_checksums(meta, file);

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

  check_checksums_cover(sums, meta, entries, file);

  // Everything fits the file: read. Allocations total at most the file size.
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, e] : entries) {
    Tensor t = empty(e.shape, e.dtype);
    const std::string what = "tensor '" + name + "'";
    in.read_at(data_start + static_cast<uint64_t>(e.begin), t.data_ptr(),
               static_cast<uint64_t>(e.end - e.begin), what.c_str());
    check_tensor_checksum(sums, name, t, file);
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
    ACCRUE_CHECK(!is_checksum_key(key), file, ": metadata key '", key,
                 "' is reserved for the checksums the writer adds (Note [Tensor checksums])");
  }
  // The reference implementation's order: largest dtype first (by its enum
  // order), then by name. Every tensor then starts at a multiple of its
  // element size, and files are byte-identical to the reference's given the
  // same metadata (which here includes the checksums).
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.dtype->reference_rank != b.dtype->reference_rank)
      return a.dtype->reference_rank > b.dtype->reference_rank;
    return *a.name < *b.name;
  });

  // Note [Tensor checksums]: the header's over the caller's metadata and the
  // entries, then one per tensor over its bytes.
  std::map<std::string, TensorEntry> entries;
  int64_t offset = 0;
  for (const Item& item : items) {
    TensorEntry& e = entries[*item.name];
    e.name = *item.name;
    e.dtype = item.host.dtype();
    e.shape = item.host.shape();
    e.begin = offset;
    e.end = offset + static_cast<int64_t>(item.host.nbytes());
    offset = e.end;
  }
  std::map<std::string, std::string> full_metadata = metadata;
  full_metadata[kChecksumKey] = hex8(header_checksum(metadata, entries));
  for (const Item& item : items)
    full_metadata[checksum_key(*item.name)] =
        hex8(crc32c(item.host.data_ptr(), item.host.nbytes()));

  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [key, value] : full_metadata) {
    if (!first) header += ',';
    first = false;
    append_json_string(header, key);
    header += ':';
    append_json_string(header, value);
  }
  header += '}';
  for (const Item& item : items) {
    const TensorEntry& e = entries.at(*item.name);
    header += ',';
    append_json_string(header, *item.name);
    header += ":{\"dtype\":\"";
    header += item.dtype->name;
    header += "\",\"shape\":";
    append_json_int_array(header, e.shape);
    header += ",\"data_offsets\":";
    append_json_int_array(header, {e.begin, e.end});
    header += '}';
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
