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

#include "accrue/core/cuda_graph.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/error.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
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
//
// Accrue memory goes back to its pool on accrue's current stream when its
// last handle dies (core/allocator.cpp), so the bridge lets its accrue
// temporaries (the loss probe, its gradient: the loss scale's seed, which is
// copied out first) die inside the scope: the free then follows their last
// use in torch's stream order, and under torch.cuda.graph it is a free node
// of the graph that allocated them. Dropped after the scope, they were freed
// on accrue's own stream: eagerly, with nothing ordering the seed's free
// after the backward that reads it; under a capture, a free of the graph's
// memory outside the graph, which invalidated the capture (a GPU run
// showed it: the next op failed with cudaErrorStreamCaptureInvalidated).
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

// A ForeignCaptureScope for Python's `with`: entered while torch.cuda.graph
// records the bridge's calls (Note [Window captured whole]).
class CaptureScope {
 public:
  void enter() {
    ACCRUE_CHECK(!scope_.has_value(), "bridge.CaptureScope: already entered");
    scope_.emplace();
  }
  void exit() { scope_.reset(); }

 private:
  std::optional<ForeignCaptureScope> scope_;
};

// __enter__ and __exit__ for a scope class with enter() and exit().
template <class Scope>
void bind_with_statement(nb::class_<Scope>& c, const char* exit_doc) {
  c.def(
       "__enter__",
       [](Scope& s) -> Scope& {
         s.enter();
         return s;
       },
       nb::rv_policy::reference)
      .def(
          "__exit__", [](Scope& s, nb::args) { s.exit(); }, exit_doc);
}

}  // namespace

void bind_bridge(nb::module_& m) {
  nb::class_<StreamScope> stream_scope(
      m, "StreamScope",
      "with StreamScope(device, stream): accrue's work on CUDA device `device` goes to `stream` "
      "(a cudaStream_t as an integer, 0 for the legacy default stream; "
      "torch.cuda.Stream.cuda_stream) on this thread (Note [Torch bridge streams]).");
  stream_scope.def(nb::init<int, uintptr_t>(), nb::arg("device"), nb::arg("stream"));
  bind_with_statement(stream_scope, "Restores the previous stream.");
  nb::class_<CaptureScope> capture_scope(
      m, "CaptureScope",
      "with CaptureScope(): accrue treats this thread as recording a CUDA graph it does not own "
      "(torch.cuda.graph), deciding on the host as under its own captures "
      "(Note [Window captured whole]).");
  capture_scope.def(nb::init<>());
  bind_with_statement(capture_scope, "Ends the scope.");
  // Note [Window captured whole]: the four calls around a capture of a whole window and
  // around each replay; the host state in between travels as a WholeCapture.
  nb::class_<optim::Window::WholeCapture>(m, "WholeCapture",
                                          "The Window's host state before a capture of a whole "
                                          "window (Note [Window captured whole]).");
  m.def(
      "begin_whole_capture", [](const optim::Window& w) { return w.begin_whole_capture(); },
      nb::arg("window"),
      "Refuses what a replayed whole window would get wrong; returns the host state to restore.");
  m.def(
      "end_whole_capture",
      [](optim::Window& w, const optim::Window::WholeCapture& before) {
        return w.end_whole_capture(before);
      },
      nb::arg("window"), nb::arg("before"),
      "Puts the host state back (the capture ran nothing); returns the written flags each "
      "replay repeats.");
  m.def(
      "before_whole_replay",
      [](optim::Window& w, const std::vector<bool>& written) { w.before_whole_replay(written); },
      nb::arg("window"), nb::arg("written"),
      "The unused-parameter check and this window's learning rates on the device, before a "
      "replay.");
  m.def(
      "after_whole_replay",
      [](optim::Window& w, const std::vector<bool>& written) { w.after_whole_replay(written); },
      nb::arg("window"), nb::arg("written"),
      "The K micro-steps' and the close's host bookkeeping, after a replay.");
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
