// The cuBLASLt state of Note [cuBLASLt state] (kernels/cuda/cublaslt_state.h):
// handles and workspaces made on first use, and the plain GEMM's plan cache,
// where the heuristic (or, with a tuning file, Note [GEMM autotuning]) picks
// each problem's algorithm once.
#include "accrue/kernels/cuda/cublaslt_state.h"

#include <algorithm>
#include <string>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/core/status_check.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::cuda::cublaslt {

// Note [GEMM SM margin]
// ~~~~~~~~~~~~~~~~~~~~~
// A GEMM that runs beside a collective shares the SMs with it. cuBLASLt's
// Hopper kernels are persistent: a grid of one block per SM that walks the
// tiles. A collective's blocks (NCCL's, or the adds of the copy engines'
// all-reduce) hold some SMs for the whole collective, so the GEMM blocks
// that land there wait or share, and the whole GEMM ends with its slowest
// block; measured: NCCL's kernels slowed a chain of the MLP's backward GEMMs
// by 25-52% (bench/RESULTS.md, "NCCL's kernels under the backward's GEMMs").
// kernels::set_gemm_sm_margin(device, n) makes every GEMM planned on `device`
// while it is set ask cuBLASLt for the device's SM count minus n
// (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, at least 1): the heuristic and the
// kernel's grid then leave n SMs to the concurrent stream. The reducer sets it
// for the last micro-step's backward (dist::ReducerOptions::gemm_sm_margin) and
// clears it in finish(); cap the communicator's blocks to match
// (NCCL_MAX_CTAS).
//  - Plans are cached per (problem, target), so a margin switched on and off
//    every window builds each plan once; epilogue plans carry the target as
//    the last entry of their key.
//  - Another target may choose another algorithm, hence other bits: a run
//    with a margin is reproducible with the same margin, not bitwise equal to
//    one without (the same as GEMM tuning, Note [GEMM autotuning]).
//  - With a margin set, GEMM tuning keeps cuBLASLt's first choice: the timed
//    choice of a tuning file was measured on the whole device.
//  - cublasGemmEx (a tuned choice) has no per-call target; a plan built under
//    a margin never chooses it.
// Measured on 2 x H200 (bench/RESULTS.md, twenty-first session), it does not
// pay for the MLP or GPT-2 under data parallelism: with 16 SMs left to 16 NCCL
// CTAs the MLP's last backward took 2.80 ms against 2.59 without, and no margin
// from 4 to 32 (with or without a CTA cap) shortened the window. The
// collectives slow the GEMMs by more than the SMs they hold. Off by default.
int32_t sm_count_target(int device) {
  const int margin = gemm_sm_margin(device);
  if (margin == 0) return 0;
  return std::max(1, ::accrue::cuda::sm_count(device) - margin);
}

bool set_sm_count_target(cublasLtMatmulDesc_t desc, int32_t target) {
  if (target == 0) return true;
  return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target,
                                        sizeof(target)) == CUBLAS_STATUS_SUCCESS;
}

namespace {

template <class T>
void set_layout_attr(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, T v) {
  ACCRUE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, attr, &v, sizeof(v)));
}

}  // namespace

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  ACCRUE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    set_layout_attr(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch));
    set_layout_attr(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride);
  }
  return layout;
}

namespace {

std::unique_ptr<GemmPlan> build_plan(cublasLtHandle_t handle, const LtProblem& p, int candidates) {
  auto plan = std::make_unique<GemmPlan>();
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, p.compute, p.scale_type));
  const int32_t transa = p.a.op, transb = p.b.op;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                                     sizeof(transa)));
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                                     sizeof(transb)));
  ACCRUE_CHECK(set_sm_count_target(plan->op, p.sm_target),
               "gemm: cuBLASLt refused an SM count target of ", p.sm_target,
               " (Note [GEMM SM margin])");
  plan->a = make_layout(p.input_type, p.a.rows, p.a.cols, p.a.ld, p.batch, p.a.batch_stride);
  plan->b = make_layout(p.input_type, p.b.rows, p.b.cols, p.b.ld, p.batch, p.b.batch_stride);
  plan->c = make_layout(p.output_type, p.m, p.n, p.ldc, p.batch, p.c_batch_stride);

  cublasLtMatmulPreference_t pref = nullptr;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v));
    if (s != CUBLAS_STATUS_SUCCESS) cublasLtMatmulPreferenceDestroy(pref);
    ACCRUE_CUBLAS_CHECK(s);
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c);

  std::array<cublasLtMatmulHeuristicResult_t, kTuneCandidates> results{};
  candidates = std::clamp(candidates, 1, kTuneCandidates);
  int returned = 0;
  cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref,
                                     candidates, results.data(), &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  ACCRUE_CHECK(s == CUBLAS_STATUS_SUCCESS && returned > 0,
               "gemm: cuBLASLt found no algorithm for m=", p.n, " n=", p.m, " k=", p.k,
               " batch=", p.batch, " (input type ", static_cast<int>(p.input_type),
               ", output type ", static_cast<int>(p.output_type), ", compute type ",
               static_cast<int>(p.compute), "; cuBLAS status ", static_cast<int>(s), ": ",
               cublasLtGetStatusString(s), ")");
  for (int i = 0; i < returned; ++i)
    plan->candidates[static_cast<size_t>(i)] = results[static_cast<size_t>(i)].algo;
  plan->candidate_count = returned;
  plan->algo = plan->candidates[0];
  return plan;
}

}  // namespace

LtState& LtState::instance() {
  static LtState* state = new LtState();  // never destroyed, on purpose
  return *state;
}

void LtState::prepare(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  handle_and_workspace(device, stream);
}

LtState::Resources LtState::acquire(const LtProblem& p, cudaStream_t stream, const void* a,
                                    const void* b) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Base base = handle_and_workspace(p.device, stream);
  // Note [GEMM autotuning]: cublasGemmEx competes for 16-bit inputs.
  const bool offer_gemm_ex = (p.input_type == CUDA_R_16BF || p.input_type == CUDA_R_16F) &&
                             p.compute == CUBLAS_COMPUTE_32F;
  const PlanKey key = p.key();
  auto it = plans_.find({key, p.sm_target});
  if (it == plans_.end()) {
    const std::string file = gemm_tuning_file();
    // Note [GEMM SM margin]: under a margin, cuBLASLt's first choice.
    const bool tuned = (!file.empty() || gemm_tuning_in_process()) && p.sm_target == 0;
    auto plan = build_plan(base.handle, p, tuned ? kTuneCandidates : 1);
    if (tuned) {
      GemmTuneProblem t;
      t.file = file;
      t.key.assign(key.begin(), key.end());
      t.device = p.device;
      t.handle = base.handle;
      t.op = plan->op;
      t.a_layout = plan->a;
      t.b_layout = plan->b;
      t.c_layout = plan->c;
      t.candidates = plan->candidates.data();
      t.candidate_count = plan->candidate_count;
      t.a = a;
      t.b = b;
      t.output_dtype = p.output_type;
      t.output_elements = p.ldc * p.n + (p.batch - 1) * p.c_batch_stride;
      t.f64_scale = p.scale_type == CUDA_R_64F;
      t.workspace = base.workspace;
      t.workspace_bytes = kWorkspaceBytes;
      t.stream = stream;
      if (offer_gemm_ex)
        t.gemm_ex = [&](void* out, const void* alpha, const void* beta) {
          return run_gemm_ex(p, stream, base.workspace, a, b, out, alpha, beta);  // mutex_ held
        };
      const int choice = choose_gemm_algorithm(t);
      plan->gemm_ex = choice == kGemmExChoice;
      if (!plan->gemm_ex) plan->algo = plan->candidates[static_cast<size_t>(choice)];
    }
    it = plans_.emplace(std::make_pair(key, p.sm_target), std::move(plan)).first;
  }
  return {base.handle, base.workspace, it->second.get()};
}

void LtState::gemm_ex(const LtProblem& p, cudaStream_t stream, const void* a, const void* b,
                      void* out, const void* alpha, const void* beta) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Base base = handle_and_workspace(p.device, stream);
  ACCRUE_CHECK(run_gemm_ex(p, stream, base.workspace, a, b, out, alpha, beta),
               "gemm: cublasGemmEx, chosen by tuning for m=", p.n, " n=", p.m, " k=", p.k,
               " batch=", p.batch, ", declined the problem");
}

LtState::Base LtState::handle_and_workspace(int device, cudaStream_t stream) {
  cublasLtHandle_t& handle = handles_.at(static_cast<size_t>(device));
  if (handle == nullptr) ACCRUE_CUBLAS_CHECK(cublasLtCreate(&handle));

  auto ws = workspaces_.find({device, stream});
  if (ws == workspaces_.end()) {
    // A first GEMM inside stream capture would allocate the workspace from
    // the graph's memory, which dies with the graph: warm up before capturing.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ACCRUE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    ACCRUE_CHECK(capture == cudaStreamCaptureStatusNone,
                 "gemm: the first GEMM on a stream ran during CUDA graph capture; run one "
                 "uncaptured step first so that its cuBLASLt workspace exists");
    Tensor buffer = empty({static_cast<int64_t>(kWorkspaceBytes / sizeof(float))}, DType::f32,
                          Device::cuda(device));
    if (prewrite_library_outputs()) buffer.fill_(0.0);  // Note [Library outputs under initcheck]
    ws = workspaces_.emplace(std::make_pair(device, stream), std::move(buffer)).first;
  }
  return {handle, ws->second.data_ptr()};
}

bool LtState::run_gemm_ex(const LtProblem& p, cudaStream_t stream, void* workspace, const void* a,
                          const void* b, void* out, const void* alpha, const void* beta) {
  cublasHandle_t& handle = blas_handles_.at(static_cast<size_t>(p.device));
  if (handle == nullptr) {
    ACCRUE_CUBLAS_CHECK(cublasCreate(&handle));
    // Sums stay in fp32, as in every cuBLASLt candidate.
    ACCRUE_CUBLAS_CHECK(cublasSetMathMode(
        handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  ACCRUE_CUBLAS_CHECK(cublasSetStream(handle, stream));
  ACCRUE_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, kWorkspaceBytes));
  const auto ta = static_cast<cublasOperation_t>(p.a.op);
  const auto tb = static_cast<cublasOperation_t>(p.b.op);
  const auto m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const auto lda = static_cast<int>(p.a.ld), ldb = static_cast<int>(p.b.ld);
  const auto ldc = static_cast<int>(p.ldc);
  const cublasStatus_t status =
      p.batch == 1
          ? cublasGemmEx(handle, ta, tb, m, n, k, alpha, a, p.input_type, lda, b, p.input_type, ldb,
                         beta, out, p.output_type, ldc, p.compute, CUBLAS_GEMM_DEFAULT)
          : cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, p.input_type, lda,
                                       p.a.batch_stride, b, p.input_type, ldb, p.b.batch_stride,
                                       beta, out, p.output_type, ldc, p.c_batch_stride,
                                       static_cast<int>(p.batch), p.compute, CUBLAS_GEMM_DEFAULT);
  return status == CUBLAS_STATUS_SUCCESS;
}

bool heuristic_algo(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, uint32_t align_a,
                    uint32_t align_b, uint32_t align_c, cublasLtMatmulAlgo_t* algo) {
  cublasLtMatmulPreference_t pref = nullptr;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  bool ok = true;
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
    ok = ok &&
         cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  if (ok) {
    ok = cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 1, &result, &returned) ==
             CUBLAS_STATUS_SUCCESS &&
         returned > 0;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (ok) *algo = result.algo;
  return ok;
}

}  // namespace accrue::kernels::cuda::cublaslt
