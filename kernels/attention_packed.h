// Packed documents (varlen) run as the equivalent right-padded problem, so
// that a path which takes padded batches (cuDNN's padding mask) takes packed
// documents too. Private to kernels/ (kernels/attention.cpp uses it; the CPU
// test runs the CPU reference through it).
//
// Note [Packed documents as padded]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A packed problem (B == 1, document n holding queries [cu_q[n], cu_q[n + 1])
// and keys [cu_kv[n], cu_kv[n + 1])) is, by Note [Attention masks], the
// right-padded problem whose sequence b is the b-th document with queries:
// its rows follow exactly the padded rules with q0 = cu_q[n], k0 = cu_kv[n]
// (the same diagonal r or r + Lk - Lq, the same window, the same scale), and
// no row of one document sees a key of another. So:
//  - its sequences are the documents with at least one query (an empty one
//    owns no row; its keys, seen by nobody, get 0 gradient), seq_len_q/kv
//    their lengths. cuDNN builds a graph per B', Tq', Tk', so these are
//    bucketed, each to at most 1.5 times what it holds (the powers of two
//    and their 1.5 multiples): Tq' and Tk' are the longest query and key
//    lengths bucketed in units of kPaddedLengthQuantum, B' the number of
//    documents bucketed, the extra sequences copies of the cheapest
//    document (whose results are dropped). A training run then builds a
//    few dozen graphs, not one per batch;
//  - q, k, v (and in backward grad_out, out, lse) are gathered into that
//    form, one row per (document, position); a padding row reads some row of
//    the packed tensor, never uninitialized memory (the padding mask ignores
//    it, but a NaN there could still reach P V through a zero probability);
//  - out, lse (in backward dq, dk, dv) are gathered back: every packed query
//    row belongs to exactly one document with queries, every packed key row
//    to one document or to none (then it reads an extra zero row).
// Its cost: one gather of q, k, v and one of out and lse in forward; of
// grad_out, q, k, v, out, lse and of the three gradients in backward; memory
// for B' Tq' query rows and B' Tk' key rows of each, B' times the longest
// document, bucketed. The offsets' host values are needed, and only offsets
// the caller gave on the CPU take this form: inside a CUDA-graph capture
// dispatch does not read device offsets back, so a call with offsets on the
// device takes the composed path eagerly too, and an eager run and a
// replayed graph of it compute alike, bit for bit (the GraphedWindow's
// property). Dropout (its Philox elements are numbered in the
// packed [Tq, Tk] space) and a bias or mask (not gathered) have none either.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "accrue/kernels/attention.h"
#include "accrue/kernels/attention_backend.h"

namespace accrue::kernels {

inline constexpr int64_t kPaddedLengthQuantum = 64;

// The validated problem of a call, as dispatch sees it (kernels/attention.cpp).
AttentionParams attention_params(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionOptions& options);

// Note [Packed documents as padded]: the padded form of a packed problem.
struct PackedAsPadded {
  // Why the problem has no padded form; when set, nothing below is.
  std::string refusal;
  // The padded problem; seq_len_q/kv on the packed problem's device.
  AttentionParams params;
  // Whether a query row of some document sees no key (an empty row of Note
  // [Attention masks]), which a fused kernel's padding mask may not give as
  // 0 output and lse -inf.
  bool rows_without_keys = false;
  // i64 on the device: the packed row each padded row reads ([B' Tq'] and
  // [B' Tk']), and the padded row each packed row is read back from ([Tq]
  // and [Tk]; B' Tk' is the zero row).
  Tensor q_rows, kv_rows, q_back, kv_back;
};
PackedAsPadded packed_as_padded(const AttentionParams& p);

// A padded problem's forward or backward on some path: false when that path
// refused it (nothing written).
using PaddedForward =
    std::function<bool(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       const Tensor& out, const Tensor& lse)>;
using PaddedBackward =
    std::function<bool(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse, const AttentionParams& p,
                       const Tensor& dq, const Tensor& dk, const Tensor& dv)>;

// The packed problem's forward (writes out and lse) or backward (writes dq,
// dk, dv) through `run` on its padded form pp (no refusal). Returns false,
// having written nothing of the caller's, when `run` does.
bool packed_forward_as_padded(const PackedAsPadded& pp, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse,
                              const PaddedForward& run);
bool packed_backward_as_padded(const PackedAsPadded& pp, const Tensor& grad_out, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv, const PaddedBackward& run);

}  // namespace accrue::kernels
