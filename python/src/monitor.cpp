// accrue._accrue.optim.LayerMonitor: per-layer gradient norms and
// update-to-weight ratios of a window (Note [Layer monitor] in
// optim/layer_monitor.h), the health monitor's figures, from Python.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "accrue/optim/layer_monitor.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "bindings.h"

namespace accrue::python {

void bind_monitor(nb::module_& m) {
  using optim::GroupReport;
  using optim::LayerMonitor;
  using optim::LayerReport;
  nb::class_<LayerReport>(m, "LayerReport", "One parameter's figures of a measured window.")
      .def_ro("name", &LayerReport::name, "The parameter's name in the store.")
      .def_ro("grad_norm", &LayerReport::grad_norm,
              "Its part of the window's gradient norm (unscaled, over N, before clipping).")
      .def_ro("update_ratio", &LayerReport::update_ratio,
              "||p_after - p_before|| / ||p_before|| of the step (0 for a skipped window).")
      .def("__repr__", [](const LayerReport& r) {
        return "LayerReport(name='" + r.name + "', grad_norm=" + std::to_string(r.grad_norm) +
               ", update_ratio=" + std::to_string(r.update_ratio) + ")";
      });
  nb::class_<GroupReport>(m, "GroupReport", "A parameter group's figures, its slots together.")
      .def_ro("group", &GroupReport::group, "The group, as Optimizer.slot_groups numbers them.")
      .def_ro("grad_norm", &GroupReport::grad_norm, "The root-sum-square of its layers' norms.")
      .def_ro("update_ratio", &GroupReport::update_ratio,
              "||delta|| / ||p|| over all of the group's weights.");
  nb::class_<LayerMonitor>(
      m, "LayerMonitor",
      "Per-layer gradient norms and update ratios of the windows it measures "
      "(Note [Layer monitor]): before_close(), window.close(), after_close(), then "
      "read(window.report()).")
      .def(nb::init<const optim::ParamStore&>(), nb::arg("store"), nb::keep_alive<1, 2>(),
           "Separate passes over the store's slots, for any close (a captured one too).")
      .def(nb::init<const optim::ParamStore&, optim::Optimizer&>(), nb::arg("store"),
           nb::arg("optimizer"), nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(),
           "The sums from the optimizer's own fused pass (an eager close over the whole store).")
      .def("before_close", &LayerMonitor::before_close,
           "Right before window.close(): each slot's gradient norm and the weights.")
      .def("after_close", &LayerMonitor::after_close,
           "Right after window.close(): each slot's update and weight norms.")
      .def("read", &LayerMonitor::read, nb::arg("report"),
           "The measured window's figures per parameter, one host read; `report` is that "
           "window's (window.report()).")
      .def_prop_ro("total_update_ratio", &LayerMonitor::total_update_ratio,
                   "The update ratio over all parameters together, from the last read().")
      .def("groups", &LayerMonitor::groups, nb::arg("slot_group"),
           "Per parameter group from the last read(); slot_group from "
           "Optimizer.slot_groups(store).");
}

}  // namespace accrue::python
