#include "accrue/nn/module.h"

#include <cmath>

#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/parameter_gate.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"

namespace accrue::nn {

namespace {

Tensor uniform_init(const Shape& shape, double bound, const ParamOptions& o) {
  // Drawn in f64 on the CPU so that every device and dtype starts from the same values.
  Tensor u = rand(shape, DType::f64, Device::cpu(), o.generator);
  std::vector<double> v = u.to_vector<double>();
  for (double& x : v)
    x = (2 * x - 1) * bound;
  return from_vector(v, shape, o.dtype, o.device);
}

Tensor normal_init(const Shape& shape, double std, const ParamOptions& o) {
  Tensor n = randn(shape, DType::f64, Device::cpu(), o.generator);
  std::vector<double> v = n.to_vector<double>();
  for (double& x : v)
    x *= std;
  return from_vector(v, shape, o.dtype, o.device);
}

}  // namespace

std::vector<NamedParameter> Module::named(Kind kind, bool (*keep)(const BufferOptions&)) const {
  std::vector<NamedParameter> out;
  for (const Slot& s : order_) {
    if (s.kind == Kind::Child) {
      const auto& [name, child] = children_[s.index];
      for (NamedParameter& p : child->named(kind, keep))
        out.push_back({name + "." + p.name, p.tensor});
    } else if (s.kind == kind) {
      if (kind == Kind::Parameter)
        out.push_back(params_[s.index]);
      else if (!keep || keep(buffer_options_[s.index]))
        out.push_back(buffers_[s.index]);
    }
  }
  return out;
}

namespace {

bool persistent(const BufferOptions& o) {
  return o.persistent();
}
bool converted(const BufferOptions& o) {
  return !o.keep_dtype();
}

// A copy of t on `device` in `dtype`, laid out as t is (channels-last stays so).
Tensor moved_copy(const Tensor& t, Device device, DType dtype) {
  Tensor out;
  if (t.is_channels_last()) {
    const Shape& s = t.shape();
    out = empty({s[0], s[2], s[3], s[1]}, dtype, device).permute({0, 3, 1, 2});
  } else {
    out = empty(t.shape(), dtype, device);
  }
  out.copy_(t);
  return out;
}

// Re-points t itself at `moved`: every handle to t sees it (as to_channels_last does).
void repoint(const Tensor& t, const Tensor& moved) {
  TensorImpl& impl = *t.impl();
  impl.storage = moved.storage();
  impl.offset = moved.offset();
  impl.strides = moved.strides();
  impl.dtype = moved.dtype();
}

}  // namespace

void Module::to(DType dtype) {
  ACCRUE_CHECK(is_floating(dtype), "Module::to: ", dtype_name(dtype),
               " is not a floating dtype; parameters and buffers convert to f32, f64, bf16 or f16");
  move(Device::cpu(), dtype, true, "to(DType)");  // the device is each tensor's own
}

void Module::to(Device device) {
  move(device, DType::f32, false, "to(Device)");
}

void Module::move(Device device, DType dtype, bool convert, const char* op) {
  NoGradGuard no_grad;
  const std::vector<NamedParameter> params = named_parameters();
  const std::vector<NamedParameter> buffers = named_buffers();
  const std::vector<NamedParameter> converted_buffers = named(Kind::Buffer, &converted);
  auto target_dtype = [&](const Tensor& t, bool follows) {
    return convert && follows && is_floating(t.dtype()) ? dtype : t.dtype();
  };
  auto target_device = [&](const Tensor& t) { return convert ? t.device() : device; };
  // Note [Module device and dtype]: a held parameter must already be there;
  // all are checked before anything moves.
  for (const NamedParameter& p : params) {
    const AutogradMeta* meta = autograd::find_meta(p.tensor);
    const GradSink* sink = meta ? meta->sink : nullptr;
    const bool held = sink != nullptr || (meta && meta->owner != nullptr);
    if (!held) continue;
    const DType want = target_dtype(p.tensor, true);
    const Device where = target_device(p.tensor);
    ACCRUE_CHECK(want == p.tensor.dtype() && where == p.tensor.device(), "Module::", op, ": '",
                 p.name, "' is held by ", sink ? sink->describe(p.tensor) : std::string("a store"),
                 ", which fixed its ", want != p.tensor.dtype() ? "dtype" : "device", " (",
                 dtype_name(p.tensor.dtype()), " on ", p.tensor.device().str(),
                 "; its master weights are the store's): build the store with ",
                 want != p.tensor.dtype()
                     ? detail::str_cat(".compute_dtype(", dtype_name(want), ")")
                     : detail::str_cat(".device(", where.str(), ")"),
                 ", or call Module::to before building it. Nothing was moved ",
                 "(Note [Module device and dtype])");
  }
  auto follows = [&](const Tensor& t) {
    for (const NamedParameter& b : converted_buffers)
      if (b.tensor.is_same(t)) return true;
    return false;
  };
  for (const NamedParameter& p : params) {
    const DType want = target_dtype(p.tensor, true);
    const Device where = target_device(p.tensor);
    if (want == p.tensor.dtype() && where == p.tensor.device()) continue;
    const Tensor g = grad(p.tensor);
    repoint(p.tensor, moved_copy(p.tensor, where, want));
    if (g.defined()) set_grad(p.tensor, moved_copy(g, where, want));
  }
  for (const NamedParameter& b : buffers) {
    const DType want = target_dtype(b.tensor, follows(b.tensor));
    const Device where = target_device(b.tensor);
    if (want == b.tensor.dtype() && where == b.tensor.device()) continue;
    repoint(b.tensor, moved_copy(b.tensor, where, want));
  }
}

std::vector<NamedParameter> Module::named_parameters() const {
  return named(Kind::Parameter);
}

std::vector<NamedParameter> Module::named_buffers() const {
  return named(Kind::Buffer);
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out = {this};
  for (auto& entry : children_)
    for (Module* m : entry.second->modules())
      out.push_back(m);
  return out;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const NamedParameter& p : named_parameters())
    // Note [One load path]: the master weights; detached, as PyTorch's state_dict
    // is, so that saving or copying an entry is data handling (Note [Raw views]).
    out[p.name] = detach(parameter_value(p.tensor));
  for (const NamedParameter& b : named(Kind::Buffer, &persistent))
    out[b.name] = b.tensor;
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  const std::map<std::string, Tensor> mine = state_dict();
  // Note [Module state dict]: everything is checked before anything is copied.
  for (const auto& [name, tensor] : mine) {
    auto it = state.find(name);
    ACCRUE_CHECK(it != state.end(), "Module::load_state_dict: missing '", name, "'");
    ACCRUE_CHECK(it->second.shape() == tensor.shape(), "Module::load_state_dict: '", name,
                 "' has shape ", shape_str(it->second.shape()), ", the module's has ",
                 shape_str(tensor.shape()));
  }
  if (strict)
    for (const auto& [name, tensor] : state)
      ACCRUE_CHECK(mine.count(name) != 0, "Module::load_state_dict: unexpected '", name,
                   "' (strict; the module has ", mine.size(), " entries)");
  // Note [One load path]: a parameter held by a store is written through it
  // (master, then compute copy); buffers are plain copies.
  for (const NamedParameter& p : named_parameters())
    load_parameter(p.tensor, state.at(p.name));
  NoGradGuard no_grad;
  for (const NamedParameter& b : named(Kind::Buffer, &persistent))
    b.tensor.copy_(state.at(b.name));
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (NamedParameter& p : named_parameters())
    out.push_back(p.tensor);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Tensor& t : parameters())
    n += t.numel();
  return n;
}

void Module::to_channels_last() {
  NoGradGuard no_grad;
  const std::vector<NamedParameter> params = named_parameters();
  for (const NamedParameter& p : params)
    ACCRUE_CHECK(autograd::sink_of(p.tensor) == nullptr, "Module::to_channels_last: '", p.name,
                 "' is held by a gradient arena already; call to_channels_last before building ",
                 "it (Note [Parameter layouts])");
  auto relayout = [](const Tensor& t) {
    if (t.dim() != 4 || t.is_channels_last()) return;
    const Shape& s = t.shape();
    // With one channel, or a 1 x 1 kernel, row-major is channels-last order already.
    if (t.is_contiguous() && (s[1] == 1 || (s[2] == 1 && s[3] == 1))) return;
    Tensor laid = empty({s[0], s[2], s[3], s[1]}, t.dtype(), t.device()).permute({0, 3, 1, 2});
    laid.copy_(t);
    // Re-point the tensor itself, as optim::ParamStore does: every handle sees the new layout.
    TensorImpl& impl = *t.impl();
    impl.storage = laid.storage();
    impl.offset = laid.offset();
    impl.strides = laid.strides();
  };
  for (const NamedParameter& p : params)
    relayout(p.tensor);
  for (const NamedParameter& b : named_buffers())
    relayout(b.tensor);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& entry : children_)
    entry.second->train(on);
}

Tensor Module::register_parameter(std::string name, Tensor t) {
  requires_grad_(t);
  params_.push_back({std::move(name), t});
  order_.push_back({Kind::Parameter, params_.size() - 1});
  return t;
}

Tensor Module::register_buffer(std::string name, Tensor t, const BufferOptions& options) {
  ACCRUE_CHECK(t.defined(), "Module::register_buffer: '", name, "' is undefined");
  ACCRUE_CHECK(!t.requires_grad(), "Module::register_buffer: '", name,
               "' requires grad; a trained tensor is a parameter (register_parameter)");
  buffers_.push_back({std::move(name), t});
  buffer_options_.push_back(options);
  order_.push_back({Kind::Buffer, buffers_.size() - 1});
  return t;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const ParamOptions& options) {
  ACCRUE_CHECK(in_features > 0 && out_features > 0, "Linear: invalid sizes in=", in_features,
               " out=", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = register_parameter("weight", uniform_init({out_features, in_features}, bound, options));
  if (bias) bias_ = register_parameter("bias", uniform_init({out_features}, bound, options));
}

Linear::Linear(Tensor weight, Tensor bias) {
  ACCRUE_CHECK(weight.defined() && weight.dim() == 2, "Linear: weight must be 2-D [out, in]");
  ACCRUE_CHECK(!bias.defined() || bias.shape() == Shape{weight.size(0)}, "Linear: bias of shape ",
               bias.defined() ? shape_str(bias.shape()) : "", " for weight of shape ",
               shape_str(weight.shape()));
  weight_ = register_parameter("weight", std::move(weight));
  if (bias.defined()) bias_ = register_parameter("bias", std::move(bias));
}

std::optional<Fp8LinearOptions> Linear::fp8_options_for(const Tensor& x) const {
  if (!fp8_ || !x.defined() || !weight_.defined() || x.numel() % (16 * weight_.size(1)) != 0)
    return std::nullopt;
  Fp8LinearOptions o = *fp8_;
  o.out_dtype = x.dtype();  // the layer composes with what follows it
  return o;
}

Tensor Linear::plain_weight(const Tensor& x) const {
  // Note [FP8 codes in the compute slots]: the store keeps an FP8 layer's
  // weight in its master slot; the compute copy held it rounded to x's dtype.
  if (fp8_ && x.defined() && weight_.dtype() != x.dtype() && is_floating(x.dtype()))
    return to_dtype(weight_, x.dtype());
  return weight_;
}

Tensor Linear::forward(const Tensor& x) const {
  return forward(x, nullptr);
}

Tensor Linear::forward(const Tensor& x, const Fp8Input* x8) const {
  const NvtxRange range("accrue Linear forward");  // Note [NVTX ranges]
  if (const std::optional<Fp8LinearOptions> o = fp8_options_for(x)) {
    return x8 != nullptr ? fp8_linear(x, *x8, weight_, bias_, *o)
                         : fp8_linear(x, weight_, bias_, *o);
  }
  return linear(x, plain_weight(x), bias_);
}

Tensor Linear::forward_gelu(const Tensor& x) const {
  if (!bias_.defined()) return gelu(forward(x));
  if (const std::optional<Fp8LinearOptions> o = fp8_options_for(x)) {
    if (o->recipe == Fp8Recipe::tensor &&
        (o->out_dtype == DType::bf16 || o->out_dtype == DType::f16))
      return fp8_linear_gelu(x, weight_, bias_, *o);
    return gelu(forward(x));
  }
  if (fp8_) return gelu(linear(x, plain_weight(x), bias_));  // rows the FP8 GEMMs cannot take
  return linear_gelu(x, weight_, bias_);
}

std::optional<Fp8Input> Linear::shared_fp8_input(std::initializer_list<const Linear*> layers,
                                                 const Tensor& x) {
  std::optional<Fp8LinearOptions> first;
  for (const Linear* l : layers) {
    const std::optional<Fp8LinearOptions> o = l->fp8_options_for(x);
    if (!o) return std::nullopt;
    if (first && (o->recipe != first->recipe || o->forward_dtype != first->forward_dtype ||
                  o->margin != first->margin))
      return std::nullopt;
    if (!first) first = o;
  }
  if (!first) return std::nullopt;
  // Note [FP8 delayed scaling]: the first layer's x row scales the shared cast.
  return fp8_input(x, *first, (*layers.begin())->weight());
}

std::vector<Tensor> use_fp8(Module& m, const Fp8LinearOptions& options) {
  std::vector<Tensor> weights;
  for (Module* child : m.modules()) {
    auto* l = dynamic_cast<Linear*>(child);
    if (l == nullptr || l->weight().size(0) % 16 != 0 || l->weight().size(1) % 16 != 0) continue;
    l->set_fp8(options);
    weights.push_back(l->weight());
  }
  return weights;
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, bool bias,
               const ParamOptions& options, const Conv2dOptions& conv)
    : conv_(conv) {
  ACCRUE_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0 && conv.groups >= 1 &&
                   in_channels % conv.groups == 0 && out_channels % conv.groups == 0,
               "Conv2d: invalid sizes in=", in_channels, " out=", out_channels, " kernel=", kernel,
               " groups=", conv.groups);
  const int64_t fan_in = in_channels / conv.groups * kernel * kernel;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = register_parameter(
      "weight",
      uniform_init({out_channels, in_channels / conv.groups, kernel, kernel}, bound, options));
  if (bias) bias_ = register_parameter("bias", uniform_init({out_channels}, bound, options));
}

Tensor Conv2d::forward(const Tensor& x) const {
  const NvtxRange range("accrue Conv2d forward");  // Note [NVTX ranges]
  return conv2d(x, weight_, bias_, conv_);
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, const ParamOptions& options, double eps)
    : groups_(groups), eps_(eps) {
  ACCRUE_CHECK(groups >= 1 && channels >= 1 && channels % groups == 0, "GroupNorm: ", groups,
               " groups do not divide ", channels, " channels");
  weight_ = register_parameter("weight", full({channels}, 1.0, options.dtype, options.device));
  bias_ = register_parameter("bias", zeros({channels}, options.dtype, options.device));
}

Tensor GroupNorm::forward(const Tensor& x) const {
  const NvtxRange range("accrue GroupNorm forward");  // Note [NVTX ranges]
  return group_norm(x, groups_, weight_, bias_, eps_);
}

Embedding::Embedding(int64_t num, int64_t dim, const ParamOptions& options, double std) {
  ACCRUE_CHECK(num > 0 && dim > 0, "Embedding: invalid sizes num=", num, " dim=", dim);
  weight_ = register_parameter("weight", normal_init({num, dim}, std, options));
}

Tensor Embedding::forward(const Tensor& indices) const {
  const NvtxRange range("accrue Embedding forward");  // Note [NVTX ranges]
  return embedding(weight_, indices);
}

LayerNorm::LayerNorm(int64_t dim, const ParamOptions& options, double eps, bool bias) : eps_(eps) {
  ACCRUE_CHECK(dim > 0, "LayerNorm: invalid dim ", dim);
  weight_ = register_parameter("weight", ones({dim}, options.dtype, options.device));
  if (bias) bias_ = register_parameter("bias", zeros({dim}, options.dtype, options.device));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  const NvtxRange range("accrue LayerNorm forward");  // Note [NVTX ranges]
  return layer_norm(x, weight_, bias_, eps_);
}

Tensor GELU::forward(const Tensor& x) const {
  return gelu(x);
}

MLP::MLP(const std::vector<int64_t>& widths, const ParamOptions& options) {
  ACCRUE_CHECK(widths.size() >= 2, "MLP: needs at least two widths, got ", widths.size());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    layers_.push_back(
        &register_module("fc" + std::to_string(i),
                         std::make_unique<Linear>(widths[i], widths[i + 1], true, options)));
  }
}

void await_parameters(const Module& module) {
  if (!parameter_gates_pending()) return;  // no vector of parameters built for nothing
  accrue::await_parameters(module.parameters());
}

Tensor MLP::forward(const Tensor& x) const {
  const NvtxRange range("accrue MLP forward");  // Note [NVTX ranges]
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    await_parameters(*layers_[i]);  // Note [Close under the forward]
    h = layers_[i]->forward(h);
    if (i + 1 < layers_.size()) h = act_.forward(h);
  }
  return h;
}

}  // namespace accrue::nn
