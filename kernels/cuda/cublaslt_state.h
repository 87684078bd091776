// The cuBLASLt state that the plain GEMM (kernels/cuda/matmul.cu) and the
// bias / GELU epilogues (kernels/cuda/gemm_epilogue.cu) share: the handles,
// the workspaces and the plan caches of Note [cuBLASLt state], and the plan
// types they cache. Private to kernels/cuda/.
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
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "accrue/core/dtype.h"
#include "accrue/core/error.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/cuda/gemm_tuning.h"

namespace accrue::kernels::cuda::cublaslt {

inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;
inline constexpr int kMaxDevices = 64;

// One operand as cuBLASLt sees it: a column-major matrix of rows x cols with
// leading dimension ld, used as op(matrix).
struct LtOperand {
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;
};

inline cudaDataType_t cuda_data_type(DType t) {
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
inline uint32_t alignment_of(const void* p) {
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
  // Note [GEMM SM margin]: the SMs to plan for, 0 for the device's all. Not in
  // key(), which also names the problem in a tuning file: the plan cache keys
  // on both.
  int32_t sm_target = 0;

  PlanKey key() const {
    return {device,  input_type, output_type, scale_type, compute,        m,    n,
            k,       batch,      a.op,        a.rows,     a.cols,         a.ld, a.batch_stride,
            b.op,    b.rows,     b.cols,      b.ld,       b.batch_stride, ldc,  c_batch_stride,
            align_a, align_b,    align_c};
  }
};

// Note [GEMM SM margin]: the SM count a GEMM planned now on `device` targets,
// 0 while no margin is set; and the descriptor attribute that carries it
// (nothing for 0; false when cuBLASLt refuses it).
int32_t sm_count_target(int device);
bool set_sm_count_target(cublasLtMatmulDesc_t desc, int32_t target);

// A column-major rows x cols layout with leading dimension ld, strided-batched
// when batch > 1.
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t batch_stride);

// The plan of a GEMM with a bias epilogue (Note [GELU epilogue], Note [Bias
// epilogue]). Its descriptor carries the bias (and aux) pointers, which change
// from call to call: `launch` guards them from being set until the matmul that
// reads them is enqueued. The last entry is the SM target (Note [GEMM SM margin]).
using EpilogueKey = std::array<int64_t, 13>;

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
  static LtState& instance();

  struct Resources {
    cublasLtHandle_t handle;
    void* workspace;
    const GemmPlan* plan;
  };

  Resources acquire(const LtProblem& p, cudaStream_t stream, const void* a, const void* b);
  // The handle and the stream's workspace made now, outside any capture
  // (kernels::prepare_stream); nothing when they exist.
  void prepare(int device, cudaStream_t stream);

  // A plan that chose cublasGemmEx runs here: cuBLAS's handle takes its
  // stream and workspace as state, so setting them and enqueueing is one
  // step under the lock. a and b are cuBLASLt's A and B.
  void gemm_ex(const LtProblem& p, cudaStream_t stream, const void* a, const void* b, void* out,
               const void* alpha, const void* beta);

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
  Base handle_and_workspace(int device, cudaStream_t stream);

  // cublasGemmEx of problem p (Note [Row-major GEMM through column-major
  // cuBLASLt]: the same operands as the cuBLASLt call), on `stream` with
  // `workspace`. Called with mutex_ held. False when cuBLAS declines.
  bool run_gemm_ex(const LtProblem& p, cudaStream_t stream, void* workspace, const void* a,
                   const void* b, void* out, const void* alpha, const void* beta);

  std::mutex mutex_;
  std::array<cublasLtHandle_t, kMaxDevices> handles_{};
  std::array<cublasHandle_t, kMaxDevices> blas_handles_{};
  std::map<std::pair<int, cudaStream_t>, Tensor> workspaces_;
  std::map<std::pair<PlanKey, int32_t>, std::unique_ptr<GemmPlan>> plans_;  // key, SM target
  std::map<EpilogueKey, std::unique_ptr<EpiloguePlan>> epilogue_plans_;
};

// cuBLASLt's first algorithm for the plan's descriptors (D in C's layout), a
// workspace of kWorkspaceBytes and these operand alignments in bytes, into
// *algo; false when a preference cannot be set or none is offered (the
// epilogue and FP8 plans, which then refuse the problem).
bool heuristic_algo(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, uint32_t align_a,
                    uint32_t align_b, uint32_t align_c, cublasLtMatmulAlgo_t* algo);

}  // namespace accrue::kernels::cuda::cublaslt
