// accrue._accrue.bridge: what accrue.torch (python/accrue/torch.py) needs
// beyond the public optim bindings, when PyTorch's autograd, not accrue's,
// fills the gradient arena.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <vector>

#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/error.h"
#include "accrue/optim/param_store.h"
#include "bindings.h"

namespace accrue::python {

namespace {

// Note [Torch bridge streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's autograd fills the gradient arena on torch's current stream, and
// the model's next forward reads, on that stream, the parameters the close
// wrote. So accrue's work for the bridge (the Window's micro-step, the close,
// the reducer's bucket sends, the report's read, the state copies) runs on
// torch's current stream: a StreamScope makes that stream accrue's current
// stream (Note [Current stream]) for the calling thread while it is open,
// and the two sides' kernels fall into one stream order, with no event and
// no host synchronization. (Before, the close ran on accrue's own stream:
// nothing ordered it after the last backward's gradient kernels, nor the
// next forward after it; the tests read a report, a host synchronization,
// after every close, which hid that.) Torch names its legacy default stream
// 0, which is cudaStreamLegacy here: accrue's null handle means its own
// stream. The reducer's hooks run on PyTorch's autograd thread, whose
// current stream is the one the backward runs on, so the bridge opens a
// scope there too.
class StreamScope {
 public:
  StreamScope(int device, uintptr_t stream) : device_(device), stream_(stream) {}

  void enter() {
    ACCRUE_CHECK(!guard_.has_value(), "bridge.StreamScope: already entered");
#ifdef ACCRUE_WITH_CUDA
    const StreamHandle handle = stream_ == 0 ? reinterpret_cast<StreamHandle>(cudaStreamLegacy)
                                             : reinterpret_cast<StreamHandle>(stream_);
    guard_.emplace(device_, handle);
#else
    ACCRUE_FAIL("bridge.StreamScope: a CUDA stream in a build without CUDA");
#endif
  }
  void exit() {
    guard_.reset();
  }

 private:
  int device_;
  uintptr_t stream_;
  std::optional<StreamGuard> guard_;
};

}  // namespace

void bind_bridge(nb::module_& m) {
  nb::class_<StreamScope>(m, "StreamScope",
                          "with StreamScope(device, stream): accrue's work on CUDA device "
                          "`device` goes to `stream` (a cudaStream_t as an integer, 0 for the "
                          "legacy default stream; torch.cuda.Stream.cuda_stream) on this thread "
                          "(Note [Torch bridge streams]).")
      .def(nb::init<int, uintptr_t>(), nb::arg("device"), nb::arg("stream"))
      .def(
          "__enter__",
          [](StreamScope& s) -> StreamScope& {
            s.enter();
            return s;
          },
          nb::rv_policy::reference)
      .def(
          "__exit__", [](StreamScope& s, nb::args) { s.exit(); }, "Restores the previous stream.");
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
