#include "accrue/core/grad_mode.h"

namespace accrue {

namespace {
thread_local bool tls_grad_enabled = true;
}

bool GradMode::is_enabled() {
  return tls_grad_enabled;
}
void GradMode::set_enabled(bool enabled) {
  tls_grad_enabled = enabled;
}

}  // namespace accrue
