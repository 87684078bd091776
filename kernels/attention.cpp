// The dispatch point of attention (kernels/attention.h): validate, allocate,
// choose the path, call the backend (kernels/attention_backend.h).
//
// Note [Attention paths]
// ~~~~~~~~~~~~~~~~~~~~~~
// Three implementations, one contract:
//  - CPU: the reference (kernels/cpu/attention.cpp), every dtype, sums in double.
//  - cuDNN (kernels/cuda/attention_cudnn.cpp): fused flash attention for
//    bf16/f16 on CUDA, taken when accrue was built with the cuDNN frontend,
//    dropout_p == 0, the device has compute capability 8.0+ and cuDNN is
//    9.5.1 or newer (cudnn::device_supported says why), dv == d, a multiple
//    of 8 up to 128 (what cuDNN 9 serves forward and backward on every
//    architecture), not Tq == Tk == 1 (no backward engine), no boolean mask
//    (cuDNN's bias cannot be boolean), and every operand (q, k, v, out, an
//    additive bias; in backward also grad_out, dq, dk, dv) starts on a
//    16-byte boundary with the strides of its non-unit dims nonzero
//    multiples of 16 bytes, and lse starts on one (the frontend's tensor
//    alignment: its kernels move 16-byte vectors). GPT-2's packed qkv views
//    meet this whenever d % 8 == 0. Grouped-query heads, both alignments of
//    the causal mask, the sliding window, per-sequence lengths (its padding
//    mask) and the additive bias (and its gradient) go to cuDNN as they are.
//    Packed documents go as their padded form (Note [Packed documents as
//    padded] in kernels/attention_packed.h), which the rules above then
//    judge: one padded sequence per document, at the cost of a gather of q,
//    k, v in and of out and lse back (in backward, of grad_out, q, k, v,
//    out, lse in and of dq, dk, dv back); only with offsets given on the CPU
//    (device offsets, which a CUDA graph needs, take the composed path in
//    every call, so eager and replay agree bit for bit), not with a bias or mask, or where a
//    document has query rows that see no key. Where cuDNN's validation or
//    support check still refuses the graph (its engines do not serve every
//    combination), the call takes the composed path, on the call as it was.
//  - composed (kernels/cuda/attention.cu): everything else on CUDA: f32
//    (true fp32 unless TF32 is allowed), f64, bf16/f16 without cuDNN, any
//    dropout, unaligned views, boolean masks, what cuDNN refuses.
// A bf16/f16 CUDA call that cuDNN does not take says so once per distinct
// reason on stderr (the shape and why), and last_attention_refusal() keeps
// the reason of the thread's last call; last_attention_path() says which
// path it took, so tests assert that cuDNN really ran.
// Dropout always takes the composed path: its mask must be accrue's Philox
// stream (Note [Attention masks] in kernels/attention_backend.h), identical
// on the CPU, and cuDNN draws its own. ACCRUE_ATTENTION_COMPOSED=1 in the
// environment sends every call to the composed path (and makes
// cudnn_attention_available() false; set_cudnn_attention(false) does the
// same from code, and its true undoes only itself): compute-sanitizer's synccheck aborts
// cuDNN's flash-attention backward and racecheck spends minutes in its
// forward, so tools/gpu_check.sh sets it for its synccheck and racecheck runs
// (Note [Sanitizer exclusions]); unset, it costs one cached getenv per call.
//
// The paths are interchangeable per call, forward and backward: lse is the
// same quantity on all of them, the natural-log log-sum-exp of the scaled,
// biased, masked scores of each query row, max + log(sum(exp(s - max))), and
// -inf for an empty row. That is exactly cuDNN's Stats output (fp32 [B, H,
// Tq, 1], natural log unless stats_use_log2 is set, which accrue never does),
// whose packed layout is that of accrue's contiguous [B, H, Tq] lse; padding
// rows, which cuDNN skips, are set to 0 output and -inf after it. So a
// backward may take another path than its forward (say, a gradient view that
// is not 16-byte aligned) and still consume the forward's lse.
//
// Lengths and document offsets are checked on the host (a tensor on the
// device is read back: one synchronization per call; inside a CUDA-graph
// capture it is not, and one on the CPU is refused there). The kernels clamp
// them (Note [Attention masks]), so an unchecked bad value never reads out of
// bounds.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "accrue/core/cuda_graph.h"
#include "accrue/core/env_flag.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/attention.h"
#include "accrue/kernels/attention_backend.h"
#include "accrue/kernels/attention_packed.h"
#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

constexpr const char* kForward = "scaled_dot_product_attention";
constexpr const char* kBackward = "scaled_dot_product_attention_backward";

thread_local AttentionPath t_last_path = AttentionPath::none;
std::atomic<bool> g_cudnn_enabled{true};
thread_local std::string t_last_refusal;

// ---- validation -------------------------------------------------------------

void check_rank4(const Tensor& t, const char* op, const char* what, const char* layout) {
  ACCRUE_CHECK(t.dim() == 4, op, ": ", what, " must be 4-D ", layout, ", got shape ",
               shape_str(t.shape()));
}

void check_like(const Tensor& t, const Tensor& q, const Shape& shape, const char* op,
                const char* what) {
  check_defined(t, op, what);
  ACCRUE_CHECK(t.device() == q.device(), op, ": ", what, " is on ", t.device().str(),
               " but q is on ", q.device().str());
  ACCRUE_CHECK(t.dtype() == q.dtype(), op, ": ", what, " has dtype ", dtype_name(t.dtype()),
               " but q has dtype ", dtype_name(q.dtype()));
  ACCRUE_CHECK(t.shape() == shape, op, ": ", what, " of shape ", shape_str(t.shape()),
               " does not match the expected ", shape_str(shape));
  check_unit_last_stride(t, op, what);
}

// The statistics dtype: f32, or f64 for f64 inputs.
DType stats_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

void check_lse(const Tensor& lse, const Tensor& q, const Shape& shape, const char* op) {
  check_defined(lse, op, "lse");
  ACCRUE_CHECK(lse.device() == q.device(), op, ": lse is on ", lse.device().str(), " but q is on ",
               q.device().str());
  ACCRUE_CHECK(lse.dtype() == stats_dtype(q.dtype()), op, ": lse has dtype ",
               dtype_name(lse.dtype()), "; expected ", dtype_name(stats_dtype(q.dtype())), " for ",
               dtype_name(q.dtype()), " inputs");
  ACCRUE_CHECK(lse.shape() == shape, op, ": lse of shape ", shape_str(lse.shape()),
               " does not match the expected ", shape_str(shape));
  check_contiguous(lse, op, "lse");
}

// An i64 vector option (lengths, offsets) of `n` entries, on the CPU or q's
// device: its values on the host, and the tensor on q's device, contiguous.
// Inside a CUDA-graph capture a device tensor is not read back (its values
// are then unchecked; the kernels clamp them) and a host one is refused (its
// copy could not be replayed with new values).
std::vector<int64_t> index_vector(const Tensor& t, int64_t n, const Tensor& q, const char* op,
                                  const char* what, Tensor* on_device) {
  ACCRUE_CHECK(t.dtype() == DType::i64, op, ": ", what, " has dtype ", dtype_name(t.dtype()),
               "; expected i64 (convert it with ", what, ".to(DType::i64))");
  ACCRUE_CHECK(t.dim() == 1 && t.size(0) == n, op, ": ", what, " of shape ", shape_str(t.shape()),
               " must be [", n, "]");
  ACCRUE_CHECK(t.device().is_cpu() || t.device() == q.device(), op, ": ", what, " is on ",
               t.device().str(), "; expected the CPU or q's device ", q.device().str());
  if (graph_capturing() && t.device() != q.device())
    refuse_in_graph(detail::str_cat(op, ": ", what, " on the CPU inside a CUDA graph (put it on ",
                                    q.device().str(), ")"));
  *on_device = t.device() == q.device() ? t.contiguous() : t.to(q.device()).contiguous();
  if (graph_capturing() && t.device().is_cuda()) return {};
  return t.to_vector<int64_t>();
}

void check_lengths(const std::vector<int64_t>& len, int64_t T, const char* op, const char* what) {
  for (size_t b = 0; b < len.size(); ++b)
    ACCRUE_CHECK(len[b] >= 0 && len[b] <= T, op, ": ", what, "[", b, "] = ", len[b],
                 " lies outside [0, ", T, "]");
}

void check_offsets(const std::vector<int64_t>& cu, int64_t T, const char* op, const char* what) {
  if (cu.empty()) return;  // not read back inside a capture
  ACCRUE_CHECK(cu.front() == 0, op, ": ", what, "[0] = ", cu.front(), " must be 0");
  ACCRUE_CHECK(cu.back() == T, op, ": ", what, "[", cu.size() - 1, "] = ", cu.back(),
               " must be the packed length ", T);
  for (size_t n = 1; n < cu.size(); ++n)
    ACCRUE_CHECK(cu[n] >= cu[n - 1], op, ": ", what, " decreases at ", n, " (", cu[n - 1], " then ",
                 cu[n], ")");
}

// The bias or mask as the [B, H, Tq, Tk] view the backends take (stride 0
// over its broadcast dims).
Tensor check_bias(const Tensor& t, const Tensor& q, const AttentionParams& p, bool is_mask,
                  const char* op) {
  const char* what = is_mask ? "mask" : "bias";
  ACCRUE_CHECK(t.dim() == 4, op, ": ", what, " must be 4-D [B or 1, H or 1, Tq, Tk], got shape ",
               shape_str(t.shape()));
  ACCRUE_CHECK((t.size(0) == p.B || t.size(0) == 1) && (t.size(1) == p.H || t.size(1) == 1) &&
                   t.size(2) == p.Tq && t.size(3) == p.Tk,
               op, ": ", what, " of shape ", shape_str(t.shape()), " does not broadcast to [B, H, ",
               "Tq, Tk] = ", shape_str({p.B, p.H, p.Tq, p.Tk}));
  ACCRUE_CHECK(t.device() == q.device(), op, ": ", what, " is on ", t.device().str(),
               " but q is on ", q.device().str());
  if (is_mask) {
    ACCRUE_CHECK(t.dtype() == DType::boolean, op, ": mask has dtype ", dtype_name(t.dtype()),
                 "; expected bool (true where the query may attend); an additive one is a bias");
  } else {
    ACCRUE_CHECK(t.dtype() == q.dtype(), op, ": bias has dtype ", dtype_name(t.dtype()),
                 " but q has dtype ", dtype_name(q.dtype()),
                 " (convert it with bias.to(DType::", dtype_enum_name(q.dtype()), "))");
  }
  check_unit_last_stride(t, op, what);
  return make_view(t, {p.B, p.H, p.Tq, p.Tk},
                   {t.size(0) == 1 ? 0 : t.stride(0), t.size(1) == 1 ? 0 : t.stride(1), t.stride(2),
                    t.stride(3)},
                   t.offset());
}

// Validates q, k, v and the options; returns the problem with the scale resolved.
AttentionParams check_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& o, const char* op) {
  check_defined(q, op, "q");
  check_defined(k, op, "k");
  check_defined(v, op, "v");
  check_rank4(q, op, "q", "[B, Hq, Tq, d]");
  check_rank4(k, op, "k", "[B, Hkv, Tk, d]");
  check_rank4(v, op, "v", "[B, Hkv, Tk, dv]");
  check_floating(q, op, "q");
  for (const Tensor* t : {&k, &v}) {
    const char* what = t == &k ? "k" : "v";
    ACCRUE_CHECK(t->device() == q.device(), op, ": devices of q (", q.device().str(), ") and ",
                 what, " (", t->device().str(), ") differ");
    ACCRUE_CHECK(t->dtype() == q.dtype(), op, ": dtypes of q (", dtype_name(q.dtype()), ") and ",
                 what, " (", dtype_name(t->dtype()), ") differ");
    ACCRUE_CHECK(t->size(0) == q.size(0), op, ": q of shape ", shape_str(q.shape()), " and ", what,
                 " of shape ", shape_str(t->shape()), " differ in the batch B");
  }
  ACCRUE_CHECK(k.size(1) == v.size(1), op, ": k of shape ", shape_str(k.shape()),
               " and v of shape ", shape_str(v.shape()), " differ in the kv heads Hkv");
  ACCRUE_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, op, ": q has ", q.size(1),
               " heads and k and v have ", k.size(1), " (q ", shape_str(q.shape()), ", k ",
               shape_str(k.shape()), "): grouped-query attention needs the query heads a ",
               "multiple of the kv heads");
  ACCRUE_CHECK(k.size(3) == q.size(3), op, ": q of shape ", shape_str(q.shape()),
               " and k of shape ", shape_str(k.shape()), " differ in the head dim d");
  ACCRUE_CHECK(v.size(2) == k.size(2), op, ": k of shape ", shape_str(k.shape()),
               " and v of shape ", shape_str(v.shape()), " differ in the key count Tk");
  ACCRUE_CHECK(q.size(3) >= 1 && v.size(3) >= 1 && k.size(2) >= 1, op,
               ": needs d >= 1, dv >= 1 and at least one key, got q ", shape_str(q.shape()), ", k ",
               shape_str(k.shape()), ", v ", shape_str(v.shape()));
  check_unit_last_stride(q, op, "q");
  check_unit_last_stride(k, op, "k");
  check_unit_last_stride(v, op, "v");
  ACCRUE_CHECK(o.dropout_p() >= 0.0 && o.dropout_p() < 1.0, op, ": dropout_p = ", o.dropout_p(),
               " must lie in [0, 1)");
  ACCRUE_CHECK(!o.get_scale() || std::isfinite(*o.get_scale()), op,
               ": scale = ", o.get_scale().value_or(0.0), " is not finite");
  ACCRUE_CHECK(o.get_window() >= 0, op, ": window = ", o.get_window(),
               " must be >= 0 (0: no window)");

  AttentionParams p;
  p.B = q.size(0);
  p.H = q.size(1);
  p.Hkv = k.size(1);
  p.Tq = q.size(2);
  p.Tk = k.size(2);
  p.d = q.size(3);
  p.dv = v.size(3);
  p.scale = o.get_scale() ? *o.get_scale() : 1.0 / std::sqrt(static_cast<double>(p.d));
  p.causal = o.is_causal();
  p.bottom_right = o.get_alignment() == MaskAlignment::bottom_right;
  p.window = o.get_window();
  p.dropout_p = o.dropout_p();
  p.seed = o.seed();
  p.offset = o.offset();

  ACCRUE_CHECK(!o.seq_len_kv().defined() || o.seq_len_q().defined(), op,
               ": seq_len_kv is set without seq_len_q");
  ACCRUE_CHECK(!o.cu_seqlens_kv().defined() || o.cu_seqlens_q().defined(), op,
               ": cu_seqlens_kv is set without cu_seqlens_q");
  ACCRUE_CHECK(!(o.seq_len_q().defined() && o.cu_seqlens_q().defined()), op,
               ": sequence lengths (padded batches) and document offsets (packed documents) ",
               "are exclusive; give one");
  if (o.seq_len_q().defined()) {
    const Tensor& lkv = o.seq_len_kv().defined() ? o.seq_len_kv() : o.seq_len_q();
    ACCRUE_CHECK(o.seq_len_kv().defined() || p.Tq == p.Tk, op, ": seq_len_kv must be given when ",
                 "Tq = ", p.Tq, " differs from Tk = ", p.Tk);
    check_lengths(index_vector(o.seq_len_q(), p.B, q, op, "seq_len_q", &p.seq_len_q), p.Tq, op,
                  "seq_len_q");
    check_lengths(index_vector(lkv, p.B, q, op, "seq_len_kv", &p.seq_len_kv), p.Tk, op,
                  "seq_len_kv");
  }
  if (o.cu_seqlens_q().defined()) {
    ACCRUE_CHECK(p.B == 1, op, ": packed documents (cu_seqlens) need B = 1, got q ",
                 shape_str(q.shape()));
    const Tensor& ckv = o.cu_seqlens_kv().defined() ? o.cu_seqlens_kv() : o.cu_seqlens_q();
    const int64_t n = o.cu_seqlens_q().dim() == 1 ? o.cu_seqlens_q().size(0) : 0;
    ACCRUE_CHECK(n >= 2, op, ": cu_seqlens_q of shape ", shape_str(o.cu_seqlens_q().shape()),
                 " must be [N + 1] with N >= 1 documents");
    p.cu_q_host = index_vector(o.cu_seqlens_q(), n, q, op, "cu_seqlens_q", &p.cu_q);
    p.cu_kv_host = index_vector(ckv, n, q, op, "cu_seqlens_kv", &p.cu_kv);
    check_offsets(p.cu_q_host, p.Tq, op, "cu_seqlens_q");
    check_offsets(p.cu_kv_host, p.Tk, op, "cu_seqlens_kv");
    p.n_docs = n - 1;
    p.offsets_on_device = o.cu_seqlens_q().device().is_cuda();
  }
  // Both alignments are one mask when every sequence has Tq == Tk queries
  // and keys; top-left is the form cuDNN serves best (GPT-2's self-attention).
  if (p.Tq == p.Tk && !p.padded() && !p.packed()) p.bottom_right = false;
  ACCRUE_CHECK(!(o.get_bias().defined() && o.get_mask().defined()), op,
               ": give an additive bias or a boolean mask, not both (fold the mask into the bias ",
               "as -inf)");
  if (o.get_bias().defined()) {
    p.bias = check_bias(o.get_bias(), q, p, false, op);
    p.bias_source = o.get_bias();
  }
  if (o.get_mask().defined()) {
    p.bias = check_bias(o.get_mask(), q, p, true, op);
    p.bias_source = o.get_mask();
    p.bias_is_mask = true;
  }
  return p;
}

// ---- path choice --------------------------------------------------------------

#ifdef ACCRUE_WITH_CUDNN_FRONTEND
std::string describe(const AttentionParams& p, DType dtype) {
  std::string s = detail::str_cat(dtype_name(dtype), " B=", p.B, " Hq=", p.H, " Hkv=", p.Hkv,
                                  " Tq=", p.Tq, " Tk=", p.Tk, " d=", p.d, " dv=", p.dv);
  if (p.causal) s += p.bottom_right ? " causal(bottom_right)" : " causal(top_left)";
  if (p.window > 0) s += detail::str_cat(" window=", p.window);
  if (p.padded()) s += " seq_lens";
  if (p.packed()) s += detail::str_cat(" documents=", p.n_docs);
  if (p.bias.defined()) s += p.bias_is_mask ? " mask" : " bias";
  return s;
}

// Note [Attention paths]: once per distinct message.
void refuse(const AttentionParams& p, DType dtype, const char* op, const std::string& why) {
  t_last_refusal = why;
  const std::string line =
      detail::str_cat("accrue: ", op, ": cuDNN does not take ", describe(p, dtype), ": ", why,
                      "; using the composed path");
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(line).second) std::cerr << line << " (said once)\n";
}

// ACCRUE_ATTENTION_COMPOSED=1 (Note [Attention paths]), read once, or
// set_cudnn_attention(false).
bool composed_forced() {
  static const bool forced = env_flag("ACCRUE_ATTENTION_COMPOSED");
  return forced || !g_cudnn_enabled.load(std::memory_order_relaxed);
}

// cuDNN's operand alignment (Note [Attention paths]).
bool cudnn_aligned(const Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(element_size(t.dtype()));
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int64_t i = 0; i < 3; ++i)
    if (t.size(i) > 1 && (t.stride(i) == 0 || (t.stride(i) * bytes) % 16 != 0)) return false;
  return true;
}

// Whether the call is one cuDNN could take at all (bf16/f16 on CUDA).
bool cudnn_candidate(const Tensor& q) {
  return q.device().is_cuda() && !composed_forced() &&
         (q.dtype() == DType::bf16 || q.dtype() == DType::f16);
}

// Why cuDNN cannot take a candidate problem, from its options and extents
// alone; empty when it may. dbias: whether the bias wants its gradient.
std::string problem_refusal(const AttentionParams& p, bool dbias) {
  if (p.dropout_p > 0.0) return "dropout must follow accrue's Philox stream";
  if (p.d % 8 != 0 || p.d > 128 || p.dv != p.d)
    return detail::str_cat("head dims d = ", p.d, ", dv = ", p.dv,
                           " (cuDNN needs dv == d, a multiple of 8 up to 128)");
  if (p.bias_is_mask) return "cuDNN's bias cannot be boolean (give an additive bias)";
  if (p.packed()) return "";  // its padded form is judged (Note [Packed documents as padded])
  if (p.Tq == 1 && p.Tk == 1) return "Tq = Tk = 1 has no cuDNN backward engine";
  // The forward graph's validation refuses this; the backward's does not, but
  // the backward must take the path its forward took (rows without keys).
  if (p.causal && p.bottom_right && p.Tq > p.Tk)
    return detail::str_cat("bottom-right causal with Tq = ", p.Tq, " > Tk = ", p.Tk,
                           " (rows without keys)");
  if (dbias && p.padded())
    return "the bias gradient with sequence lengths (cuDNN does not define it as 0 at padding)";
  return "";
}

// Why cuDNN cannot take the operands (every [B, H, T, d] tensor of the call)
// and lse; empty when it may.
std::string operand_refusal(const std::vector<const Tensor*>& operands, const Tensor& lse,
                            const AttentionParams& p) {
  const Tensor& bias = p.bias_source;
  for (const Tensor* t : operands)
    if (!cudnn_aligned(*t))
      return detail::str_cat("an operand of strides ", shape_str(t->strides()),
                             " is not 16-byte aligned");
  if (bias.defined() && !cudnn_aligned(bias))
    return detail::str_cat("the bias of strides ", shape_str(bias.strides()),
                           " is not 16-byte aligned (Tk a multiple of 8 makes it so)");
  if (reinterpret_cast<uintptr_t>(lse.data_ptr()) % 16 != 0) return "lse is not 16-byte aligned";
  return "";
}

std::string device_refusal(const Tensor& q) {
  if (!cudnn::device_supported(q.device().index))
    return "the device or the cuDNN version cannot run fused attention (compute capability 8.0+ "
           "and cuDNN 9.5.1+, not 9.10.0/9.10.1)";
  return "";
}

// Packed documents on cuDNN (Note [Packed documents as padded]): their padded
// form, or why they have none that cuDNN takes (*why).
PackedAsPadded cudnn_padded_form(const AttentionParams& p, std::string* why) {
  PackedAsPadded pp = packed_as_padded(p);
  *why = pp.refusal;
  if (why->empty() && pp.rows_without_keys)
    *why =
        "a document has query rows that see no key (cuDNN's padding mask does not define "
        "them as empty)";
  if (why->empty()) *why = problem_refusal(pp.params, false);
  return pp;
}

bool cudnn_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                   const Tensor& out, const Tensor& lse, std::string* why) {
  // x: the problem run, the padded form or the call itself.
  const auto run = [why](const Tensor& qx, const Tensor& kx, const Tensor& vx,
                         const AttentionParams& px, const Tensor& outx, const Tensor& lsex) {
    *why = operand_refusal({&qx, &kx, &vx, &outx}, lsex, px);
    return why->empty() && cudnn::attention_forward(qx, kx, vx, px, outx, lsex, why);
  };
  *why = problem_refusal(p, false);
  if (why->empty()) *why = device_refusal(q);
  if (!why->empty()) return false;
  if (!p.packed()) return run(q, k, v, p, out, lse);
  const PackedAsPadded pp = cudnn_padded_form(p, why);
  return why->empty() && packed_forward_as_padded(pp, q, k, v, out, lse, run);
}

bool cudnn_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& out, const Tensor& lse, const AttentionParams& p,
                    const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias,
                    std::string* why) {
  // x: the problem run, the padded form or the call itself.
  const auto run = [why, &dbias](const Tensor& gx, const Tensor& qx, const Tensor& kx,
                                 const Tensor& vx, const Tensor& outx, const Tensor& lsex,
                                 const AttentionParams& px, const Tensor& dqx, const Tensor& dkx,
                                 const Tensor& dvx) {
    *why = operand_refusal({&qx, &kx, &vx, &outx, &gx, &dqx, &dkx, &dvx}, lsex, px);
    return why->empty() &&
           cudnn::attention_backward(gx, qx, kx, vx, outx, lsex, px, dqx, dkx, dvx, dbias, why);
  };
  *why = problem_refusal(p, dbias.defined());
  if (why->empty()) *why = device_refusal(q);
  if (!why->empty()) return false;
  if (!p.packed()) return run(g, q, k, v, out, lse, p, dq, dk, dv);
  const PackedAsPadded pp = cudnn_padded_form(p, why);
  return why->empty() && packed_backward_as_padded(pp, g, q, k, v, out, lse, dq, dk, dv, run);
}
#endif

// The path of Note [Attention paths]: cuDNN where it takes the call, else
// the backend of the device (with packed documents, on the packed problem
// itself, whatever cuDNN refused).
void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                 const Tensor& out, const Tensor& lse) {
  t_last_refusal.clear();
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  if (cudnn_candidate(q)) {
    std::string why;
    if (cudnn_forward(q, k, v, p, out, lse, &why)) {
      t_last_path = AttentionPath::cudnn;
      return;
    }
    refuse(p, q.dtype(), kForward, why);
  }
#endif
  t_last_path = q.device().is_cuda() ? AttentionPath::composed : AttentionPath::cpu;
  ACCRUE_BACKEND_CALL(q.device(), attention_forward, q, k, v, p, out, lse);
}

void run_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse, const AttentionParams& p, const Tensor& dq,
                  const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  t_last_refusal.clear();
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  if (cudnn_candidate(q)) {
    std::string why;
    if (cudnn_backward(g, q, k, v, out, lse, p, dq, dk, dv, dbias, &why)) {
      t_last_path = AttentionPath::cudnn;
      return;
    }
    refuse(p, q.dtype(), kBackward, why);
  }
#endif
  t_last_path = q.device().is_cuda() ? AttentionPath::composed : AttentionPath::cpu;
  ACCRUE_BACKEND_CALL(q.device(), attention_backward, g, q, k, v, out, lse, p, dq, dk, dv, dbias);
}

}  // namespace

AttentionParams attention_params(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionOptions& options) {
  return check_inputs(q, k, v, options, kForward);
}

const char* alignment_name(MaskAlignment a) {
  return a == MaskAlignment::top_left ? "top_left" : "bottom_right";
}

const char* attention_path_name(AttentionPath p) {
  switch (p) {
    case AttentionPath::cpu:
      return "cpu";
    case AttentionPath::composed:
      return "composed";
    case AttentionPath::cudnn:
      return "cudnn";
    case AttentionPath::none:
      break;
  }
  return "none";
}

AttentionPath last_attention_path() {
  return t_last_path;
}

const std::string& last_attention_refusal() {
  return t_last_refusal;
}

void set_cudnn_attention(bool enabled) {
  g_cudnn_enabled.store(enabled, std::memory_order_relaxed);
}

bool cudnn_attention_available() {
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  return !composed_forced();
#else
  return false;
#endif
}

void attention_into(const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionOptions& options, const Tensor& out, const Tensor& lse) {
  NoGradGuard no_grad;
  const AttentionParams p = check_inputs(q, k, v, options, kForward);
  check_like(out, q, {p.B, p.H, p.Tq, p.dv}, kForward, "out");
  check_lse(lse, q, {p.B, p.H, p.Tq}, kForward);
  if (p.B * p.H * p.Tq == 0) return;
  run_forward(q, k, v, p, out, lse);
}

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionOptions& options) {
  NoGradGuard no_grad;
  const AttentionParams p = check_inputs(q, k, v, options, kForward);
  // [B, Tq, H, dv] in memory, so that out.transpose(1, 2) is contiguous.
  AttentionResult r{empty({p.B, p.Tq, p.H, p.dv}, q.dtype(), q.device()).transpose(1, 2),
                    empty({p.B, p.H, p.Tq}, stats_dtype(q.dtype()), q.device())};
  attention_into(q, k, v, options, r.out, r.lse);
  return r;
}

void attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionOptions& options, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& dbias) {
  NoGradGuard no_grad;
  const AttentionParams p = check_inputs(q, k, v, options, kBackward);
  const Shape out_shape{p.B, p.H, p.Tq, p.dv};
  check_like(grad_out, q, out_shape, kBackward, "grad_out");
  check_like(out, q, out_shape, kBackward, "out");
  check_lse(lse, q, {p.B, p.H, p.Tq}, kBackward);
  check_like(dq, q, q.shape(), kBackward, "dq");
  check_like(dk, q, k.shape(), kBackward, "dk");
  check_like(dv, q, v.shape(), kBackward, "dv");
  if (dbias.defined()) {
    ACCRUE_CHECK(options.get_bias().defined(), kBackward,
                 ": dbias is given but the call has no additive bias");
    check_like(dbias, q, options.get_bias().shape(), kBackward, "dbias");
    check_contiguous(dbias, kBackward, "dbias");
  }
  if (p.B * p.H == 0) return;
  if (p.Tq == 0) {
    // No query: nothing flows to the keys, values and bias.
    Tensor(dk).fill_(0.0);
    Tensor(dv).fill_(0.0);
    if (dbias.defined()) Tensor(dbias).fill_(0.0);
    return;
  }
  run_backward(grad_out, q, k, v, out, lse, p, dq, dk, dv, dbias);
}

}  // namespace accrue::kernels
