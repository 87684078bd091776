// accrue._accrue.bridge: what accrue.torch (python/accrue/torch.py) needs
// beyond the public optim bindings, when PyTorch's autograd, not accrue's,
// fills the gradient arena.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "accrue/core/error.h"
#include "accrue/optim/param_store.h"
#include "bindings.h"

namespace accrue::python {

void bind_bridge(nb::module_& m) {
  // Note [Overwrite first] zeroes at the close the slots accrue's backward
  // did not write; PyTorch's AccumulateGrad writes them behind accrue's back,
  // so the bridge tells the store which ones it wrote.
  m.def(
      "written_flags",
      [](const optim::ParamStore& store) {
        const std::vector<bool>& f = store.written_flags();
        return std::vector<bool>(f.begin(), f.end());
      },
      nb::arg("store"), "One flag per slot: written in this window (Note [Overwrite first]).");
  m.def(
      "set_written_flags",
      [](optim::ParamStore& store, const std::vector<bool>& flags) {
        ACCRUE_CHECK(flags.size() == store.size(), "bridge.set_written_flags: ", flags.size(),
                     " flags for a store of ", store.size(), " parameters");
        store.set_written_flags(flags);
      },
      nb::arg("store"), nb::arg("flags"),
      "Marks the slots written in this window, one flag per slot, for gradients that PyTorch "
      "accumulated into the arena.");
}

}  // namespace accrue::python
