// The three torch optimizers as the kernels' plain flags (kernels/window_close.h),
// for the window-close tests of both backends.
#pragma once

#include "accrue/kernels/window_close.h"

namespace accrue::test {

enum class Kind { SGD, Adam, AdamW };

inline void set_kind(kernels::OptimizerConfig& c, Kind kind) {
  c.adam = kind != Kind::SGD;
  c.decoupled_weight_decay = kind == Kind::AdamW;
}

inline void set_dynamic_scaler(kernels::ScalerConfig& s) {
  s.scaled = true;
  s.dynamic = true;
}

}  // namespace accrue::test
