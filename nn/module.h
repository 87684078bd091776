// Modules: layers that own parameters and buffers, listed in registration order.
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/conv.h"

namespace accrue::nn {

// Declared in autograd/variable.h, which the gradient arena and
// optim::ParamStore take them from.
using accrue::NamedParameter;

// How a buffer behaves (Module::register_buffer), named setters.
class BufferOptions {
 public:
  // In the state dict (the default), or not: state rebuilt from the config
  // (a table of positions), as PyTorch's persistent=False.
  BufferOptions& persistent(bool on) {
    persistent_ = on;
    return *this;
  }
  // Keeps its dtype when Module::to(DType) converts the model (a statistic
  // kept in f64 on purpose); it still follows the device.
  BufferOptions& keep_dtype(bool on) {
    keep_dtype_ = on;
    return *this;
  }
  bool persistent() const { return persistent_; }
  bool keep_dtype() const { return keep_dtype_; }

 private:
  bool persistent_ = true;
  bool keep_dtype_ = false;
};

// Where parameters are created: their device and dtype, and the generator for
// their initial values (a fixed seed makes a model reproducible on any device).
struct ParamOptions {
  Device device = Device::cpu();
  DType dtype = DType::f32;
  Generator* generator = nullptr;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its children, in registration order
  // (the order the gradient arena will lay them out in).
  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;
  // Buffers: state that is not trained (running statistics, counters, tables
  // of positions or frequencies), persistent or not, in registration order
  // with the same "child." prefixes. No gradient reaches them and the
  // gradient arena never holds them.
  std::vector<NamedParameter> named_buffers() const;

  // Note [Module device and dtype]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // to(DType) and to(Device) move the model: every parameter and every
  // buffer, its children's too, each tensor keeping its identity (handles
  // the model and the caller hold see the new dtype or device, as
  // to_channels_last does) and its layout. to(DType) converts floating
  // tensors only (PyTorch converts floating buffers, not counters or
  // indices) and leaves a buffer registered with keep_dtype alone
  // (nn::BatchNorm's running statistics are f64 on purpose: Note [BatchNorm
  // in f32]); a tensor the model computes with must be a parameter or a
  // buffer, or it stays behind and the mismatch shows up later as "mul:
  // dtypes f64 and f32 differ" (a rotary-embedding table is a buffer,
  // non-persistent when it is rebuilt from the config).
  // A parameter an optim::ParamStore holds is the store's: the store fixed
  // its device and dtype (the compute copy's), and its master weights are
  // the store's. So once a store exists, to() still moves the buffers, which
  // a store never holds (bringing a RoPE table to a bf16 compute copy's
  // dtype), but a held parameter must already have the target device and
  // dtype: otherwise to() throws naming the parameter, its store and what
  // to do (build the store with that device or compute dtype, or call to()
  // before building it), and nothing is changed. Everything is checked
  // before anything moves. A parameter's .grad, when it has one, moves with it.
  void to(DType dtype);
  void to(Device device);

  // Note [Module state dict]
  // ~~~~~~~~~~~~~~~~~~~~~~~~
  // Every parameter and buffer by its dotted name (save it with
  // save_safetensors). load_state_dict copies each entry into the module's
  // own tensor, casting the dtype, after checking all of them first: a
  // missing or (when strict) unexpected name, or a shape that differs, is an
  // error naming it, and nothing is changed. Once an optim::ParamStore holds
  // the parameters, state_dict gives their master weights and
  // load_state_dict writes the master and then the compute copy (Note [One
  // load path]), so loading before or after the store is built is the same.
  // A training checkpoint is the Window's state_dict (optim/window.h) plus
  // these buffers.
  std::map<std::string, Tensor> state_dict() const;
  // This module and every descendant, parents before children.
  std::vector<Module*> modules();
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // Lays every 4-D parameter and buffer of this module and its children out
  // channels-last (memory order N, H, W, C; PyTorch's
  // model.to(memory_format=torch.channels_last)), values unchanged, so that a
  // channels-last convolution reads its weight without a copy. Each tensor
  // keeps its identity (handles the caller holds see the new layout); ones
  // already in that order (1 x 1 kernels) are left alone. Call it before a
  // ParamStore takes the parameters: the store keeps each one's layout (Note
  // [Parameter layouts]); afterwards it throws.
  void to_channels_last();

  // Training mode (the default) turns dropout on; train(false) / eval() set
  // this module and all its children.
  bool training() const { return training_; }
  void train(bool on = true);
  void eval() { train(false); }

 protected:
  // Registers a leaf that requires grad and returns it.
  Tensor register_parameter(std::string name, Tensor t);
  // Registers a tensor that is state but not a parameter, and returns it.
  Tensor register_buffer(std::string name, Tensor t, const BufferOptions& options = {});
  // Registers a child; its parameters follow, prefixed with "name.".
  template <class M>
  M& register_module(std::string name, std::unique_ptr<M> child) {
    M& ref = *child;
    children_.emplace_back(std::move(name), std::move(child));
    order_.push_back({Kind::Child, children_.size() - 1});
    return ref;
  }

 private:
  enum class Kind { Parameter, Buffer, Child };
  struct Slot {
    Kind kind;
    size_t index;
  };
  // The named tensors of one kind, this module's and its children's, in
  // order; buffers only those that pass `keep` (all when it is null).
  std::vector<NamedParameter> named(Kind kind, bool (*keep)(const BufferOptions&) = nullptr) const;
  // Note [Module device and dtype]: moves every tensor to `device` and, when
  // `dtype` is floating, the floating ones to `dtype`; `op` names the call.
  void move(Device device, DType dtype, bool convert, const char* op);
  std::vector<NamedParameter> params_;
  std::vector<NamedParameter> buffers_;
  std::vector<BufferOptions> buffer_options_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::vector<Slot> order_;
  bool training_ = true;
};

// y = x W^T + b with W [out, in] initialized uniform(-1/sqrt(in), 1/sqrt(in)) as in PyTorch.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, const ParamOptions& options);
  // Registers tensors initialized by the caller: weight [out, in], bias [out] or undefined.
  Linear(Tensor weight, Tensor bias);
  Tensor forward(const Tensor& x) const;
  // forward with x's FP8 codes shared by the layers that read x (Note [FP8
  // shared input]); with x8 null, or when this layer runs plain, forward(x).
  Tensor forward(const Tensor& x, const Fp8Input* x8) const;
  // x cast once for `layers` when every one of them would cast it the same
  // way in forward (FP8, one recipe, forward_dtype and margin, x's rows a
  // multiple of 16); otherwise nothing, and each runs as forward(x).
  static std::optional<Fp8Input> shared_fp8_input(std::initializer_list<const Linear*> layers,
                                                  const Tensor& x);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  // Note [FP8 linear] (autograd/fp8_ops.h): with options, forward runs
  // fp8_linear (its output in x's dtype, the weight's FP8 copy its store's
  // when kept, Note [Window FP8 weights]); std::nullopt: plain linear. A
  // batch whose rows are not a multiple of 16 (a decode step of one token)
  // runs plain, as the FP8 GEMMs cannot take it, with the weight rounded to
  // x's dtype where its store moved it to the master (Note [FP8 codes in the
  // compute slots], optim/fp8_weights.h).
  void set_fp8(std::optional<Fp8LinearOptions> options) { fp8_ = options; }
  bool fp8() const { return fp8_.has_value(); }
  // gelu(forward(x)) with the bias and GELU in the GEMM's epilogue where
  // there is a bias: linear_gelu, or fp8_linear_gelu for an FP8 layer of the
  // per-tensor recipe (16-bit x); otherwise forward, then gelu.
  Tensor forward_gelu(const Tensor& x) const;

 private:
  // The options forward(x) runs fp8_linear with, or nothing: it runs plain.
  std::optional<Fp8LinearOptions> fp8_options_for(const Tensor& x) const;
  // The weight the plain path multiplies x by.
  Tensor plain_weight(const Tensor& x) const;

  Tensor weight_, bias_;
  std::optional<Fp8LinearOptions> fp8_;
};

// Every Linear of `m` and its descendants whose in and out features are
// multiples of 16 computes in FP8 with `options` (Note [FP8 linear]); the
// others stay as they are. Returns the converted layers' weights, for
// optim::ParamStore::keep_fp8_copies (Note [Window FP8 weights]).
std::vector<Tensor> use_fp8(Module& m, const Fp8LinearOptions& options = {});
// use_fp8 over each of `modules`, their weights in order.
template <class M>
std::vector<Tensor> use_fp8_each(const std::vector<M*>& modules, const Fp8LinearOptions& options) {
  std::vector<Tensor> weights;
  for (M* m : modules) {
    const std::vector<Tensor> w = use_fp8(*m, options);
    weights.insert(weights.end(), w.begin(), w.end());
  }
  return weights;
}

// A 2-D convolution over NCHW inputs (autograd/conv_ops.h; the CPU reference
// so far): weight [out, in / groups, k, k] and bias [out], initialized
// uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) as torch.nn.Conv2d's bias is.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, bool bias,
         const ParamOptions& options, const Conv2dOptions& conv = {});
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_, bias_;
  Conv2dOptions conv_;
};

// torch.nn.GroupNorm: weight ones and bias zeros, [channels] each.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t groups, int64_t channels, const ParamOptions& options, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;

 private:
  int64_t groups_;
  double eps_;
  Tensor weight_, bias_;
};

// Rows of a [num, dim] table, initialized normal(0, std).
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, const ParamOptions& options, double std = 0.02);
  Tensor forward(const Tensor& indices) const;
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

class LayerNorm : public Module {
 public:
  // Weight ones, bias zeros (no bias parameter when bias is false).
  LayerNorm(int64_t dim, const ParamOptions& options, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  double eps() const { return eps_; }

 private:
  Tensor weight_, bias_;
  double eps_;
};

class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) const;
};

// Note [Parameter gates] (autograd/parameter_gate.h): the current stream
// waits until the module's parameters hold the last close's step (a no-op
// unless a Window steps them beside the forward, Note [Close under the
// forward]). Models call it before each layer reads its weights.
void await_parameters(const Module& module);

// Linear -> GELU -> ... -> Linear over the given widths (at least two).
class MLP : public Module {
 public:
  MLP(const std::vector<int64_t>& widths, const ParamOptions& options);
  Tensor forward(const Tensor& x) const;

 private:
  std::vector<Linear*> layers_;
  GELU act_;
};

}  // namespace accrue::nn
