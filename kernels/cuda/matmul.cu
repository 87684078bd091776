// CUDA matrix products: batched GEMM through cuBLASLt. Its handles,
// workspaces and plans: kernels/cuda/cublaslt_state.h; the GEMMs with a bias
// (and GELU) epilogue: kernels/cuda/gemm_epilogue.cu.
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
#include <cstdint>
#include <limits>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/cublaslt_state.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

using cublaslt::alignment_of;
using cublaslt::cuda_data_type;
using cublaslt::kWorkspaceBytes;
using cublaslt::LtOperand;
using cublaslt::LtProblem;
using cublaslt::LtState;

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
  p.sm_target = cublaslt::sm_count_target(dev);  // Note [GEMM SM margin]

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

}  // namespace accrue::kernels::cuda
