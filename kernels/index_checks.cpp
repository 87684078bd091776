// The index checks of kernels/index_checks.h: eager, or deferred to the
// window (Note [Deferred index checks]).
#include "accrue/kernels/index_checks.h"

#include <algorithm>
#include <limits>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/index_checks_backend.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

// The live instances of this thread, innermost last.
thread_local std::vector<DeferredIndexChecks*> t_active;

std::string range_text(int64_t bound, int64_t ignore_index, bool use_ignore) {
  std::string s = "out of range [0, " + std::to_string(bound) + ")";
  if (use_ignore) s += " and not ignore_index " + std::to_string(ignore_index);
  return s;
}

bool in_range(int64_t v, int64_t bound, int64_t ignore_index, bool use_ignore) {
  return (use_ignore && v == ignore_index) || (v >= 0 && v < bound);
}

// Counts the bad indices (on CUDA a host synchronization) and throws naming
// the first.
void check_eagerly(const Tensor& indices, int64_t bound, int64_t ignore_index, bool use_ignore,
                   const char* op, const char* what) {
  const int64_t bad = ACCRUE_BACKEND_CALL(indices.device(), count_out_of_range, indices, bound,
                                          ignore_index, use_ignore);
  if (bad == 0) return;
  // The error path only: find the first offender on the host to name it.
  const std::vector<int64_t> v = indices.to_vector<int64_t>();
  size_t first = 0;
  while (first < v.size() && in_range(v[first], bound, ignore_index, use_ignore))
    ++first;
  const int64_t value = first < v.size() ? v[first] : -1;
  ACCRUE_FAIL(op, ": ", what, " ", value, " (at flat position ", first, " of shape ",
              shape_str(indices.shape()), ") ", range_text(bound, ignore_index, use_ignore), "; ",
              bad, " of ", v.size(), " are out of range");
}

}  // namespace

DeferredIndexChecks::DeferredIndexChecks(Device device, Tensor items)
    : device_(device), items_(std::move(items)) {
  ACCRUE_CHECK(items_.defined() && items_.numel() == 1 && items_.dtype() == DType::f64 &&
                   items_.device() == device,
               "DeferredIndexChecks: items must be one f64 element on ", device.str());
  record_ = fresh_record();
  t_active.push_back(this);
}

DeferredIndexChecks::~DeferredIndexChecks() {
  const auto it = std::find(t_active.rbegin(), t_active.rend(), this);
  if (it != t_active.rend()) t_active.erase(std::next(it).base());
}

DeferredIndexChecks* DeferredIndexChecks::active(Device device) {
  for (auto it = t_active.rbegin(); it != t_active.rend(); ++it)
    if ((*it)->device_ == device) return *it;
  return nullptr;
}

Tensor DeferredIndexChecks::fresh_record() const {
  std::vector<int64_t> v(kIndexFaultFields, 0);
  v[kFaultScratch] = -1;
  return from_vector<int64_t>(v, {kIndexFaultFields}, DType::i64).to(device_);
}

void DeferredIndexChecks::set_position(int64_t window, int64_t micro_step) {
  window_ = window;
  micro_step_ = micro_step;
}

int64_t DeferredIndexChecks::call_id(Call call) {
  for (size_t i = 0; i < calls_.size(); ++i) {
    const Call& c = calls_[i];
    if (c.op == call.op && c.what == call.what && c.shape == call.shape && c.bound == call.bound &&
        c.ignore_index == call.ignore_index && c.use_ignore == call.use_ignore)
      return static_cast<int64_t>(i);
  }
  calls_.push_back(std::move(call));
  return static_cast<int64_t>(calls_.size()) - 1;
}

void DeferredIndexChecks::check(const Tensor& indices, int64_t bound, int64_t ignore_index,
                                bool use_ignore, const char* op, const char* what) {
  ACCRUE_CHECK(indices.device() == device_, op, ": indices on ", indices.device().str(),
               ", the deferred checks on ", device_.str());
  if (indices.numel() == 0) return;
  NoGradGuard no_grad;
  IndexCheckCall call;
  call.bound = bound;
  call.ignore_index = ignore_index;
  call.use_ignore = use_ignore;
  call.id = call_id({op, what, shape_str(indices.shape()), bound, ignore_index, use_ignore});
  call.window = window_;
  call.micro_step = micro_step_;
  ACCRUE_BACKEND_CALL(device_, record_index_fault, indices.contiguous(), call, record_, items_);
}

void DeferredIndexChecks::raise_pending() {
  const std::vector<int64_t> r = record_.to_vector<int64_t>();
  if (r[kFaultRaised] == 0) return;
  record_.copy_(fresh_record());
  const int64_t id = r[kFaultCall];
  ACCRUE_CHECK(id >= 0 && id < static_cast<int64_t>(calls_.size()),
               "DeferredIndexChecks: the fault record names call ", id, " of ", calls_.size());
  const Call& c = calls_[static_cast<size_t>(id)];
  ACCRUE_FAIL(c.op, ": ", c.what, " ", r[kFaultValue], " (at flat position ", r[kFaultPosition],
              " of shape ", c.shape, ") ", range_text(c.bound, c.ignore_index, c.use_ignore),
              "; found on the device in window ", r[kFaultWindow], " (micro-step ",
              r[kFaultMicroStep], " counted from 0), whose update was skipped");
}

void check_index_range(const Tensor& indices, int64_t bound, int64_t ignore_index, bool use_ignore,
                       const char* op, const char* what) {
  if (indices.numel() == 0) return;
  if (indices.device().is_cuda() && !check_indices()) return;
  if (DeferredIndexChecks* deferred = DeferredIndexChecks::active(indices.device())) {
    deferred->check(indices, bound, ignore_index, use_ignore, op, what);
    return;
  }
  check_eagerly(indices, bound, ignore_index, use_ignore, op, what);
}

}  // namespace accrue::kernels
