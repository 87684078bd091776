// The timed choice among cuBLASLt's algorithms for one GEMM problem, and the
// tuning file that makes it repeatable (Note [GEMM autotuning] in gemm_tuning.cpp).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace accrue::kernels::cuda {

// cuBLASLt candidates asked for when tuning. 8 left the logits data gradient
// (K = 50304) 1.04-1.17x PyTorch's time: none of the top 8 was its kernel.
inline constexpr int kTuneCandidates = 24;

// choose_gemm_algorithm's answer "run cuBLAS's own GEMM" (GemmTuneProblem::gemm_ex).
inline constexpr int kGemmExChoice = -1;

// One plain GEMM problem at its first call: its plan, its candidates, the
// call's input pointers, and what a scratch output needs.
struct GemmTuneProblem {
  std::string file;          // the tuning file
  std::vector<int64_t> key;  // everything that decides the algorithm (the plan key)
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
  const cublasLtMatmulAlgo_t* candidates = nullptr;  // candidate_count of them, at least one
  int candidate_count = 0;
  const void* a = nullptr;  // cuBLASLt's A and B, as the call passes them
  const void* b = nullptr;
  cudaDataType_t output_dtype{};
  int64_t output_elements = 0;
  bool f64_scale = false;  // alpha and beta are doubles
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  // cuBLAS's own GEMM (cublasGemmEx: other heuristics, other kernels), a
  // further candidate when set: runs the problem into `out` with alpha and
  // beta; false when it declines.
  std::function<bool(void* out, const void* alpha, const void* beta)> gemm_ex;
};

// The position in candidates to run, or kGemmExChoice: the file's recorded
// choice, else the fastest on the call's inputs (recorded), else 0 (inside a
// capture, or one candidate).
int choose_gemm_algorithm(const GemmTuneProblem& problem);

}  // namespace accrue::kernels::cuda
