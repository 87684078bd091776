// accrue._accrue.dist: data parallelism from Python (docs/PYTHON.md): an NCCL
// communicator built from a unique id the caller shares (accrue.torch shares
// it through torch.distributed), and the Reducer that sums a store's
// gradients over the ranks at the window's close (Note [Reducer] in
// dist/reducer.h), as a GradientSync a Window takes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "accrue/core/error.h"
#include "accrue/dist/bucket_plan.h"
#include "accrue/dist/process_group.h"
#include "accrue/dist/reducer.h"
#include "accrue/optim/gradient_sync.h"
#include "accrue/optim/param_store.h"
#include "bindings.h"
#ifdef ACCRUE_WITH_NCCL
#include "accrue/dist/nccl_communicator.h"
#endif

namespace accrue::python {

void bind_dist(nb::module_& m) {
#ifdef ACCRUE_WITH_NCCL
  m.attr("nccl_available") = true;
#else
  m.attr("nccl_available") = false;
#endif
  m.def(
      "nccl_unique_id",
      []() -> nb::bytes {
#ifdef ACCRUE_WITH_NCCL
        const auto id = dist::NcclCommunicator::make_unique_id();
        return nb::bytes(reinterpret_cast<const char*>(id.data()), id.size());
#else
        ACCRUE_FAIL("accrue.dist.nccl_unique_id: this build has no NCCL");
#endif
      },
      "A fresh NCCL unique id (rank 0 makes it; every rank of the world needs it).");

  nb::class_<dist::Communicator>(m, "Communicator",
                                 "The collectives data parallelism needs (dist/process_group.h).")
      .def_prop_ro("rank", &dist::Communicator::rank, "This rank.")
      .def_prop_ro("world_size", &dist::Communicator::world_size, "Ranks in the world.");

#ifdef ACCRUE_WITH_NCCL
  nb::class_<dist::NcclCommunicator, dist::Communicator>(
      m, "NcclCommunicator", "One rank of an NCCL world, one CUDA device per rank.")
      .def(
          "__init__",
          [](dist::NcclCommunicator* self, nb::bytes id, int rank, int world_size, int device) {
            dist::Blob blob{};
            ACCRUE_CHECK(id.size() == blob.size(),
                         "accrue.dist.NcclCommunicator: the unique id has ", id.size(),
                         " bytes; expected ", blob.size(), " (from nccl_unique_id())");
            std::memcpy(blob.data(), id.c_str(), blob.size());
            new (self) dist::NcclCommunicator(blob, rank, world_size, device);
          },
          nb::arg("unique_id"), nb::arg("rank"), nb::arg("world_size"), nb::arg("device"),
          "Joins the world the unique id names as `rank` of `world_size` on CUDA device "
          "`device`; every rank must call it.");
#endif

  nb::class_<dist::Reducer, optim::GradientSync>(
      m, "Reducer",
      "Sums a store's gradients and the window's item count over the communicator's ranks at "
      "the close (Note [Reducer]); a GradientSync for optim.Window(..., sync=reducer).")
      .def(
          "__init__",
          [](dist::Reducer* self, optim::ParamStore& store, dist::Communicator& comm, bool zero1,
             std::optional<double> bucket_mb, const std::string& transport) {
            dist::ReducerOptions o;
            o.zero1 = zero1;
            if (bucket_mb) o.buckets = dist::buckets_of_mib(*bucket_mb);
            if (transport == "bf16" || transport == "f16") {
              o.transport = transport == "bf16" ? DType::bf16 : DType::f16;
            } else {
              ACCRUE_CHECK(transport == "exact",
                           "accrue.dist.Reducer: transport must be "
                           "'exact', 'bf16' or 'f16', got '",
                           transport, "'");
            }
            new (self) dist::Reducer(store, comm, o);
          },
          nb::arg("store"), nb::arg("communicator"), nb::arg("zero1") = false,
          nb::arg("bucket_mb").none() = nb::none(), nb::arg("transport") = "exact",
          nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(),
          "zero1 shards the optimizer state (Note [ZeRO-1]): the store must be built with "
          "shard_ranks = the world size. bucket_mb: the buckets' size in MiB (None: 25; "
          "PyTorch DDP's bucket_cap_mb). transport: 'exact' (the store's dtype), or 'bf16' / "
          "'f16' for half the bytes at a rounding cost (Note [Gradient transport]).")
      .def("broadcast_parameters", &dist::Reducer::broadcast_parameters, nb::arg("root") = 0,
           "Every rank's weights (and moments) become rank `root`'s; call once before training.")
      .def_prop_ro("world_size", &dist::Reducer::world_size, "Ranks the sums run over.")
      .def("grad_ready", &dist::Reducer::grad_ready, nb::arg("slot"),
           "Slot `slot`'s gradient is final in this backward (for an autograd other than "
           "accrue's): in the last micro-step, sends the buckets that became complete, after "
           "the current stream's work (Note [Reducer]).")
      .def_prop_ro("buckets_sent_in_backward", &dist::Reducer::buckets_sent_in_backward,
                   "Of the last closed window: buckets reduced during its last backward (the "
                   "rest went at the close).")
      .def_prop_ro("collectives_issued", &dist::Reducer::collectives_issued,
                   "Collectives enqueued so far (buckets, item counts, broadcasts, the layout "
                   "check).");
}

}  // namespace accrue::python
