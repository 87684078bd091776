// CUDA GEMMs with a fused epilogue (kernels/fused_backend.h): x @ weight^T
// plus a bias, with or without GELU, as one cuBLASLt matmul, and the GEMM of
// the backward that takes GELU's gradient. The plain GEMM and the cuBLASLt
// conventions: kernels/cuda/matmul.cu.
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
//
// Note [GELU gradient epilogue]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In the backward of linear(gelu(pre), W2, b2) (a transformer's MLP), the
// gradient that reaches pre is (g @ W2) * gelu'(pre), with g [N, out] and W2
// [out, hidden]. matmul_gelu_backward on CUDA is one cuBLASLt matmul with
// CUBLASLT_EPILOGUE_DGELU, whose aux input is pre as linear_gelu's GELU
// epilogue stored it: the fp32 product is multiplied by the derivative of
// GELU's tanh form at pre and rounded once, where matmul-then-gelu_backward
// rounds the product to the dtype first and reads and writes an [N, hidden]
// tensor twice more (2.0 ms of GPT-2 124M's 57 ms window at micro-batch 32
// on an H200). But cuBLASLt's DGELU GEMMs are slower than its plain ones,
// and more so at fewer rows: GPT-2 124M's window on an H200 (bench/RESULTS.md,
// sixteenth session) took 1.4% less time with the epilogue at 32 x 1024 rows
// a micro-batch, 0.5% more at 4 x 1024 and 5.2% more at 1 x 1024. So
// kernels::matmul_gelu_backward takes it from 32,768 rows up and runs the two
// ops below. Column-major, D is W2^T g^T, our row-major [N, hidden]:
// cuBLASLt's A is W2 as stored (op N, [hidden, out], ld hidden),
// its B is g (op N, ld out), and aux is pre with leading dimension hidden, a
// multiple of 8 as cuBLASLt requires. There is no bias. For bf16/f16 the
// result may differ from the two ops in the last bit (one rounding instead of
// two), so the tests compare with dtype tolerances; the CPU runs the two ops.
// Where the epilogue cannot run (f64, hidden % 8 != 0, out = 0, no
// algorithm) gemm_dgelu returns false and matmul_gelu_backward runs matmul
// then gelu_backward.
#include <cublasLt.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/cublaslt_state.h"
#include "accrue/kernels/fused_backend.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

using cublaslt::alignment_of;
using cublaslt::cuda_data_type;
using cublaslt::EpilogueKey;
using cublaslt::EpiloguePlan;
using cublaslt::kWorkspaceBytes;
using cublaslt::LtState;
using cublaslt::make_layout;

struct EpilogueProblem {
  int device = 0;
  cublasLtEpilogue_t epilogue{};
  cudaDataType_t type{};
  cublasComputeType_t compute{};
  int64_t n = 0, in = 0, out = 0;  // x [n, in], weight [out, in]
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* pre = nullptr;  // the aux buffer: GELU_AUX_BIAS writes it, DGELU reads it
  void* y = nullptr;
  int32_t sm_target = 0;  // Note [GEMM SM margin]

  bool has_aux() const {
    return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU;
  }
  bool has_bias() const { return epilogue != CUBLASLT_EPILOGUE_DGELU; }
  // DGELU multiplies by the weight as stored, [in, out] (Note [GELU gradient
  // epilogue]); the others by its transpose, the weight being [out, in].
  bool weight_as_stored() const { return epilogue == CUBLASLT_EPILOGUE_DGELU; }

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
            alignment_of(y),
            sm_target};
  }
};

// Sets a descriptor attribute, reporting whether cuBLASLt accepted it.
template <class T>
bool set_desc_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& v) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
}

bool set_epilogue_pointers(const EpiloguePlan& plan, const EpilogueProblem& p) {
  return (!p.has_bias() || set_desc_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias)) &&
         (!p.has_aux() || set_desc_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.pre));
}

// The plan of one epilogue problem. Anything cuBLASLt refuses leaves it
// unusable (the caller falls back) rather than failing the op.
std::unique_ptr<EpiloguePlan> build_epilogue_plan(cublasLtHandle_t handle,
                                                  const EpilogueProblem& p) {
  auto plan = std::make_unique<EpiloguePlan>();
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, p.compute, CUDA_R_32F));
  plan->a = p.weight_as_stored() ? make_layout(p.type, p.out, p.in, p.out, 1, 0)
                                 : make_layout(p.type, p.in, p.out, p.in, 1, 0);
  plan->b = make_layout(p.type, p.in, p.n, p.in, 1, 0);
  plan->c = make_layout(p.type, p.out, p.n, p.out, 1, 0);
  const int32_t transa = p.weight_as_stored() ? CUBLAS_OP_N : CUBLAS_OP_T, transb = CUBLAS_OP_N;
  const int64_t aux_ld = p.out;
  bool ok =
      set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, transa) &&
      set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, transb) &&
      set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue) &&
      cublaslt::set_sm_count_target(plan->op, p.sm_target) &&
      (!p.has_aux() || set_desc_attr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld)) &&
      set_epilogue_pointers(*plan, p);
  if (!ok) return plan;

  plan->usable =
      cublaslt::heuristic_algo(handle, plan->op, plan->a, plan->b, plan->c, alignment_of(p.weight),
                               alignment_of(p.x), alignment_of(p.y), &plan->algo);
  return plan;
}

// The problem of y = epilogue(x @ weight^T + bias) on y's device (for DGELU,
// y = (x @ weight) * gelu'(pre), no bias), or false when no epilogue can take
// it (a dtype cuBLASLt has no epilogue for here, K = 0, sizes beyond 32 bits).
bool describe_epilogue(cublasLtEpilogue_t epilogue, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, const Tensor& y, EpilogueProblem* p) {
  const DType dtype = x.dtype();
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) return false;
  const int64_t n = x.size(0), in = x.size(1),
                out_features =
                    epilogue == CUBLASLT_EPILOGUE_DGELU ? weight.size(1) : weight.size(0);
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
  p->bias = bias.defined() ? bias.data_ptr() : nullptr;
  p->y = y.data_ptr();
  p->sm_target = cublaslt::sm_count_target(p->device);
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

bool gemm_dgelu(const Tensor& grad, const Tensor& weight, const Tensor& pre, const Tensor& dpre) {
  // The aux buffer's leading dimension (hidden) must be a multiple of 8.
  if (weight.size(1) % 8 != 0) return false;
  EpilogueProblem p;
  if (!describe_epilogue(CUBLASLT_EPILOGUE_DGELU, grad, weight, Tensor(), dpre, &p)) return false;
  p.pre = pre.data_ptr();
  if (prewrite_library_outputs()) dpre.fill_(0.0);  // Note [Library outputs under initcheck]
  return run_epilogue(p, "matmul_gelu_backward");
}

}  // namespace accrue::kernels::cuda
