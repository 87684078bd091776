// CUDA matrix products: batched GEMM through cuBLASLt.
//
// Note [Row-major GEMM through column-major cuBLASLt]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// accrue's matrices are row-major, cuBLASLt's are column-major. A row-major
// [R, C] matrix with row stride ld, read column-major, is its transpose: a
// [C, R] matrix with leading dimension ld. So out = a @ b is computed as
// out^T = b^T a^T: cuBLASLt's "A" is our b, its "B" is our a, and its
// column-major [N, M] result with leading dimension N is exactly our row-major
// out [M, N]. A transposed view (stride(-2) == 1) is already column-major: it
// goes in as is with CUBLAS_OP_T, never copied.
//
// Note [cuBLASLt state]
// ~~~~~~~~~~~~~~~~~~~~~
// One cublasLtHandle per device (created on first use; a cublasHandle too for
// the problems that tuning gave to cublasGemmEx), one 32 MiB workspace per
// (device, stream), shared by both, so that concurrent streams never share
// scratch memory (and results stay bitwise reproducible,
// Note [Determinism]), and one plan (descriptors plus the heuristic's
// algorithm) per problem key: dtypes, compute type, transposes, sizes,
// leading dimensions, batch strides and pointer alignments. The heuristic
// runs once per key; every later call with that key runs the same
// algorithm, hence the same bits. The state lives for the whole process and
// is never destroyed: destroying handles and freeing device memory from
// static destructors races the CUDA driver's own teardown.
//
// The choice among cuBLASLt's candidates when a tuning file is set:
// Note [GEMM autotuning] in kernels/cuda/gemm_tuning.cpp.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/cuda_types.cuh"
#include "kernels/backend.h"
#include "kernels/cuda/gemm_tuning.h"
#include "kernels/fused_backend.h"
#include "kernels/ops.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxDevices = 64;

// One operand as cuBLASLt sees it: a column-major matrix of rows x cols with
// leading dimension ld, used as op(matrix).
struct LtOperand {
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;
};

// One of our row-major logical [rows, cols] input matrices per batch entry.
struct RowMajorArg {
  const void* ptr = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0, batch_stride = 0;
};

RowMajorArg arg_of(const Tensor& x) {
  return {x.data_ptr(), x.size(1),   x.size(2),
          x.stride(1),  x.stride(2), x.size(0) == 1 ? 0 : x.stride(0)};
}

// Describes x^T ([cols, rows]) as op(X) with X column-major, which is what
// Note [Row-major GEMM through column-major cuBLASLt] needs. Returns false
// when x's strides fit neither form (e.g. an expanded row with row stride 0);
// the caller then copies x to contiguous memory.
bool describe_transposed(const RowMajorArg& x, LtOperand& o) {
  o.batch_stride = x.batch_stride;
  if (x.col_stride == 1 && (x.rows == 1 || x.row_stride >= x.cols)) {
    // Row-major: read column-major it is already x^T.
    o.op = CUBLAS_OP_N;
    o.rows = x.cols;
    o.cols = x.rows;
    o.ld = x.rows == 1 ? x.cols : x.row_stride;  // one row: its stride is never used
    return true;
  }
  if (x.row_stride == 1 && (x.cols == 1 || x.col_stride >= x.rows)) {
    // Transposed view: column-major x, so op = T gives x^T.
    o.op = CUBLAS_OP_T;
    o.rows = x.rows;
    o.cols = x.cols;
    o.ld = x.cols == 1 ? x.rows : x.col_stride;
    return true;
  }
  return false;
}

cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      ACCRUE_FAIL("gemm: dtype ", dtype_name(t), " is not a floating dtype");
  }
}

// Largest power of two (up to 256) that divides the address: the alignment the
// heuristic may assume for a buffer (narrowed views are not 256-byte aligned).
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 1;
  while (align < 256 && address % (2 * align) == 0)
    align *= 2;
  return align;
}

// Everything that decides the algorithm, see Note [cuBLASLt state].
using PlanKey = std::array<int64_t, 24>;

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // cuBLASLt's A: our b
  cublasLtMatrixLayout_t b = nullptr;  // cuBLASLt's B: our a
  cublasLtMatrixLayout_t c = nullptr;  // C and D: out
  cublasLtMatmulAlgo_t algo{};
  // cuBLASLt's candidates, best guess first: only the first unless tuning
  // (Note [GEMM autotuning]).
  std::array<cublasLtMatmulAlgo_t, kTuneCandidates> candidates{};
  int candidate_count = 0;
  // Tuning chose cublasGemmEx over every cuBLASLt candidate (Note [GEMM autotuning]).
  bool gemm_ex = false;

  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {  // only reached when building a plan failed
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The numbers of one cuBLASLt call (after Note [Row-major GEMM through column-major cuBLASLt]).
struct LtProblem {
  int device = 0;
  cudaDataType_t input_type{}, output_type{}, scale_type{};
  cublasComputeType_t compute{};
  int64_t m = 0, n = 0, k = 0, batch = 1;  // cuBLASLt's m = our N, n = our M
  LtOperand a, b;                          // cuBLASLt's A (our b) and B (our a)
  int64_t ldc = 0, c_batch_stride = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0;

  PlanKey key() const {
    return {device,  input_type, output_type, scale_type, compute,        m,    n,
            k,       batch,      a.op,        a.rows,     a.cols,         a.ld, a.batch_stride,
            b.op,    b.rows,     b.cols,      b.ld,       b.batch_stride, ldc,  c_batch_stride,
            align_a, align_b,    align_c};
  }
};

template <class T>
void set_layout_attr(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, T v) {
  ACCRUE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, attr, &v, sizeof(v)));
}

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

std::unique_ptr<GemmPlan> build_plan(cublasLtHandle_t handle, const LtProblem& p, int candidates) {
  auto plan = std::make_unique<GemmPlan>();
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, p.compute, p.scale_type));
  const int32_t transa = p.a.op, transb = p.b.op;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                                     sizeof(transa)));
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                                     sizeof(transb)));
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

// The plan of a GEMM with a bias epilogue (Note [GELU epilogue], Note [Bias
// epilogue]). Its descriptor carries the bias (and aux) pointers, which change
// from call to call: `launch` guards them from being set until the matmul that
// reads them is enqueued.
using EpilogueKey = std::array<int64_t, 12>;

struct EpiloguePlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // weight
  cublasLtMatrixLayout_t b = nullptr;  // x
  cublasLtMatrixLayout_t c = nullptr;  // out
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // cuBLASLt offered an algorithm (and has not refused it since)
  std::mutex launch;

  EpiloguePlan() = default;
  EpiloguePlan(const EpiloguePlan&) = delete;
  EpiloguePlan& operator=(const EpiloguePlan&) = delete;
  ~EpiloguePlan() {  // never reached: plans live as long as the process (Note [cuBLASLt state])
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// See Note [cuBLASLt state].
class LtState {
 public:
  static LtState& instance() {
    static LtState* state = new LtState();  // never destroyed, on purpose
    return *state;
  }

  struct Resources {
    cublasLtHandle_t handle;
    void* workspace;
    const GemmPlan* plan;
  };

  Resources acquire(const LtProblem& p, cudaStream_t stream, const void* a, const void* b) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Base base = handle_and_workspace(p.device, stream);
    // Note [GEMM autotuning]: cublasGemmEx competes for 16-bit inputs.
    const bool offer_gemm_ex = (p.input_type == CUDA_R_16BF || p.input_type == CUDA_R_16F) &&
                               p.compute == CUBLAS_COMPUTE_32F;
    const PlanKey key = p.key();
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      const std::string file = gemm_tuning_file();
      auto plan = build_plan(base.handle, p, file.empty() ? 1 : kTuneCandidates);
      if (!file.empty()) {
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
      it = plans_.emplace(key, std::move(plan)).first;
    }
    return {base.handle, base.workspace, it->second.get()};
  }

  // A plan that chose cublasGemmEx runs here: cuBLAS's handle takes its
  // stream and workspace as state, so setting them and enqueueing is one
  // step under the lock. a and b are cuBLASLt's A and B.
  void gemm_ex(const LtProblem& p, cudaStream_t stream, const void* a, const void* b, void* out,
               const void* alpha, const void* beta) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Base base = handle_and_workspace(p.device, stream);
    ACCRUE_CHECK(run_gemm_ex(p, stream, base.workspace, a, b, out, alpha, beta),
                 "gemm: cublasGemmEx, chosen by tuning for m=", p.n, " n=", p.m, " k=", p.k,
                 " batch=", p.batch, ", declined the problem");
  }

  // The same for an epilogue problem (Note [GELU epilogue], Note [Bias
  // epilogue]): `build(handle)` makes the plan of `key` on first use.
  template <class Build>
  std::pair<Resources, EpiloguePlan*> acquire_epilogue(int device, cudaStream_t stream,
                                                       const EpilogueKey& key, Build&& build) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Base base = handle_and_workspace(device, stream);
    auto it = epilogue_plans_.find(key);
    if (it == epilogue_plans_.end()) it = epilogue_plans_.emplace(key, build(base.handle)).first;
    return {{base.handle, base.workspace, nullptr}, it->second.get()};
  }

 private:
  struct Base {
    cublasLtHandle_t handle;
    void* workspace;
  };

  // Called with mutex_ held.
  Base handle_and_workspace(int device, cudaStream_t stream) {
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

  // cublasGemmEx of problem p (Note [Row-major GEMM through column-major
  // cuBLASLt]: the same operands as the cuBLASLt call), on `stream` with
  // `workspace`. Called with mutex_ held. False when cuBLAS declines.
  bool run_gemm_ex(const LtProblem& p, cudaStream_t stream, void* workspace, const void* a,
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
            ? cublasGemmEx(handle, ta, tb, m, n, k, alpha, a, p.input_type, lda, b, p.input_type,
                           ldb, beta, out, p.output_type, ldc, p.compute, CUBLAS_GEMM_DEFAULT)
            : cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, p.input_type, lda,
                                         p.a.batch_stride, b, p.input_type, ldb, p.b.batch_stride,
                                         beta, out, p.output_type, ldc, p.c_batch_stride,
                                         static_cast<int>(p.batch), p.compute, CUBLAS_GEMM_DEFAULT);
    return status == CUBLAS_STATUS_SUCCESS;
  }

  std::mutex mutex_;
  std::array<cublasLtHandle_t, kMaxDevices> handles_{};
  std::array<cublasHandle_t, kMaxDevices> blas_handles_{};
  std::map<std::pair<int, cudaStream_t>, Tensor> workspaces_;
  std::map<PlanKey, std::unique_ptr<GemmPlan>> plans_;
  std::map<EpilogueKey, std::unique_ptr<EpiloguePlan>> epilogue_plans_;
};

// out = beta * out, for K = 0 (cuBLASLt does not take empty inner dimensions).
template <class T>
__global__ void scale_kernel(T* out, int64_t n, cu::math_t<T> beta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cu::convert<T>(beta * cu::convert<cu::math_t<T>>(out[i]));
}

void scale_output(const Tensor& out, double beta, cudaStream_t stream) {
  if (beta == 1.0) return;
  if (beta == 0.0) {  // must not read out: it may hold NaN (Note [Overwrite first])
    ACCRUE_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream));
    return;
  }
  cu::visit_float_dtype(out.dtype(), "gemm", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    const int64_t n = out.numel();
    scale_kernel<T><<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out.data_ptr()), n, static_cast<cu::math_t<T>>(beta));
    ACCRUE_LAUNCH_CHECK();
  });
}

// out = tmp + beta * out, for f64 products stored in an f32 out (cuBLASLt's
// 64F compute has no f32 output). beta == 0 does not read out.
__global__ void add_scaled_kernel(float* out, const double* tmp, int64_t n, double beta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<float>(beta == 0.0 ? tmp[i] : tmp[i] + beta * out[i]);
}

void check_fits_int32(int64_t v, const char* what, const Tensor& a, const Tensor& b) {
  ACCRUE_CHECK(v <= std::numeric_limits<int32_t>::max(), "gemm: ", what, " = ", v,
               " exceeds cuBLASLt's 32-bit limit (a ", shape_str(a.shape()), ", b ",
               shape_str(b.shape()), ")");
}

}  // namespace

void gemm(const Tensor& a_in, const Tensor& b_in, const Tensor& out, double alpha, double beta) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  int64_t batch = out.size(0), M = out.size(1);
  const int64_t N = out.size(2), K = a_in.size(2);
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) return scale_output(out, beta, stream);
  if (a_in.dtype() == DType::f64 && out.dtype() == DType::f32) {
    const Tensor tmp = empty(out.shape(), DType::f64, out.device());
    gemm(a_in, b_in, tmp, alpha, 0.0);
    constexpr int kThreads = 256;
    const int64_t n = out.numel();
    add_scaled_kernel<<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<float*>(out.data_ptr()), static_cast<const double*>(tmp.data_ptr()), n, beta);
    ACCRUE_LAUNCH_CHECK();
    return;
  }

  // Inputs whose strides cuBLASLt cannot express are copied (rare: expanded rows).
  LtOperand lt_a, lt_b;
  Tensor a = a_in, b = b_in;
  if (!describe_transposed(arg_of(a), lt_b)) a = a.contiguous();
  if (!describe_transposed(arg_of(b), lt_a)) b = b.contiguous();
  RowMajorArg ra = arg_of(a), rb = arg_of(b);

  // A batch of row-major a against one shared b (a Linear on [B, T, C]) is one
  // plain GEMM with B*M rows: fewer, larger tiles than a strided batch.
  if (batch > 1 && rb.batch_stride == 0 && ra.col_stride == 1) {
    const int64_t rows_stride = ra.rows == 1 ? ra.batch_stride : ra.row_stride;
    const bool evenly_spaced = ra.rows == 1 || ra.batch_stride == ra.rows * ra.row_stride;
    if (evenly_spaced && rows_stride >= ra.cols) {
      ra.rows *= batch;
      ra.row_stride = rows_stride;
      ra.batch_stride = 0;
      M *= batch;
      batch = 1;
    }
  }
  const bool ok_a = describe_transposed(ra, lt_b);
  const bool ok_b = describe_transposed(rb, lt_a);
  ACCRUE_CHECK(ok_a && ok_b, "gemm: internal error describing a ", shape_str(a.shape()),
               " strides ", shape_str(a.strides()), " and b ", shape_str(b.shape()), " strides ",
               shape_str(b.strides()));
  check_fits_int32(M, "M", a, b);
  check_fits_int32(N, "N", a, b);
  check_fits_int32(K, "K", a, b);
  check_fits_int32(batch, "batch", a, b);

  LtProblem p;
  p.device = dev;
  p.input_type = cuda_data_type(a.dtype());
  p.output_type = cuda_data_type(out.dtype());
  const bool f64 = a.dtype() == DType::f64;
  p.scale_type = f64 ? CUDA_R_64F : CUDA_R_32F;
  if (f64) {
    p.compute = CUBLAS_COMPUTE_64F;
  } else if (a.dtype() == DType::f32 && allow_tf32()) {
    p.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  } else {
    p.compute = CUBLAS_COMPUTE_32F;  // true fp32, and fp32 accumulation for bf16/f16
  }
  p.m = N;
  p.n = M;
  p.k = K;
  p.batch = batch;
  p.a = lt_a;
  p.b = lt_b;
  p.ldc = N;
  p.c_batch_stride = batch > 1 ? M * N : 0;
  p.align_a = alignment_of(rb.ptr);
  p.align_b = alignment_of(ra.ptr);
  p.align_c = alignment_of(out.data_ptr());

  // Note [Library outputs under initcheck] (core/cuda_runtime.h).
  if (beta == 0.0 && prewrite_library_outputs()) out.fill_(0.0);
  const LtState::Resources r = LtState::instance().acquire(p, stream, rb.ptr, ra.ptr);
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_ptr = f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta) : &beta_f;
  // C and D are both out: beta 0 writes it without reading it, beta 1 adds into
  // it (the fused weight-gradient GEMM, Note [Fused weight-gradient accumulation]).
  if (r.plan->gemm_ex)
    return LtState::instance().gemm_ex(p, stream, rb.ptr, ra.ptr, out.data_ptr(), alpha_ptr,
                                       beta_ptr);
  ACCRUE_CUBLAS_CHECK(cublasLtMatmul(r.handle, r.plan->op, alpha_ptr, rb.ptr, r.plan->a, ra.ptr,
                                     r.plan->b, beta_ptr, out.data_ptr(), r.plan->c, out.data_ptr(),
                                     r.plan->c, &r.plan->algo, r.workspace, kWorkspaceBytes,
                                     stream));
}

// ---- GEMM with the bias + GELU epilogue (kernels/fused.h) ------------------------------------
//
// Note [GELU epilogue]
// ~~~~~~~~~~~~~~~~~~~~
// linear_gelu on CUDA is one cuBLASLt matmul with CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
// the fp32 accumulator gets the bias, is stored to the aux buffer (the
// pre-activation, in the output's dtype) and goes through GELU's tanh form
// into D. After Note [Row-major GEMM through column-major cuBLASLt], D is
// W x^T as a column-major [out, N] matrix, which is our row-major out [N, out]:
// cuBLASLt's A is the weight (op T, ld in), its B is x (op N, ld in). The bias
// then has D's row count, out, as cuBLASLt requires, and aux is pre with
// leading dimension out, which cuBLASLt requires to be a multiple of 8. The
// heuristic reads the bias and aux pointers for their alignment, so those
// alignments are part of the plan key; each call sets its own pointers on the
// cached descriptor under the plan's lock. f32 stays true fp32 unless
// allow_tf32(). Where the epilogue cannot run (f64, out % 8 != 0, K = 0, no
// algorithm) gemm_bias_gelu returns false and linear_gelu runs the plain GEMM
// (into fp32 for 16-bit inputs, the epilogue's accumulator) and bias_gelu
// (kernels/cuda/fused.cu), which applies GELU before rounding, like the epilogue.
//
// Note [Bias epilogue]
// ~~~~~~~~~~~~~~~~~~~~
// kernels::linear on CUDA is one cuBLASLt matmul with CUBLASLT_EPILOGUE_BIAS,
// laid out as in Note [GELU epilogue]: D is our out [N, out], the bias has D's
// row count (out) and is packed (contiguous), and its elements have D's dtype
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE's default), as cublasLt.h requires.
// There is no aux buffer, so no rule on out's size: an out that no algorithm
// takes is declined by the heuristic. The bias is added to the fp32
// accumulator and the sum is rounded once to the output dtype, where
// matmul-then-add rounds twice (the product to the dtype, then the sum): for
// bf16/f16 the fused result is slightly more accurate and may differ from the
// unfused one in the last bit, so the tests compare with dtype tolerances.
// (For f32 both round once; they may still differ by the algorithm the
// heuristic picks.) f32 stays true fp32 unless allow_tf32(). Where the
// epilogue cannot run (f64, K = 0, no algorithm) gemm_bias returns false and
// kernels::linear runs matmul then add.

namespace {

struct EpilogueProblem {
  int device = 0;
  cublasLtEpilogue_t epilogue{};
  cudaDataType_t type{};
  cublasComputeType_t compute{};
  int64_t n = 0, in = 0, out = 0;  // x [n, in], weight [out, in]
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* pre = nullptr;  // the aux buffer, GELU_AUX_BIAS only
  void* y = nullptr;

  bool has_aux() const { return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }

  EpilogueKey key() const {
    return {device,
            epilogue,
            type,
            compute,
            n,
            in,
            out,
            alignment_of(x),
            alignment_of(weight),
            alignment_of(bias),
            alignment_of(pre),
            alignment_of(y)};
  }
};

// Sets a descriptor attribute, reporting whether cuBLASLt accepted it.
template <class T>
bool set_desc_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& v) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
}

bool set_epilogue_pointers(const EpiloguePlan& plan, const EpilogueProblem& p) {
  return set_desc_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias) &&
         (!p.has_aux() || set_desc_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.pre));
}

// The plan of one epilogue problem. Anything cuBLASLt refuses leaves it
// unusable (the caller falls back) rather than failing the op.
std::unique_ptr<EpiloguePlan> build_epilogue_plan(cublasLtHandle_t handle,
                                                  const EpilogueProblem& p) {
  auto plan = std::make_unique<EpiloguePlan>();
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, p.compute, CUDA_R_32F));
  plan->a = make_layout(p.type, p.in, p.out, p.in, 1, 0);
  plan->b = make_layout(p.type, p.in, p.n, p.in, 1, 0);
  plan->c = make_layout(p.type, p.out, p.n, p.out, 1, 0);
  const int32_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  const int64_t aux_ld = p.out;
  bool ok =
      set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, transa) &&
      set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, transb) &&
      set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue) &&
      (!p.has_aux() || set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld)) &&
      set_epilogue_pointers(*plan, p);
  if (!ok) return plan;

  cublasLtMatmulPreference_t pref = nullptr;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
    ok = ok &&
         cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(p.weight));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(p.x));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(p.y));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(p.y));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  if (ok) {
    ok = cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref,
                                        1, &result, &returned) == CUBLAS_STATUS_SUCCESS &&
         returned > 0;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (ok) {
    plan->algo = result.algo;
    plan->usable = true;
  }
  return plan;
}

// The problem of y = epilogue(x @ weight^T + bias) on y's device, or false
// when no epilogue can take it (a dtype cuBLASLt has no epilogue for here, K
// = 0, sizes beyond 32 bits).
bool describe_epilogue(cublasLtEpilogue_t epilogue, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, const Tensor& y, EpilogueProblem* p) {
  const DType dtype = x.dtype();
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) return false;
  const int64_t n = x.size(0), in = x.size(1), out_features = weight.size(0);
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (in == 0 || n > kInt32Max || in > kInt32Max || out_features > kInt32Max) return false;
  p->device = y.device().index;
  p->epilogue = epilogue;
  p->type = cuda_data_type(dtype);
  p->compute =
      dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  p->n = n;
  p->in = in;
  p->out = out_features;
  p->x = x.data_ptr();
  p->weight = weight.data_ptr();
  p->bias = bias.data_ptr();
  p->y = y.data_ptr();
  return true;
}

// Runs p's matmul on the current stream of p's device; false, having launched
// nothing, when cuBLASLt offers or accepts no algorithm for it.
bool run_epilogue(const EpilogueProblem& p, const char* name) {
  cu::DeviceScope scope(p.device);
  cudaStream_t stream = cu::stream_for(p.device);
  auto [r, plan] = LtState::instance().acquire_epilogue(
      p.device, stream, p.key(),
      [&](cublasLtHandle_t handle) { return build_epilogue_plan(handle, p); });

  std::lock_guard<std::mutex> lock(plan->launch);
  if (!plan->usable) return false;
  ACCRUE_CHECK(set_epilogue_pointers(*plan, p), name,
               ": cuBLASLt refused the epilogue pointers of a cached plan");
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s =
      cublasLtMatmul(r.handle, plan->op, &alpha, p.weight, plan->a, p.x, plan->b, &beta, p.y,
                     plan->c, p.y, plan->c, &plan->algo, r.workspace, kWorkspaceBytes, stream);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
    // cuBLASLt validates before it launches anything: nothing ran, fall back
    // now and for every later call with this key.
    plan->usable = false;
    return false;
  }
  ACCRUE_CUBLAS_CHECK(s);
  return true;
}

}  // namespace

bool gemm_bias_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                    const Tensor& out) {
  // The aux buffer's leading dimension must be a multiple of 8.
  if (weight.size(0) % 8 != 0) return false;
  EpilogueProblem p;
  if (!describe_epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, x, weight, bias, out, &p)) return false;
  p.pre = pre.data_ptr();
  if (prewrite_library_outputs()) {  // Note [Library outputs under initcheck]
    pre.fill_(0.0);
    out.fill_(0.0);
  }
  return run_epilogue(p, "linear_gelu");
}

bool gemm_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  EpilogueProblem p;
  if (!describe_epilogue(CUBLASLT_EPILOGUE_BIAS, x, weight, bias, out, &p)) return false;
  if (prewrite_library_outputs()) out.fill_(0.0);  // Note [Library outputs under initcheck]
  return run_epilogue(p, "linear");
}

}  // namespace accrue::kernels::cuda
