// NVTX ranges, so that an Nsight Systems timeline shows accrue's structure:
// the window, each micro-step, the close, each bucket's collective, the
// forward of every nn module (GPT-2 and its blocks, attention and MLP,
// ResNet, Linear, Conv2d, the norms, Embedding, MLP) and the backward of
// every op (named after its autograd node, e.g. "LinearBackward").
//
// Note [NVTX ranges]
// ~~~~~~~~~~~~~~~~~~
// Off by default, and then a range costs one load of a flag: nothing is
// pushed. set_nvtx(true), or ACCRUE_NVTX=1 in the environment at the first
// range, turns them on; the NVTX3 headers of the CUDA toolkit then forward
// each push and pop to the profiler that is attached (none attached: a
// no-op inside NVTX). Without CUDA nothing is ever pushed. The names are
// string literals, so a range allocates nothing.
#pragma once

#include <cstdint>

namespace accrue {

void set_nvtx(bool on);
bool nvtx_enabled();
// Ranges pushed since the process started (for tests: 0 while off).
int64_t nvtx_ranges_pushed();

class NvtxRange {
 public:
  explicit NvtxRange(const char* name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace accrue
