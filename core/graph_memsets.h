// A captured graph's memset nodes rewritten as fill kernels (Note [Memset
// nodes as kernels] in core/graph_memsets.cu).
#pragma once

#include <vector>

namespace accrue::detail {

// Adds beside every memset node of `graph` (a cudaGraph_t; child graphs are
// left alone) a kernel node that writes the same bytes, with the same
// incoming and outgoing edges. Returns the memset nodes (cudaGraphNode_t),
// which the graph's executable must then disable (disable_nodes). Throws
// accrue::Error when CUDA refuses an edit (the graph is then unusable).
std::vector<void*> add_fill_kernels(void* graph);

// Disables `nodes` in `exec` (a cudaGraphExec_t instantiated from their graph).
void disable_nodes(void* exec, const std::vector<void*>& nodes);

}  // namespace accrue::detail
