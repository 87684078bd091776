// The FP8 GEMMs on cuBLASLt (Note [FP8 GEMM], Note [FP8 block GEMM]): one
// plan per problem, cached beside the epilogue plans of Note [cuBLASLt
// state], with the scale pointers set on the descriptor under the plan's
// launch lock for each call, as the epilogues' bias pointers are. A refusal
// becomes an error naming the problem, never a silent fallback; only the
// bias epilogue, where refused, gives way to an add after the GEMM (Note
// [FP8 GEMM]).
#include <cstdint>
#include <memory>
#include <mutex>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/cublaslt_state.h"
#include "accrue/kernels/fp8_backend.h"
#include "accrue/kernels/ops.h"

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
  // How a's and b's scales apply (cublasLtMatmulMatrixScale_t): per tensor,
  // or per tile of Note [FP8 block GEMM].
  int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const void* a = nullptr;
  const void* b = nullptr;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  const void* bias = nullptr;  // Note [FP8 GEMM]: [n] in out's type, in the epilogue
  void* aux = nullptr;         // with bias: the pre-GELU output, [m, n] in out's type
  void* out = nullptr;
  int32_t sm_target = 0;  // Note [GEMM SM margin]

  EpilogueKey key() const {
    return {device,
            kFp8KeyTag,
            static_cast<int64_t>(a_type),
            static_cast<int64_t>(b_type),
            static_cast<int64_t>(out_type),
            m,
            n,
            k,
            (accumulate ? 1 : 0) | (fast ? 2 : 0) | (bias != nullptr ? 4 : 0) |
                (aux != nullptr ? 8 : 0),
            a_mode,
            b_mode,
            0,
            sm_target};
  }
};

// cuBLASLt's A is our b and its B our a (Note [Row-major GEMM through
// column-major cuBLASLt]), so its A scale is scale_b and its B scale scale_a.
// D is our out transposed, [n, m]: the bias has D's row count.
bool set_pointers(const EpiloguePlan& plan, const Fp8Problem& p) {
  return set_attr(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_b) &&
         set_attr(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_a) &&
         (p.bias == nullptr || set_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias)) &&
         (p.aux == nullptr || set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux));
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
            cublaslt::set_sm_count_target(plan->op, p.sm_target) && set_pointers(*plan, p);
  if (p.bias != nullptr) {
    // With aux, GELU too: aux = the biased product (D's layout, [n, m] ld n).
    const cublasLtEpilogue_t epilogue =
        p.aux != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t type = fp8_data_type(p.out_type);
    ok = ok && set_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue) &&
         set_attr(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
    if (p.aux != nullptr) {
      const int64_t aux_ld = p.n;
      ok = ok && set_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld) &&
           set_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, type);
    }
  }
  // Swapped as the pointers are: cuBLASLt's A is our b.
  if (p.a_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
      p.b_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
    ok = ok && set_attr(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, p.b_mode) &&
         set_attr(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, p.a_mode);
  }
  if (!ok) return plan;

  // Dispatch guarantees 16-byte alignment (Note [FP8 GEMM]), so the plan
  // holds for every call with this key.
  plan->usable = cublaslt::heuristic_algo(handle, plan->op, plan->a, plan->b, plan->c, 16, 16, 16,
                                          &plan->algo);
  return plan;
}

// FP8 tensor cores: compute capability 8.9 (Ada) and up; the 128-element
// block scales, 9.0 (Hopper) only.
void check_fp8_device(int device, bool block_scales, const char* op) {
  int major = 0, minor = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int cc = major * 10 + minor;
  ACCRUE_CHECK(cc >= 89, op, ": device cuda:", device, " has compute capability ", major, ".",
               minor, "; FP8 GEMMs need 8.9 or newer (Ada, Hopper, Blackwell)");
  ACCRUE_CHECK(!block_scales || cc == 90, op, ": device cuda:", device, " has compute capability ",
               major, ".", minor,
               "; cuBLASLt's 128-element block scales (VEC128 and BLK128x128) run on 9.0 "
               "(Hopper) only");
}

Fp8Problem problem_of(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  Fp8Problem p;
  p.device = out.device().index;
  p.sm_target = cublaslt::sm_count_target(p.device);
  p.a_type = a.dtype();
  p.b_type = b.dtype();
  p.out_type = out.dtype();
  p.m = a.size(0);
  p.k = a.size(1);
  p.n = b.size(0);
  p.accumulate = accumulate;
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.out = out.data_ptr();
  return p;
}

void run_fp8_gemm(const Fp8Problem& p, const Tensor& out, const char* op,
                  const Tensor& bias = Tensor()) {
  const bool block_scales = p.a_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
                            p.b_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  cu::DeviceScope scope(p.device);
  check_fp8_device(p.device, block_scales, op);
  cudaStream_t stream = cu::stream_for(p.device);
  auto [r, plan] = LtState::instance().acquire_epilogue(
      p.device, stream, p.key(),
      [&](cublasLtHandle_t handle) { return build_fp8_plan(handle, p); });

  std::unique_lock<std::mutex> lock(plan->launch);
  if (!plan->usable && p.bias != nullptr) {
    // Note [FP8 GEMM]: no algorithm with the epilogue; the GEMM without it,
    // then the bias added (and GELU, by fp8_matmul_gelu).
    lock.unlock();
    Fp8Problem plain = p;
    plain.bias = nullptr;
    plain.aux = nullptr;
    run_fp8_gemm(plain, out, op);
    out.copy_(kernels::binary(BinaryOp::Add, out, bias));
    return;
  }
  ACCRUE_CHECK(plan->usable, op, ": cuBLASLt offers no FP8 algorithm for a ", dtype_name(p.a_type),
               " [", p.m, ", ", p.k, "] @ ", dtype_name(p.b_type), " [", p.n, ", ", p.k, "]^T -> ",
               dtype_name(p.out_type), p.accumulate ? " (accumulating)" : "", " with scale modes ",
               p.a_mode, " x ", p.b_mode, " on cuda:", p.device);
  ACCRUE_CHECK(set_pointers(*plan, p), op,
               ": cuBLASLt refused the scale or bias pointers of a cached plan");
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  // Note [Library outputs under initcheck] (core/cuda_runtime.h).
  if (!p.accumulate && prewrite_library_outputs()) out.fill_(0.0);
  ACCRUE_CUBLAS_CHECK(cublasLtMatmul(r.handle, plan->op, &alpha, p.b, plan->a, p.a, plan->b, &beta,
                                     p.out, plan->c, p.out, plan->c, &plan->algo, r.workspace,
                                     kWorkspaceBytes, stream));
}

// Note [FP8 block GEMM]: a scale_inv of cast_to_fp8_blockwise's layout, as
// cuBLASLt reads it. 1 x 128 tiles (VEC128_32F): [rows, k_blocks] row-major
// becomes k-block-major, the rows of one k block contiguous. 128 x 128 blocks
// (BLK128x128_32F): [row_blocks, k_blocks] row-major with each row padded to
// a multiple of 4 scales (16 bytes). Both are as PyTorch's torch._scaled_mm
// passes its blockwise scales to cuBLASLt.
Tensor cublaslt_scales(const Tensor& scale_inv, int64_t rows_per_tile) {
  if (rows_per_tile == 1) return scale_inv.transpose(0, 1).contiguous();
  const int64_t row_blocks = scale_inv.size(0), k_blocks = scale_inv.size(1);
  const int64_t padded = (k_blocks + 3) / 4 * 4;
  if (padded == k_blocks) return scale_inv;
  Tensor out = zeros({row_blocks, padded}, DType::f32, scale_inv.device());
  out.narrow(1, 0, k_blocks).copy_(scale_inv);
  return out;
}

int32_t scale_mode(int64_t rows_per_tile) {
  return rows_per_tile == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                            : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

}  // namespace

void fp8_matmul(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                const Tensor& bias, const Tensor& out, bool accumulate, bool fast_accumulation) {
  Fp8Problem p = problem_of(a, b, out, accumulate);
  p.fast = fast_accumulation;
  p.scale_a = static_cast<const float*>(scale_a.data_ptr());
  p.scale_b = static_cast<const float*>(scale_b.data_ptr());
  // The epilogue reads the bias in 16-byte vectors; a bias placed otherwise
  // (an arena offset) is added after the GEMM.
  const bool in_epilogue = bias.defined() && reinterpret_cast<uintptr_t>(bias.data_ptr()) % 16 == 0;
  p.bias = in_epilogue ? bias.data_ptr() : nullptr;
  run_fp8_gemm(p, out, "fp8_matmul", bias);
  if (bias.defined() && !in_epilogue) out.copy_(kernels::binary(BinaryOp::Add, out, bias));
}

void fp8_matmul_gelu(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                     const Tensor& bias, const Tensor& pre, const Tensor& out,
                     bool fast_accumulation) {
  auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  Fp8Problem p = problem_of(a, b, out, false);
  p.fast = fast_accumulation;
  p.scale_a = static_cast<const float*>(scale_a.data_ptr());
  p.scale_b = static_cast<const float*>(scale_b.data_ptr());
  if (aligned(bias) && aligned(pre) && p.n % 8 == 0) {
    cu::DeviceScope scope(p.device);
    p.bias = bias.data_ptr();
    p.aux = pre.data_ptr();
    auto [r, plan] = LtState::instance().acquire_epilogue(
        p.device, cu::stream_for(p.device), p.key(),
        [&](cublasLtHandle_t handle) { return build_fp8_plan(handle, p); });
    if (plan->usable) {
      // Note [Library outputs under initcheck]: the aux output too.
      if (prewrite_library_outputs()) pre.fill_(0.0);
      run_fp8_gemm(p, out, "fp8_matmul_gelu", bias);
      return;
    }
  }
  // Note [FP8 GEMM]: the bias epilogue into pre, then the GELU kernel.
  fp8_matmul(a, b, scale_a, scale_b, bias, pre, false, fast_accumulation);
  out.copy_(kernels::unary(UnaryOp::Gelu, pre));
}

void fp8_block_matmul(const Tensor& a, const Tensor& scale_inv_a, int64_t a_rows_per_tile,
                      const Tensor& b, const Tensor& scale_inv_b, int64_t b_rows_per_tile,
                      const Tensor& out, bool accumulate) {
  cu::DeviceScope scope(out.device().index);
  // Held until the GEMM is enqueued; the allocator orders their reuse after it.
  const Tensor sa = cublaslt_scales(scale_inv_a, a_rows_per_tile);
  const Tensor sb = cublaslt_scales(scale_inv_b, b_rows_per_tile);
  Fp8Problem p = problem_of(a, b, out, accumulate);
  p.a_mode = scale_mode(a_rows_per_tile);
  p.b_mode = scale_mode(b_rows_per_tile);
  p.scale_a = static_cast<const float*>(sa.data_ptr());
  p.scale_b = static_cast<const float*>(sb.data_ptr());
  run_fp8_gemm(p, out, "fp8_block_matmul");
}

}  // namespace accrue::kernels::cuda
