// The extension's entry point and the mapping of accrue's errors to Python
// exceptions.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "accrue/core/error.h"
#include "bindings.h"

namespace accrue::python {

namespace {
// Kept for the translator, which runs without the module object at hand;
// never released (a handle, not an object), so that nothing is freed after
// the interpreter is gone.
nb::handle g_error_type;
nb::handle g_oom_type;

// Raises `type(message)` with `.where` set to the C++ location of the check
// (Note [Error locations]): str(e) is the message alone, as a user reads it.
void raise(nb::handle type, const Error& e) {
  nb::object exc = type(e.message());
  exc.attr("where") = e.where();
  PyErr_SetObject(type.ptr(), exc.ptr());
}
}  // namespace

void bind_errors(nb::module_& m) {
  g_error_type = nb::handle(
      PyErr_NewExceptionWithDoc("accrue.Error",
                                "Bad input or a failed operation in accrue (accrue::Error): the "
                                "message names the operation and the values; `where` is the C++ "
                                "source location of the check.",
                                PyExc_RuntimeError, nullptr));
  g_oom_type = nb::handle(PyErr_NewExceptionWithDoc(
      "accrue.OutOfMemoryError",
      "A device (or the host) could not give the memory asked for (accrue::OutOfMemoryError); "
      "`requested_bytes` is how much.",
      nb::make_tuple(g_error_type, nb::handle(PyExc_MemoryError)).ptr(), nullptr));
  m.attr("Error") = g_error_type;
  m.attr("OutOfMemoryError") = g_oom_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const OutOfMemoryError& e) {
      nb::object exc = g_oom_type(e.message());
      exc.attr("where") = e.where();
      exc.attr("requested_bytes") = e.requested_bytes();
      PyErr_SetObject(g_oom_type.ptr(), exc.ptr());
    } catch (const Error& e) {
      raise(g_error_type, e);
    }
  });
}

}  // namespace accrue::python

NB_MODULE(_accrue, m) {
  using namespace accrue::python;
  m.doc() =
      "accrue's C++ engine: tensors, autograd, modules and the accumulation Window. Import "
      "`accrue`, which re-exports this module with Python conveniences (docs/PYTHON.md).";
  bind_errors(m);
  bind_types(m);
  bind_tensor(m);
  bind_factories(m);
  bind_dlpack(m);
  bind_autograd(m);
  bind_transformer(m);
  bind_checkpoint(m);
  nb::module_ nn =
      m.def_submodule("nn", "Native modules: Linear, Embedding, LayerNorm, MLP, GPT2.");
  bind_nn(nn);
  bind_llama(nn);
  nb::module_ optim = m.def_submodule(
      "optim", "Parameter store, optimizers, schedules, the accumulation Window and its verifier.");
  bind_optim(optim);
  bind_graphed_window(optim);
  bind_monitor(optim);
  nb::module_ bridge = m.def_submodule(
      "bridge", "What accrue.torch needs when PyTorch's autograd fills the gradient arena.");
  bind_bridge(bridge);
  nb::module_ dist = m.def_submodule(
      "dist", "Data parallelism: an NCCL communicator and the Reducer a Window syncs through.");
  bind_dist(dist);
  nb::module_ data = m.def_submodule(
      "data", "llm.c-format token shards and the rank-aware data loader of the trainers.");
  bind_data(data);
}
