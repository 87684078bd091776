// Index checks: every index of embedding and every target of cross_entropy and
// of the fused classifier lies in its valid range (ignore_index excepted).
//
// Note [Deferred index checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Outside a training window the check is eager: it counts the bad indices and
// throws at the call. On CUDA, reading that count back is one host
// synchronization per call, which a window of K micro-steps cannot afford. So
// while a DeferredIndexChecks lives on this thread for the tensor's device
// (every optim::Window holds one), the check is deferred instead:
//  - the first out-of-range index of the call, in flat order, is found on the
//    device (CUDA: an atomicMin over integer positions, exact in any order);
//  - one single-thread step then keeps, in the fault record, the first fault
//    since the host last read it, in call order (the stream orders the calls):
//    the call's id, the position, the value, the window and the micro-step;
//  - the same step writes NaN into the window's item count N. A non-finite N
//    makes the scalar step skip the window (Note [Skipped window]), so a
//    window that saw a bad index never updates the weights. Under data
//    parallelism N is summed over ranks at close, so every rank sees the NaN
//    and skips the same window;
//  - the kernels never read outside their tensors for a bad index (embedding
//    and classifier rows become NaN), so nothing is corrupted meanwhile;
//  - the host reads the record when it next reads the window
//    (Window::report(), Window::check()): the fault becomes an accrue::Error
//    naming the op, the bad value, its position, the valid range, the window
//    and the micro-step, and the record is cleared.
// No call synchronizes the host. A forward run while the Window lives but
// outside its micro-steps (a validation pass) is checked the same way, and a
// fault there skips the window being accumulated. kernels::set_check_indices
// (false) turns the CUDA checks off altogether, eager and deferred.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

// Fields of the fault record: an i64 tensor of kIndexFaultFields elements.
enum IndexFaultField : int {
  kFaultRaised = 0,     // 1 once a fault is kept, until the host reads it
  kFaultCall = 1,       // the call's id (DeferredIndexChecks' table of calls)
  kFaultPosition = 2,   // flat position of the first bad index of that call
  kFaultValue = 3,      // its value
  kFaultWindow = 4,     // windows closed when the call ran
  kFaultMicroStep = 5,  // micro-steps done in that window when the call ran
  kFaultScratch = 6,    // the running call's smallest bad position; -1 when none
  kIndexFaultFields = 8
};

// Registered with the thread that constructs it (the thread whose calls it
// receives): construct and destroy it on the same thread.
class DeferredIndexChecks {
 public:
  // items: the single f64 element a fault sets to NaN (a window's N), on device.
  DeferredIndexChecks(Device device, Tensor items);
  ~DeferredIndexChecks();
  DeferredIndexChecks(const DeferredIndexChecks&) = delete;
  DeferredIndexChecks& operator=(const DeferredIndexChecks&) = delete;

  // Where the next calls run, for the message: windows closed, micro-steps done.
  void set_position(int64_t window, int64_t micro_step);
  // Note [Deferred index checks]: records the call's first bad index, if any,
  // without synchronizing. indices: any layout, i32 or i64, on device().
  void check(const Tensor& indices, int64_t bound, int64_t ignore_index, bool use_ignore,
             const char* op, const char* what);
  // Reads the record (one host synchronization). When it holds a fault, clears
  // it and throws accrue::Error describing the fault.
  void raise_pending();

  Device device() const { return device_; }
  // The innermost live instance for `device` on this thread, or nullptr.
  static DeferredIndexChecks* active(Device device);

 private:
  struct Call {
    std::string op, what, shape;
    int64_t bound;
    int64_t ignore_index;
    bool use_ignore;
  };
  int64_t call_id(Call call);
  Tensor fresh_record() const;

  Device device_;
  Tensor items_;
  Tensor record_;            // i64 [kIndexFaultFields] on device_
  std::vector<Call> calls_;  // the distinct calls seen, by id
  int64_t window_ = 0;
  int64_t micro_step_ = 0;
};

// The index check of every op with data-dependent bounds: every element of
// `indices` in [0, bound), or equal to ignore_index when use_ignore. Deferred
// to DeferredIndexChecks::active(indices.device()) when there is one, eager
// otherwise (throws here); off on CUDA when !check_indices().
void check_index_range(const Tensor& indices, int64_t bound, int64_t ignore_index, bool use_ignore,
                       const char* op, const char* what);

}  // namespace accrue::kernels
