// A captured graph's memset nodes rewritten as fill kernels (Note [Memset
// nodes as kernels] in core/graph_memsets.cu).
#pragma once

#include <cstdint>

namespace accrue::detail {

// Replaces every memset node of `graph` (a cudaGraph_t), and of the child
// graphs it embeds, by a kernel node that writes the same bytes, with the
// same dependencies on both sides. Returns how many were replaced. Throws
// accrue::Error when CUDA refuses an edit (the graph is then unusable).
int64_t memset_nodes_as_kernels(void* graph);

// The memset nodes left in `graph` and its child graphs (for the tests).
int64_t count_memset_nodes(void* graph);

}  // namespace accrue::detail
