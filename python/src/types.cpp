// accrue.dtype, accrue.Device, accrue.Generator and the tensor factories
// (zeros, ones, full, arange, rand, randn, randint, ...).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include <string>

#include "accrue/autograd/variable.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/random.h"
#include "bindings.h"

namespace accrue::python {

void bind_types(nb::module_& m) {
  nb::enum_<DType>(m, "dtype",
                   "Element types. accrue never promotes: operands of one op share a dtype.")
      .value("f32", DType::f32, "32-bit float (torch.float32)")
      .value("f64", DType::f64, "64-bit float (torch.float64)")
      .value("bf16", DType::bf16, "bfloat16 (torch.bfloat16)")
      .value("f16", DType::f16, "IEEE half (torch.float16)")
      .value("i32", DType::i32, "32-bit integer (torch.int32)")
      .value("i64", DType::i64, "64-bit integer (torch.int64)")
      .value("bool", DType::boolean, "bool (torch.bool)")
      .value("f8e4m3", DType::f8e4m3,
             "FP8 e4m3fn, storage for scaled GEMMs (torch.float8_e4m3fn; Note [FP8 dtypes])")
      .value("f8e5m2", DType::f8e5m2,
             "FP8 e5m2, storage for scaled GEMMs (torch.float8_e5m2; Note [FP8 dtypes])");
  m.def(
      "element_size", [](DType t) { return element_size(t); }, nb::arg("dtype"),
      "Bytes per element of `dtype`.");
  m.def(
      "is_floating_point", [](DType t) { return is_floating(t); }, nb::arg("dtype"),
      "True for f32, f64, bf16 and f16.");

  nb::class_<Device>(m, "Device", "Where a tensor lives: 'cpu' or 'cuda:<index>'.")
      .def(
          "__init__",
          [](Device* d, const std::string& text) { new (d) Device(parse_device(text)); },
          nb::arg("device"), "Parses 'cpu', 'cuda' (device 0) or 'cuda:<index>'.")
      .def_prop_ro(
          "type", [](const Device& d) { return d.is_cpu() ? "cpu" : "cuda"; }, "'cpu' or 'cuda'.")
      .def_prop_ro(
          "index", [](const Device& d) { return d.index; }, "The CUDA device index (0 on the CPU).")
      .def("__str__", &Device::str, "'cpu' or 'cuda:<index>'.")
      .def(
          "__repr__", [](const Device& d) { return "device('" + d.str() + "')"; }, "device('cpu').")
      .def(
          "__eq__", [](const Device& a, const Device& b) { return a == b; }, nb::arg("other"),
          "Same kind and, for CUDA, same index.")
      .def(
          "__hash__", [](const Device& d) { return std::hash<std::string>()(d.str()); },
          "Hash of str(device).");

  m.def("cuda_is_available", &cuda_available,
        "True when accrue was built with CUDA and a device is usable (torch.cuda.is_available).");
  m.def("cuda_device_count", &cuda_device_count, "CUDA devices accrue can use (0 without CUDA).");

  nb::class_<Generator>(m, "Generator",
                        "A seed and a running counter: counter-based random numbers, the same on "
                        "the CPU and every GPU for one seed.")
      .def(nb::init<uint64_t>(), nb::arg("seed") = 0, "A generator at counter 0 of `seed`.")
      .def_prop_ro("seed", &Generator::seed, "The seed.")
      .def_prop_ro("offset", &Generator::offset, "The next counter a draw takes.")
      .def("set_state", &Generator::set_state, nb::arg("seed"), nb::arg("offset"),
           "Restarts at `offset` of `seed` (resume a run).")
      .def(
          "manual_seed",
          [](Generator& g, uint64_t seed) -> Generator& {
            g.set_state(seed, 0);
            return g;
          },
          nb::arg("seed"), nb::rv_policy::reference,
          "Restarts at counter 0 of `seed`; returns self.");
  m.def("manual_seed", &manual_seed, nb::arg("seed"), "Seeds the default generator.");
  m.def("default_generator", &default_generator, nb::rv_policy::reference,
        "The process-wide generator used when none is passed.");
}

void bind_factories(nb::module_& m) {
  const auto factory = [](Tensor x, bool requires_grad) {
    if (requires_grad) requires_grad_(x, true);
    return x;
  };
  m.def(
      "empty",
      [=](const Shape& shape, DType dtype, DeviceArg device, bool rg) {
        return factory(empty(shape, dtype, device), rg);
      },
      nb::arg("shape"), nb::arg("dtype") = DType::f32, nb::arg("device") = "cpu",
      nb::arg("requires_grad") = false, "An uninitialized tensor.");
  m.def(
      "zeros",
      [=](const Shape& shape, DType dtype, DeviceArg device, bool rg) {
        return factory(zeros(shape, dtype, device), rg);
      },
      nb::arg("shape"), nb::arg("dtype") = DType::f32, nb::arg("device") = "cpu",
      nb::arg("requires_grad") = false, "A tensor of zeros.");
  m.def(
      "ones",
      [=](const Shape& shape, DType dtype, DeviceArg device, bool rg) {
        return factory(ones(shape, dtype, device), rg);
      },
      nb::arg("shape"), nb::arg("dtype") = DType::f32, nb::arg("device") = "cpu",
      nb::arg("requires_grad") = false, "A tensor of ones.");
  m.def(
      "full",
      [=](const Shape& shape, double value, DType dtype, DeviceArg device, bool rg) {
        return factory(full(shape, value, dtype, device), rg);
      },
      nb::arg("shape"), nb::arg("fill_value"), nb::arg("dtype") = DType::f32,
      nb::arg("device") = "cpu", nb::arg("requires_grad") = false, "A tensor of `fill_value`.");
  m.def(
      "arange",
      [=](double start, std::optional<double> end, double step, std::optional<DType> dtype,
          DeviceArg device, bool rg) {
        if (!end) {
          end = start;
          start = 0.0;
        }
        const auto integral = [](double v) { return std::floor(v) == v; };
        const DType d = dtype.value_or(
            integral(start) && integral(*end) && integral(step) ? DType::i64 : DType::f32);
        return factory(arange(start, *end, step, d, device), rg);
      },
      nb::arg("start"), nb::arg("end") = nb::none(), nb::arg("step") = 1.0,
      nb::arg("dtype") = nb::none(), nb::arg("device") = "cpu", nb::arg("requires_grad") = false,
      "[start, end) by step (arange(n): [0, n)); i64 when all three are whole numbers, else "
      "f32, unless `dtype` says.");
  m.def(
      "rand",
      [=](const Shape& shape, DType dtype, DeviceArg device, Generator* gen, bool rg) {
        return factory(rand(shape, dtype, device, gen), rg);
      },
      nb::arg("shape"), nb::arg("dtype") = DType::f32, nb::arg("device") = "cpu",
      nb::arg("generator") = nb::none(), nb::arg("requires_grad") = false,
      "Uniform on [0, 1) (the default generator unless one is passed).");
  m.def(
      "randn",
      [=](const Shape& shape, DType dtype, DeviceArg device, Generator* gen, bool rg) {
        return factory(randn(shape, dtype, device, gen), rg);
      },
      nb::arg("shape"), nb::arg("dtype") = DType::f32, nb::arg("device") = "cpu",
      nb::arg("generator") = nb::none(), nb::arg("requires_grad") = false, "Standard normal.");
  m.def(
      "randint",
      [](int64_t low, int64_t high, const Shape& shape, DType dtype, DeviceArg device,
         Generator* gen) { return randint(low, high, shape, dtype, device, gen); },
      nb::arg("low"), nb::arg("high"), nb::arg("shape"), nb::arg("dtype") = DType::i64,
      nb::arg("device") = "cpu", nb::arg("generator") = nb::none(),
      "Integers uniform on [low, high).");
  m.def(
      "scalar_tensor",
      [](double v, DType dtype, DeviceArg device) { return scalar_tensor(v, dtype, device); },
      nb::arg("value"), nb::arg("dtype") = DType::f32, nb::arg("device") = "cpu", "A 0-d tensor.");
}

}  // namespace accrue::python
