// CUDA graphs as accrue sees them: capture a callable on the current stream,
// replay it, and let code that cannot be replayed say so.
//
// Note [Capturable code]
// ~~~~~~~~~~~~~~~~~~~~~~
// A captured graph replays the device work that the capture recorded, with
// the pointers and kernel arguments of that moment; the host code between the
// launches does not run again. So code is capturable when everything it
// decides on the host is the same on every replay:
//  - allocations come from the stream-ordered pool (cudaMallocAsync and
//    cudaFreeAsync become the graph's own memory nodes); plain cudaMalloc is
//    not recorded, so capture() refuses under CudaAllocatorMode::Plain;
//  - workspaces and plans exist before the capture (a first, eager run
//    creates them: the cuBLASLt workspace refuses to be created inside one);
//  - nothing synchronizes the host (CUDA ends the capture with an error);
//  - no host counter feeds a kernel argument that must change between
//    replays. Code that has one calls refuse_in_graph() first, before it
//    moves the counter: dropout, whose Philox offset advances on the host,
//    is the one such op today.
// A refused or failed capture has recorded work but run none of it, so the
// caller restores its own host state and runs the same code eagerly.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "accrue/core/error.h"

namespace accrue {

// Thrown by refuse_in_graph() inside a capture; the capture then fails and the caller runs eagerly.
class GraphRefused : public Error {
 public:
  using Error::Error;
};

// True on this thread while CudaGraph::capture runs its callable, or while a
// ForeignCaptureScope lives.
bool graph_capturing();

// Marks a capture accrue does not own, recording on this thread (the torch
// bridge under torch.cuda.graph, Note [Window captured whole] in
// optim/window.h): while it lives graph_capturing() is true, so accrue makes
// the host decisions of Note [Capturable code] as under CudaGraph::capture.
class ForeignCaptureScope {
 public:
  ForeignCaptureScope();
  ~ForeignCaptureScope();
  ForeignCaptureScope(const ForeignCaptureScope&) = delete;
  ForeignCaptureScope& operator=(const ForeignCaptureScope&) = delete;

 private:
  bool previous_;
};

// Note [Capturable code]: throws GraphRefused naming `what` when called inside a capture.
void refuse_in_graph(const std::string& what);

// Bytes the driver holds for graph memory nodes on `device` (current and high-water mark).
struct GraphMemory {
  int64_t reserved_bytes = 0;
  int64_t reserved_high_bytes = 0;
};
GraphMemory graph_memory(int device);

// One instantiated graph.
class CudaGraph {
 public:
  // Records `body` on device's current stream and instantiates it; nothing
  // runs. Returns null and sets *why when the body refused (GraphRefused) or
  // when CUDA could not capture or instantiate what it did (for example a
  // synchronizing call); any other exception from the body propagates, after
  // the capture is ended. Either way no work of the body ran.
  static std::unique_ptr<CudaGraph> capture(int device, const std::function<void()>& body,
                                            std::string* why);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Replays the graph on device's current stream.
  void launch() const;
  int64_t nodes() const { return nodes_; }

 private:
  CudaGraph() = default;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  int device_ = 0;
  int64_t nodes_ = 0;
};

}  // namespace accrue
