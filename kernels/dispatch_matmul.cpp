// Dispatch of the matrix products of kernels/ops.h: 3-D gemm views of the
// operands (see Note [Dispatch shapes]).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels {

// The shared checks and shaping of kernels/dispatch_util.h.
using namespace dispatch_util;

namespace {

std::atomic<bool> g_allow_tf32{false};

// A [B, R, C] view of `t` (shape batch + [R, C], batch already broadcast)
// fit for the backends' gemm: batch dims merged into one stride, the last two
// dims row-major (stride 1 along C) or column-major (stride 1 along R) with a
// leading dimension of at least the other extent. Size-1 dims get canonical
// strides, since their stride is never used but a BLAS checks it.
Tensor as_gemm_operand(Tensor t) {
  const int64_t rank = t.dim();
  const int64_t r = t.size(-2), c = t.size(-1);
  const int64_t batch = shape_numel(Shape(t.shape().begin(), t.shape().end() - 2));
  auto merged_batch_stride = [&](const Tensor& x, int64_t& stride) {
    stride = 0;
    int64_t expected = -1;
    for (int64_t d = rank - 3; d >= 0; --d) {
      if (x.shape()[d] == 1) continue;
      if (expected < 0) {
        stride = x.strides()[d];
      } else if (x.strides()[d] != expected) {
        return false;
      }
      expected = x.strides()[d] * x.shape()[d];
    }
    return true;
  };
  int64_t sb = 0;
  if (!merged_batch_stride(t, sb)) {
    t = t.contiguous();
    merged_batch_stride(t, sb);
  }
  int64_t sr = t.strides()[rank - 2], sc = t.strides()[rank - 1];
  const bool row_major = (c == 1 || sc == 1) && (r == 1 || sr >= std::max<int64_t>(c, 1));
  const bool col_major = (r == 1 || sr == 1) && (c == 1 || sc >= std::max<int64_t>(r, 1));
  if (row_major) {
    sc = 1;
    if (r == 1) sr = std::max<int64_t>(c, 1);
  } else if (col_major) {
    sr = 1;
    if (c == 1) sc = std::max<int64_t>(r, 1);
  } else {
    // Neither layout (e.g. a narrowed stride-2 view or expanded rows): copy.
    Tensor dense = make_view(t, {batch, r, c}, {sb, sr, sc}, t.offset()).contiguous();
    return make_view(dense, {batch, r, c}, {batch == 1 ? 0 : r * c, std::max<int64_t>(c, 1), 1},
                     dense.offset());
  }
  if (batch == 1) sb = 0;
  return make_view(t, {batch, r, c}, {sb, sr, sc}, t.offset());
}

}  // namespace

namespace {
std::mutex g_tuning_mutex;
std::optional<std::string> g_tuning_file;  // unset: ACCRUE_GEMM_TUNING decides
std::atomic<bool> g_tuning_in_process{false};
constexpr int kMarginDevices = 64;
std::array<std::atomic<int>, kMarginDevices> g_sm_margin{};  // Note [GEMM SM margin]
}  // namespace

void set_gemm_tuning_file(const std::string& path) {
  const std::lock_guard<std::mutex> lock(g_tuning_mutex);
  g_tuning_file = path;
}

void set_gemm_tuning_in_process(bool on) {
  g_tuning_in_process.store(on);
}

bool gemm_tuning_in_process() {
  return g_tuning_in_process.load();
}

void set_gemm_sm_margin(int device, int sms) {
  ACCRUE_CHECK(device >= 0 && device < kMarginDevices, "set_gemm_sm_margin: device ", device,
               " is outside [0, ", kMarginDevices, ")");
  ACCRUE_CHECK(sms >= 0 && sms < 1024, "set_gemm_sm_margin: ", sms, " SMs for device ", device,
               " is outside [0, 1024)");
  g_sm_margin[static_cast<size_t>(device)].store(sms, std::memory_order_relaxed);
}

int gemm_sm_margin(int device) {
  ACCRUE_CHECK(device >= 0 && device < kMarginDevices, "gemm_sm_margin: device ", device,
               " is outside [0, ", kMarginDevices, ")");
  return g_sm_margin[static_cast<size_t>(device)].load(std::memory_order_relaxed);
}

std::string gemm_tuning_file() {
  const std::lock_guard<std::mutex> lock(g_tuning_mutex);
  if (!g_tuning_file) {
    const char* env = std::getenv("ACCRUE_GEMM_TUNING");
    g_tuning_file = env != nullptr ? env : "";
  }
  return *g_tuning_file;
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
}
bool allow_tf32() {
  return g_allow_tf32.load();
}

// ---- matrix products ----------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  check_float_pair(a, b, "matmul", "a", "b");
  ACCRUE_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must have at least 1 dim, got ",
               shape_str(a.shape()), " @ ", shape_str(b.shape()));
  // numpy semantics: a 1-D a is a row [1, K], a 1-D b a column [K, 1], and
  // the added dim is dropped from the result.
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  ACCRUE_CHECK(b2.size(-2) == k, "matmul: inner dims differ: ", shape_str(a.shape()), " @ ",
               shape_str(b.shape()));
  const Shape batch_a(a2.shape().begin(), a2.shape().end() - 2);
  const Shape batch_b(b2.shape().begin(), b2.shape().end() - 2);
  const size_t rank = std::max(batch_a.size(), batch_b.size());
  Shape batch(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - batch_a.size() ? 1 : batch_a[i - (rank - batch_a.size())];
    const int64_t db = i < rank - batch_b.size() ? 1 : batch_b[i - (rank - batch_b.size())];
    ACCRUE_CHECK(da == db || da == 1 || db == 1, "matmul: batch dims of ", shape_str(a.shape()),
                 " and ", shape_str(b.shape()), " cannot be broadcast together");
    batch[i] = da == 1 ? db : da;
  }
  Shape result = batch;
  if (a.dim() > 1) result.push_back(m);
  if (b.dim() > 1) result.push_back(n);
  Shape full = batch;
  full.push_back(m);
  full.push_back(n);
  Tensor out = empty(full, a.dtype(), a.device());
  if (out.numel() == 0) return dense_view(out, result);
  if (k == 0) return dense_view(out.fill_(0.0), result);
  Shape shape_a = batch, shape_b = batch;
  shape_a.insert(shape_a.end(), {m, k});
  shape_b.insert(shape_b.end(), {k, n});
  const int64_t nb = shape_numel(batch);
  ACCRUE_BACKEND_CALL(a.device(), gemm, as_gemm_operand(a2.expand(shape_a)),
                      as_gemm_operand(b2.expand(shape_b)), dense_view(out, {nb, m, n}), 1.0, 0.0);
  return dense_view(out, result);
}

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& out,
          double alpha, double beta) {
  NoGradGuard no_grad;
  check_float_pair(a, b, "gemm", "a", "b");
  check_defined(out, "gemm", "out");
  check_same_device(a, out, "gemm");
  ACCRUE_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2,
               "gemm: expects 2-D a, b and out, got shapes ", shape_str(a.shape()), ", ",
               shape_str(b.shape()), " and ", shape_str(out.shape()));
  check_dtype_or_f32(out, a.dtype(), is_16_bit(a.dtype()), "gemm", "out");
  const Tensor opa = transpose_a ? a.transpose(0, 1) : a;
  const Tensor opb = transpose_b ? b.transpose(0, 1) : b;
  const int64_t m = opa.size(0), k = opa.size(1), n = opb.size(1);
  ACCRUE_CHECK(opb.size(0) == k, "gemm: inner dims differ: ", shape_str(opa.shape()), " @ ",
               shape_str(opb.shape()), " (a ", shape_str(a.shape()),
               transpose_a ? " transposed" : "", ", b ", shape_str(b.shape()),
               transpose_b ? " transposed" : "", ")");
  ACCRUE_CHECK(out.size(0) == m && out.size(1) == n, "gemm: out shape ", shape_str(out.shape()),
               " does not match ", shape_str(opa.shape()), " @ ", shape_str(opb.shape()), " = ",
               shape_str({m, n}));
  check_contiguous(out, "gemm", "out");
  if (out.numel() == 0) return;
  if (k == 0) {
    // An empty product: out = beta * out (and beta == 0 never reads out).
    if (beta == 0.0) {
      fill(out, 0.0);
    } else if (beta != 1.0) {
      Tensor(out).copy_(binary_scalar(BinaryOp::Mul, out, beta));
    }
    return;
  }
  ACCRUE_BACKEND_CALL(a.device(), gemm, as_gemm_operand(opa.unsqueeze(0)),
                      as_gemm_operand(opb.unsqueeze(0)), dense_view(out, {1, m, n}), alpha, beta);
}

}  // namespace accrue::kernels
