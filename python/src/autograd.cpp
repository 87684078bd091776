// The differentiable ops of autograd/ops.h and autograd/indexing_ops.h as
// module functions, backward, grad mode and gradcheck.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/parameter_gate.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "bindings.h"

namespace accrue::python {

namespace {

using Unary = Tensor (*)(const Tensor&);

void unary(nb::module_& m, const char* name, Unary f, const char* doc) {
  m.def(name, f, nb::arg("input"), doc);
}

Tensor optional_tensor(const std::optional<Tensor>& t) {
  return t ? *t : Tensor();
}

}  // namespace

Fp8LinearOptions fp8_options(const char* op, const std::string& recipe, DType grad_dtype) {
  ACCRUE_CHECK(recipe == "tensor" || recipe == "block", op,
               ": recipe must be 'tensor' or 'block', got '", recipe, "'");
  ACCRUE_CHECK(grad_dtype == DType::f8e5m2 || grad_dtype == DType::f8e4m3, op,
               ": grad_dtype must be f8e5m2 or f8e4m3, got ", dtype_name(grad_dtype));
  Fp8LinearOptions o;
  o.recipe = recipe == "block" ? Fp8Recipe::block : Fp8Recipe::tensor;
  o.grad_dtype = grad_dtype;
  return o;
}

void bind_autograd(nb::module_& m) {
  // ---- grad mode
  m.def("is_grad_enabled", &GradMode::is_enabled, "Whether ops record the graph on this thread.");
  m.def("set_grad_enabled", &GradMode::set_enabled, nb::arg("enabled"),
        "Turns graph recording on or off for this thread (accrue.no_grad() is the context "
        "manager).");
  m.def(
      "backward",
      [](const Tensor& root, std::optional<Tensor> seed, bool retain_graph) {
        backward(root, optional_tensor(seed), retain_graph);
      },
      nb::arg("tensor"), nb::arg("gradient") = nb::none(), nb::arg("retain_graph") = false,
      "Gradients of `tensor` into every leaf that requires grad (`gradient` required for a "
      "tensor of more than one element).");
  m.def("load_parameter", &load_parameter, nb::arg("param"), nb::arg("value"),
        "Sets a parameter's value through its owner (a ParamStore's master weights, then the "
        "compute copy), else by a copy. No graph.");
  m.def("parameter_value", &parameter_value, nb::arg("param"),
        "The parameter's authoritative value: its store's master slot, else the tensor.");
  m.def(
      "await_parameters",
      [](const std::vector<Tensor>& params) { accrue::await_parameters(params); },
      nb::arg("params"),
      "Waits until these parameters hold the last close's step (a no-op unless a Window with "
      "close_under_forward steps them beside the forward): call it before a layer reads its "
      "weights (Note [Close under the forward]).");

  // For accrue.nn.Module.to (Note [Python modules]).
  m.def(
      "_is_held",
      [](const Tensor& t) {
        const AutogradMeta* meta = autograd::find_meta(t);
        return meta != nullptr && (meta->sink != nullptr || meta->owner != nullptr);
      },
      nb::arg("param"), "True when a ParamStore or gradient arena holds the parameter.");
  m.def(
      "_repoint",
      [](const Tensor& dst, const Tensor& src) {
        TensorImpl& d = *dst.impl();
        const TensorImpl& s = *src.impl();
        d.storage = s.storage;
        d.offset = s.offset;
        d.shape = s.shape;
        d.strides = s.strides;
        d.dtype = s.dtype;
      },
      nb::arg("dst"), nb::arg("src"),
      "Makes dst view src's memory and geometry, keeping dst's identity and autograd state "
      "(torch's `param.data = src`): every handle of dst sees the change.");

  // ---- elementwise
  m.def("add", nb::overload_cast<const Tensor&, const Tensor&>(&add), nb::arg("a"), nb::arg("b"),
        "a + b (broadcasting; one dtype).");
  m.def("add", nb::overload_cast<const Tensor&, double>(&add), nb::arg("a"), nb::arg("b"),
        "a + s.");
  m.def("sub", nb::overload_cast<const Tensor&, const Tensor&>(&sub), nb::arg("a"), nb::arg("b"),
        "a - b.");
  m.def("mul", nb::overload_cast<const Tensor&, const Tensor&>(&mul), nb::arg("a"), nb::arg("b"),
        "a * b.");
  m.def("mul", nb::overload_cast<const Tensor&, double>(&mul), nb::arg("a"), nb::arg("b"),
        "a * s.");
  m.def("div", nb::overload_cast<const Tensor&, const Tensor&>(&div), nb::arg("a"), nb::arg("b"),
        "a / b.");
  unary(m, "neg", &neg, "-x.");
  unary(m, "exp", &exp, "e^x.");
  unary(m, "log", &log, "Natural log.");
  unary(m, "sqrt", &sqrt, "Square root.");
  unary(m, "rsqrt", &rsqrt, "1 / sqrt(x).");
  unary(m, "tanh", &tanh, "tanh.");
  unary(m, "relu", &relu, "max(x, 0).");
  unary(m, "gelu", &gelu, "GELU, tanh approximation (GPT-2's).");
  unary(m, "sigmoid", &sigmoid, "1 / (1 + e^-x).");
  unary(m, "silu", &silu, "x * sigmoid(x).");
  unary(m, "sin", &sin, "sin.");
  unary(m, "cos", &cos, "cos.");
  unary(m, "abs", &abs, "|x| (gradient 0 at 0, as PyTorch).");
  m.def("pow", &pow, nb::arg("input"), nb::arg("exponent"), "x ** exponent (a scalar).");
  m.def("clamp", &clamp, nb::arg("input"), nb::arg("min") = nb::none(), nb::arg("max") = nb::none(),
        "min(max(x, min), max), either bound absent; the gradient passes where min <= x <= max.");
  m.def("minimum", &minimum, nb::arg("a"), nb::arg("b"),
        "Elementwise min; ties split the gradient.");
  m.def("maximum", &maximum, nb::arg("a"), nb::arg("b"),
        "Elementwise max; ties split the gradient.");
  m.def("where", nb::overload_cast<const Tensor&, const Tensor&, const Tensor&>(&where),
        nb::arg("condition"), nb::arg("input"), nb::arg("other"),
        "condition ? input : other (condition a bool tensor).");
  m.def("where", nb::overload_cast<const Tensor&, const Tensor&, double>(&where),
        nb::arg("condition"), nb::arg("input"), nb::arg("other"), "condition ? input : scalar.");
  m.def("where", nb::overload_cast<const Tensor&, double, const Tensor&>(&where),
        nb::arg("condition"), nb::arg("input"), nb::arg("other"), "condition ? scalar : other.");
  m.def("masked_fill", &masked_fill, nb::arg("input"), nb::arg("mask"), nb::arg("value"),
        "input with `value` where the bool mask (broadcast) is true; no gradient there.");
  m.def("tril", &tril, nb::arg("input"), nb::arg("diagonal") = 0,
        "The lower triangle of the last two dims (j - i <= diagonal), zeros elsewhere.");
  m.def("triu", &triu, nb::arg("input"), nb::arg("diagonal") = 0,
        "The upper triangle of the last two dims (j - i >= diagonal), zeros elsewhere.");

  // ---- reductions
  m.def(
      "sum",
      [](const Tensor& x, nb::handle dim, bool keepdim) { return sum(x, dims_from(dim), keepdim); },
      nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
      "The sum over `dim` (an int or a sequence; every dim when None).");
  m.def(
      "mean",
      [](const Tensor& x, nb::handle dim, bool keepdim) {
        return mean(x, dims_from(dim), keepdim);
      },
      nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
      "The mean over `dim`.");
  m.def(
      "amax",
      [](const Tensor& x, nb::handle dim, bool keepdim) { return max(x, dims_from(dim), keepdim); },
      nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
      "The maximum over `dim` (torch.amax; accrue's max): ties split the gradient.");
  m.def("softmax", &softmax, nb::arg("input"), nb::arg("dim"), "softmax along dim.");
  m.def("log_softmax", &log_softmax, nb::arg("input"), nb::arg("dim"), "log_softmax along dim.");

  // ---- shapes
  m.def("reshape", &reshape, nb::arg("input"), nb::arg("shape"), "The same values in `shape`.");
  m.def("view", nb::overload_cast<const Tensor&, const Shape&>(&view), nb::arg("input"),
        nb::arg("shape"), "A view in `shape` (no copy; refused where strides forbid it).");
  m.def("transpose", nb::overload_cast<const Tensor&, int64_t, int64_t>(&transpose),
        nb::arg("input"), nb::arg("dim0"), nb::arg("dim1"), "Swaps two dims (a view).");
  m.def("permute", nb::overload_cast<const Tensor&, const std::vector<int64_t>&>(&permute),
        nb::arg("input"), nb::arg("dims"), "The dims in the given order (a view).");
  m.def("narrow", nb::overload_cast<const Tensor&, int64_t, int64_t, int64_t>(&narrow),
        nb::arg("input"), nb::arg("dim"), nb::arg("start"), nb::arg("length"),
        "Elements [start, start + length) of dim (a view).");
  m.def("select", nb::overload_cast<const Tensor&, int64_t, int64_t>(&select), nb::arg("input"),
        nb::arg("dim"), nb::arg("index"), "Index `index` of dim, the dim removed (a view).");
  m.def("unsqueeze", nb::overload_cast<const Tensor&, int64_t>(&unsqueeze), nb::arg("input"),
        nb::arg("dim"), "A new dim of size 1.");
  m.def("squeeze", nb::overload_cast<const Tensor&, int64_t>(&squeeze), nb::arg("input"),
        nb::arg("dim"), "Removes a dim of size 1.");
  m.def("expand", nb::overload_cast<const Tensor&, const Shape&>(&expand), nb::arg("input"),
        nb::arg("shape"), "Broadcasts to `shape` (a view; its gradient sums).");
  m.def("contiguous", nb::overload_cast<const Tensor&>(&contiguous), nb::arg("input"),
        "Row-major: the input when it is, else a copy.");
  m.def("clone", nb::overload_cast<const Tensor&>(&clone), nb::arg("input"), "A copy.");
  m.def("detach", &detach, nb::arg("input"), "The same memory, cut from the graph.");
  m.def("to_dtype", &to_dtype, nb::arg("input"), nb::arg("dtype"),
        "A cast between float dtypes; the gradient is cast back.");
  m.def("to_device", &to_device, nb::arg("input"), nb::arg("device"),
        "A copy on another device; the gradient is copied back.");

  // ---- matrix products and nn ops
  m.def("matmul", &matmul, nb::arg("a"), nb::arg("b"), "Matrix product (batched, broadcasting).");
  m.def(
      "linear",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) {
        return linear(x, w, optional_tensor(b));
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(),
      "input [..., in] @ weight[out, in]^T + bias[out].");
  m.def(
      "fp8_linear",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, DType forward_dtype,
         DType grad_dtype, int margin, DType out_dtype, const std::string& recipe) {
        Fp8LinearOptions o = fp8_options("fp8_linear", recipe, grad_dtype);
        o.forward_dtype = forward_dtype;
        o.margin = margin;
        o.out_dtype = out_dtype;
        return fp8_linear(x, w, optional_tensor(b), o);
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(),
      nb::arg("forward_dtype") = DType::f8e4m3, nb::arg("grad_dtype") = DType::f8e5m2,
      nb::arg("margin") = 0, nb::arg("out_dtype") = DType::bf16, nb::arg("recipe") = "tensor",
      "linear() with its three GEMMs in FP8, per-tensor current scaling (Note [FP8 linear]): "
      "input and weight in forward_dtype, the output gradient in grad_dtype, the weight "
      "gradient into its fp32 store slot. The weight's FP8 copy is its store's when the store "
      "keeps one (ParamStore.keep_fp8_copies), else cast now. recipe 'block' scales each 1 x 128 "
      "tile and 128 x 128 weight block (Note [FP8 block recipe]). Rows, in and out features "
      "must be multiples of 16.");
  m.def("embedding", &embedding, nb::arg("weight"), nb::arg("indices"),
        "Rows of weight [num, dim] at integer indices (accrue's argument order: weight first).");
  m.def(
      "layer_norm",
      [](const Tensor& x, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
        return layer_norm(x, optional_tensor(w), optional_tensor(b), eps);
      },
      nb::arg("input"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
      nb::arg("eps") = 1e-5, "LayerNorm over the last dim.");

  nb::class_<Loss>(m, "Loss",
                   "A loss as (sum, count): the summed loss (differentiable, 0-d) and the number "
                   "of counted targets (0-d i64). The Window divides by the window's total count "
                   "(Note [Normalization]); loss.mean() is sum / count for one batch.")
      .def(nb::init<>(), "An empty loss.")
      .def(
          "__init__",
          [](Loss* l, Tensor s, Tensor c) {
            new (l) Loss{std::move(s), std::move(c)};
          },
          nb::arg("sum"), nb::arg("count"), "A loss from its sum and count.")
      .def_rw("sum", &Loss::sum, "The summed loss, 0-d, differentiable.")
      .def_rw("count", &Loss::count, "The number of counted targets, 0-d i64.")
      .def(
          "mean", [](const Loss& l) { return div(l.sum, l.count.to(l.sum.dtype())); },
          "sum / count (differentiable): the mean over this loss's targets.")
      .def(
          "__iter__", [](const Loss& l) { return nb::iter(nb::make_tuple(l.sum, l.count)); },
          "sum, count = loss.");
  m.def("cross_entropy", &cross_entropy, nb::arg("logits"), nb::arg("targets"),
        nb::arg("ignore_index") = -100,
        "Cross-entropy of logits [..., classes] against integer targets, as a Loss (sum, count): "
        "targets equal to ignore_index are not counted. torch's reduction='sum' plus the count.");

  // ---- indexing
  m.def("cat", &cat, nb::arg("tensors"), nb::arg("dim") = 0, "Joins along an existing dim.");
  m.def("stack", &stack, nb::arg("tensors"), nb::arg("dim") = 0, "Joins along a new dim.");
  m.def(
      "split",
      [](const Tensor& x, nb::handle sizes, int64_t dim) {
        if (nb::isinstance<nb::int_>(sizes))
          return split(x, SplitSizes(nb::cast<int64_t>(sizes)), dim);
        return split(x, SplitSizes(nb::cast<std::vector<int64_t>>(sizes)), dim);
      },
      nb::arg("input"), nb::arg("split_size_or_sections"), nb::arg("dim") = 0,
      "Views of pieces of an int size (the last may be smaller) or of the listed sizes.");
  m.def("chunk", &chunk, nb::arg("input"), nb::arg("chunks"), nb::arg("dim") = 0,
        "At most `chunks` views of ceil(size / chunks).");
  m.def("unbind", &unbind, nb::arg("input"), nb::arg("dim") = 0,
        "The slices along dim, that dim removed (views).");
  m.def("repeat_interleave", &repeat_interleave, nb::arg("input"), nb::arg("repeats"),
        nb::arg("dim"), "Each slice along dim repeated `repeats` times in place.");
  m.def("gather", &gather, nb::arg("input"), nb::arg("dim"), nb::arg("index"),
        "out[i][j] = input[index[i][j]][j] for dim 0 (PyTorch's gather).");
  m.def("scatter_add", &scatter_add, nb::arg("input"), nb::arg("dim"), nb::arg("index"),
        nb::arg("src"), "input with src added at index along dim.");
  m.def("index_select", &index_select, nb::arg("input"), nb::arg("dim"), nb::arg("index"),
        "The slices along dim at index (a copy).");
  m.def("index_add", &index_add, nb::arg("input"), nb::arg("dim"), nb::arg("index"),
        nb::arg("source"), nb::arg("alpha") = 1.0, "input with alpha * source added at index.");
  m.def("one_hot", &one_hot, nb::arg("input"), nb::arg("num_classes") = -1,
        nb::arg("dtype") = DType::i64, "[..., num_classes] one-hot (not differentiable).");
  m.def("cumsum", &cumsum, nb::arg("input"), nb::arg("dim"), "Running sum along dim.");
  m.def("argmax", &argmax, nb::arg("input"), nb::arg("dim") = nb::none(),
        nb::arg("keepdim") = false, "Position of the first maximum (i64).");
  m.def(
      "sort",
      [](const Tensor& x, int64_t dim, bool descending) {
        SortResult r = sort(x, dim, descending);
        return std::make_pair(r.values, r.indices);
      },
      nb::arg("input"), nb::arg("dim") = -1, nb::arg("descending") = false,
      "(values, indices), stable; NaN above every number.");
  m.def("argsort", &argsort, nb::arg("input"), nb::arg("dim") = -1, nb::arg("descending") = false,
        "The sorting positions (i64).");
  m.def(
      "topk",
      [](const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
        SortResult r = topk(x, k, dim, largest, sorted);
        return std::make_pair(r.values, r.indices);
      },
      nb::arg("input"), nb::arg("k"), nb::arg("dim") = -1, nb::arg("largest") = true,
      nb::arg("sorted") = true, "(values, indices) of the k largest (or smallest).");

  // ---- gradcheck
  nb::class_<GradcheckResult>(m, "GradcheckResult", "What gradcheck found.")
      .def_ro("ok", &GradcheckResult::ok, "True when every gradient matched.")
      .def_ro("message", &GradcheckResult::message,
              "The first mismatch: input, element, analytic and numeric values.")
      .def(
          "__bool__", [](const GradcheckResult& r) { return r.ok; }, "ok.")
      .def(
          "__repr__",
          [](const GradcheckResult& r) {
            return r.ok ? std::string("GradcheckResult(ok=True)")
                        : "GradcheckResult(ok=False, message='" + r.message + "')";
          },
          "GradcheckResult(ok=...).");
  m.def(
      "gradcheck",
      [](nb::callable fn, const std::vector<Tensor>& inputs, double eps, double atol, double rtol,
         uint64_t seed, bool raise_exception) {
        GradcheckOptions o;
        o.eps = eps;
        o.atol = atol;
        o.rtol = rtol;
        o.seed = seed;
        GradcheckResult r = gradcheck(
            [&](const std::vector<Tensor>& xs) {
              nb::list args;
              for (const Tensor& x : xs)
                args.append(x);
              nb::object out = fn(*nb::tuple(args));
              if (nb::isinstance<Loss>(out)) return nb::cast<Loss>(out).sum;
              return nb::cast<Tensor>(out);
            },
            inputs, o);
        ACCRUE_CHECK(r.ok || !raise_exception, "gradcheck: ", r.message);
        return r;
      },
      nb::arg("fn"), nb::arg("inputs"), nb::arg("eps") = 1e-6, nb::arg("atol") = 1e-7,
      nb::arg("rtol") = 1e-5, nb::arg("seed") = 1, nb::arg("raise_exception") = true,
      "Checks the gradients of fn(*inputs) (f64 CPU tensors; those that require grad are "
      "checked) against central differences, on a random projection of the output. Raises "
      "accrue.Error on a mismatch unless raise_exception=False; returns the result.");
}

}  // namespace accrue::python
