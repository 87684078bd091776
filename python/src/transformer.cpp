// The transformer ops of autograd/transformer_ops.h and
// autograd/attention_ops.h as module functions: RMSNorm and its fused
// residual form, RoPE with its styles and Llama 3 scaling, SwiGLU, the fused
// linear + GELU, classifier cross-entropy and scaled_dot_product_attention
// with its SdpaOptions builder.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "bindings.h"

namespace accrue::python {

namespace {

nb::tuple residual_tuple(const ResidualNorm& r) {
  return nb::make_tuple(r.sum, r.normed);
}

Tensor optional_tensor(const std::optional<Tensor>& t) {
  return t ? *t : Tensor();
}

}  // namespace

void bind_transformer(nb::module_& m) {
  // ---- normalization
  m.def(
      "rms_norm",
      [](const Tensor& x, std::optional<Tensor> weight, double eps) {
        return rms_norm(x, optional_tensor(weight), eps);
      },
      nb::arg("input"), nb::arg("weight") = nb::none(), nb::arg("eps") = 1e-6,
      "RMSNorm over the last dim (Llama's LlamaRMSNorm): x / sqrt(mean(x^2) + eps) * weight; "
      "16-bit inputs are computed in f32; `weight` [D] may be None.");
  m.def("qk_norm", &qk_norm, nb::arg("input"), nb::arg("weight"), nb::arg("eps") = 1e-6,
        "Per-head RMSNorm of q or k (Qwen3, OLMo 2, Gemma 3): x [..., H, D] normalized over D "
        "with weight [D]; x may be a strided view.");
  m.def(
      "add_rms_norm",
      [](const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
        return residual_tuple(add_rms_norm(x, residual, weight, eps));
      },
      nb::arg("input"), nb::arg("residual"), nb::arg("weight"), nb::arg("eps") = 1e-6,
      "The residual stream of pre-RMSNorm transformers in one pass: returns (sum, normed) with "
      "sum = input + residual and normed = rms_norm(sum, weight, eps).");
  m.def(
      "residual_layer_norm",
      [](const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
         double eps) {
        return residual_tuple(residual_layer_norm(x, residual, weight, bias, eps));
      },
      nb::arg("input"), nb::arg("residual"), nb::arg("weight"), nb::arg("bias"),
      nb::arg("eps") = 1e-5,
      "The residual stream of pre-LayerNorm transformers in one pass: returns (sum, normed) "
      "with sum = input + residual and normed = layer_norm(sum, weight, bias, eps).");

  // ---- rotary embeddings
  nb::enum_<RopeStyle>(m, "RopeStyle",
                       "How RoPE pairs the channels: RotateHalf (Llama, Hugging Face: channel i "
                       "with i + D/2) or Interleaved (the original paper, GPT-J: 2i with 2i+1).")
      .value("RotateHalf", RopeStyle::RotateHalf, "Channel i pairs with i + D/2.")
      .value("Interleaved", RopeStyle::Interleaved, "Channel 2i pairs with 2i + 1.");
  nb::class_<RopeScaling> scaling(
      m, "RopeScaling",
      "RoPE frequency scaling: none (the plain frequencies) or Llama 3's (transformers' "
      "rope_type 'llama3'); build the latter with RopeScaling.llama3(...).");
  nb::enum_<RopeScaling::Type>(scaling, "Type", "The kind of frequency scaling.")
      .value("none", RopeScaling::Type::none, "The plain frequencies.")
      .value("llama3", RopeScaling::Type::llama3, "Llama 3's wavelength-band scaling.");
  scaling.def(nb::init<>(), "No scaling.")
      .def_static("llama3", &RopeScaling::llama3, nb::arg("factor") = 8.0,
                  nb::arg("low_freq_factor") = 1.0, nb::arg("high_freq_factor") = 4.0,
                  nb::arg("original_max_position") = 8192,
                  "Llama 3's scaling: wavelengths above original_max_position / low_freq_factor "
                  "divided by factor, those below original_max_position / high_freq_factor "
                  "kept, those between interpolated.")
      .def_rw("type", &RopeScaling::type, "none or llama3.")
      .def_rw("factor", &RopeScaling::factor, "Divisor of the long wavelengths.")
      .def_rw("low_freq_factor", &RopeScaling::low_freq_factor, "Low-frequency band edge.")
      .def_rw("high_freq_factor", &RopeScaling::high_freq_factor, "High-frequency band edge.")
      .def_rw("original_max_position", &RopeScaling::original_max_position,
              "The context length the model was pretrained at.");
  m.def("rope", &rope, nb::arg("input"), nb::arg("positions"), nb::arg("theta") = 10000.0,
        nb::arg("style") = RopeStyle::RotateHalf, nb::arg("scaling") = RopeScaling{},
        "Rotary position embeddings: input [B, T, H, D] (D even; a strided view is read in "
        "place), positions i64 [B, T] or [T]. Returns a contiguous [B, T, H, D].");

  // ---- MLP pieces
  m.def("swiglu", &swiglu, nb::arg("gate"), nb::arg("up"),
        "SwiGLU: silu(gate) * up in one kernel (and its backward in one).");
  m.def("swiglu_packed", &swiglu_packed, nb::arg("input"),
        "SwiGLU of a packed [..., 2 * F] input: its first F channels are the gate, the last F "
        "the up projection.");
  m.def("linear_gelu", &linear_gelu, nb::arg("input"), nb::arg("weight"), nb::arg("bias"),
        "gelu(input @ weight^T + bias) fused (the tanh GELU): input [..., in], weight [out, in], "
        "bias [out].");
  m.def("linear_gelu_linear", &linear_gelu_linear, nb::arg("input"), nb::arg("fc_weight"),
        nb::arg("fc_bias"), nb::arg("proj_weight"), nb::arg("proj_bias"),
        "A transformer's MLP, linear(linear_gelu(input, fc_weight, fc_bias), proj_weight, "
        "proj_bias), as one node whose backward takes GELU's gradient in a GEMM epilogue on "
        "CUDA: input [..., in], fc_weight [hidden, in], proj_weight [out, hidden].");
  m.def("classifier_cross_entropy", &classifier_cross_entropy, nb::arg("hidden"), nb::arg("weight"),
        nb::arg("targets"), nb::arg("valid_classes"), nb::arg("ignore_index") = -100,
        "cross_entropy(hidden @ weight^T, targets) over the first `valid_classes` rows of "
        "weight (a padded vocabulary), as a Loss (sum, count), without keeping the logits.");

  m.def("dropout", &dropout, nb::arg("input"), nb::arg("p"), nb::arg("training") = true,
        nb::arg("generator") = nb::none(),
        "Zeroes each element with probability p and scales the rest by 1 / (1 - p), drawn from "
        "`generator` (default: the default generator); training=False or p == 0 returns input "
        "itself.");

  // ---- attention
  nb::enum_<MaskAlignment>(m, "MaskAlignment",
                           "Where a causal mask's diagonal sits when Tq != Tk: top_left "
                           "(PyTorch's is_causal) or bottom_right (a KV cache's queries at the "
                           "end; flash-attn's).")
      .value("top_left", MaskAlignment::top_left, "Query i sees keys 0..i.")
      .value("bottom_right", MaskAlignment::bottom_right, "Query i sees keys 0..i + Tk - Tq.");
  nb::class_<SdpaOptions>(m, "SdpaOptions",
                          "The options of scaled_dot_product_attention as chained setters: "
                          "SdpaOptions().causal().window(4096).seq_lens(lengths).")
      .def(nb::init<>(), "No mask, scale 1 / sqrt(d), no dropout.")
      .def("causal", &SdpaOptions::causal, nb::arg("alignment") = MaskAlignment::top_left,
           nb::rv_policy::reference_internal,
           "Causal masking with its diagonal aligned as `alignment`.")
      .def("alignment", &SdpaOptions::alignment, nb::arg("alignment"),
           nb::rv_policy::reference_internal,
           "The diagonal's alignment without causal masking (for a window alone).")
      .def("window", &SdpaOptions::window, nb::arg("left"), nb::rv_policy::reference_internal,
           "A sliding window: query i sees only the `left` keys ending at its diagonal (0: "
           "none).")
      .def("seq_lens", &SdpaOptions::seq_lens, nb::arg("seq_len_q"),
           nb::arg("seq_len_kv") = Tensor(), nb::rv_policy::reference_internal,
           "Right-padded batches: i64 [B] lengths; rows past the length give 0, keys past it "
           "are masked. seq_len_kv defaults to seq_len_q.")
      .def("varlen", &SdpaOptions::varlen, nb::arg("cu_seqlens_q"),
           nb::arg("cu_seqlens_kv") = Tensor(), nb::rv_policy::reference_internal,
           "Packed documents (B == 1): i64 [N + 1] cumulative offsets, 0 first; attention never "
           "crosses a document.")
      .def("bias", &SdpaOptions::bias, nb::arg("additive"), nb::rv_policy::reference_internal,
           "An additive, differentiable bias on the scaled scores, [B or 1, Hq or 1, Tq, Tk] of "
           "q's dtype (-inf masks).")
      .def("mask", &SdpaOptions::mask, nb::arg("keep"), nb::rv_policy::reference_internal,
           "A boolean mask [B or 1, Hq or 1, Tq, Tk], true where the query may attend "
           "(PyTorch's attn_mask).")
      .def("scale", &SdpaOptions::scale, nb::arg("scale"), nb::rv_policy::reference_internal,
           "The score scale (default 1 / sqrt(d)).")
      .def("dropout", &SdpaOptions::dropout, nb::arg("p"), nb::arg("generator") = nb::none(),
           nb::keep_alive<1, 3>(), nb::rv_policy::reference_internal,
           "Dropout on the probabilities with probability p, drawn from `generator` (default: "
           "the default generator).")
      .def_prop_ro("dropout_p", &SdpaOptions::dropout_p, "The dropout probability.");
  m.def(
      "packed_causal_attention",
      [](const Tensor& qkv, int64_t n_head, std::optional<double> scale) {
        AttentionOptions o;
        o.causal = true;
        o.scale = scale;
        return packed_causal_attention(qkv, n_head, o);
      },
      nb::arg("qkv"), nb::arg("n_head"), nb::arg("scale") = nb::none(),
      "GPT-2's packed form: qkv [B, T, 3 * H * d] (q, k, v concatenated, heads contiguous "
      "within each) -> causal attention [B, T, H * d]; backward writes one dqkv buffer.");
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, std::optional<SdpaOptions> options,
         bool is_causal) {
        SdpaOptions o = options ? *options : SdpaOptions();
        if (is_causal) o.causal();
        return scaled_dot_product_attention(q, k, v, o);
      },
      nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("options") = nb::none(),
      nb::arg("is_causal") = false,
      "Attention: q [B, Hq, Tq, d], k [B, Hkv, Tk, d], v [B, Hkv, Tk, dv] -> [B, Hq, Tq, dv], "
      "grouped-query when Hq is a multiple of Hkv; masks, lengths, packing, window, bias and "
      "dropout from `options` (SdpaOptions). is_causal=True is options.causal(). A query row "
      "that sees no key gives 0.");
}

}  // namespace accrue::python
