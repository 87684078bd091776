#include "accrue/core/cuda_graph.h"

#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"

#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime.h>

#include "accrue/core/status_check.h"
#endif

namespace accrue {

namespace {
thread_local bool t_capturing = false;

struct CapturingFlag {
  CapturingFlag() { t_capturing = true; }
  ~CapturingFlag() { t_capturing = false; }
};
}  // namespace

bool graph_capturing() {
  return t_capturing;
}

ForeignCaptureScope::ForeignCaptureScope() : previous_(t_capturing) {
  t_capturing = true;
}

ForeignCaptureScope::~ForeignCaptureScope() {
  t_capturing = previous_;
}

void refuse_in_graph(const std::string& what) {
  if (t_capturing) throw GraphRefused(what);
}

#ifdef ACCRUE_WITH_CUDA

GraphMemory graph_memory(int device) {
  set_cuda_device(device);
  unsigned long long current = 0, high = 0;
  ACCRUE_CUDA_CHECK(
      cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrReservedMemCurrent, &current));
  ACCRUE_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrReservedMemHigh, &high));
  return {static_cast<int64_t>(current), static_cast<int64_t>(high)};
}

std::unique_ptr<CudaGraph> CudaGraph::capture(int device, const std::function<void()>& body,
                                              std::string* why) {
  ACCRUE_CHECK(!t_capturing, "CudaGraph::capture: already capturing on this thread");
  if (cuda_allocator_mode() != CudaAllocatorMode::StreamOrderedPool) {
    *why = "the CUDA allocator is in plain mode, whose cudaMalloc a graph does not record";
    return nullptr;
  }
  set_cuda_device(device);
  auto stream = static_cast<cudaStream_t>(current_stream(device));
  ACCRUE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  auto end_capture = [&] {
    graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream, &graph);
    (void)cudaGetLastError();  // a broken capture's error is not sticky
    return e;
  };
  try {
    const CapturingFlag flag;
    body();
  } catch (const Error& e) {
    // A CUDA call the capture cannot record (a synchronization) fails with an
    // accrue::Error too: refused, like GraphRefused. Other errors would
    // repeat eagerly, where they are reported with nothing recorded around them.
    end_capture();
    if (graph != nullptr) cudaGraphDestroy(graph);
    *why = e.message();  // Note [Error locations]
    return nullptr;
  } catch (...) {
    end_capture();
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  const cudaError_t ended = end_capture();
  if (ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    *why = detail::str_cat("CUDA could not capture it (", cudaGetErrorString(ended), ")");
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made =
      cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    cudaGraphDestroy(graph);
    *why = detail::str_cat("CUDA could not instantiate the graph (", cudaGetErrorString(made), ")");
    return nullptr;
  }
  std::unique_ptr<CudaGraph> g(new CudaGraph());
  g->graph_ = graph;
  g->exec_ = exec;
  g->device_ = device;
  size_t nodes = 0;
  ACCRUE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  g->nodes_ = static_cast<int64_t>(nodes);
  return g;
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void CudaGraph::launch() const {
  set_cuda_device(device_);
  ACCRUE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_),
                                    static_cast<cudaStream_t>(current_stream(device_))));
}

#else  // !ACCRUE_WITH_CUDA

GraphMemory graph_memory(int device) {
  ACCRUE_FAIL("graph_memory(cuda:", device, "): accrue was built without CUDA");
}

std::unique_ptr<CudaGraph> CudaGraph::capture(int device, const std::function<void()>&,
                                              std::string*) {
  ACCRUE_FAIL("CudaGraph::capture(cuda:", device, "): accrue was built without CUDA");
}

CudaGraph::~CudaGraph() = default;

void CudaGraph::launch() const {
  ACCRUE_FAIL("CudaGraph::launch: accrue was built without CUDA");
}

#endif

}  // namespace accrue
