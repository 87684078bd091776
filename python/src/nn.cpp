// accrue._accrue.nn: the native modules. Python modules subclass the pure
// Python accrue.nn.Module (python/accrue/nn.py, Note [Python modules]), which
// holds these as children.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "accrue/nn/gpt2.h"
#include "accrue/nn/module.h"
#include "bindings.h"

namespace accrue::python {

namespace {

nn::ParamOptions param_options(Device device, DType dtype, Generator* generator) {
  return nn::ParamOptions{device, dtype, generator};
}

std::vector<std::pair<std::string, Tensor>> pairs(const std::vector<NamedParameter>& named) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(named.size());
  for (const NamedParameter& p : named)
    out.emplace_back(p.name, p.tensor);
  return out;
}

// The keyword arguments every constructor takes, after its own.
#define ACCRUE_PARAM_KWARGS                                                \
  nb::kw_only(), nb::arg("device") = "cpu", nb::arg("dtype") = DType::f32, \
                 nb::arg("generator") = nb::none()

}  // namespace

void bind_nn(nb::module_& m) {
  nb::class_<nn::Module>(
      m, "NativeModule",
      "The base of the C++ modules (nn::Module). accrue.nn.Module, the base of modules written "
      "in Python, counts these as modules and holds them as children.")
      .def(
          "named_parameters", [](const nn::Module& x) { return pairs(x.named_parameters()); },
          "(dotted name, parameter) pairs, in registration order (the arena's layout).")
      .def("parameters", &nn::Module::parameters, "The parameters, in registration order.")
      .def("parameter_count", &nn::Module::parameter_count, "The number of parameter elements.")
      .def(
          "named_buffers", [](const nn::Module& x) { return pairs(x.named_buffers()); },
          "(dotted name, buffer) pairs: state that is not trained.")
      .def("state_dict", &nn::Module::state_dict,
           "Every parameter and persistent buffer by dotted name (master weights once a "
           "ParamStore holds them; Note [Module state dict]).")
      .def("load_state_dict", &nn::Module::load_state_dict, nb::arg("state_dict"),
           nb::arg("strict") = true,
           "Copies each entry into the module's own tensor (cast to its dtype) after checking "
           "all of them; nothing changes on an error.")
      .def(
          "train",
          [](nn::Module& x, bool on) -> nn::Module& {
            x.train(on);
            return x;
          },
          nb::arg("mode") = true, nb::rv_policy::reference,
          "Training mode (dropout on) for this module and its children; returns self.")
      .def(
          "eval",
          [](nn::Module& x) -> nn::Module& {
            x.eval();
            return x;
          },
          nb::rv_policy::reference, "train(False); returns self.")
      .def_prop_ro("training", &nn::Module::training, "True in training mode.")
      .def(
          "to",
          [](nn::Module& x, DType d) -> nn::Module& {
            x.to(d);
            return x;
          },
          nb::arg("dtype"), nb::rv_policy::reference,
          "Converts floating parameters and buffers in place (each tensor keeps its identity); "
          "returns self. Note [Module device and dtype].")
      .def(
          "to",
          [](nn::Module& x, DeviceArg d) -> nn::Module& {
            x.to(d);
            return x;
          },
          nb::arg("device"), nb::rv_policy::reference,
          "Moves parameters and buffers in place; returns self.");

  nb::class_<nn::Linear, nn::Module>(m, "Linear", "y = x W^T + b, W [out, in] (torch.nn.Linear).")
      .def(
          "__init__",
          [](nn::Linear* self, int64_t in, int64_t out, bool bias, DeviceArg device, DType dtype,
             Generator* gen) {
            new (self) nn::Linear(in, out, bias, param_options(device, dtype, gen));
          },
          nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias") = true,
          ACCRUE_PARAM_KWARGS,
          "W and b uniform(-1/sqrt(in), 1/sqrt(in)), as PyTorch (from `generator`, else the "
          "default one).")
      .def("forward", nb::overload_cast<const Tensor&>(&nn::Linear::forward, nb::const_),
           nb::arg("input"), "x W^T + b.")
      .def("__call__", nb::overload_cast<const Tensor&>(&nn::Linear::forward, nb::const_),
           nb::arg("input"), "forward(input).")
      .def_prop_rw(
          "fp8", &nn::Linear::fp8,
          [](nn::Linear& l, bool on) {
            l.set_fp8(on ? std::optional<Fp8LinearOptions>(Fp8LinearOptions{}) : std::nullopt);
          },
          "Whether forward runs fp8_linear (Note [FP8 linear]; e4m3 / e5m2, output in the "
          "input's dtype).")
      .def_prop_ro("weight", &nn::Linear::weight, "[out, in].")
      .def_prop_ro(
          "bias",
          [](const nn::Linear& x) -> nb::object {
            return x.bias().defined() ? nb::cast(x.bias()) : nb::none();
          },
          "[out], or None.");

  nb::class_<nn::Embedding, nn::Module>(m, "Embedding",
                                        "Rows of a [num, dim] table (torch.nn.Embedding).")
      .def(
          "__init__",
          [](nn::Embedding* self, int64_t num, int64_t dim, double std, DeviceArg device,
             DType dtype, Generator* gen) {
            new (self) nn::Embedding(num, dim, param_options(device, dtype, gen), std);
          },
          nb::arg("num_embeddings"), nb::arg("embedding_dim"), nb::arg("std") = 0.02,
          ACCRUE_PARAM_KWARGS, "The table normal(0, std) (torch's default std is 1).")
      .def("forward", &nn::Embedding::forward, nb::arg("indices"), "The rows at integer indices.")
      .def("__call__", &nn::Embedding::forward, nb::arg("indices"), "forward(indices).")
      .def_prop_ro("weight", &nn::Embedding::weight, "[num, dim].");

  nb::class_<nn::LayerNorm, nn::Module>(m, "LayerNorm",
                                        "LayerNorm over the last dim (torch.nn.LayerNorm).")
      .def(
          "__init__",
          [](nn::LayerNorm* self, int64_t dim, double eps, bool bias, DeviceArg device, DType dtype,
             Generator* gen) {
            new (self) nn::LayerNorm(dim, param_options(device, dtype, gen), eps, bias);
          },
          nb::arg("normalized_shape"), nb::arg("eps") = 1e-5, nb::arg("bias") = true,
          ACCRUE_PARAM_KWARGS, "Weight ones, bias zeros (none when bias=False).")
      .def("forward", &nn::LayerNorm::forward, nb::arg("input"), "The normalized input.")
      .def("__call__", &nn::LayerNorm::forward, nb::arg("input"), "forward(input).")
      .def_prop_ro("weight", &nn::LayerNorm::weight, "[dim].")
      .def_prop_ro(
          "bias",
          [](const nn::LayerNorm& x) -> nb::object {
            return x.bias().defined() ? nb::cast(x.bias()) : nb::none();
          },
          "[dim], or None.")
      .def_prop_ro("eps", &nn::LayerNorm::eps, "The variance epsilon.");

  nb::class_<nn::GELU, nn::Module>(m, "GELU", "GELU, tanh approximation (torch.nn.GELU('tanh')).")
      .def(nb::init<>(), "No parameters.")
      .def("forward", &nn::GELU::forward, nb::arg("input"), "gelu(input).")
      .def("__call__", &nn::GELU::forward, nb::arg("input"), "forward(input).");

  nb::class_<nn::MLP, nn::Module>(m, "MLP",
                                  "Linear -> GELU -> ... -> Linear over the given widths.")
      .def(
          "__init__",
          [](nn::MLP* self, const std::vector<int64_t>& widths, DeviceArg device, DType dtype,
             Generator* gen) { new (self) nn::MLP(widths, param_options(device, dtype, gen)); },
          nb::arg("widths"), ACCRUE_PARAM_KWARGS, "widths: at least two (in, ..., out).")
      .def("forward", &nn::MLP::forward, nb::arg("input"), "The MLP of input.")
      .def("__call__", &nn::MLP::forward, nb::arg("input"), "forward(input).");

  nb::class_<nn::GPT2Config>(m, "GPT2Config", "GPT-2's sizes and options (nn/gpt2.h).")
      .def(nb::init<>(), "GPT-2 124M (d12).")
      .def_rw("n_layer", &nn::GPT2Config::n_layer, "Blocks.")
      .def_rw("n_head", &nn::GPT2Config::n_head, "Attention heads.")
      .def_rw("n_embd", &nn::GPT2Config::n_embd, "Width of the residual stream.")
      .def_rw("block_size", &nn::GPT2Config::block_size, "The longest sequence.")
      .def_rw("vocab_size", &nn::GPT2Config::vocab_size, "Tokens.")
      .def_rw("padded_vocab_size", &nn::GPT2Config::padded_vocab_size,
              "Rows of wte (0: vocab_size rounded up to a multiple of 128).")
      .def_rw("dropout", &nn::GPT2Config::dropout, "Dropout probability.")
      .def_rw("layer_norm_eps", &nn::GPT2Config::layer_norm_eps, "LayerNorm epsilon.")
      .def_rw("activation_checkpointing", &nn::GPT2Config::activation_checkpointing,
              "Recompute each block in backward.")
      .def_rw("bias", &nn::GPT2Config::bias, "Linear and LayerNorm biases.")
      .def_rw("dropout_seed", &nn::GPT2Config::dropout_seed, "Seed of the dropout generator.")
      .def_static("d12", &nn::GPT2Config::d12, "124M.")
      .def_static("d24", &nn::GPT2Config::d24, "350M.")
      .def_static("d36", &nn::GPT2Config::d36, "774M.")
      .def_static("d48", &nn::GPT2Config::d48, "1.5B.")
      .def_static("from_name", &nn::GPT2Config::from_name, nb::arg("name"),
                  "'d12'/'gpt2', 'd24'/'gpt2-medium', 'd36'/'gpt2-large', 'd48'/'gpt2-xl'.")
      .def("padded_vocab", &nn::GPT2Config::padded_vocab, "The rows of wte.")
      .def("validate", &nn::GPT2Config::validate, "Raises accrue.Error on a bad value.")
      .def("parameter_count", &nn::GPT2Config::parameter_count,
           "The parameters the model has, without building it.");

  nb::class_<nn::GPT2, nn::Module>(m, "GPT2", "GPT-2 with a tied classifier (nn/gpt2.h).")
      .def(
          "__init__",
          [](nn::GPT2* self, const nn::GPT2Config& config, DeviceArg device, DType dtype,
             Generator* gen) { new (self) nn::GPT2(config, param_options(device, dtype, gen)); },
          nb::arg("config"), ACCRUE_PARAM_KWARGS,
          "Initialized as GPT-2 (Note [GPT-2 initialization]) from `generator`.")
      .def_prop_ro("config", &nn::GPT2::config, "The config.")
      .def("forward", &nn::GPT2::forward, nb::arg("idx"),
           "idx [B, T] token ids -> hidden state [B, T, C] after ln_f.")
      .def("__call__", &nn::GPT2::forward, nb::arg("idx"), "forward(idx).")
      .def("loss", &nn::GPT2::loss, nb::arg("idx"), nb::arg("targets"),
           "The next-token Loss (sum, count) over targets [B, T] (ignore_index -100), through the "
           "fused classifier.")
      .def("logits", &nn::GPT2::logits, nb::arg("idx"), "[B, T, vocab_size] logits.")
      .def(
          "use_fp8",
          [](nn::GPT2& g, const std::string& recipe, DType grad_dtype) {
            return g.use_fp8(fp8_options("GPT2.use_fp8", recipe, grad_dtype));
          },
          nb::arg("recipe") = "tensor", nb::arg("grad_dtype") = DType::f8e5m2,
          "Each block's four projections in FP8 (Note [FP8 linear]), the output gradients in "
          "grad_dtype (f8e5m2 or f8e4m3), per tensor or per block (recipe 'block'); returns "
          "their weights, for ParamStore.keep_fp8_copies.");
  m.def(
      "use_fp8",
      [](nn::Module& module, const std::string& recipe, DType grad_dtype) {
        return nn::use_fp8(module, fp8_options("use_fp8", recipe, grad_dtype));
      },
      nb::arg("module"), nb::arg("recipe") = "tensor", nb::arg("grad_dtype") = DType::f8e5m2,
      "Every Linear of the module whose sizes are multiples of 16 in FP8 (Note [FP8 linear]), "
      "the output gradients in grad_dtype (f8e5m2 or f8e4m3), per tensor or per block (recipe "
      "'block'); returns their weights, for ParamStore.keep_fp8_copies.");
}

}  // namespace accrue::python
