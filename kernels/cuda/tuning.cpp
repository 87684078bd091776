#include "accrue/kernels/cuda/tuning.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>

#include "accrue/core/status_check.h"

namespace accrue::kernels::cuda {

namespace {

constexpr int kTuneRepeats = 5;
constexpr int kTuneRounds = 3;

// A tuning file's lines, read once per file: everything but the choice -> the choice.
struct TuningFiles {
  // Recursive: a choice's timing may make another (a convolution path's GEMM
  // tunes its own algorithm on its first run).
  std::recursive_mutex mutex;
  std::map<std::string, std::map<std::string, int>> choices;  // file -> its lines

  std::map<std::string, int>& lines_of(const std::string& file) {
    auto it = choices.find(file);
    if (it != choices.end()) return it->second;
    std::map<std::string, int>& lines = choices[file];
    if (file.empty()) return lines;  // in memory only
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      const size_t cut = line.rfind(',');
      if (cut == std::string::npos) continue;
      lines[line.substr(0, cut + 1)] = std::atoi(line.c_str() + cut + 1);
    }
    return lines;
  }
};

TuningFiles& tuning_files() {
  static TuningFiles* files = new TuningFiles();  // never destroyed, as the plans
  return *files;
}

}  // namespace

std::vector<float> time_candidates(cudaStream_t stream, int count,
                                   const std::function<bool(int)>& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  ACCRUE_CUDA_CHECK(cudaEventCreate(&start));
  ACCRUE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> best_ms(static_cast<size_t>(count), std::numeric_limits<float>::infinity());
  std::vector<char> usable(static_cast<size_t>(count), 1);
  for (int round = 0; round < kTuneRounds; ++round)
    for (int i = 0; i < count; ++i) {
      for (int r = 0; r <= kTuneRepeats && usable[i]; ++r) {
        if (r == 1) ACCRUE_CUDA_CHECK(cudaEventRecord(start, stream));
        usable[i] = run(i);
      }
      if (!usable[i]) continue;
      ACCRUE_CUDA_CHECK(cudaEventRecord(stop, stream));
      ACCRUE_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      ACCRUE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      best_ms[i] = std::min(best_ms[i], ms);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms;
}

int fastest_index(const std::vector<float>& ms) {
  return static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
}

std::string tuning_gpu_name(int device) {
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::string name = prop.name;
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ACCRUE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

std::optional<int> tuned_choice(const std::string& file, const std::string& line,
                                const std::function<std::optional<int>()>& choose) {
  TuningFiles& files = tuning_files();
  const std::lock_guard<std::recursive_mutex> lock(files.mutex);
  std::map<std::string, int>& lines = files.lines_of(file);
  auto known = lines.find(line);
  if (known != lines.end()) return known->second;
  const std::optional<int> choice = choose();
  if (!choice) return std::nullopt;
  lines[line] = *choice;
  if (!file.empty()) {
    std::ofstream out(file, std::ios::app);
    out << line << *choice << "\n";
    ACCRUE_CHECK(out.good(), "cannot append to the tuning file '", file, "'");
  }
  return *choice;
}

size_t tuned_choice_count(const std::string& file) {
  TuningFiles& files = tuning_files();
  const std::lock_guard<std::recursive_mutex> lock(files.mutex);
  return files.lines_of(file).size();
}

}  // namespace accrue::kernels::cuda
