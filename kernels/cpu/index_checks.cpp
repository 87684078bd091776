// The CPU side of the deferred index checks (Note [Deferred index checks]).
#include <cmath>
#include <limits>

#include "accrue/kernels/cpu/cpu_util.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/index_checks_backend.h"

namespace accrue::kernels::cpu {

void record_index_fault(const Tensor& indices, const IndexCheckCall& call, const Tensor& record,
                        const Tensor& items) {
  int64_t first = -1, value = 0;
  visit_index_dtype(indices.dtype(), "record_index_fault", [&](auto tag) {
    using I = decltype(tag);
    const I* p = ptr<I>(indices);
    for (int64_t i = 0; i < indices.numel(); ++i) {
      const int64_t v = static_cast<int64_t>(p[i]);
      if ((call.use_ignore && v == call.ignore_index) || (v >= 0 && v < call.bound)) continue;
      first = i;
      value = v;
      break;
    }
  });
  if (first < 0) return;
  *ptr<double>(items) = std::numeric_limits<double>::quiet_NaN();
  int64_t* r = ptr<int64_t>(record);
  if (r[kFaultRaised] != 0) return;  // the first fault since the host looked stays
  r[kFaultRaised] = 1;
  r[kFaultCall] = call.id;
  r[kFaultPosition] = first;
  r[kFaultValue] = value;
  r[kFaultWindow] = call.window;
  r[kFaultMicroStep] = call.micro_step;
}

}  // namespace accrue::kernels::cpu
