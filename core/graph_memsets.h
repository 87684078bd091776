// A captured graph's memset nodes rewritten as fill kernels (Note [Memset
// nodes as kernels] in core/graph_memsets.cu).
#pragma once

#include <vector>

namespace accrue::detail {

// Where each fill kernel goes against its memset node.
enum class FillPlacement {
  beside,  // the memset's incoming and outgoing edges, in parallel with it
  after,   // after the memset (an edge from it) and before its dependents
};

// Adds to every memset node of `graph` (a cudaGraph_t; child graphs are left
// alone) a kernel node that writes the same bytes, placed as `placement`
// says. Returns the memset nodes (cudaGraphNode_t), which the graph's
// executable must then disable (disable_nodes). Throws accrue::Error when
// CUDA refuses an edit (the graph is then unusable).
std::vector<void*> add_fill_kernels(void* graph, FillPlacement placement = FillPlacement::beside);

// Disables `nodes` in `exec` (a cudaGraphExec_t instantiated from their graph).
void disable_nodes(void* exec, const std::vector<void*>& nodes);

}  // namespace accrue::detail
