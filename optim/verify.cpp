#include "accrue/optim/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "accrue/core/error.h"

namespace accrue::optim {

namespace {

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    // NaN must fail: written so that a NaN difference is never "within".
    const double d = std::fabs(a[i] - b[i]);
    diff = std::isnan(d) || d > diff ? d : diff;
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

}  // namespace

double VerifyOptions::tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return 1e-5;
    case DType::bf16:
    case DType::f16:
      return 2e-2;
    default:
      ACCRUE_FAIL("VerifyOptions::tolerance_for: ", dtype_name(dtype), " is not a float dtype");
  }
}

VerifyReport verify_accumulation(const VerifyFactory& make, const VerifyOptions& options) {
  const int64_t K = options.micro_steps, batch = options.batch;
  ACCRUE_CHECK(K >= 2 && options.windows >= 1 && batch >= K && batch % K == 0,
               "verify_accumulation: ", batch, " items per window must split into K = ", K,
               " >= 2 equal micro-batches, over windows = ", options.windows, " >= 1");
  ACCRUE_CHECK(options.tolerance >= 0.0, "verify_accumulation: tolerance ", options.tolerance);
  std::unique_ptr<VerifyRun> accumulated = make(K), large = make(1);
  ACCRUE_CHECK(accumulated && large, "verify_accumulation: the factory returned no run");
  VerifyReport report;
  report.tolerance = options.tolerance;
  report.micro_steps = K;
  ACCRUE_CHECK(accumulated->parameters() == large->parameters(),
               "verify_accumulation: the factory's two runs start from different parameters; "
               "build them from the same seed");
  const int64_t b = batch / K;
  report.passed = true;
  for (int64_t w = 0; w < options.windows; ++w) {
    for (int64_t k = 0; k < K; ++k)
      accumulated->micro_step(w, k * b, (k + 1) * b);
    accumulated->close();
    large->micro_step(w, 0, batch);
    large->close();
    const double error = relative_error(accumulated->parameters(), large->parameters());
    report.parameter_error.push_back(error);
    if (!(error <= options.tolerance)) report.passed = false;
  }
  return report;
}

std::string VerifyReport::table() const {
  std::string out;
  char line[160];
  for (size_t w = 0; w < parameter_error.size(); ++w) {
    std::snprintf(line, sizeof line, "window %3zu: K=%lld vs one batch, parameters %.3g%s\n", w,
                  static_cast<long long>(micro_steps), parameter_error[w],
                  parameter_error[w] <= tolerance ? "" : "  <- over the tolerance");
    out += line;
  }
  std::snprintf(line, sizeof line, "%s (tolerance %.3g)\n", passed ? "PASS" : "FAIL", tolerance);
  return out + line;
}

}  // namespace accrue::optim
