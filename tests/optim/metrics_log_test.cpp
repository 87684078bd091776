// Note [Metrics log]: what a line holds, null for non-finite numbers, the
// noise scale only when measured, appending, and the error for a bad path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "accrue/optim/metrics_log.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

TEST(MetricsLog, one_line_per_window_with_null_for_non_finite_numbers) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "accrue_metrics_log_test.jsonl").string();
  optim::WindowReport r;
  r.window = 7;
  r.loss = 2.5;
  r.items = 256;
  r.grad_norm = 4.0;
  r.clip_coef = 0.25;
  r.loss_scale = 1024;
  r.skipped = false;
  r.optimizer_steps = 7;
  {
    optim::MetricsLog log(path, /*append=*/false);
    log.write(r, {{"lr", 3e-4}, {"val_loss", NAN}});
    r.window = 8;
    r.skipped = true;
    r.skipped_windows = 1;
    r.grad_norm = INFINITY;
    r.noise_windows = 2;
    r.grad_sq = 1.5;
    r.trace_sigma = 24.0;
    r.noise_scale = 16.0;
    log.write(r);
  }
  optim::MetricsLog(path, /*append=*/true).write(r, {{"tokens_per_s", 1000}});
  const std::vector<std::string> lines = lines_of(path);
  std::filesystem::remove(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "{\"window\": 7, \"loss\": 2.5, \"items\": 256, \"grad_norm\": 4, "
            "\"grad_norm_clipped\": 1, \"clip_coef\": 0.25, \"loss_scale\": 1024, \"skipped\": "
            "false, \"skipped_windows\": 0, \"optimizer_steps\": 7, \"lr\": 0.0003, \"val_loss\": "
            "null}");
  EXPECT_EQ(lines[1],
            "{\"window\": 8, \"loss\": 2.5, \"items\": 256, \"grad_norm\": null, "
            "\"grad_norm_clipped\": null, \"clip_coef\": 0.25, \"loss_scale\": 1024, \"skipped\": "
            "true, \"skipped_windows\": 1, \"optimizer_steps\": 7, \"noise_grad_sq\": 1.5, "
            "\"noise_trace_sigma\": 24, \"noise_scale\": 16}");
  EXPECT_NE(lines[2].find("\"window\": 8"), std::string::npos);
  EXPECT_NE(lines[2].find("\"tokens_per_s\": 1000}"), std::string::npos);
  // A closed log writes nothing; a path that cannot be opened is an error naming it.
  optim::MetricsLog closed;
  EXPECT_FALSE(closed.is_open());
  closed.write(r);
  EXPECT_ERROR(optim::MetricsLog("/nonexistent-dir/m.jsonl", false), "MetricsLog",
               "/nonexistent-dir/m.jsonl");
}

// The alerts' z-score: against the values before, NaN until there is a
// spread, non-finite values neither scored nor kept, a ring of `window`.
TEST(ZScore, scores_a_value_against_the_window_before_it) {
  optim::ZScore z(4);
  EXPECT_TRUE(std::isnan(z.add(1.0)));
  EXPECT_TRUE(std::isnan(z.add(1.0)));  // one value: no spread yet
  EXPECT_TRUE(std::isnan(z.add(3.0)));  // {1, 1}: no spread
  // {1, 1, 3}: mean 5/3, variance 8/9.
  EXPECT_NEAR(z.add(5.0), (5.0 - 5.0 / 3.0) / std::sqrt(8.0 / 9.0), 1e-12);
  EXPECT_TRUE(std::isnan(z.add(INFINITY)));  // not kept
  // The ring holds {1, 1, 3, 5}; 9 replaces the oldest after scoring.
  const double mean = 2.5, var = (2.25 + 2.25 + 0.25 + 6.25) / 4;
  EXPECT_NEAR(z.add(9.0), (9.0 - mean) / std::sqrt(var), 1e-12);
  EXPECT_NEAR(z.add(1.0), (1.0 - 4.5) / std::sqrt((12.25 + 2.25 + 0.25 + 20.25) / 4), 1e-12);
  EXPECT_ERROR(optim::ZScore(1), "ZScore", "window", "1");
}

}  // namespace
}  // namespace accrue
