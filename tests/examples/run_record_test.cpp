// The trainers' resume checks (examples/common): Note [Run record], Note
// [Metrics after resume] and Note [Honest exit codes].
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "accrue/core/error.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/options.h"
#include "examples/common/run_guard.h"

namespace {

using accrue::Error;
using accrue::examples::parse_change_words;
using accrue::examples::RunGuard;
using accrue::examples::RunRecord;
using accrue::examples::truncate_metrics_log;
using accrue::examples::UsageError;
using Metadata = std::map<std::string, std::string>;

RunRecord record(int64_t micro_batch, double lr, int64_t windows) {
  RunRecord r;
  r.integer("micro_batch", micro_batch, {}, "micro_batch");
  r.text("data", "synthetic");
  r.number("lr", lr, "lr");
  r.integer("windows", windows, "windows");
  return r;
}

// The message of the Error that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(RunRecord, SameRunPassesAndWritesPrefixedKeys) {
  Metadata meta;
  record(4, 6e-4, 50).write(&meta);
  EXPECT_EQ(meta.at("accrue.run.micro_batch"), "4");
  EXPECT_EQ(meta.at("accrue.run.lr"), "0.0006");  // the shortest text of the double
  EXPECT_EQ(meta.at("accrue.run.data"), "synthetic");
  EXPECT_TRUE(record(4, 6e-4, 50).compare("c.st", meta, {}).empty());
}

TEST(RunRecord, NumbersCompareAsDoubles) {
  Metadata meta;
  record(4, 0.1 + 0.2, 50).write(&meta);
  EXPECT_EQ(meta.at("accrue.run.lr"), "0.30000000000000004");
  const std::string message = error_of([&] { record(4, 0.3, 50).compare("c.st", meta, {}); });
  EXPECT_NE(message.find("lr = 0.30000000000000004 but this run has 0.3"), std::string::npos)
      << message;
}

TEST(RunRecord, EveryDifferenceIsNamedOldAndNew) {
  Metadata meta;
  record(4, 6e-4, 50).write(&meta);
  const std::string message = error_of([&] { record(8, 1e-3, 50).compare("c.st", meta, {}); });
  EXPECT_NE(message.find("checkpoint c.st is of another run: micro_batch = 4 but this run has 8; "
                         "lr = 0.0006 but this run has 0.001"),
            std::string::npos)
      << message;
  // micro_batch has no change word: only lr could be let through.
  EXPECT_NE(message.find("(--allow-changed lr admits some of these changes)"), std::string::npos)
      << message;
}

TEST(RunRecord, AllowedChangesPassAndAreReported) {
  Metadata meta;
  record(4, 6e-4, 50).write(&meta);
  const std::vector<std::string> lines =
      record(4, 1e-3, 80).compare("c.st", meta, {"lr", "windows"});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "resume: changed as --allow-changed permits: lr 0.0006 -> 0.001, windows "
            "50 -> 80");
  // A word admits its own fields only.
  const std::string message = error_of([&] { record(4, 1e-3, 80).compare("c.st", meta, {"lr"}); });
  EXPECT_NE(message.find("windows = 50 but this run has 80 (--allow-changed windows admits this "
                         "change)"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("lr ="), std::string::npos) << message;
}

TEST(RunRecord, NoteIsAppendedToARefusal) {
  Metadata meta;
  record(4, 6e-4, 50).write(&meta);
  const std::string message =
      error_of([&] { record(2, 6e-4, 50).compare("c.st", meta, {}, "inside a window"); });
  EXPECT_NE(message.find("micro_batch = 4 but this run has 2; inside a window"), std::string::npos)
      << message;
}

TEST(RunRecord, OlderCheckpointIsComparedOnItsLegacyKeys) {
  // Written before the record: micro_batch under its old key, the rest absent.
  const Metadata legacy{{"micro_batch", "4"}, {"format", "v2"}};
  const std::vector<std::string> lines = record(4, 6e-4, 50).compare("old.st", legacy, {});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "resume: checkpoint old.st does not record data, lr, windows (written before the run "
            "record): not checked");
  const std::string message = error_of([&] { record(8, 6e-4, 50).compare("old.st", legacy, {}); });
  EXPECT_NE(message.find("micro_batch = 4 but this run has 8"), std::string::npos) << message;
}

TEST(RunRecord, EmptyValuesAreShownAsNone) {
  RunRecord with, without;
  with.text("metrics", "/tmp/m.jsonl", "metrics");
  without.text("metrics", "", "metrics");
  Metadata meta;
  with.write(&meta);
  const std::string message = error_of([&] { without.compare("c.st", meta, {}); });
  EXPECT_NE(message.find("metrics = /tmp/m.jsonl but this run has (none)"), std::string::npos)
      << message;
}

TEST(ParseChangeWords, TakesKnownWordsAndRefusesOthers) {
  const std::vector<std::string> words{"lr", "windows"};
  EXPECT_EQ(parse_change_words("--allow-changed", "windows,lr", words),
            (std::vector<std::string>{"windows", "lr"}));
  EXPECT_THROW(parse_change_words("--allow-changed", "lr,seed", words), UsageError);
  EXPECT_THROW(parse_change_words("--allow-changed", "lr,", words), UsageError);
  try {
    parse_change_words("--allow-changed", "k", words);
    FAIL() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "--allow-changed takes a comma-separated list of lr, windows; got 'k' "
                 "in 'k'");
  }
}

class MetricsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("accrue_run_record_test_" + std::to_string(::getpid()) + ".jsonl"))
                .string();
    std::filesystem::remove(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void write(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }
  std::string read() const {
    std::ifstream in(path_, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static std::string rows(int first, int last) {
    std::string text;
    for (int w = first; w <= last; ++w)
      text += "{\"window\": " + std::to_string(w) + ", \"loss\": 5.5}\n";
    return text;
  }
  std::string path_;
};

TEST_F(MetricsFile, MissingFileIsLeftMissing) {
  EXPECT_EQ(truncate_metrics_log(path_, 3), 0);
  EXPECT_FALSE(std::filesystem::exists(path_));
}

TEST_F(MetricsFile, RowsAfterTheResumedWindowAreCut) {
  write(rows(1, 5));
  EXPECT_EQ(truncate_metrics_log(path_, 3), 2);
  EXPECT_EQ(read(), rows(1, 3));
  // Nothing after window 3 any more: a second cut changes nothing.
  EXPECT_EQ(truncate_metrics_log(path_, 3), 0);
  EXPECT_EQ(read(), rows(1, 3));
  EXPECT_EQ(truncate_metrics_log(path_, 0), 3);
  EXPECT_EQ(read(), "");
}

TEST_F(MetricsFile, RowCutShortByAKillIsRemoved) {
  write(rows(1, 2) + "{\"window\": 3, \"lo");
  EXPECT_EQ(truncate_metrics_log(path_, 3), 1);
  EXPECT_EQ(read(), rows(1, 2));
}

TEST_F(MetricsFile, ALineThatIsNotARowEndsTheKeptPart) {
  write(rows(1, 2) + "garbage\n" + rows(3, 3));
  EXPECT_EQ(truncate_metrics_log(path_, 5), 2);
  EXPECT_EQ(read(), rows(1, 2));
}

accrue::optim::WindowReport report(int64_t window, double loss, bool skipped, int64_t steps) {
  accrue::optim::WindowReport r;
  r.window = window;
  r.loss = loss;
  r.skipped = skipped;
  r.optimizer_steps = steps;
  return r;
}

TEST(RunGuard, BoundsSkipsInARow) {
  RunGuard guard(2);
  guard.after_window(report(1, 5.0, false, 1));
  guard.after_window(report(2, NAN, true, 1));
  guard.after_window(report(3, NAN, true, 1));
  EXPECT_EQ(guard.skipped_in_a_row(), 2);
  const std::string message = error_of([&] { guard.after_window(report(4, NAN, true, 1)); });
  EXPECT_NE(message.find("3 windows in a row were skipped (windows 2 to 4: "), std::string::npos)
      << message;
  EXPECT_NE(message.find("more than --max-skipped-windows 2"), std::string::npos) << message;
}

TEST(RunGuard, AStepResetsTheCountAndAResumeCarriesIt) {
  RunGuard guard(1, /*skipped_in_a_row=*/1);  // the resumed run ended on a skip
  guard.after_window(report(5, 5.0, false, 4));
  guard.after_window(report(6, 5.0, true, 4));
  EXPECT_EQ(guard.skipped_in_a_row(), 1);
  RunGuard resumed(1, 1);
  const std::string message =
      error_of([&] { resumed.after_window(report(7, 5.0, true, 4), " of epoch 2"); });
  EXPECT_NE(message.find("2 windows in a row were skipped (windows 6 to 7 of epoch 2: "),
            std::string::npos)
      << message;
}

TEST(RunGuard, FinishRefusesANonFiniteLossNamingItsWindows) {
  RunGuard guard(100);
  guard.after_window(report(1, 5.0, false, 1));
  guard.after_window(report(2, NAN, true, 1));
  guard.after_window(report(3, INFINITY, true, 1));
  const std::string message = error_of([&] { guard.finish(report(3, INFINITY, true, 1)); });
  EXPECT_NE(message.find("the loss is not finite (inf) in windows 2 to 3, the last"),
            std::string::npos)
      << message;
  RunGuard finite(100);
  finite.after_window(report(1, NAN, true, 1));
  finite.after_window(report(2, 5.0, false, 2));
  EXPECT_EQ(error_of([&] { finite.finish(report(2, 5.0, false, 2)); }), "");
}

TEST(RunGuard, FinishRefusesARunThatNeverStepped) {
  RunGuard guard(100);
  for (int64_t w = 1; w <= 4; ++w)
    guard.after_window(report(w, 5.0, true, 0));
  const std::string message = error_of([&] { guard.finish(report(4, 5.0, true, 0)); });
  EXPECT_NE(message.find("every window was skipped (windows 1 to 4)"), std::string::npos)
      << message;
  // Stopped early to be resumed (--stop-after): f16's first windows may all be skipped.
  EXPECT_EQ(error_of([&] { guard.finish(report(4, 5.0, true, 0), {}, /*whole_run=*/false); }), "");
}

}  // namespace
