// What the libraries keep per stream, made ahead of a CUDA graph capture.
#pragma once

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/device.h"

namespace accrue::kernels {

// Makes the cuBLASLt workspace and the cuDNN handles of `stream` on a CUDA
// device, outside any capture and without running a kernel on the stream;
// nothing on the CPU. A first GEMM on a stream inside a capture refuses
// (its workspace would be the graph's memory, Note [Capturable code]), so a
// stream that a capture forks to (Note [Concurrent micro-batches] in
// optim/graphed_window.h) is prepared first. Running a warm-up kernel there
// instead would slow every later kernel of the process (bench/RESULTS.md,
// stream_gap).
void prepare_stream(Device device, StreamHandle stream);

}  // namespace accrue::kernels
