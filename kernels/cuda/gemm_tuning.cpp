// Note [GEMM autotuning]
// ~~~~~~~~~~~~~~~~~~~~~~
// cuBLASLt's first heuristic choice is not always its fastest kernel (the
// bf16 logits GEMM [8192,768]x[768,50304] ran 1.11-1.14x PyTorch's). With a
// tuning file set (kernels::set_gemm_tuning_file, ACCRUE_GEMM_TUNING), the
// first call of each plain GEMM problem (kernels/cuda/matmul.cu) asks for up
// to kTuneCandidates algorithms and times each on the call's own inputs: one
// untimed run, then kTuneRepeats runs between two CUDA events, all writing a
// scratch output, never the call's (a beta-1 accumulation must not see
// them). That is one round; kTuneRounds rounds go over all the candidates in
// turn and a candidate's time is its best round, so that one slow moment
// (a clock step, another process) cannot decide alone: with one round the
// tuned choice sometimes timed slower than the heuristic's first. The fastest
// is kept. Timing waits for the GPU once per candidate and round, so it
// happens on first use only, and never inside a CUDA graph capture: there the
// heuristic's first choice runs, unrecorded.
//
// For 16-bit inputs one more candidate runs: cuBLAS's own cublasGemmEx,
// whose heuristics pick kernels that cuBLASLt's top candidates may not hold
// (PyTorch's bf16 matmul goes through it). It runs with reduced-precision
// reductions disallowed, so its sums stay in fp32 as cuBLASLt's do.
//
// The choice is a position in cuBLASLt's candidate list, or -1 for
// cublasGemmEx, appended to the file as one line: the plan key, cuBLASLt's
// version, the GPU's name, then the choice. A later process with the same
// file reads the line instead of timing, so it runs the same algorithm and
// computes the same bits; a line written under another cuBLASLt version or
// GPU does not match and is ignored. GEMMs with an epilogue (Note [Bias
// epilogue], Note [GELU epilogue]) keep the heuristic's first choice.
#include "accrue/kernels/cuda/gemm_tuning.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "accrue/core/status_check.h"
#include "accrue/core/tensor.h"

namespace accrue::kernels::cuda {

namespace {

constexpr int kTuneRepeats = 5;
constexpr int kTuneRounds = 3;

// The tuning file's lines, read once per file: everything but the choice -> the choice.
struct TuningFile {
  std::mutex mutex;
  std::string path;
  bool loaded = false;
  std::map<std::string, int> choices;

  void load(const std::string& file) {
    if (loaded && path == file) return;
    path = file;
    loaded = true;
    choices.clear();
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      const size_t cut = line.rfind(',');
      if (cut == std::string::npos) continue;
      choices[line.substr(0, cut + 1)] = std::atoi(line.c_str() + cut + 1);
    }
  }
};

TuningFile& tuning_file() {
  static TuningFile* file = new TuningFile();  // never destroyed, as the plans
  return *file;
}

std::string line_prefix(const GemmTuneProblem& p) {
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, p.device));
  std::ostringstream s;
  for (int64_t v : p.key)
    s << v << ",";
  s << "cublasLt" << cublasLtGetVersion() << "," << prop.name << ",";
  std::string line = s.str();
  std::replace(line.begin(), line.end(), ' ', '_');
  return line;
}

DType dtype_of(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_64F:
      return DType::f64;
    case CUDA_R_16BF:
      return DType::bf16;
    case CUDA_R_16F:
      return DType::f16;
    default:
      return DType::f32;
  }
}

// The fastest candidate on the call's inputs, by CUDA events: each
// candidate's best of kTuneRounds rounds.
int fastest(const GemmTuneProblem& p) {
  const Tensor scratch =
      empty({p.output_elements}, dtype_of(p.output_dtype), Device::cuda(p.device));
  const double one = 1.0, zero = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const void* alpha = p.f64_scale ? static_cast<const void*>(&one) : &one_f;
  const void* beta = p.f64_scale ? static_cast<const void*>(&zero) : &zero_f;
  cudaEvent_t start = nullptr, stop = nullptr;
  ACCRUE_CUDA_CHECK(cudaEventCreate(&start));
  ACCRUE_CUDA_CHECK(cudaEventCreate(&stop));
  // cuBLASLt's candidates, then cublasGemmEx (when offered) as the last one.
  const size_t lt_count = static_cast<size_t>(p.candidate_count);
  const size_t count = lt_count + (p.gemm_ex ? 1 : 0);
  auto run = [&](size_t i) {
    // A candidate may decline these operands: it is skipped.
    if (i == lt_count) return p.gemm_ex(scratch.data_ptr(), alpha, beta);
    return cublasLtMatmul(p.handle, p.op, alpha, p.a, p.a_layout, p.b, p.b_layout, beta,
                          scratch.data_ptr(), p.c_layout, scratch.data_ptr(), p.c_layout,
                          &p.candidates[i], p.workspace, p.workspace_bytes,
                          p.stream) == CUBLAS_STATUS_SUCCESS;
  };
  std::vector<float> best_ms(count, std::numeric_limits<float>::infinity());
  std::vector<char> usable(count, 1);
  for (int round = 0; round < kTuneRounds; ++round)
    for (size_t i = 0; i < count; ++i) {
      for (int r = 0; r <= kTuneRepeats && usable[i]; ++r) {
        if (r == 1) ACCRUE_CUDA_CHECK(cudaEventRecord(start, p.stream));
        usable[i] = run(i);
      }
      if (!usable[i]) continue;
      ACCRUE_CUDA_CHECK(cudaEventRecord(stop, p.stream));
      ACCRUE_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      ACCRUE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      best_ms[i] = std::min(best_ms[i], ms);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // The first fastest: ties keep the heuristic's order.
  const size_t best =
      static_cast<size_t>(std::min_element(best_ms.begin(), best_ms.end()) - best_ms.begin());
  return best == lt_count ? kGemmExChoice : static_cast<int>(best);
}

}  // namespace

int choose_gemm_algorithm(const GemmTuneProblem& p) {
  const int count = p.candidate_count;
  TuningFile& file = tuning_file();
  const std::lock_guard<std::mutex> lock(file.mutex);
  file.load(p.file);
  const std::string prefix = line_prefix(p);
  auto known = file.choices.find(prefix);
  if (known != file.choices.end()) {
    const int choice = known->second;
    if (choice == kGemmExChoice) return p.gemm_ex ? choice : 0;
    return choice >= 0 && choice < count ? choice : 0;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ACCRUE_CUDA_CHECK(cudaStreamIsCapturing(p.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return 0;
  const int best = count < 2 && !p.gemm_ex ? 0 : fastest(p);
  file.choices[prefix] = best;
  std::ofstream out(p.file, std::ios::app);
  out << prefix << best << "\n";
  ACCRUE_CHECK(out.good(), "gemm: cannot append to the GEMM tuning file '", p.file, "'");
  return best;
}

}  // namespace accrue::kernels::cuda
