// Differentiable attention: scaled_dot_product_attention (autograd/
// attention_ops.h, and the plain form of autograd/transformer_ops.h) and
// GPT-2's packed_causal_attention. Each saves q, k, v
// (for the packed form, the qkv buffer they are views of), the output and
// the softmax statistics lse, never the attention matrix; a dropout mask is
// regenerated in backward from the (seed, offset) its forward reserved (Note
// [Attention masks] in kernels/attention_backend.h).
#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/attention.h"

namespace accrue {

using autograd::record;
using autograd::saved;
using autograd::wants_grad;

namespace {

// The kernel options of one forward. With dropout, the B * H * Tq * Tk counters
// of its mask are reserved from the generator, but only once the kernel has
// accepted the inputs (`reserve_counters` is called after validation): a
// rejected call leaves the generator untouched.
kernels::AttentionOptions with_dropout(kernels::AttentionOptions k, double p, Generator* g) {
  if (p > 0.0) {
    const Generator& gen = g ? *g : default_generator();
    k.dropout(p, gen.seed(), gen.offset());  // the offset reserve() will return
  } else {
    k.dropout(p);
  }
  return k;
}

// The plain options: causal is aligned to the bottom right, as it always was
// (the same as top-left for the Tq == Tk of self-attention).
kernels::AttentionOptions kernel_options(const AttentionOptions& o) {
  kernels::AttentionOptions k;
  if (o.causal) k.causal(kernels::MaskAlignment::bottom_right);
  if (o.scale) k.scale(*o.scale);
  return with_dropout(k, o.dropout_p, o.generator);
}

void reserve_counters(double p, Generator* g, const kernels::AttentionOptions& k, int64_t n) {
  if (p <= 0.0) return;
  Generator& gen = g ? *g : default_generator();
  const uint64_t base = gen.reserve(n);
  ACCRUE_CHECK(base == k.offset(), "scaled_dot_product_attention: the generator moved from offset ",
               k.offset(), " to ", base, " during the forward");
}

// A gradient the kernels accept: unit stride in the last dim.
Tensor unit_last_stride(const Tensor& g) {
  return g.size(-1) <= 1 || g.stride(-1) == 1 ? g : g.contiguous();
}

}  // namespace

namespace {

Tensor attention_node(const Tensor& q, const Tensor& k, const Tensor& v,
                      const kernels::AttentionOptions& ko, double dropout_p, Generator* generator) {
  kernels::AttentionResult r = kernels::attention(q, k, v, ko);
  reserve_counters(dropout_p, generator, ko, q.size(0) * q.size(1) * q.size(2) * k.size(2));
  const Tensor sq = saved(q), sk = saved(k), sv = saved(v), so = saved(r.out), lse = r.lse;
  const Tensor& bias = ko.get_bias();
  // The backward's options hold the bias detached (Note [Saved tensors are detached]).
  kernels::AttentionOptions saved_options = ko;
  if (bias.defined()) saved_options.bias(saved(bias));
  const bool gq = wants_grad(q), gk = wants_grad(k), gv = wants_grad(v);
  const bool gb = bias.defined() && wants_grad(bias);
  std::vector<Tensor> inputs{q, k, v};
  if (bias.defined()) inputs.push_back(bias);
  return record(
      "ScaledDotProductAttentionBackward", r.out, inputs,
      [=](const Tensor& g) -> std::vector<Tensor> {
        Tensor dq = empty(sq.shape(), sq.dtype(), sq.device());
        Tensor dk = empty(sk.shape(), sk.dtype(), sk.device());
        Tensor dv = empty(sv.shape(), sv.dtype(), sv.device());
        const Tensor& b = saved_options.get_bias();
        Tensor db = gb ? empty(b.shape(), b.dtype(), b.device()) : Tensor();
        kernels::attention_backward_into(unit_last_stride(g), sq, sk, sv, so, lse, saved_options,
                                         dq, dk, dv, db);
        std::vector<Tensor> grads{gq ? dq : Tensor(), gk ? dk : Tensor(), gv ? dv : Tensor()};
        if (b.defined()) grads.push_back(db);
        return grads;
      });
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  return attention_node(q, k, v, kernel_options(options), options.dropout_p, options.generator);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options) {
  return attention_node(q, k, v,
                        with_dropout(options.kernel(), options.dropout_p(), options.generator()),
                        options.dropout_p(), options.generator());
}

namespace {

// Part `part` (0 q, 1 k, 2 v) of a packed [B, T, 3 * H * d] buffer (unit last
// stride) as the [B, H, T, d] view attention takes: no copy.
Tensor packed_part(const Tensor& qkv, int64_t n_head, int64_t part) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, d = C / n_head;
  return make_view(qkv, {B, n_head, T, d}, {qkv.stride(0), d, qkv.stride(1), 1},
                   qkv.offset() + part * C);
}

}  // namespace

Tensor packed_causal_attention(const Tensor& qkv, int64_t n_head, const AttentionOptions& options) {
  const char* op = "packed_causal_attention";
  ACCRUE_CHECK(qkv.defined(), op, ": qkv is an undefined tensor");
  ACCRUE_CHECK(qkv.dim() == 3, op, ": qkv must be 3-D [B, T, 3 * n_head * d], got shape ",
               shape_str(qkv.shape()));
  ACCRUE_CHECK(n_head >= 1, op, ": n_head = ", n_head, " must be >= 1");
  ACCRUE_CHECK(is_floating(qkv.dtype()), op, ": qkv of shape ", shape_str(qkv.shape()),
               " has dtype ", dtype_name(qkv.dtype()), "; expected a floating dtype");
  const int64_t width = qkv.size(2);
  ACCRUE_CHECK(width > 0 && width % (3 * n_head) == 0, op, ": the width ", width,
               " of qkv of shape ", shape_str(qkv.shape()), " is not a positive multiple of 3 * ",
               "n_head = ", 3 * n_head);
  ACCRUE_CHECK(qkv.stride(2) == 1, op, ": qkv of shape ", shape_str(qkv.shape()), " and strides ",
               shape_str(qkv.strides()), " must have stride 1 in its last dim");
  const int64_t B = qkv.size(0), T = qkv.size(1), C = width / 3;

  // The packed form is causal by definition, whatever options.causal says.
  AttentionOptions o = options;
  o.causal = true;
  const kernels::AttentionOptions ko = kernel_options(o);
  const Tensor base = detach(qkv);
  const Tensor q = packed_part(base, n_head, 0), k = packed_part(base, n_head, 1),
               v = packed_part(base, n_head, 2);
  kernels::AttentionResult r = kernels::attention(q, k, v, ko);
  reserve_counters(o.dropout_p, o.generator, ko, B * n_head * T * T);
  // r.out is [B, Tq, H, d] in memory: [B, T, C] is a view of it.
  Tensor out = make_view(r.out, {B, T, C}, {T * C, C, 1}, r.out.offset());
  const Tensor so = r.out, lse = r.lse;
  const DType dtype = qkv.dtype();
  const Device device = qkv.device();
  return record(
      "PackedCausalAttentionBackward", out, {qkv}, [=](const Tensor& g) -> std::vector<Tensor> {
        // g [B, T, C] as the [B, H, T, d] view of it that out was.
        const Tensor gc = g.is_contiguous() ? g : g.contiguous();
        const Tensor g4 =
            make_view(gc, {B, n_head, T, C / n_head}, {T * C, C / n_head, C, 1}, gc.offset());
        // One dqkv buffer; its three parts are written in place.
        Tensor dqkv = empty({B, T, 3 * C}, dtype, device);
        kernels::attention_backward_into(g4, q, k, v, so, lse, ko, packed_part(dqkv, n_head, 0),
                                         packed_part(dqkv, n_head, 1),
                                         packed_part(dqkv, n_head, 2));
        return {dqkv};
      });
}

}  // namespace accrue
