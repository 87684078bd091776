// The backend side of attention (kernels/attention.h): the functions that
// kernels/cpu/attention.cpp and kernels/cuda/attention.cu implement (listed
// in kernels/attention_functions.inc) and kernels/cuda/attention_cudnn.cpp
// implements, and the rules all of them share. Private to kernels/.
//
// kernels/attention.cpp has validated every tensor and chosen the path (Note
// [Attention paths]) before a backend is called: q [B, H, Tq, d], k [B, Hkv, Tk,
// d], v [B, Hkv, Tk, dv] with H a multiple of Hkv, out and grad_out [B, H, Tq,
// dv], dq/dk/dv shaped like q/k/v, all of one floating dtype on one device, any
// strides whose last is 1; lse contiguous [B, H, Tq] of the statistics dtype
// (f32, f64 for f64); every extent >= 1. The mask tensors of AttentionParams
// are on that device: lengths and offsets contiguous i64, the bias (or bool
// mask) a [B, H, Tq, Tk] view whose broadcast dims have stride 0 and whose
// last stride is 1; dbias, when defined, contiguous and shaped like the
// caller's bias ([B or 1, H or 1, Tq, Tk]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/host_device.h"
#include "accrue/core/philox.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

// One attention problem, options resolved (the scale is never defaulted here).
struct AttentionParams {
  int64_t B = 0, H = 0, Hkv = 0, Tq = 0, Tk = 0, d = 0, dv = 0;
  double scale = 1.0;
  bool causal = false;
  bool bottom_right = false;  // the diagonal's alignment (MaskAlignment)
  int64_t window = 0;         // 0: none
  double dropout_p = 0.0;
  uint64_t seed = 0;
  uint64_t offset = 0;
  Tensor seq_len_q, seq_len_kv;  // both or neither
  Tensor cu_q, cu_kv;            // both or neither; B == 1
  // Their values on the host (empty inside a CUDA-graph capture, where they
  // are not read back): what dispatch needs to run them padded (Note [Packed
  // documents as padded] in kernels/attention_packed.h).
  std::vector<int64_t> cu_q_host, cu_kv_host;
  // The caller's offsets were on the GPU (Note [Packed documents as padded]:
  // then every call takes the composed path, as a CUDA-graph capture must).
  bool offsets_on_device = false;
  int64_t n_docs = 0;
  Tensor bias;         // additive, of q's dtype, or a bool mask; [B, H, Tq, Tk] view
  Tensor bias_source;  // the caller's bias or mask, [B or 1, H or 1, Tq, Tk]
  bool bias_is_mask = false;
  int64_t group() const { return H / Hkv; }
  bool padded() const { return seq_len_q.defined(); }
  bool packed() const { return cu_q.defined(); }
};

// Note [Attention masks]
// ~~~~~~~~~~~~~~~~~~~~~~
// Which keys query row i of sequence b sees, on every path. Its sequence:
//  - packed documents: the document n with cu_q[n] <= i < cu_q[n + 1] (the
//    last such n, so empty documents are skipped); its queries start at q0 =
//    cu_q[n], Lq = cu_q[n + 1] - q0, its keys at k0 = cu_kv[n], Lk likewise;
//  - right-padded: q0 = k0 = 0, Lq = seq_len_q[b], Lk = seq_len_kv[b];
//  - else q0 = k0 = 0, Lq = Tq, Lk = Tk.
// With r = i - q0, a row r >= Lq is padding: it sees nothing. Otherwise its
// diagonal is diag = r (top-left) or r + Lk - Lq (bottom-right), and it sees
// keys k0 + c for c in [0, Lk), c <= diag when causal, c > diag - window when
// a window is set: one contiguous range [lo, hi) (AttentionRow). Within it a
// boolean mask may hide keys, and an additive bias of -inf does (the bias is
// added to the scaled score). A row that sees no key, or whose every score is
// -inf, is empty: output 0, lse -inf, and no gradient flows through it; every
// path must produce exactly that (PyTorch's math path gives such rows NaN,
// its fused paths 0: accrue follows the fused ones). Lengths and offsets are
// clamped to [0, T] here, so a bad value read on the device (dispatch checks
// them on the host) cannot index outside the tensors.
//
// Dropout on the probabilities: element (b, h, i, j) is element
// e = ((b * H + h) * Tq + i) * Tk + j of a Philox draw based at `offset`
// (Note [Philox element mapping]: block offset + e / 2, lanes of e % 2), so a
// generator that reserve()s B * H * Tq * Tk elements owns exactly these
// counters. The element is kept when its uniform, philox::uniform_float's
// 24-bit k / 2^24 for every dtype (the draw of standalone dropout, Note
// [Dropout threshold] in kernels/dropout_backend.h), is >= p; kept
// probabilities are scaled by 1 / (1 - p). CPU and GPU evaluate this same
// function (k / 2^24 and p compared in double, exactly), so their masks are
// identical, and backward regenerates the mask from (seed, offset) instead
// of saving it. lse is always the statistic of the undropped softmax.
struct AttentionMaskSpec {
  int64_t Tq = 0, Tk = 0;
  bool causal = false, bottom_right = false;
  int64_t window = 0;
  const int64_t* seq_len_q = nullptr;
  const int64_t* seq_len_kv = nullptr;
  const int64_t* cu_q = nullptr;
  const int64_t* cu_kv = nullptr;
  int64_t n_docs = 0;
};

// The keys [lo, hi) that row i of sequence b may see; lo == hi: none.
struct AttentionRow {
  int64_t lo, hi;
};

ACCRUE_HD int64_t attention_clamp(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

ACCRUE_HD AttentionRow attention_row(const AttentionMaskSpec& m, int64_t b, int64_t i) {
  int64_t q0 = 0, k0 = 0, Lq = m.Tq, Lk = m.Tk;
  if (m.cu_q) {
    int64_t lo = 0, hi = m.n_docs;  // cu_q[lo] <= i
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (m.cu_q[mid] <= i)
        lo = mid;
      else
        hi = mid;
    }
    q0 = attention_clamp(m.cu_q[lo], 0, m.Tq);
    Lq = attention_clamp(m.cu_q[lo + 1], q0, m.Tq) - q0;
    k0 = attention_clamp(m.cu_kv[lo], 0, m.Tk);
    Lk = attention_clamp(m.cu_kv[lo + 1], k0, m.Tk) - k0;
  } else if (m.seq_len_q) {
    Lq = attention_clamp(m.seq_len_q[b], 0, m.Tq);
    Lk = attention_clamp(m.seq_len_kv[b], 0, m.Tk);
  }
  const int64_t r = i - q0;
  if (r < 0 || r >= Lq) return {0, 0};
  const int64_t diag = r + (m.bottom_right ? Lk - Lq : 0);
  int64_t lo = 0, hi = Lk;
  if (m.causal && diag + 1 < hi) hi = diag + 1;
  if (m.window > 0 && diag - m.window + 1 > lo) lo = diag - m.window + 1;
  if (hi <= lo) return {0, 0};
  return {k0 + lo, k0 + hi};
}

// The spec of p, its pointers into p's tensors (valid on their device).
inline AttentionMaskSpec attention_mask_spec(const AttentionParams& p) {
  AttentionMaskSpec m;
  m.Tq = p.Tq;
  m.Tk = p.Tk;
  m.causal = p.causal;
  m.bottom_right = p.bottom_right;
  m.window = p.window;
  if (p.padded()) {
    m.seq_len_q = static_cast<const int64_t*>(p.seq_len_q.data_ptr());
    m.seq_len_kv = static_cast<const int64_t*>(p.seq_len_kv.data_ptr());
  }
  if (p.packed()) {
    m.cu_q = static_cast<const int64_t*>(p.cu_q.data_ptr());
    m.cu_kv = static_cast<const int64_t*>(p.cu_kv.data_ptr());
    m.n_docs = p.n_docs;
  }
  return m;
}

ACCRUE_HD bool attention_keep(uint64_t seed, uint64_t offset, int64_t element, double p) {
  uint32_t a, b;
  philox::element_bits(seed, offset, element, &a, &b);
  return static_cast<double>(philox::uniform_float(a)) >= p;
}

}  // namespace accrue::kernels

// ---- the backends ---------------------------------------------------------------------------

namespace accrue::kernels::cpu {
#include "accrue/kernels/attention_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/attention_functions.inc"
}  // namespace accrue::kernels::cuda

namespace accrue::kernels {

// cuDNN's fused flash attention (built only with the cuDNN frontend): a third
// path beside the backends' own, which kernels/attention.cpp chooses by the
// call rather than the device: bf16/f16 on CUDA, no dropout, and the layouts
// Note [Attention paths] admits. Same contract as the backend functions,
// except that cuDNN may refuse a graph (a combination its engines do not
// serve): then nothing is written, the functions return false and *why says
// what cuDNN said, and the caller takes the composed path.
namespace cudnn {
// Whether the device can run cuDNN's fused attention (compute capability 8.0+).
bool device_supported(int device);
// The attention handle of `stream` made now (kernels::prepare_stream).
void prepare_attention_stream(int device, StreamHandle stream);
bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       const Tensor& out, const Tensor& lse, std::string* why);
bool attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionParams& p,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias,
                        std::string* why);
}  // namespace cudnn

}  // namespace accrue::kernels
