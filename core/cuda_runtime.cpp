#include "accrue/core/cuda_runtime.h"

#include <mutex>
#include <string>
#include <vector>

#include "accrue/core/env_flag.h"
#include "accrue/core/error.h"

#ifdef ACCRUE_WITH_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "accrue/core/device_scope.h"
#include "accrue/core/status_check.h"
#endif

namespace accrue {

#ifdef ACCRUE_WITH_CUDA

namespace {

struct DeviceProbe {
  int count = 0;
  std::string reason;
};

const DeviceProbe& probe() {
  static const DeviceProbe result = [] {
    DeviceProbe p;
    cudaError_t e = cudaGetDeviceCount(&p.count);
    if (e != cudaSuccess) {
      p.count = 0;
      p.reason = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
      cudaGetLastError();  // clear the sticky-free error so later probes start clean
    } else if (p.count == 0) {
      p.reason = "no CUDA device found";
    }
    return p;
  }();
  return result;
}

constexpr int kMaxDevices = 64;

// Library-created default streams, one per device, created on first use and
// kept for the process lifetime (destroying them at exit races the driver's teardown).
StreamHandle default_stream(int device) {
  static std::once_flag flags[kMaxDevices];
  static StreamHandle streams[kMaxDevices] = {};
  std::call_once(flags[device], [device] {
    int previous = 0;
    ACCRUE_CUDA_CHECK(cudaGetDevice(&previous));
    ACCRUE_CUDA_CHECK(cudaSetDevice(device));
    cudaStream_t s;
    ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams[device] = s;
    ACCRUE_CUDA_CHECK(cudaSetDevice(previous));
  });
  return streams[device];
}

thread_local StreamHandle tls_current[kMaxDevices] = {};

void check_device(int device) {
  ACCRUE_CHECK(device >= 0 && device < cuda_device_count() && device < kMaxDevices, "cuda device ",
               device, " does not exist (", cuda_device_count(), " visible)");
}

}  // namespace

bool cuda_available() {
  return probe().count > 0;
}
int64_t cuda_free_bytes(int index) {
  cuda::DeviceScope scope(index);
  size_t free_bytes = 0, total_bytes = 0;
  ACCRUE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}
int cuda_device_count() {
  return probe().count;
}
const char* cuda_unavailable_reason() {
  return cuda_available() ? "" : probe().reason.c_str();
}

void set_cuda_device(int index) {
  check_device(index);
  ACCRUE_CUDA_CHECK(cudaSetDevice(index));
}

StreamHandle current_stream(int device) {
  check_device(device);
  StreamHandle s = tls_current[device];
  return s ? s : default_stream(device);
}

void set_current_stream(int device, StreamHandle stream) {
  check_device(device);
  tls_current[device] = stream;
}

Stream::Stream(int device, int priority) : device_(device) {
  check_device(device);
  int previous = 0;
  ACCRUE_CUDA_CHECK(cudaGetDevice(&previous));
  ACCRUE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s;
  ACCRUE_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  handle_ = s;
  ACCRUE_CUDA_CHECK(cudaSetDevice(previous));
}

Stream::~Stream() {
  if (handle_) cudaStreamDestroy(handle_);
}

void Stream::synchronize() const {
  synchronize_stream(handle_);
}

StreamGuard::StreamGuard(int device, StreamHandle stream)
    : device_(device), previous_(tls_current[device]) {
  set_current_stream(device, stream);
}

StreamGuard::~StreamGuard() {
  tls_current[device_] = previous_;
}

Event::Event(bool timing) {
  cudaEvent_t e;
  ACCRUE_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = e;
}

Event::~Event() {
  if (handle_) cudaEventDestroy(handle_);
}

void Event::record(StreamHandle stream) {
  ACCRUE_CUDA_CHECK(cudaEventRecord(handle_, stream));
}
void Event::record_external(StreamHandle stream) {
  ACCRUE_CUDA_CHECK(cudaEventRecordWithFlags(handle_, stream, cudaEventRecordExternal));
}
void Event::block(StreamHandle stream) const {
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, handle_, 0));
}
void Event::block_external(StreamHandle stream) const {
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, handle_, cudaEventWaitExternal));
}
void Event::synchronize() const {
  ACCRUE_CUDA_CHECK(cudaEventSynchronize(handle_));
}
bool Event::query() const {
  cudaError_t e = cudaEventQuery(handle_);
  if (e == cudaErrorNotReady) return false;
  ACCRUE_CUDA_CHECK(e);
  return true;
}
float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  ACCRUE_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_));
  return ms;
}

void synchronize_stream(StreamHandle stream) {
  ACCRUE_CUDA_CHECK(cudaStreamSynchronize(stream));
}
void synchronize_device(int device) {
  set_cuda_device(device);
  ACCRUE_CUDA_CHECK(cudaDeviceSynchronize());
}
void cuda_profiler_start() {
  ACCRUE_CUDA_CHECK(cudaProfilerStart());
}
void cuda_profiler_stop() {
  ACCRUE_CUDA_CHECK(cudaProfilerStop());
}

#else  // !ACCRUE_WITH_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  ACCRUE_FAIL(what, ": accrue was built without CUDA (configure with ACCRUE_CUDA=ON)");
}
}  // namespace

bool cuda_available() {
  return false;
}
int cuda_device_count() {
  return 0;
}
const char* cuda_unavailable_reason() {
  return "accrue was built without CUDA";
}
void set_cuda_device(int) {
  no_cuda("set_cuda_device");
}
int64_t cuda_free_bytes(int) {
  no_cuda("cuda_free_bytes");
}
StreamHandle current_stream(int) {
  no_cuda("current_stream");
}
void set_current_stream(int, StreamHandle) {
  no_cuda("set_current_stream");
}
Stream::Stream(int, int) {
  no_cuda("Stream");
}
Stream::~Stream() = default;
void Stream::synchronize() const {
  no_cuda("Stream::synchronize");
}
StreamGuard::StreamGuard(int, StreamHandle) : device_(0), previous_(nullptr) {
  no_cuda("StreamGuard");
}
StreamGuard::~StreamGuard() = default;
Event::Event(bool) {
  no_cuda("Event");
}
Event::~Event() = default;
void Event::record(StreamHandle) {
  no_cuda("Event::record");
}
void Event::record_external(StreamHandle) {
  no_cuda("Event::record_external");
}
void Event::block(StreamHandle) const {
  no_cuda("Event::block");
}
void Event::block_external(StreamHandle) const {
  no_cuda("Event::block_external");
}
void Event::synchronize() const {
  no_cuda("Event::synchronize");
}
bool Event::query() const {
  no_cuda("Event::query");
}
float Event::elapsed_ms(const Event&) const {
  no_cuda("Event::elapsed_ms");
}
void synchronize_stream(StreamHandle) {
  no_cuda("synchronize_stream");
}
void synchronize_device(int) {
  no_cuda("synchronize_device");
}
void cuda_profiler_start() {}
void cuda_profiler_stop() {}

#endif

// Note [Library outputs under initcheck]: read once.
bool prewrite_library_outputs() {
  static const bool on = env_flag("ACCRUE_INITCHECK_LIBRARY_OUTPUTS");
  return on;
}

}  // namespace accrue
