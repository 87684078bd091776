#include "accrue/nn/hf_checkpoint.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <system_error>

#include "accrue/core/error.h"
#include "accrue/core/json.h"
#include "accrue/core/tensor_file.h"
#include "accrue/core/tensor_io.h"
#include "accrue/core/utf8.h"

namespace accrue::nn {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = 100'000'000;  // as a safetensors header

// transformers' shard names: model-00001-of-00003.safetensors.
const std::regex& shard_name_pattern() {
  static const std::regex pattern("model-[0-9]{5,}-of-[0-9]{5,}\\.safetensors");
  return pattern;
}

std::string shard_name(size_t i, size_t n) {
  char s[64];
  std::snprintf(s, sizeof s, "model-%05zu-of-%05zu.safetensors", i, n);
  return s;
}

// Both follow symbolic links (the Hugging Face cache's snapshots are links
// to blobs) and treat an unreadable path as absent, never throwing.
bool regular_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool directory(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

// Note [Checkpoint directories]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint directory is untrusted as its files are (Note [Untrusted
// tensor files]): the index is read by the schema-driven JSON cursor (Note
// [Schema-driven JSON]) and capped at 100 MB, and a shard name must be a
// plain file name ending in ".safetensors" (no separator, no "." or "..",
// no NUL), so an index cannot send the loader outside the directory. The
// result must be exactly the index's weight_map: every listed shard exists
// (checked before any is read), every tensor of a shard is listed for that
// shard, no tensor is held by two shards, and every listed tensor is held by
// its shard. "metadata" (total_size, total_parameters) is not checked: the
// tensors' own shapes and checksums are what a load trusts. A directory with
// both model.safetensors and an index is refused rather than one of them
// silently preferred; the writer removes the stale layout for that reason.

std::map<std::string, std::string> parse_safetensors_index(const std::string& text,
                                                           const std::string& name) {
  const detail::FileRef file{"load_safetensors_dir", name};
  const size_t bad = detail::find_invalid_utf8(text);
  ACCRUE_CHECK(bad == std::string::npos, file, ": the index is not valid UTF-8 (byte ", bad, ")");
  detail::JsonReader json(text, file, "index JSON");
  std::map<std::string, std::string> weight_map;
  bool has_map = false, has_metadata = false;
  if (json.peek() != '{')
    json.fail("the index must be a JSON object, found ", json.describe_next());
  json.parse_object("the index", [&](const std::string& key) {
    if (key == "weight_map") {
      if (has_map) json.fail("duplicate key 'weight_map'");
      has_map = true;
      json.parse_object("'weight_map'", [&](const std::string& tensor) {
        if (json.peek() != '"')
          json.fail("'weight_map' entry '", tensor, "' must be a shard file name, found ",
                    json.describe_next());
        std::string shard = json.parse_string();
        const bool plain = !shard.empty() && shard != "." && shard != ".." &&
                           shard.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
        if (!plain)
          json.fail("'weight_map' puts tensor '", tensor, "' in '", shard,
                    "', which is not a plain file name in the directory",
                    " (Note [Checkpoint directories])");
        if (!shard.ends_with(".safetensors"))
          json.fail("'weight_map' puts tensor '", tensor, "' in '", shard,
                    "', which is not a .safetensors file");
        if (!weight_map.emplace(tensor, std::move(shard)).second)
          json.fail("'weight_map' lists tensor '", tensor, "' twice");
      });
    } else if (key == "metadata") {
      if (has_metadata) json.fail("duplicate key 'metadata'");
      has_metadata = true;
      json.skip_value();
    } else {
      json.skip_value();
    }
  });
  json.expect_end();
  ACCRUE_CHECK(has_map, file, ": the index has no 'weight_map'");
  return weight_map;
}

std::map<std::string, Tensor> load_safetensors_dir(const std::string& dir,
                                                   std::map<std::string, std::string>* sources) {
  const fs::path root(dir);
  const fs::path single = root / kSingleFile, index = root / kIndexFile;
  const bool has_single = regular_file(single), has_index = regular_file(index);
  ACCRUE_CHECK(!(has_single && has_index), "load_safetensors_dir('", dir,
               "'): the directory holds ", "both ", kSingleFile, " and ", kIndexFile,
               ": remove the stale one (Note [Checkpoint directories])");
  std::map<std::string, Tensor> out;
  if (has_single) {
    out = load_safetensors(single.string());
    if (sources)
      for (const auto& [tensor, t] : out)
        (*sources)[tensor] = single.string();
    return out;
  }
  ACCRUE_CHECK(has_index, "load_safetensors_dir('", dir, "'): neither ", kSingleFile, " nor ",
               kIndexFile, " is there", directory(root) ? "" : " (no such directory)");

  const std::string index_path = index.string();
  const detail::FileRef file{"load_safetensors_dir", index_path};
  std::string text;
  {
    detail::InputFile in(file);
    ACCRUE_CHECK(in.size() <= kMaxIndexBytes, file, ": the index is ", in.size(),
                 " bytes, above the cap of ", kMaxIndexBytes);
    text.resize(in.size());
    in.read_at(0, text.data(), in.size(), "the index");
  }
  const std::map<std::string, std::string> weight_map = parse_safetensors_index(text, index_path);

  // Every shard exists before any is read.
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor it should hold
  for (const auto& [tensor, shard] : weight_map)
    first_tensor.emplace(shard, tensor);
  for (const auto& [shard, tensor] : first_tensor)
    ACCRUE_CHECK(regular_file(root / shard), file, ": shard '", (root / shard).string(),
                 "', which the weight_map gives for tensor '", tensor, "', does not exist");

  // Every shard read first, so that a tensor in two shards is named as such.
  std::map<std::string, std::string> found_in;  // tensor -> the shard (name) holding it
  for (const auto& [shard, unused] : first_tensor) {
    const std::string path = (root / shard).string();
    for (auto& [tensor, t] : load_safetensors(path)) {
      auto [it, inserted] = found_in.emplace(tensor, shard);
      ACCRUE_CHECK(inserted, file, ": tensor '", tensor, "' is in two shards, '",
                   (root / it->second).string(), "' and '", path, "'");
      out.emplace(tensor, std::move(t));
    }
  }
  for (const auto& [tensor, shard] : found_in) {
    const std::string path = (root / shard).string();
    auto listed = weight_map.find(tensor);
    ACCRUE_CHECK(listed != weight_map.end(), file, ": shard '", path, "' holds tensor '", tensor,
                 "', which the weight_map does not list");
    ACCRUE_CHECK(listed->second == shard, file, ": shard '", path, "' holds tensor '", tensor,
                 "', which the weight_map puts in '", listed->second, "'");
  }
  for (const auto& [tensor, shard] : weight_map)
    ACCRUE_CHECK(found_in.count(tensor), file, ": the weight_map puts tensor '", tensor, "' in '",
                 (root / shard).string(), "', which does not hold it");
  if (sources)
    for (const auto& [tensor, shard] : found_in)
      (*sources)[tensor] = (root / shard).string();
  return out;
}

std::map<std::string, Tensor> load_safetensors_dir(const std::string& dir) {
  return load_safetensors_dir(dir, nullptr);
}

int64_t parse_shard_size(const std::string& text) {
  std::string lower;
  for (const char c : text)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Unit {
    const char* suffix;
    double bytes;
  };
  // Longest suffixes first, so that "kib" is not read as "b".
  constexpr Unit kUnits[] = {{"kib", 1024.0},
                             {"mib", 1024.0 * 1024},
                             {"gib", 1024.0 * 1024 * 1024},
                             {"tib", 1024.0 * 1024 * 1024 * 1024},
                             {"kb", 1e3},
                             {"mb", 1e6},
                             {"gb", 1e9},
                             {"tb", 1e12},
                             {"b", 1.0}};
  double scale = 1.0;
  std::string number = lower;
  for (const Unit& u : kUnits)
    if (lower.ends_with(u.suffix)) {
      // transformers: a decimal unit ending in a lowercase b counts bits ("5Gb").
      const bool bits = std::strlen(u.suffix) == 2 && text.back() == 'b';
      scale = bits ? u.bytes / 8 : u.bytes;
      number = lower.substr(0, lower.size() - std::strlen(u.suffix));
      break;
    }
  double value = 0;
  const char* begin = number.data();
  const char* end = begin + number.size();
  const auto parsed = std::from_chars(begin, end, value);
  const bool ok = !number.empty() && parsed.ec == std::errc() && parsed.ptr == end &&
                  std::isfinite(value) && value * scale >= 1.0 && value * scale < 9.2e18;
  ACCRUE_CHECK(ok, "max shard size '", text,
               "' is not a size of at least one byte: a byte count or a number with a unit "
               "(KB, MB, GB, TB: powers of 10; KiB, MiB, GiB, TiB: powers of 2), e.g. 5GB");
  return static_cast<int64_t>(value * scale);
}

void save_safetensors_dir(const std::string& dir,
                          const std::vector<std::pair<std::string, Tensor>>& tensors,
                          int64_t max_shard_bytes,
                          const std::map<std::string, std::string>& metadata) {
  ACCRUE_CHECK(max_shard_bytes >= 1, "save_safetensors_dir('", dir, "'): max_shard_bytes ",
               max_shard_bytes, " must be >= 1");
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    ACCRUE_CHECK(names.insert(name).second, "save_safetensors_dir('", dir, "'): tensor '", name,
                 "' is given twice");
    ACCRUE_CHECK(t.defined(), "save_safetensors_dir('", dir, "'): tensor '", name,
                 "' is undefined");
  }
  // huggingface_hub's split_torch_state_dict_into_shards, which
  // save_pretrained calls: in order; a tensor above the limit alone.
  std::vector<std::map<std::string, Tensor>> shards;
  std::map<std::string, Tensor> current;
  int64_t current_bytes = 0, total_bytes = 0;
  for (const auto& [name, t] : tensors) {
    const auto bytes = static_cast<int64_t>(t.nbytes());
    total_bytes += bytes;
    if (bytes > max_shard_bytes) {
      shards.push_back({{name, t}});
      continue;
    }
    if (current_bytes + bytes > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.emplace(name, t);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  ACCRUE_CHECK(!ec && directory(root), "save_safetensors_dir('", dir,
               "'): cannot create the directory: ", ec.message());
  std::vector<std::string> written;
  if (shards.size() == 1) {
    save_safetensors((root / kSingleFile).string(), shards[0], metadata);
    written.push_back(kSingleFile);
  } else {
    std::map<std::string, std::string> weight_map;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string shard = shard_name(i + 1, shards.size());
      save_safetensors((root / shard).string(), shards[i], metadata);
      written.push_back(shard);
      for (const auto& [name, t] : shards[i])
        weight_map.emplace(name, shard);
    }
    // As transformers: json.dumps(index, indent=2, sort_keys=True) + "\n".
    std::string text = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_bytes) +
                       "\n  },\n  \"weight_map\": {";
    bool first = true;
    for (const auto& [name, shard] : weight_map) {
      text += first ? "\n    " : ",\n    ";
      first = false;
      detail::append_json_string(text, name);
      text += ": ";
      detail::append_json_string(text, shard);
    }
    text += "\n  }\n}\n";
    const std::string index_path = (root / kIndexFile).string();
    detail::OutputFile out(detail::FileRef{"save_safetensors_dir", index_path});
    out.write(text);
    out.close();
    written.push_back(kIndexFile);
  }
  // Note [Checkpoint directories]: the other layout's files would make the
  // directory ambiguous or stale.
  const std::set<std::string> keep(written.begin(), written.end());
  std::vector<fs::path> stale;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string f = entry.path().filename().string();
    const bool ours =
        f == kSingleFile || f == kIndexFile || std::regex_match(f, shard_name_pattern());
    if (ours && !keep.count(f)) stale.push_back(entry.path());
  }
  for (const fs::path& p : stale) {
    fs::remove(p, ec);
    ACCRUE_CHECK(!ec, "save_safetensors_dir('", dir, "'): cannot remove the stale file '",
                 p.string(), "': ", ec.message());
  }
}

std::string read_hf_config_text(const std::string& path, const char* op) {
  constexpr uint64_t kMaxConfigBytes = 16'000'000;
  const detail::FileRef file{op, path};
  detail::InputFile in(file);
  ACCRUE_CHECK(in.size() <= kMaxConfigBytes, file, ": the file is ", in.size(),
               " bytes, above the cap of ", kMaxConfigBytes, " for a config.json");
  std::string text(in.size(), '\0');
  in.read_at(0, text.data(), in.size(), "the config");
  return text;
}

std::string hf_model_type(const std::string& text, const std::string& name) {
  const detail::FileRef file{"hf_model_type", name};
  const size_t bad = detail::find_invalid_utf8(text);
  ACCRUE_CHECK(bad == std::string::npos, file, ": the file is not valid UTF-8 (byte ", bad, ")");
  detail::JsonReader json(text, file, "config JSON");
  if (json.peek() != '{')
    json.fail("a config.json must be a JSON object, found ", json.describe_next());
  std::string type;
  json.parse_object("the config", [&](const std::string& key) {
    if (key != "model_type") return json.skip_value();
    if (json.peek() != '"')
      json.fail("'model_type' must be a string, found ", json.describe_next());
    type = json.parse_string();
  });
  json.expect_end();
  return type;
}

}  // namespace accrue::nn
