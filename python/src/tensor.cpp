// accrue.Tensor: the handle, its operators and views (dtype, Device,
// Generator and the factories: types.cpp).
//
// Note [Python views]
// ~~~~~~~~~~~~~~~~~~~
// Methods and operators of the Python Tensor are the differentiable ops of
// autograd/ops.h, never Tensor's raw views (Note [Raw views]), so that a
// model written with them records the graph as the C++ one does. Indexing
// makes views: ints select, slices of step 1 narrow, None unsqueezes, ...
// skips dims. A slice of step > 1 is a strided view too, except on a tensor
// that requires grad while grad mode is on: no differentiable strided view
// exists, so that one is an index_select (a copy, with its gradient).
// Assignment (t[k] = v) writes through the raw views and refuses, as copy_
// does, a destination that requires grad.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <string>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/random.h"
#include "accrue/kernels/ops.h"
#include "bindings.h"

namespace accrue::python {

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    size_t used = 0;
    int index = -1;
    try {
      index = std::stoi(text.substr(5), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == text.size() - 5 && index >= 0) return Device::cuda(index);
  }
  ACCRUE_FAIL("device '", text, "': expected 'cpu', 'cuda' or 'cuda:<index>'");
}

std::vector<int64_t> dims_from(nb::handle dims) {
  if (dims.is_none()) return {};
  if (nb::isinstance<nb::int_>(dims)) return {nb::cast<int64_t>(dims)};
  return nb::cast<std::vector<int64_t>>(dims);
}

namespace {

// A shape from f(2, 3) or f((2, 3)) / f([2, 3]).
Shape shape_from(const nb::args& args) {
  if (args.size() == 1 && !nb::isinstance<nb::int_>(args[0])) return nb::cast<Shape>(args[0]);
  return nb::cast<Shape>(args);
}

nb::tuple to_tuple(const Shape& shape) {
  nb::list l;
  for (int64_t s : shape)
    l.append(s);
  return nb::tuple(l);
}

bool grad_tracked(const Tensor& t) {
  return GradMode::is_enabled() && t.requires_grad();
}

// Note [Python views]: a strided slice of dim d.
Tensor step_slice(const Tensor& t, int64_t d, int64_t start, int64_t length, int64_t step,
                  bool raw) {
  if (!raw && grad_tracked(t)) {
    Tensor idx = arange(static_cast<double>(start), static_cast<double>(start + length * step),
                        static_cast<double>(step), DType::i64, t.device());
    return index_select(t, d, idx);
  }
  Shape shape = t.shape(), strides = t.strides();
  const int64_t offset = t.offset() + (length > 0 ? start * strides[d] : 0);
  shape[d] = length;
  strides[d] *= step;
  return make_view(t, shape, strides, offset);
}

// Note [Python views]. `raw` selects Tensor's raw views (for assignment).
Tensor index(const Tensor& self, nb::handle key, bool raw) {
  if (nb::isinstance<Tensor>(key)) {
    ACCRUE_CHECK(!raw,
                 "Tensor.__setitem__: indexing by a tensor is not supported; index_add or "
                 "masked_fill write by index or mask");
    const Tensor& idx = nb::cast<const Tensor&>(key);
    ACCRUE_CHECK(idx.dim() == 1 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32),
                 "Tensor.__getitem__: a tensor index must be a 1-D i64 or i32 tensor, got ",
                 dtype_name(idx.dtype()), " of shape ", shape_str(idx.shape()),
                 " (boolean masks: use masked_fill or where)");
    return index_select(self, 0, idx);
  }
  std::vector<nb::handle> items;
  if (nb::isinstance<nb::tuple>(key)) {
    for (nb::handle h : nb::borrow<nb::tuple>(key))
      items.push_back(h);
  } else {
    items.push_back(key);
  }
  int64_t consuming = 0;
  bool ellipsis = false;
  for (nb::handle h : items) {
    if (h.ptr() == Py_Ellipsis) {
      ACCRUE_CHECK(!ellipsis, "Tensor.__getitem__: more than one Ellipsis (...)");
      ellipsis = true;
    } else if (!h.is_none()) {
      ++consuming;
    }
  }
  Tensor t = self;
  if (consuming > t.dim())
    throw nb::index_error(("too many indices for a tensor of " + std::to_string(t.dim()) +
                           " dims: " + std::to_string(consuming))
                              .c_str());
  int64_t d = 0;
  for (nb::handle h : items) {
    if (h.ptr() == Py_Ellipsis) {
      d = t.dim() - consuming;  // the dims the items after it consume stay
      continue;
    }
    if (h.is_none()) {
      t = raw ? t.unsqueeze(d) : unsqueeze(t, d);
      ++d;
      continue;
    }
    --consuming;
    const int64_t size = t.size(d);
    if (PySlice_Check(h.ptr())) {
      Py_ssize_t start = 0, stop = 0, step = 0;
      if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      if (step <= 0)
        throw nb::value_error("Tensor slices need a step >= 1 (views step forward only)");
      const int64_t length = PySlice_AdjustIndices(size, &start, &stop, step);
      if (step == 1) {
        t = raw ? t.narrow(d, start, length) : narrow(t, d, start, length);
      } else {
        t = step_slice(t, d, start, length, step, raw);
      }
      ++d;
      continue;
    }
    if (!nb::isinstance<nb::int_>(h))
      throw nb::type_error(
          ("Tensor indices are ints, slices, None, ... or a 1-D index tensor, not " +
           std::string(nb::str(nb::type_name(h.type())).c_str()))
              .c_str());
    int64_t i = nb::cast<int64_t>(h);
    if (i < -size || i >= size)
      throw nb::index_error(("index " + std::to_string(i) + " is out of range for dim " +
                             std::to_string(d) + " of size " + std::to_string(size))
                                .c_str());
    if (i < 0) i += size;
    t = raw ? t.select(d, i) : select(t, d, i);
  }
  return t;
}

Tensor to_dtype_any(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  if (grad_tracked(t)) return to_dtype(t, dtype);
  return t.to(dtype);
}

Tensor to_device_any(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  if (grad_tracked(t)) return to_device(t, device);
  return t.to(device);
}

nb::object numpy_of(nb::handle self) {
  const Tensor& t = nb::cast<const Tensor&>(self);
  ACCRUE_CHECK(t.device().is_cpu(), "Tensor.numpy(): the tensor is on ", t.device().str(),
               "; copy it to the host first: t.to('cpu').numpy()");
  ACCRUE_CHECK(!grad_tracked(t),
               "Tensor.numpy(): the tensor requires grad; call t.detach().numpy() (numpy would "
               "not carry the gradient)");
  ACCRUE_CHECK(t.dtype() != DType::bf16,
               "Tensor.numpy(): numpy has no bfloat16; convert first: t.to(accrue.f32).numpy()");
  return nb::module_::import_("numpy").attr("from_dlpack")(self);
}

const char kShapeDoc[] = "The sizes, as f(2, 3) or f((2, 3)).";

// Elementwise comparisons give bool tensors, which no gradient crosses.
template <kernels::CompareOp Op>
Tensor compare_with(const Tensor& a, nb::handle b) {
  if (nb::isinstance<Tensor>(b)) return kernels::compare(Op, a, nb::cast<const Tensor&>(b));
  return kernels::compare(Op, a, scalar_tensor(nb::cast<double>(b), a.dtype(), a.device()));
}

}  // namespace

void bind_tensor(nb::module_& m) {
  nb::class_<Tensor> t(m, "Tensor",
                       "A shared handle to (storage, offset, shape, strides, dtype), with autograd "
                       "state. Copying the handle shares it. Methods and operators are "
                       "differentiable (Note [Python views]).");
  t.def_prop_ro(
       "shape", [](const Tensor& x) { return to_tuple(x.shape()); }, "The sizes, a tuple.")
      .def(
          "size",
          [](const Tensor& x, std::optional<int64_t> dim) -> nb::object {
            if (dim) return nb::int_(x.size(*dim));
            return to_tuple(x.shape());
          },
          nb::arg("dim") = nb::none(), "The sizes (a tuple), or the size of `dim`.")
      .def(
          "stride", [](const Tensor& x) { return to_tuple(x.strides()); },
          "The strides, in elements.")
      .def("storage_offset", &Tensor::offset,
           "The offset of element 0 in its storage, in elements.")
      .def_prop_ro("ndim", &Tensor::dim, "The number of dims.")
      .def("dim", &Tensor::dim, "The number of dims.")
      .def("numel", &Tensor::numel, "The number of elements.")
      .def_prop_ro("dtype", &Tensor::dtype, "The element type.")
      .def_prop_ro("device", &Tensor::device, "Where the elements live.")
      .def("is_contiguous", &Tensor::is_contiguous, "Row-major and dense.")
      .def(
          "data_ptr", [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.data_ptr()); },
          "The address of element 0.")
      .def(
          "element_size", [](const Tensor& x) { return element_size(x.dtype()); },
          "Bytes per element.")
      .def(
          "__len__",
          [](const Tensor& x) {
            if (x.dim() == 0) throw nb::type_error("len() of a 0-d tensor");
            return x.size(0);
          },
          "The size of dim 0.")
      .def("item", &Tensor::item, "The value of a one-element tensor, as a Python float.")
      .def("__float__", &Tensor::item, "float(t) of a one-element tensor.")
      .def(
          "__int__", [](const Tensor& x) { return static_cast<int64_t>(x.item()); },
          "int(t) of a one-element tensor (truncated).")
      .def(
          "__bool__",
          [](const Tensor& x) {
            ACCRUE_CHECK(x.numel() == 1, "bool() of a tensor of ", x.numel(),
                         " elements is ambiguous");
            return x.item() != 0.0;
          },
          "bool(t) of a one-element tensor.")
      .def(
          "numpy", [](nb::handle self) { return numpy_of(self); },
          "A numpy array over the same memory (zero-copy, strides kept, writes show through): "
          "CPU tensors not requiring grad, any dtype but bf16.")
      .def(
          "__array__",
          [](nb::handle self, nb::handle dtype, nb::handle copy) {
            nb::object a = numpy_of(self);
            if (!dtype.is_none()) a = a.attr("astype")(dtype);
            if (!copy.is_none() && nb::cast<bool>(copy)) a = a.attr("copy")();
            return a;
          },
          nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none(),
          "numpy.asarray(t): as numpy().")
      .def(
          "tolist",
          [](nb::handle self) {
            const Tensor& x = nb::cast<const Tensor&>(self);
            NoGradGuard guard;
            Tensor host = x.to(Device::cpu());
            if (host.dtype() == DType::bf16) host = host.to(DType::f32);
            return numpy_of(nb::cast(host)).attr("tolist")();
          },
          "The values as (nested) Python lists.")
      .def(
          "__repr__",
          [](nb::handle self) {
            const Tensor& x = nb::cast<const Tensor&>(self);
            std::string body;
            {
              NoGradGuard guard;
              Tensor host = x.to(Device::cpu());
              if (host.dtype() == DType::bf16) host = host.to(DType::f32);
              body = nb::cast<std::string>(nb::module_::import_("numpy").attr("array2string")(
                  numpy_of(nb::cast(host)), nb::arg("separator") = ", ",
                  nb::arg("prefix") = "tensor("));
            }
            std::string out = "tensor(" + body + ", dtype=" + dtype_name(x.dtype());
            if (!x.device().is_cpu()) out += ", device='" + x.device().str() + "'";
            if (x.requires_grad()) out += ", requires_grad=True";
            return out + ")";
          },
          "tensor(array(...), dtype=f32[, device=...][, requires_grad=True]).")
      // ---- autograd
      .def_prop_rw(
          "requires_grad", &Tensor::requires_grad,
          [](const Tensor& x, bool on) { requires_grad_(x, on); },
          "Whether autograd tracks this tensor; set it on leaves.")
      .def(
          "requires_grad_", [](const Tensor& x, bool on) { return requires_grad_(x, on); },
          nb::arg("requires_grad") = true, "Marks a leaf as needing a gradient; returns self.")
      .def_prop_rw(
          "grad",
          [](const Tensor& x) -> std::optional<Tensor> {
            Tensor g = grad(x);
            if (!g.defined()) return std::nullopt;
            return g;
          },
          [](const Tensor& x, std::optional<Tensor> g) {
            if (g) {
              set_grad(x, *g);
            } else {
              clear_grad(x);
            }
          },
          nb::arg("value").none(),
          "The accumulated gradient of a leaf, or None; assigning None forgets it.")
      .def_prop_ro(
          "is_leaf", [](const Tensor& x) { return is_leaf(x); },
          "True for tensors no tracked op made.")
      .def(
          "backward",
          [](const Tensor& x, std::optional<Tensor> gradient, bool retain_graph) {
            backward(x, gradient ? *gradient : Tensor(), retain_graph);
          },
          nb::arg("gradient") = nb::none(), nb::arg("retain_graph") = false,
          "Computes the gradients of this tensor (a loss; else pass `gradient`, d objective / "
          "d this) into every leaf that requires grad.")
      .def(
          "detach", [](const Tensor& x) { return detach(x); },
          "The same memory, cut from the graph.")
      // ---- copies, conversions
      .def(
          "clone", [](const Tensor& x) { return clone(x); }, "A copy (differentiable).")
      .def(
          "contiguous", [](const Tensor& x) { return contiguous(x); },
          "Self when row-major and dense, else a row-major copy (differentiable).")
      .def("to", &to_dtype_any, nb::arg("dtype"),
           "A copy in `dtype` (self when it has it); differentiable between float dtypes.")
      .def(
          "to", [](const Tensor& x, DeviceArg d) { return to_device_any(x, d); }, nb::arg("device"),
          "A copy on `device` ('cpu', 'cuda:0', or a Device; self when there); differentiable.")
      .def(
          "cpu", [](const Tensor& x) { return to_device_any(x, Device::cpu()); }, "to('cpu').")
      .def(
          "cuda", [](const Tensor& x, int index) { return to_device_any(x, Device::cuda(index)); },
          nb::arg("index") = 0, "to('cuda:<index>').")
      .def(
          "copy_",
          [](const Tensor& x, const Tensor& src) {
            x.copy_(src);
            return x;
          },
          nb::arg("src"),
          "Copies src (broadcast, any dtype or device) into this tensor's memory; returns self. "
          "Refused on a tensor that requires grad outside no_grad().")
      .def(
          "fill_",
          [](const Tensor& x, double v) {
            x.fill_(v);
            return x;
          },
          nb::arg("value"), "Sets every element to `value`; returns self.")
      .def(
          "zero_",
          [](const Tensor& x) {
            x.fill_(0.0);
            return x;
          },
          "fill_(0).")
      // ---- views
      .def(
          "__getitem__", [](const Tensor& x, nb::handle key) { return index(x, key, false); },
          nb::arg("key"), "Views by int, slice, None and ... (Note [Python views]).")
      .def(
          "__setitem__",
          [](const Tensor& x, nb::handle key, nb::handle value) {
            Tensor dst = index(x, key, true);
            if (nb::isinstance<Tensor>(value)) {
              dst.copy_(nb::cast<const Tensor&>(value));
            } else {
              dst.fill_(nb::cast<double>(value));
            }
          },
          nb::arg("key"), nb::arg("value"),
          "Writes a tensor (broadcast) or a number into the view t[key].")
      .def(
          "view", [](const Tensor& x, nb::args s) { return view(x, shape_from(s)); }, kShapeDoc)
      .def(
          "reshape", [](const Tensor& x, nb::args s) { return reshape(x, shape_from(s)); },
          kShapeDoc)
      .def(
          "expand", [](const Tensor& x, nb::args s) { return expand(x, shape_from(s)); }, kShapeDoc)
      .def(
          "permute", [](const Tensor& x, nb::args s) { return permute(x, shape_from(s)); },
          "The dims in the given order, as f(1, 0) or f((1, 0)).")
      .def(
          "transpose", [](const Tensor& x, int64_t a, int64_t b) { return transpose(x, a, b); },
          nb::arg("dim0"), nb::arg("dim1"), "Swaps two dims (a view).")
      .def_prop_ro(
          "T",
          [](const Tensor& x) {
            ACCRUE_CHECK(x.dim() == 2, "Tensor.T: needs 2 dims, got ", shape_str(x.shape()));
            return transpose(x, 0, 1);
          },
          "The transpose of a matrix.")
      .def(
          "unsqueeze", [](const Tensor& x, int64_t d) { return unsqueeze(x, d); }, nb::arg("dim"),
          "A new dim of size 1 at `dim`.")
      .def(
          "squeeze", [](const Tensor& x, int64_t d) { return squeeze(x, d); }, nb::arg("dim"),
          "Removes `dim`, of size 1.")
      .def(
          "narrow",
          [](const Tensor& x, int64_t d, int64_t s, int64_t n) { return narrow(x, d, s, n); },
          nb::arg("dim"), nb::arg("start"), nb::arg("length"),
          "Elements [start, start + length) of dim.")
      .def(
          "select", [](const Tensor& x, int64_t d, int64_t i) { return select(x, d, i); },
          nb::arg("dim"), nb::arg("index"), "Index `index` of `dim`, the dim removed.")
      .def(
          "flatten", [](const Tensor& x) { return reshape(x, {x.numel()}); }, "reshape(-1).")
      // ---- math
      .def(
          "sum",
          [](const Tensor& x, nb::handle dim, bool keepdim) {
            return sum(x, dims_from(dim), keepdim);
          },
          nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
          "The sum over `dim` (an int or a sequence; all dims when None).")
      .def(
          "mean",
          [](const Tensor& x, nb::handle dim, bool keepdim) {
            return mean(x, dims_from(dim), keepdim);
          },
          nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, "The mean over `dim`.")
      .def(
          "max",
          [](const Tensor& x, nb::handle dim, bool keepdim) {
            return max(x, dims_from(dim), keepdim);
          },
          nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
          "The maximum over `dim` (values only; argmax gives positions).")
      .def(
          "softmax", [](const Tensor& x, int64_t d) { return softmax(x, d); }, nb::arg("dim"),
          "softmax along `dim`.")
      .def(
          "log_softmax", [](const Tensor& x, int64_t d) { return log_softmax(x, d); },
          nb::arg("dim"), "log_softmax along `dim`.")
      .def(
          "exp", [](const Tensor& x) { return exp(x); }, "e^x.")
      .def(
          "log", [](const Tensor& x) { return log(x); }, "Natural log.")
      .def(
          "sqrt", [](const Tensor& x) { return sqrt(x); }, "Square root.")
      .def(
          "rsqrt", [](const Tensor& x) { return rsqrt(x); }, "1 / sqrt(x).")
      .def(
          "tanh", [](const Tensor& x) { return tanh(x); }, "tanh.")
      .def(
          "relu", [](const Tensor& x) { return relu(x); }, "max(x, 0).")
      .def(
          "sigmoid", [](const Tensor& x) { return sigmoid(x); }, "1 / (1 + e^-x).")
      .def(
          "abs", [](const Tensor& x) { return abs(x); }, "|x| (gradient 0 at 0).")
      .def(
          "pow", [](const Tensor& x, double e) { return pow(x, e); }, nb::arg("exponent"),
          "x ** exponent.")
      .def(
          "matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, nb::arg("other"),
          "Matrix product (batched, broadcasting).")
      // ---- operators (Note [Broadcasting and dtypes]: no promotion)
      .def(
          "__add__", [](const Tensor& a, const Tensor& b) { return a + b; }, nb::is_operator(),
          "a + b.")
      .def(
          "__add__", [](const Tensor& a, double s) { return a + s; }, nb::is_operator(), "a + s.")
      .def(
          "__radd__", [](const Tensor& a, double s) { return s + a; }, nb::is_operator(), "s + a.")
      .def(
          "__sub__", [](const Tensor& a, const Tensor& b) { return a - b; }, nb::is_operator(),
          "a - b.")
      .def(
          "__sub__", [](const Tensor& a, double s) { return a - s; }, nb::is_operator(), "a - s.")
      .def(
          "__rsub__", [](const Tensor& a, double s) { return s - a; }, nb::is_operator(), "s - a.")
      .def(
          "__mul__", [](const Tensor& a, const Tensor& b) { return a * b; }, nb::is_operator(),
          "a * b.")
      .def(
          "__mul__", [](const Tensor& a, double s) { return a * s; }, nb::is_operator(), "a * s.")
      .def(
          "__rmul__", [](const Tensor& a, double s) { return s * a; }, nb::is_operator(), "s * a.")
      .def(
          "__truediv__", [](const Tensor& a, const Tensor& b) { return a / b; }, nb::is_operator(),
          "a / b.")
      .def(
          "__truediv__", [](const Tensor& a, double s) { return a / s; }, nb::is_operator(),
          "a / s.")
      .def(
          "__rtruediv__", [](const Tensor& a, double s) { return s / a; }, nb::is_operator(),
          "s / a.")
      .def(
          "__neg__", [](const Tensor& a) { return -a; }, "-a.")
      .def(
          "__pos__", [](const Tensor& a) { return a; }, "a.")
      .def(
          "__pow__", [](const Tensor& a, double e) { return pow(a, e); }, nb::is_operator(),
          "a ** e (a scalar exponent).")
      .def("__eq__", &compare_with<kernels::CompareOp::Eq>, nb::is_operator(),
           "a == b elementwise (a bool tensor).")
      .def("__ne__", &compare_with<kernels::CompareOp::Ne>, nb::is_operator(),
           "a != b elementwise (a bool tensor).")
      .def("__lt__", &compare_with<kernels::CompareOp::Lt>, nb::is_operator(),
           "a < b elementwise (a bool tensor).")
      .def("__le__", &compare_with<kernels::CompareOp::Le>, nb::is_operator(),
           "a <= b elementwise (a bool tensor).")
      .def("__gt__", &compare_with<kernels::CompareOp::Gt>, nb::is_operator(),
           "a > b elementwise (a bool tensor).")
      .def("__ge__", &compare_with<kernels::CompareOp::Ge>, nb::is_operator(),
           "a >= b elementwise (a bool tensor).")
      .def(
          "__hash__", [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.impl()); },
          "By identity of the shared handle (== is elementwise, as in PyTorch).")
      .def(
          "__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
          nb::is_operator(), "a @ b.");
}

}  // namespace accrue::python
