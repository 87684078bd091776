// The CUDA runtime as accrue sees it: device discovery, RAII streams and
// events, and the current stream every kernel launches on.
//
// This header compiles without the CUDA toolkit (ACCRUE_WITH_CUDA undefined):
// cuda_available() is then false and everything else throws accrue::Error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "accrue/core/device.h"

struct CUstream_st;
struct CUevent_st;

namespace accrue {

using StreamHandle = CUstream_st*;
using EventHandle = CUevent_st*;

// True when accrue was built with CUDA and at least one device is usable.
// Never throws: a machine without a driver or GPU simply answers false.
bool cuda_available();
int cuda_device_count();
// Why cuda_available() is false, for skip messages ("built without CUDA", "no CUDA device: ...").
const char* cuda_unavailable_reason();

// Makes `index` the calling thread's device (cudaSetDevice) after checking it exists.
void set_cuda_device(int index);
// Bytes the driver reports free on device `index` (cudaMemGetInfo).
int64_t cuda_free_bytes(int index);

// Note [Current stream]
// ~~~~~~~~~~~~~~~~~~~~~
// Every kernel, copy and allocation of accrue goes to the calling thread's
// current stream for the device. By default that is one non-blocking stream
// per device that accrue creates on first use; StreamGuard switches it for a
// scope. Host read-backs synchronize only that stream.
StreamHandle current_stream(int device);
void set_current_stream(int device, StreamHandle stream);

class Stream {
 public:
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle handle() const { return handle_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  StreamHandle handle_ = nullptr;
  int device_ = 0;
};

class StreamGuard {
 public:
  StreamGuard(int device, StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  StreamHandle previous_;
};

class Event {
 public:
  // timing=false gives the cheap synchronization-only event.
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  EventHandle handle() const { return handle_; }
  void record(StreamHandle stream);
  // The same inside a CUDA graph capture (cudaEventRecordExternal): the graph
  // gets an event-record node, so each replay records the event at that point
  // of the replay, and streams outside the graph can wait for it (a plain
  // record inside a capture only orders the graph's own nodes). Note [Steps
  // graph] in optim/layer_steps.cpp records each layer range's event so.
  void record_external(StreamHandle stream);
  // Makes `stream` wait for this event on the device (no host block).
  void block(StreamHandle stream) const;
  // The same inside a CUDA graph capture, for an event recorded outside it
  // (cudaEventWaitExternal): the graph gets an event-wait node, and each
  // replay waits for the event's latest record at that point of the replay.
  void block_external(StreamHandle stream) const;
  void synchronize() const;
  bool query() const;
  // Milliseconds between two recorded timing events.
  float elapsed_ms(const Event& end) const;

 private:
  EventHandle handle_ = nullptr;
};

void synchronize_stream(StreamHandle stream);
void synchronize_device(int device);

// Note [Profiled span]
// ~~~~~~~~~~~~~~~~~~~~
// cudaProfilerStart / cudaProfilerStop: a profiler started with
// `ncu --profile-from-start off` (or nsys's cudaProfilerApi capture range)
// records only the kernels between them. The benchmarks' timed windows
// (examples/common/timing.cpp) sit between the two, so a profile is the
// timed windows and nothing of the set-up or the warm-up. No profiler
// attached: both are no-ops. Without CUDA they do nothing (never throw).
void cuda_profiler_start();
void cuda_profiler_stop();

// Note [Library outputs under initcheck]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// compute-sanitizer's initcheck does not see every store of the closed-source
// library kernels as initializing memory: an accrue kernel that reads what a
// bf16 cuBLASLt GEMM or a cuDNN graph wrote (the logits, the attention
// projection) is reported as reading uninitialized memory, tens of thousands
// of times per test (measured on an H200, tools/gpu_check.sh); the libraries'
// own kernels are reported too, reading back their workspaces (cuBLASLt's
// split-K reduction, cuDNN's layout transforms). With
// ACCRUE_INITCHECK_LIBRARY_OUTPUTS=1 in the environment, which gpu_check sets
// for its initcheck runs only, every output that a cuBLASLt matmul with beta 0
// or a cuDNN graph is about to overwrite, and every workspace handed to them,
// is first zeroed by accrue's fill kernel on the current stream (the callers:
// kernels/cuda/matmul.cu, conv_cudnn.cpp, attention_cudnn.cpp), so initcheck
// sees it written; every other byte, and every read by accrue's own kernels
// and by the libraries of accrue's own tensors, stays checked. A
// library that then failed to write part of its output would leave zeros,
// which the GPU tests' comparisons with the CPU reference catch. Unset
// (always outside the sanitizer) this costs one cached getenv per call.
bool prewrite_library_outputs();

}  // namespace accrue
