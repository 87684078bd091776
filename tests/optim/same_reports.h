// Two runs' window reports, window by window: the same loss, gradient norm,
// clip coefficient, skip and step count (bitwise; a skipped window's NaN norm
// matches a NaN). Shared by the tests that compare two ways of running one
// training (graphed_window_cases.h, layer_steps_cases.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "accrue/optim/window.h"

namespace accrue::test {

inline void expect_same_value(double b, double a, const char* what) {
  if (std::isnan(a)) {
    EXPECT_TRUE(std::isnan(b)) << what;
  } else {
    EXPECT_EQ(b, a) << what;
  }
}

inline void expect_same_reports(const std::vector<optim::WindowReport>& ra,
                                const std::vector<optim::WindowReport>& rb) {
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t w = 0; w < ra.size(); ++w) {
    SCOPED_TRACE("window " + std::to_string(w));
    EXPECT_EQ(rb[w].loss, ra[w].loss);
    expect_same_value(rb[w].grad_norm, ra[w].grad_norm, "grad_norm");
    expect_same_value(rb[w].clip_coef, ra[w].clip_coef, "clip_coef");
    EXPECT_EQ(rb[w].skipped, ra[w].skipped);
    EXPECT_EQ(rb[w].optimizer_steps, ra[w].optimizer_steps);
  }
}

}  // namespace accrue::test
