// Packed documents as the equivalent right-padded problem: Note [Packed
// documents as padded] (kernels/attention_packed.h).
#include "accrue/kernels/attention_packed.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/indexing_backend.h"

namespace accrue::kernels {

namespace {

// The smallest of unit x {1, 2, 3, 4, 6, 8, 12, 16, ...} (the powers of two
// and, from 2 on, their 1.5 multiples) that is at least x: at most 1.5 x
// (or unit), in about 2 log2(x / unit) distinct values.
int64_t bucket(int64_t x, int64_t unit) {
  for (int64_t p = unit;; p *= 2) {
    if (p >= x) return p;
    if (p >= 2 * unit && p / 2 * 3 >= x) return p / 2 * 3;
  }
}

// dst [R, H, c] = rows[j] of x [T, H, c] (unit last strides; rows i64 [R],
// every value in [0, T) by construction, so the indexing ops' checks and
// their synchronizations are not needed): the backend's gather, into dst
// directly when it is contiguous.
void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& dst) {
  const Tensor out = dst.is_contiguous() ? dst : empty(dst.shape(), dst.dtype(), dst.device());
  IndexedDim at;
  at.lines.rank = 3;
  for (int e = 0; e < 3; ++e) {
    at.lines.sizes[e] = dst.size(e);
    at.lines.strides[e] = e == 0 ? 0 : x.stride(e);
  }
  at.stride = x.stride(0);
  at.size = x.size(0);
  at.dim = 0;
  const Tensor index = make_view(rows, dst.shape(), {rows.stride(0), 0, 0}, rows.offset());
  ACCRUE_BACKEND_CALL(x.device(), gather, x, at, index, out);
  if (!out.is_same(dst)) dst.copy_(out);
}

// The rows [T, H, c] of a [1, H, T, c] operand (a view).
Tensor rows_of(const Tensor& t) {
  return t.select(0, 0).transpose(0, 1);
}

// The rows [T, H, 1] of a [1, H, T] lse (a view).
Tensor lse_rows(const Tensor& lse) {
  return lse.select(0, 0).transpose(0, 1).unsqueeze(2);
}

// The [B, H, L, c] padded operand over a buffer of rows [B L (+ more), H, c]:
// each document's positions, then its heads, in memory (cuDNN's BSHD form,
// 16-byte aligned strides when c is a multiple of 8 in 16 bits).
Tensor padded_view(const Tensor& rows, int64_t B, int64_t L) {
  return rows.narrow(0, 0, B * L).view({B, L, rows.size(1), rows.size(2)}).transpose(1, 2);
}

Tensor to_padded(const Tensor& t, const Tensor& rows, int64_t B, int64_t L) {
  const Tensor buffer = empty({B * L, t.size(1), t.size(3)}, t.dtype(), t.device());
  gather_rows(rows_of(t), rows, buffer);
  return padded_view(buffer, B, L);
}

// lse [1, H, T] -> contiguous [B, H, L] (cuDNN's packed Stats), and back.
Tensor lse_to_padded(const Tensor& lse, const Tensor& rows, int64_t B, int64_t L) {
  const Tensor buffer = empty({B * L, lse.size(1), 1}, lse.dtype(), lse.device());
  gather_rows(lse_rows(lse), rows, buffer);
  return buffer.view({B, L, lse.size(1)}).permute({0, 2, 1}).contiguous();
}

void lse_from_padded(const Tensor& padded, const Tensor& back, const Tensor& lse) {
  const Tensor rows = padded.permute({0, 2, 1}).contiguous().view(
      {padded.size(0) * padded.size(2), padded.size(1), 1});
  gather_rows(rows, back, lse_rows(lse));
}

}  // namespace

PackedAsPadded packed_as_padded(const AttentionParams& p) {
  PackedAsPadded pp;
  if (p.cu_q_host.empty() || p.offsets_on_device) {
    pp.refusal =
        "packed documents whose offsets are on the device take the composed path in every "
        "call: inside a CUDA-graph capture they are not read back (the padded form needs "
        "them), and eager calls compute as a replay does, bit for bit (give cu_seqlens on the "
        "CPU for cuDNN)";
    return pp;
  }
  if (p.dropout_p > 0.0) {
    pp.refusal = "dropout with packed documents (its elements are numbered in the packed space)";
    return pp;
  }
  if (p.bias.defined()) {
    pp.refusal = p.bias_is_mask ? "a boolean mask with packed documents"
                                : "an additive bias with packed documents (it is not gathered "
                                  "into the padded form)";
    return pp;
  }
  const std::vector<int64_t>& cq = p.cu_q_host;
  const std::vector<int64_t>& ck = p.cu_kv_host;
  std::vector<int64_t> docs;  // the documents with queries, in order
  int64_t lq = 1, lk = 1, cheapest = -1;
  for (int64_t n = 0; n < p.n_docs; ++n) {
    const int64_t dq = cq[n + 1] - cq[n], dk = ck[n + 1] - ck[n];
    if (dq == 0) continue;
    docs.push_back(n);
    lq = std::max(lq, dq);
    lk = std::max(lk, dk);
    if (cheapest < 0 ||
        dq * dk < (cq[cheapest + 1] - cq[cheapest]) * (ck[cheapest + 1] - ck[cheapest]))
      cheapest = n;
  }
  const int64_t documents = static_cast<int64_t>(docs.size());
  // The batch filled up to its bucket with copies of the cheapest document:
  // they compute exactly what it does (so the lse gathered for them in
  // backward is theirs), and nothing of theirs is gathered back.
  const int64_t B = bucket(documents, 1);
  docs.resize(static_cast<size_t>(B), cheapest);
  const int64_t Lq = bucket(lq, kPaddedLengthQuantum);
  const int64_t Lk = bucket(lk, kPaddedLengthQuantum);

  // One host buffer, one copy to the device: seq_len_q [B], seq_len_kv [B],
  // q_rows [B Lq], kv_rows [B Lk], q_back [Tq], kv_back [Tk].
  std::vector<int64_t> h(static_cast<size_t>(2 * B + B * Lq + B * Lk + p.Tq + p.Tk), 0);
  int64_t* seq_q = h.data();
  int64_t* seq_kv = seq_q + B;
  int64_t* q_rows = seq_kv + B;
  int64_t* kv_rows = q_rows + B * Lq;
  int64_t* q_back = kv_rows + B * Lk;
  int64_t* kv_back = q_back + p.Tq;
  std::fill(kv_back, kv_back + p.Tk, B * Lk);  // keys no query sees read the zero row
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = docs[static_cast<size_t>(b)];
    const int64_t q0 = cq[n], k0 = ck[n];
    seq_q[b] = cq[n + 1] - q0;
    seq_kv[b] = ck[n + 1] - k0;
    // A padding row reads the document's first row (the packed row 0 when
    // the document has no key): finite, in bounds.
    for (int64_t r = 0; r < Lq; ++r)
      q_rows[b * Lq + r] = q0 + (r < seq_q[b] ? r : 0);
    for (int64_t r = 0; r < Lk; ++r)
      kv_rows[b * Lk + r] = seq_kv[b] == 0 ? 0 : k0 + (r < seq_kv[b] ? r : 0);
    if (b >= documents) continue;  // a copy
    for (int64_t r = 0; r < seq_q[b]; ++r)
      q_back[q0 + r] = b * Lq + r;
    for (int64_t r = 0; r < seq_kv[b]; ++r)
      kv_back[k0 + r] = b * Lk + r;
  }

  pp.params = p;
  AttentionParams& pd = pp.params;
  pd.B = B;
  pd.Tq = Lq;
  pd.Tk = Lk;
  pd.cu_q = pd.cu_kv = Tensor();
  pd.cu_q_host.clear();
  pd.cu_kv_host.clear();
  pd.n_docs = 0;

  // The empty rows of Note [Attention masks] lie at a document's first rows
  // (causal, diagonal below 0) or its last (window, past the last key).
  AttentionMaskSpec m;
  m.Tq = Lq;
  m.Tk = Lk;
  m.causal = p.causal;
  m.bottom_right = p.bottom_right;
  m.window = p.window;
  m.seq_len_q = seq_q;
  m.seq_len_kv = seq_kv;
  for (int64_t b = 0; b < B && !pp.rows_without_keys; ++b)
    for (int64_t r : {int64_t{0}, seq_q[b] - 1}) {
      const AttentionRow row = attention_row(m, b, r);
      if (row.hi <= row.lo) pp.rows_without_keys = true;
    }

  const Tensor all = from_vector(h, {static_cast<int64_t>(h.size())}, DType::i64, p.cu_q.device());
  int64_t at = 0;
  const auto next = [&](int64_t n) {
    const Tensor t = all.narrow(0, at, n);
    at += n;
    return t;
  };
  pd.seq_len_q = next(B);
  pd.seq_len_kv = next(B);
  pp.q_rows = next(B * Lq);
  pp.kv_rows = next(B * Lk);
  pp.q_back = next(p.Tq);
  pp.kv_back = next(p.Tk);
  return pp;
}

bool packed_forward_as_padded(const PackedAsPadded& pp, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse,
                              const PaddedForward& run) {
  NoGradGuard no_grad;
  const AttentionParams& pd = pp.params;
  const Tensor qp = to_padded(q, pp.q_rows, pd.B, pd.Tq);
  const Tensor kp = to_padded(k, pp.kv_rows, pd.B, pd.Tk);
  const Tensor vp = to_padded(v, pp.kv_rows, pd.B, pd.Tk);
  const Tensor out_rows = empty({pd.B * pd.Tq, pd.H, pd.dv}, out.dtype(), out.device());
  const Tensor lse_p = empty({pd.B, pd.H, pd.Tq}, lse.dtype(), lse.device());
  if (!run(qp, kp, vp, pd, padded_view(out_rows, pd.B, pd.Tq), lse_p)) return false;
  gather_rows(out_rows, pp.q_back, rows_of(out));
  lse_from_padded(lse_p, pp.q_back, lse);
  return true;
}

bool packed_backward_as_padded(const PackedAsPadded& pp, const Tensor& grad_out, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv, const PaddedBackward& run) {
  NoGradGuard no_grad;
  const AttentionParams& pd = pp.params;
  const Tensor gp = to_padded(grad_out, pp.q_rows, pd.B, pd.Tq);
  const Tensor qp = to_padded(q, pp.q_rows, pd.B, pd.Tq);
  const Tensor kp = to_padded(k, pp.kv_rows, pd.B, pd.Tk);
  const Tensor vp = to_padded(v, pp.kv_rows, pd.B, pd.Tk);
  const Tensor op = to_padded(out, pp.q_rows, pd.B, pd.Tq);
  const Tensor lse_p = lse_to_padded(lse, pp.q_rows, pd.B, pd.Tq);
  // One more row past the padded gradients of the keys: the zero row that
  // keys no query sees read back.
  const Tensor dq_rows = empty({pd.B * pd.Tq, pd.H, pd.d}, dq.dtype(), dq.device());
  const Tensor dk_rows = empty({pd.B * pd.Tk + 1, pd.Hkv, pd.d}, dk.dtype(), dk.device());
  const Tensor dv_rows = empty({pd.B * pd.Tk + 1, pd.Hkv, pd.dv}, dv.dtype(), dv.device());
  if (!run(gp, qp, kp, vp, op, lse_p, pd, padded_view(dq_rows, pd.B, pd.Tq),
           padded_view(dk_rows, pd.B, pd.Tk), padded_view(dv_rows, pd.B, pd.Tk)))
    return false;
  dk_rows.narrow(0, pd.B * pd.Tk, 1).fill_(0.0);
  dv_rows.narrow(0, pd.B * pd.Tk, 1).fill_(0.0);
  gather_rows(dq_rows, pp.q_back, rows_of(dq));
  gather_rows(dk_rows, pp.kv_back, rows_of(dk));
  gather_rows(dv_rows, pp.kv_back, rows_of(dv));
  return true;
}

}  // namespace accrue::kernels
