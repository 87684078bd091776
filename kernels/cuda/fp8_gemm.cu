// The FP8 GEMM on cuBLASLt (Note [FP8 GEMM]): one plan per problem, cached
// beside the epilogue plans of Note [cuBLASLt state], with the scale pointers
// set on the descriptor under the plan's launch lock for each call, as the
// epilogues' bias pointers are.
//
// Not yet run on a GPU (written where none runs): what cuBLASLt will accept is
// taken from its documented FP8 requirements (TN, sizes and leading
// dimensions multiples of 16, 16-byte aligned data, A/B scale pointers with
// CUBLAS_COMPUTE_32F and f32 scales, C of D's type, e5m2 x e5m2 refused); a
// refusal becomes an error naming the problem, never a silent fallback.
#include <cstdint>
#include <memory>
#include <mutex>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/cublaslt_state.h"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

using cublaslt::EpilogueKey;
using cublaslt::EpiloguePlan;
using cublaslt::kWorkspaceBytes;
using cublaslt::LtState;
using cublaslt::make_layout;

// Slot 1 of an epilogue key holds a cublasLtEpilogue_t (non-negative); this
// marks the FP8 problems that share the epilogue plans' cache.
constexpr int64_t kFp8KeyTag = -8;

cudaDataType_t fp8_data_type(DType t) {
  switch (t) {
    case DType::f8e4m3:
      return CUDA_R_8F_E4M3;
    case DType::f8e5m2:
      return CUDA_R_8F_E5M2;
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      ACCRUE_FAIL("fp8_matmul: dtype ", dtype_name(t), " has no cuBLASLt FP8 GEMM type");
  }
}

template <class T>
bool set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& v) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
}

struct Fp8Problem {
  int device = 0;
  DType a_type{}, b_type{}, out_type{};
  int64_t m = 0, n = 0, k = 0;  // ours: out [m, n] = a [m, k] @ b [n, k]^T
  bool accumulate = false, fast = false;
  const void* a = nullptr;
  const void* b = nullptr;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  void* out = nullptr;

  EpilogueKey key() const {
    return {device,
            kFp8KeyTag,
            static_cast<int64_t>(a_type),
            static_cast<int64_t>(b_type),
            static_cast<int64_t>(out_type),
            m,
            n,
            k,
            accumulate ? 1 : 0,
            fast ? 1 : 0,
            0,
            0};
  }
};

// cuBLASLt's A is our b and its B our a (Note [Row-major GEMM through
// column-major cuBLASLt]), so its A scale is scale_b and its B scale scale_a.
bool set_scale_pointers(const EpiloguePlan& plan, const Fp8Problem& p) {
  return set_attr(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_b) &&
         set_attr(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_a);
}

std::unique_ptr<EpiloguePlan> build_fp8_plan(cublasLtHandle_t handle, const Fp8Problem& p) {
  auto plan = std::make_unique<EpiloguePlan>();
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major: A = b^T as stored ([k, n], ld k) used transposed; B = a^T
  // as stored ([k, m], ld k) used as is; C = D = out^T ([n, m], ld n).
  plan->a = make_layout(fp8_data_type(p.b_type), p.k, p.n, p.k, 1, 0);
  plan->b = make_layout(fp8_data_type(p.a_type), p.k, p.m, p.k, 1, 0);
  plan->c = make_layout(fp8_data_type(p.out_type), p.n, p.m, p.n, 1, 0);
  const int32_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  const int8_t fast = p.fast ? 1 : 0;
  bool ok = set_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, transa) &&
            set_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, transb) &&
            set_attr(plan->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast) &&
            set_scale_pointers(*plan, p);
  if (!ok) return plan;

  // Dispatch guarantees 16-byte alignment (Note [FP8 GEMM]), so the plan
  // holds for every call with this key.
  plan->usable = cublaslt::heuristic_algo(handle, plan->op, plan->a, plan->b, plan->c, 16, 16, 16,
                                          &plan->algo);
  return plan;
}

// FP8 tensor cores: compute capability 8.9 (Ada) and up.
void check_fp8_device(int device) {
  int major = 0, minor = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  ACCRUE_CHECK(major * 10 + minor >= 89, "fp8_matmul: device cuda:", device,
               " has compute capability ", major, ".", minor,
               "; FP8 GEMMs need 8.9 or newer (Ada, Hopper, Blackwell)");
}

}  // namespace

void fp8_matmul(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                const Tensor& out, bool accumulate, bool fast_accumulation) {
  Fp8Problem p;
  p.device = out.device().index;
  p.a_type = a.dtype();
  p.b_type = b.dtype();
  p.out_type = out.dtype();
  p.m = a.size(0);
  p.k = a.size(1);
  p.n = b.size(0);
  p.accumulate = accumulate;
  p.fast = fast_accumulation;
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.scale_a = static_cast<const float*>(scale_a.data_ptr());
  p.scale_b = static_cast<const float*>(scale_b.data_ptr());
  p.out = out.data_ptr();

  cu::DeviceScope scope(p.device);
  check_fp8_device(p.device);
  cudaStream_t stream = cu::stream_for(p.device);
  auto [r, plan] = LtState::instance().acquire_epilogue(
      p.device, stream, p.key(),
      [&](cublasLtHandle_t handle) { return build_fp8_plan(handle, p); });

  std::lock_guard<std::mutex> lock(plan->launch);
  ACCRUE_CHECK(plan->usable, "fp8_matmul: cuBLASLt offers no FP8 algorithm for a ",
               dtype_name(p.a_type), " [", p.m, ", ", p.k, "] @ ", dtype_name(p.b_type), " [", p.n,
               ", ", p.k, "]^T -> ", dtype_name(p.out_type), accumulate ? " (accumulating)" : "",
               " on cuda:", p.device);
  ACCRUE_CHECK(set_scale_pointers(*plan, p),
               "fp8_matmul: cuBLASLt refused the scale pointers of a cached plan");
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Note [Library outputs under initcheck] (core/cuda_runtime.h).
  if (!accumulate && prewrite_library_outputs()) out.fill_(0.0);
  ACCRUE_CUBLAS_CHECK(cublasLtMatmul(r.handle, plan->op, &alpha, p.b, plan->a, p.a, plan->b, &beta,
                                     p.out, plan->c, p.out, plan->c, &plan->algo, r.workspace,
                                     kWorkspaceBytes, stream));
}

}  // namespace accrue::kernels::cuda
