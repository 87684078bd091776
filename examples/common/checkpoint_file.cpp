#include "examples/common/checkpoint_file.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "examples/common/options.h"

namespace accrue::examples {

void probe_output_file(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) usage_error(option, " ", path, " is a directory");
    if (!fs::is_regular_file(status))
      usage_error(option, " ", path, " is not a regular file (a FIFO, socket or device)");
    if (::access(path.c_str(), W_OK) != 0) usage_error(option, " ", path, " is not writable");
    return;
  }
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  if (!fs::is_directory(folder, ec))
    usage_error(option, " ", path, ": no folder ", folder.string());
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    usage_error(option, " ", path, ": the folder ", folder.string(), " is not writable");
}

void save_checkpoint_file(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  const std::string tmp = path + ".tmp";
  save_safetensors(tmp, tensors, metadata);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ACCRUE_CHECK(!ec, "cannot move the checkpoint ", tmp, " to ", path, ": ", ec.message());
}

std::string file_report(const std::string& path, std::chrono::steady_clock::time_point since) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  char s[64];
  std::snprintf(s, sizeof s, "%s in %.2f s", ec ? "?" : mib(static_cast<int64_t>(bytes)).c_str(),
                seconds);
  return s;
}

namespace {

constexpr const char* kRunPrefix = "accrue.run.";

std::string shown(const std::string& value) {
  return value.empty() ? "(none)" : value;
}

std::string joined(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += separator;
    out += p;
  }
  return out;
}

bool contains(const std::vector<std::string>& words, const std::string& word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

}  // namespace

RunRecord& RunRecord::text(const std::string& field, const std::string& value,
                           const std::string& change, const std::string& legacy_key) {
  fields_.push_back({field, value, change, legacy_key});
  return *this;
}

RunRecord& RunRecord::integer(const std::string& field, int64_t value, const std::string& change,
                              const std::string& legacy_key) {
  return text(field, std::to_string(value), change, legacy_key);
}

RunRecord& RunRecord::number(const std::string& field, double value, const std::string& change) {
  // The shortest text that reads back as the same double: equal values give
  // equal text, different values different text, and 0.05 stays "0.05".
  char s[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(s, sizeof s, "%.*g", digits, value);
    if (std::strtod(s, nullptr) == value) break;
  }
  return text(field, s, change);
}

void RunRecord::write(std::map<std::string, std::string>* metadata) const {
  for (const Field& f : fields_)
    (*metadata)[kRunPrefix + f.name] = f.value;
}

std::string RunRecord::value(const std::string& field) const {
  for (const Field& f : fields_)
    if (f.name == field) return f.value;
  return {};
}

std::vector<std::string> RunRecord::compare(const std::string& path,
                                            const std::map<std::string, std::string>& metadata,
                                            const std::vector<std::string>& allowed,
                                            const std::string& note) const {
  std::vector<std::string> refused, changed, unrecorded, words;
  size_t admissible = 0;  // refused fields that a change word would let through
  for (const Field& f : fields_) {
    auto it = metadata.find(kRunPrefix + f.name);
    if (it == metadata.end() && !f.legacy_key.empty()) it = metadata.find(f.legacy_key);
    if (it == metadata.end()) {
      unrecorded.push_back(f.name);
      continue;
    }
    const std::string& old = it->second;
    if (old == f.value) continue;
    if (!f.change.empty() && contains(allowed, f.change)) {
      changed.push_back(f.name + " " + shown(old) + " -> " + shown(f.value));
      continue;
    }
    refused.push_back(f.name + " = " + shown(old) + " but this run has " + shown(f.value));
    if (f.change.empty()) continue;
    ++admissible;
    if (!contains(words, f.change)) words.push_back(f.change);
  }
  if (!refused.empty()) {
    std::string message = "checkpoint " + path + " is of another run: " + joined(refused, "; ");
    if (!words.empty())
      message += " (--allow-changed " + joined(words, ",") + " admits " +
                 (refused.size() == 1            ? "this change"
                  : admissible == refused.size() ? "these changes"
                                                 : "some of these changes") +
                 ")";
    if (!note.empty()) message += "; " + note;
    ACCRUE_FAIL(message);
  }
  std::vector<std::string> lines;
  if (!changed.empty())
    lines.push_back("resume: changed as --allow-changed permits: " + joined(changed, ", "));
  if (!unrecorded.empty())
    lines.push_back("resume: checkpoint " + path + " does not record " + joined(unrecorded, ", ") +
                    " (written before the run record): not checked");
  return lines;
}

std::vector<std::string> parse_change_words(const std::string& option, const std::string& list,
                                            const std::vector<std::string>& words) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    const std::string word = list.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!contains(words, word))
      usage_error(option, " takes a comma-separated list of ", joined(words, ", "), "; got '", word,
                  "' in '", list, "'");
    out.push_back(word);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int64_t truncate_metrics_log(const std::string& path, int64_t windows) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  static const std::string kRowStart = "{\"window\": ";
  std::string line;
  uintmax_t keep = 0;
  int64_t removed = 0;
  bool cut = false;
  while (std::getline(in, line)) {
    if (!cut) {
      const bool complete = !in.eof();  // the row ends in its newline
      int64_t w = -1;
      if (line.compare(0, kRowStart.size(), kRowStart) == 0) {
        const char* first = line.data() + kRowStart.size();
        const auto [ptr, ec] = std::from_chars(first, line.data() + line.size(), w);
        if (ec != std::errc() || ptr == first) w = -1;
      }
      if (complete && w >= 0 && w <= windows) {
        keep += line.size() + 1;
        continue;
      }
      cut = true;
    }
    ++removed;
  }
  in.close();
  if (cut) {
    std::error_code ec;
    std::filesystem::resize_file(path, keep, ec);
    ACCRUE_CHECK(!ec, "cannot cut the metrics file ", path, " after window ", windows, ": ",
                 ec.message());
  }
  return removed;
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key,
                 const std::string& path) {
  auto it = meta.find(key);
  ACCRUE_CHECK(it != meta.end(), "checkpoint ", path, " has no '", key, "' in its metadata");
  int64_t v = 0;
  const std::string& s = it->second;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  ACCRUE_CHECK(ec == std::errc() && ptr == s.data() + s.size() && !s.empty(), "checkpoint ", path,
               ": metadata '", key, "' = '", s, "' is not an integer");
  return v;
}

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

}  // namespace accrue::examples
