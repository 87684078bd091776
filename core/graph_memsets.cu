// Note [Memset nodes as kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A captured stream's cudaMemsetAsync (ours, cuDNN's zeroed dQ accumulator
// before its flash backward, cuBLASLt's split-K workspace) becomes a memset
// node. On an H200 a graph replay idles 2-5 us after each memset node before
// the next kernel starts (bench/kernel_trace.py's gap pairs: 1.6 ms of GPT-2
// 124M's 4 x 8 window and 3.9 ms of its 1 x 32 one, against 0.3 ms at 32 x
// 1), where one kernel follows another within about 1 us. So
// CudaGraph::capture rewrites each memset node, before it instantiates the
// graph, as a kernel node that writes the same bytes:
//  - the memset's value repeated in elements of 1, 2 or 4 bytes over
//    `height` rows of `width` elements, `pitch` bytes apart, as the widest
//    word (16, 4, 2 or 1 bytes) that the address, the pitch and the row's
//    bytes allow; the bytes written are exactly the memset's;
//  - the kernel node gets the memset node's incoming and outgoing edges,
//    with their edge data. The memset node stays in the graph, because CUDA
//    destroys no node of a graph that holds memory nodes (every capture with
//    the stream-ordered pool does), and is disabled in the instantiated
//    graph, which runs it as an empty node. Child graphs are left alone;
//  - the environment variable ACCRUE_GRAPH_MEMSET_NODES=1 keeps the memset
//    nodes (for a side-by-side timing).
// A replay then writes the same bytes as before, at the same point.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "accrue/core/graph_memsets.h"
#include "accrue/core/status_check.h"

namespace accrue::detail {

namespace {

constexpr int kThreads = 256;

// Rows (blockIdx.y, grid-strided) of row_words words each, pitch bytes apart.
template <class W>
__global__ void __launch_bounds__(kThreads)
    fill_rows_kernel(char* dst, size_t pitch, size_t row_words, size_t rows, W word) {
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
    W* row = reinterpret_cast<W*>(dst + r * pitch);
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < row_words;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
      row[i] = word;
  }
}

// The memset's value as 4 bytes: its element repeated.
uint32_t repeated_value(const cudaMemsetParams& p) {
  if (p.elementSize == 1) return (p.value & 0xffu) * 0x01010101u;
  if (p.elementSize == 2) return (p.value & 0xffffu) * 0x00010001u;
  return p.value;
}

// Adds the kernel node that writes what memset node p writes; no edges yet.
template <class W>
cudaGraphNode_t add_fill_node(cudaGraph_t graph, const cudaMemsetParams& p, W word) {
  char* dst = static_cast<char*>(p.dst);
  size_t pitch = p.height > 1 ? p.pitch : 0;
  size_t row_words = p.width * p.elementSize / sizeof(W);
  size_t rows = p.height;
  const size_t blocks_x = std::min<size_t>((row_words + kThreads - 1) / kThreads, 1024);
  const size_t blocks_y = std::min<size_t>(rows, 65535);
  void* args[] = {&dst, &pitch, &row_words, &rows, &word};
  cudaKernelNodeParams k = {};
  k.func = reinterpret_cast<void*>(&fill_rows_kernel<W>);
  k.gridDim = dim3(static_cast<unsigned>(std::max<size_t>(blocks_x, 1)),
                   static_cast<unsigned>(std::max<size_t>(blocks_y, 1)));
  k.blockDim = dim3(kThreads);
  k.sharedMemBytes = 0;
  k.kernelParams = args;  // copied by the call below
  cudaGraphNode_t node = nullptr;
  ACCRUE_CUDA_CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &k));
  return node;
}

// The widest word that every row's start and length allow.
cudaGraphNode_t add_fill_node(cudaGraph_t graph, const cudaMemsetParams& p) {
  const uint32_t v = repeated_value(p);
  const size_t row_bytes = p.width * p.elementSize;
  const size_t pitch = p.height > 1 ? p.pitch : 0;
  auto fits = [&](size_t w) {
    return reinterpret_cast<uintptr_t>(p.dst) % w == 0 && pitch % w == 0 && row_bytes % w == 0;
  };
  if (fits(16)) return add_fill_node(graph, p, make_uint4(v, v, v, v));
  if (fits(4)) return add_fill_node(graph, p, v);
  if (fits(2)) return add_fill_node(graph, p, static_cast<uint16_t>(v));
  return add_fill_node(graph, p, static_cast<uint8_t>(v));
}

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph) {
  size_t n = 0;
  ACCRUE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) ACCRUE_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  return nodes;
}

struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

Edges incoming(cudaGraphNode_t node) {
  size_t n = 0;
  ACCRUE_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  Edges e{std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphEdgeData>(n)};
  if (n > 0)
    ACCRUE_CUDA_CHECK(cudaGraphNodeGetDependencies(node, e.nodes.data(), e.data.data(), &n));
  return e;
}

Edges outgoing(cudaGraphNode_t node) {
  size_t n = 0;
  ACCRUE_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &n));
  Edges e{std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphEdgeData>(n)};
  if (n > 0)
    ACCRUE_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, e.nodes.data(), e.data.data(), &n));
  return e;
}

}  // namespace

std::vector<void*> add_fill_kernels(void* graph_handle, FillPlacement placement) {
  const auto graph = static_cast<cudaGraph_t>(graph_handle);
  std::vector<void*> memsets;
  for (cudaGraphNode_t node : graph_nodes(graph)) {
    cudaGraphNodeType type;
    ACCRUE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams p = {};
    ACCRUE_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &p));
    Edges in = incoming(node);
    const Edges out = outgoing(node);
    const cudaGraphNode_t fill = add_fill_node(graph, p);
    if (placement == FillPlacement::after) in = Edges{{node}, {cudaGraphEdgeData{}}};
    if (!in.nodes.empty()) {
      const std::vector<cudaGraphNode_t> to(in.nodes.size(), fill);
      ACCRUE_CUDA_CHECK(
          cudaGraphAddDependencies(graph, in.nodes.data(), to.data(), in.data.data(), to.size()));
    }
    if (!out.nodes.empty()) {
      const std::vector<cudaGraphNode_t> from(out.nodes.size(), fill);
      ACCRUE_CUDA_CHECK(cudaGraphAddDependencies(graph, from.data(), out.nodes.data(),
                                                 out.data.data(), from.size()));
    }
    memsets.push_back(node);
  }
  return memsets;
}

void disable_nodes(void* exec, const std::vector<void*>& nodes) {
  for (void* node : nodes)
    ACCRUE_CUDA_CHECK(cudaGraphNodeSetEnabled(static_cast<cudaGraphExec_t>(exec),
                                              static_cast<cudaGraphNode_t>(node), 0));
}

}  // namespace accrue::detail
