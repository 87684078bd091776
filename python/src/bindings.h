// What the binding files of accrue._accrue share: one bind_* function per
// area (each file owns one), and the conversions they all use.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accrue/autograd/fp8_ops.h"
#include "accrue/core/device.h"
#include "accrue/core/dtype.h"
#include "accrue/core/tensor.h"

namespace accrue::python {

namespace nb = nanobind;

// accrue.Error and accrue.OutOfMemoryError, and the translator that raises
// them (module.cpp).
void bind_errors(nb::module_& m);
// accrue.dtype, accrue.Device and accrue.Generator (types.cpp), before the Tensor.
void bind_types(nb::module_& m);
// accrue.Tensor (tensor.cpp).
void bind_tensor(nb::module_& m);
// The factories: zeros, ones, full, arange, rand, randn, ... (types.cpp), after the Tensor.
void bind_factories(nb::module_& m);
// accrue.from_dlpack, Tensor.__dlpack__ and Tensor.__dlpack_device__ (dlpack.cpp).
void bind_dlpack(nb::module_& m);
// The differentiable ops, backward, grad mode and gradcheck (autograd.cpp).
void bind_autograd(nb::module_& m);
// Fp8LinearOptions from Python's keywords (autograd.cpp); `op` names the
// caller in the error for a recipe other than 'tensor' or 'block'.
Fp8LinearOptions fp8_options(const char* op, const std::string& recipe,
                             DType grad_dtype = DType::f8e5m2);
// accrue._accrue.nn: the native modules (nn.cpp).
void bind_nn(nb::module_& m);
// accrue._accrue.optim: ParamStore, optimizers, schedules, Window, verify (optim.cpp).
void bind_optim(nb::module_& m);
// accrue._accrue.bridge: the store's written flags for accrue.torch (bridge.cpp).
void bind_bridge(nb::module_& m);
// accrue._accrue.dist (src/dist.cpp).
void bind_dist(nb::module_& m);
// accrue._accrue.optim.LayerMonitor and its reports (monitor.cpp), after bind_optim.
void bind_monitor(nb::module_& m);
// accrue._accrue.data: token shards and the data loader (data.cpp).
void bind_data(nb::module_& m);
// RMSNorm, RoPE, SwiGLU, attention and the other transformer ops (transformer.cpp).
void bind_transformer(nb::module_& m);
// accrue._accrue.nn's Llama, its config, BatchLayout, KV cache and greedy generation
// (llama.cpp), after bind_nn.
void bind_llama(nb::module_& m);
// save/load_safetensors and save/load_npy (checkpoint.cpp).
void bind_checkpoint(nb::module_& m);
// accrue._accrue.optim.GraphedWindow (checkpoint.cpp), after bind_optim.
void bind_graphed_window(nb::module_& m);

// "cpu", "cuda", "cuda:1" -> Device, or accrue::Error naming the text.
Device parse_device(const std::string& text);
// A device argument: a Device or its text. The text is parsed where the
// argument is used, so that a bad one raises accrue.Error with accrue's
// message rather than nanobind's "incompatible function arguments".
struct DeviceArg {
  std::optional<Device> device;
  std::string text;
  operator Device() const { return device ? *device : parse_device(text); }  // NOLINT: by design
};

// A dim list from an int or a sequence of ints (sum(x, 1), sum(x, (0, 2))).
std::vector<int64_t> dims_from(nb::handle dims);

}  // namespace accrue::python

namespace nanobind::detail {
template <>
struct type_caster<accrue::python::DeviceArg> {
  NB_TYPE_CASTER(accrue::python::DeviceArg, const_name("Device | str"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    if (PyUnicode_Check(src.ptr())) {
      Py_ssize_t size = 0;
      const char* text = PyUnicode_AsUTF8AndSize(src.ptr(), &size);
      if (text == nullptr) {
        PyErr_Clear();
        return false;
      }
      value.device.reset();
      value.text.assign(text, static_cast<size_t>(size));
      return true;
    }
    accrue::Device d;
    if (!try_cast(src, d)) return false;
    value.device = d;
    return true;
  }
  static handle from_cpp(const accrue::python::DeviceArg& v, rv_policy, cleanup_list*) noexcept {
    return cast(static_cast<accrue::Device>(v)).release();
  }
};
}  // namespace nanobind::detail
