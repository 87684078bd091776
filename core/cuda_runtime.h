// The CUDA runtime as accrue sees it: device discovery, RAII streams and
// events, and the current stream every kernel launches on.
//
// This header compiles without the CUDA toolkit (ACCRUE_WITH_CUDA undefined):
// cuda_available() is then false and everything else throws accrue::Error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

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
  // Makes `stream` wait for this event on the device (no host block).
  void block(StreamHandle stream) const;
  void synchronize() const;
  bool query() const;
  // Milliseconds between two recorded timing events.
  float elapsed_ms(const Event& end) const;

 private:
  EventHandle handle_ = nullptr;
};

void synchronize_stream(StreamHandle stream);
void synchronize_device(int device);

}  // namespace accrue
