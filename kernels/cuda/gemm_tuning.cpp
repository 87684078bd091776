// Note [GEMM autotuning]
// ~~~~~~~~~~~~~~~~~~~~~~
// cuBLASLt's first heuristic choice is not always its fastest kernel (the
// bf16 logits GEMM [8192,768]x[768,50304] ran 1.11-1.14x PyTorch's). With a
// tuning file set (kernels::set_gemm_tuning_file, ACCRUE_GEMM_TUNING), or
// with tuning in process on (kernels::set_gemm_tuning_in_process: the
// choices kept in memory, Note [Tuning file]), the first call of each plain
// GEMM problem (kernels/cuda/matmul.cu) asks for up to kTuneCandidates
// algorithms and times each on the call's own inputs (time_candidates,
// kernels/cuda/tuning.h: one untimed run, then timed runs between two CUDA
// events, in rounds over all the candidates, a candidate's
// time its best round: with one round the tuned choice sometimes timed slower
// than the heuristic's first), all writing a scratch output, never the
// call's (a beta-1 accumulation must not see them). The fastest is kept.
// Timing waits for the GPU, so it happens on first use only, and never inside
// a CUDA graph capture: there the heuristic's first choice runs, unrecorded.
//
// For 16-bit inputs one more candidate runs: cuBLAS's own cublasGemmEx,
// whose heuristics pick kernels that cuBLASLt's top candidates may not hold
// (PyTorch's bf16 matmul goes through it). It runs with reduced-precision
// reductions disallowed, so its sums stay in fp32 as cuBLASLt's do.
//
// The choice is a position in cuBLASLt's candidate list, or -1 for
// cublasGemmEx, kept in the tuning file (Note [Tuning file] in
// kernels/cuda/tuning.h) under the plan key and cuBLASLt's version. GEMMs
// with an epilogue (Note [Bias epilogue], Note [GELU epilogue]) keep the
// heuristic's first choice.
#include "accrue/kernels/cuda/gemm_tuning.h"

#include <optional>
#include <sstream>

#include "accrue/core/status_check.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/cuda/tuning.h"

namespace accrue::kernels::cuda {

namespace {

std::string line_prefix(const GemmTuneProblem& p) {
  std::ostringstream s;
  for (int64_t v : p.key)
    s << v << ",";
  s << "cublasLt" << cublasLtGetVersion() << "," << tuning_gpu_name(p.device) << ",";
  return s.str();
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
  // cuBLASLt's candidates, then cublasGemmEx (when offered) as the last one.
  const int lt_count = p.candidate_count;
  const int count = lt_count + (p.gemm_ex ? 1 : 0);
  const int best = fastest_index(time_candidates(p.stream, count, [&](int i) {
    // A candidate may decline these operands: it is skipped.
    if (i == lt_count) return p.gemm_ex(scratch.data_ptr(), alpha, beta);
    return cublasLtMatmul(p.handle, p.op, alpha, p.a, p.a_layout, p.b, p.b_layout, beta,
                          scratch.data_ptr(), p.c_layout, scratch.data_ptr(), p.c_layout,
                          &p.candidates[i], p.workspace, p.workspace_bytes,
                          p.stream) == CUBLAS_STATUS_SUCCESS;
  }));
  return best == lt_count ? kGemmExChoice : best;
}

}  // namespace

int choose_gemm_algorithm(const GemmTuneProblem& p) {
  const int count = p.candidate_count;
  const std::optional<int> choice =
      tuned_choice(p.file, line_prefix(p), [&]() -> std::optional<int> {
        if (stream_capturing(p.stream)) return std::nullopt;
        return count < 2 && !p.gemm_ex ? 0 : fastest(p);
      });
  if (!choice) return 0;
  if (*choice == kGemmExChoice) return p.gemm_ex ? *choice : 0;
  return *choice >= 0 && *choice < count ? *choice : 0;
}

}  // namespace accrue::kernels::cuda
