// Checkpoint files and the graphed Window: accrue.save_safetensors /
// load_safetensors / save_npy / load_npy (core/tensor_io.h), and
// accrue._accrue.optim.GraphedWindow (optim/graphed_window.h). With
// Window.state_dict and Module.state_dict they let a Python loop checkpoint
// and resume bitwise.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "accrue/core/tensor_io.h"
#include "accrue/optim/graphed_window.h"
#include "accrue/optim/window.h"
#include "bindings.h"

namespace accrue::python {

void bind_checkpoint(nb::module_& m) {
  m.def(
      "save_safetensors",
      [](const std::string& path, const std::map<std::string, Tensor>& tensors,
         const std::map<std::string, std::string>& metadata) {
        save_safetensors(path, tensors, metadata);
      },
      nb::arg("path"), nb::arg("tensors"),
      nb::arg("metadata") = std::map<std::string, std::string>{},
      "Writes a dict of tensors (any device, dtype and strides) as a .safetensors file with "
      "CRC32C checksums; `metadata` is a str -> str dict. Window.state_dict() and "
      "Module.state_dict() save with it.");
  m.def(
      "load_safetensors",
      [](const std::string& path, bool with_metadata) -> nb::object {
        std::map<std::string, std::string> metadata;
        std::map<std::string, Tensor> tensors = load_safetensors(path, &metadata);
        if (with_metadata) return nb::make_tuple(tensors, metadata);
        return nb::cast(tensors);
      },
      nb::arg("path"), nb::arg("with_metadata") = false,
      "Reads a .safetensors file into a dict of CPU tensors (checksums verified where the "
      "file has them); with_metadata=True returns (tensors, metadata).");
  m.def("save_npy", &save_npy, nb::arg("path"), nb::arg("tensor"),
        "Writes one tensor as numpy's .npy (bf16 refused: convert to f32 first).");
  m.def("load_npy", &load_npy, nb::arg("path"), "Reads a numpy .npy file into a CPU tensor.");
}

void bind_graphed_window(nb::module_& m) {
  using optim::GraphedWindow;
  nb::class_<GraphedWindow::Counts>(m, "GraphedWindowCounts",
                                    "How a GraphedWindow's calls ran: replayed or eager.")
      .def_ro("replayed_micro_steps", &GraphedWindow::Counts::replayed_micro_steps,
              "Micro-steps launched from a graph (the capturing one included).")
      .def_ro("eager_micro_steps", &GraphedWindow::Counts::eager_micro_steps,
              "Micro-steps run eagerly.")
      .def_ro("replayed_closes", &GraphedWindow::Counts::replayed_closes,
              "Closes launched from a graph.")
      .def_ro("eager_closes", &GraphedWindow::Counts::eager_closes, "Closes run eagerly.")
      .def_ro("graphs", &GraphedWindow::Counts::graphs, "Graphs captured so far.");
  nb::class_<GraphedWindow>(
      m, "GraphedWindow",
      "A Window whose micro-steps and close replay as CUDA graphs (Note [Graphed window]): "
      "`step(*inputs)` is the forward of one micro-step and returns its Loss; backward(inputs) "
      "runs it and the Window's backward. On the CPU every call runs eagerly.")
      .def(
          "__init__",
          [](GraphedWindow* self, optim::Window& window, nb::callable step) {
            new (self) GraphedWindow(window, [step](const std::vector<Tensor>& inputs) {
              nb::gil_scoped_acquire gil;
              nb::list args;
              for (const Tensor& t : inputs)
                args.append(t);
              return nb::cast<Loss>(step(*nb::tuple(args)));
            });
          },
          nb::arg("window"), nb::arg("step"), nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(),
          "Wraps `window`; step(*inputs) -> Loss must not keep the tensors it makes.")
      .def("backward", &GraphedWindow::backward, nb::arg("inputs"),
           "One micro-step on these inputs (a list of tensors): step(*inputs), then the "
           "Window's backward; replayed from a graph once one is captured.")
      .def("ready", &GraphedWindow::ready, "True after K micro-steps.")
      .def("close", &GraphedWindow::close, "The Window's close, replayed once captured.")
      .def_prop_rw("concurrent_micro_batches", &GraphedWindow::concurrent_micro_batches,
                   &GraphedWindow::set_concurrent_micro_batches,
                   "Micro-steps in flight at once under the graphs, each on its own stream, "
                   "the same bits (Note [Concurrent micro-batches]); 1 (the default): one after "
                   "another. Set before the first backward.")
      .def_prop_rw("weight_grad_branch", &GraphedWindow::weight_grad_branch,
                   &GraphedWindow::set_weight_grad_branch,
                   "The lag of the weight-gradient branch: with lag >= 1 the captured "
                   "micro-steps issue their Linear, convolution, LayerNorm and classifier "
                   "parameter gradients "
                   "on a side stream "
                   "beside the rest of the backward, the same bits "
                   "(Note [Weight gradients on a branch]); 0 (the default): inline. Not with "
                   "concurrent micro-batches. Set before the first backward.")
      .def("flush", &GraphedWindow::flush,
           "Runs the micro-steps whose inputs wait for the rest of their group (Note "
           "[Concurrent micro-batches]), so that window.micro_step counts every input: before "
           "a checkpoint inside a window.")
      .def_prop_ro("window", &GraphedWindow::window, nb::rv_policy::reference_internal,
                   "The wrapped Window (report(), state_dict(), ...).")
      .def_prop_ro("counts", &GraphedWindow::counts, nb::rv_policy::copy,
                   "GraphedWindowCounts: what was replayed and what ran eagerly.")
      .def_prop_ro("why_eager", &GraphedWindow::why_eager,
                   "Why nothing is captured at all (empty when graphs are used; empty on the "
                   "CPU, where every call is eager silently).");
}

}  // namespace accrue::python
