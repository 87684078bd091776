// The example binaries' option table and main() wrapper (examples/common):
// Note [Command-line values] and Note [Exit codes].
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "accrue/core/error.h"
#include "examples/common/checkpoint_file.h"
#include "examples/common/json.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"

namespace {

using accrue::examples::checked_product;
using accrue::examples::JsonObject;
using accrue::examples::OptionTable;
using accrue::examples::probe_output_file;
using accrue::examples::run_main;
using accrue::examples::usage_error;
using accrue::examples::UsageError;
using accrue::examples::user_message;

struct Values {
  int64_t count = 4;
  uint64_t seed = 7;
  std::optional<int64_t> length;
  double rate = 0.5;
  double fraction = 0.0;
  std::optional<double> scale;
  bool fast = false;
  bool gemm = true;
  std::string mode = "a";
  int level = 1;
  std::string note = "hi";
  std::string out;
};

// A table over `v` like a trainer's.
struct Table {
  Values v;
  OptionTable cli{"prog", "Does a thing."};
  Table() {
    cli.section("sizes");
    cli.integer("--count", &v.count, "N", "how many").min(1).max(1000);
    cli.integer("--seed", &v.seed, "S", "the seed");
    cli.integer("--length", &v.length, "T", "tokens").min(1).default_text("the block size");
    cli.section("numbers");
    cli.number("--rate", &v.rate, "R", "a rate").above(0);
    cli.number("--fraction", &v.fraction, "F", "a fraction").min(0).below(1);
    cli.number("--scale", &v.scale, "S", "a scale").min(1);
    cli.section("");
    cli.flag("--fast", &v.fast, "go fast");
    cli.flag_off("--no-gemm", &v.gemm, "no GEMM");
    cli.choice("--mode", &v.mode, {"a", "bb", "ccc"}, "the mode");
    cli.choice<int>("--level", &v.level, {{"low", 0}, {"mid", 1}, {"high", 2}}, "the level");
    cli.text("--note", &v.note, "TEXT", "a note");
    cli.path("--out", &v.out, "FILE", "where").alias("-o");
  }
  bool parse(std::vector<std::string> args) { return cli.parse(args); }
};

// The UsageError parsing `args` throws; fails the test when none is thrown.
std::string refusal(std::vector<std::string> args) {
  Table t;
  try {
    t.parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << testing::PrintToString(args);
  return "";
}

TEST(OptionTableTest, ParsesEveryType) {
  Table t;
  EXPECT_TRUE(
      t.parse({"--count",    "12",      "--seed=42", "--length", "64",     "--rate",    "1e-3",
               "--fraction", "0.25",    "--scale",   "1024",     "--fast", "--no-gemm", "--mode",
               "bb",         "--level", "high",      "--note",   "",       "-o",        "x.bin"}));
  EXPECT_EQ(t.v.count, 12);
  EXPECT_EQ(t.v.seed, 42u);
  EXPECT_EQ(t.v.length, 64);
  EXPECT_DOUBLE_EQ(t.v.rate, 1e-3);
  EXPECT_DOUBLE_EQ(t.v.fraction, 0.25);
  EXPECT_EQ(t.v.scale, 1024.0);
  EXPECT_TRUE(t.v.fast);
  EXPECT_FALSE(t.v.gemm);
  EXPECT_EQ(t.v.mode, "bb");
  EXPECT_EQ(t.v.level, 2);
  EXPECT_EQ(t.v.note, "");
  EXPECT_EQ(t.v.out, "x.bin");
  EXPECT_TRUE(t.cli.given("--out"));
  EXPECT_TRUE(t.cli.given("--count"));
}

TEST(OptionTableTest, DefaultsStayWhenNotGiven) {
  Table t;
  EXPECT_TRUE(t.parse({}));
  EXPECT_EQ(t.v.count, 4);
  EXPECT_FALSE(t.v.length.has_value());
  EXPECT_FALSE(t.cli.given("--count"));
  EXPECT_TRUE(t.v.gemm);
}

TEST(OptionTableTest, RepeatedOptionTakesTheLastValue) {
  Table t;
  EXPECT_TRUE(t.parse({"--count", "2", "--count", "3", "--mode", "a", "--mode", "ccc"}));
  EXPECT_EQ(t.v.count, 3);
  EXPECT_EQ(t.v.mode, "ccc");
}

TEST(OptionTableTest, RefusesUnknownOptionsAndArguments) {
  EXPECT_EQ(refusal({"--counts", "2"}), "unknown option '--counts'");
  EXPECT_EQ(refusal({"--counts=2"}), "unknown option '--counts'");
  EXPECT_EQ(refusal({"stray"}), "unexpected argument 'stray'");
  EXPECT_EQ(refusal({"-x"}), "unknown option '-x'");
}

TEST(OptionTableTest, RefusesMissingValues) {
  EXPECT_EQ(refusal({"--count"}), "--count needs a value");
  EXPECT_EQ(refusal({"--out", "--fast"}), "--out needs a value, got the option '--fast'");
  EXPECT_EQ(refusal({"--out", ""}), "--out needs a non-empty path");
  EXPECT_EQ(refusal({"--out="}), "--out needs a non-empty path");
  EXPECT_EQ(refusal({"--fast=1"}), "--fast takes no value, got '--fast=1'");
}

TEST(OptionTableTest, RefusesMalformedIntegers) {
  EXPECT_EQ(refusal({"--count", "12x"}), "--count expects an integer, got '12x'");
  EXPECT_EQ(refusal({"--count", "abc"}), "--count expects an integer, got 'abc'");
  EXPECT_EQ(refusal({"--count", ""}), "--count expects an integer, got ''");
  EXPECT_EQ(refusal({"--count", " 12"}), "--count expects an integer, got ' 12'");
  EXPECT_EQ(refusal({"--count", "1.5"}), "--count expects an integer, got '1.5'");
  EXPECT_EQ(refusal({"--count", "1e3"}), "--count expects an integer, got '1e3'");
  EXPECT_EQ(refusal({"--count", "0x10"}), "--count expects an integer, got '0x10'");
}

TEST(OptionTableTest, RefusesIntegersThatOverflowInsteadOfClamping) {
  EXPECT_EQ(refusal({"--count", "99999999999999999999"}),
            "--count 99999999999999999999 does not fit a 64-bit integer");
  EXPECT_EQ(refusal({"--seed", "-99999999999999999999"}),
            "--seed -99999999999999999999 does not fit a 64-bit integer");
  // INT64_MAX parses, and is then out of --count's range.
  EXPECT_EQ(refusal({"--count", "9223372036854775807"}),
            "--count must be in [1, 1000], got 9223372036854775807");
}

TEST(OptionTableTest, RefusesIntegersOutOfRange) {
  EXPECT_EQ(refusal({"--count", "0"}), "--count must be in [1, 1000], got 0");
  EXPECT_EQ(refusal({"--count", "1001"}), "--count must be in [1, 1000], got 1001");
  EXPECT_EQ(refusal({"--count", "-3"}), "--count must be in [1, 1000], got -3");
  EXPECT_EQ(refusal({"--length", "0"}), "--length must be >= 1, got 0");
  EXPECT_EQ(refusal({"--seed", "-1"}), "--seed must be >= 0, got -1");
  Table t;
  EXPECT_TRUE(t.parse({"--count", "1000", "--seed", "9223372036854775807"}));
  EXPECT_EQ(t.v.count, 1000);
  EXPECT_EQ(t.v.seed, 9223372036854775807u);
}

TEST(OptionTableTest, RefusesMalformedAndNonFiniteNumbers) {
  EXPECT_EQ(refusal({"--rate", "1e-3x"}), "--rate expects a number, got '1e-3x'");
  EXPECT_EQ(refusal({"--rate", ""}), "--rate expects a number, got ''");
  EXPECT_EQ(refusal({"--rate", "fast"}), "--rate expects a number, got 'fast'");
  EXPECT_EQ(refusal({"--rate", "nan"}), "--rate expects a finite number, got 'nan'");
  EXPECT_EQ(refusal({"--rate", "inf"}), "--rate expects a finite number, got 'inf'");
  EXPECT_EQ(refusal({"--rate", "1e999"}), "--rate 1e999 is out of the range of a double");
}

TEST(OptionTableTest, RefusesNumbersOutOfRange) {
  EXPECT_EQ(refusal({"--rate", "0"}), "--rate must be > 0, got 0");
  EXPECT_EQ(refusal({"--rate", "-1"}), "--rate must be > 0, got -1");
  EXPECT_EQ(refusal({"--fraction", "1"}), "--fraction must be in [0, 1), got 1");
  EXPECT_EQ(refusal({"--fraction", "-0.5"}), "--fraction must be in [0, 1), got -0.5");
  EXPECT_EQ(refusal({"--scale", "0.5"}), "--scale must be >= 1, got 0.5");
  Table t;
  EXPECT_TRUE(t.parse({"--fraction", "0", "--scale", "1"}));
}

TEST(OptionTableTest, RefusesUnknownChoices) {
  EXPECT_EQ(refusal({"--mode", "d"}), "--mode must be a, bb or ccc, got 'd'");
  EXPECT_EQ(refusal({"--level", "2"}), "--level must be low, mid or high, got '2'");
  EXPECT_EQ(refusal({"--mode", ""}), "--mode must be a, bb or ccc, got ''");
}

TEST(OptionTableTest, HelpListsEveryOptionWithTypeRangeAndDefault) {
  Table t;
  testing::internal::CaptureStdout();
  EXPECT_FALSE(t.parse({"--count", "5", "--help", "--no-such-option"}));
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_EQ(printed, t.cli.help());
  const std::string help = t.cli.help();
  EXPECT_EQ(help.rfind("usage: prog [options]\n\nDoes a thing.\n", 0), 0u) << help;
  for (const char* fragment : {"sizes\n",
                               "numbers\n",
                               "--count N",
                               "how many [integer in [1, 1000]; default 4]",
                               "--seed S",
                               "[integer >= 0; default 7]",
                               "--length T",
                               "[integer >= 1; default the block size]",
                               "a rate [number > 0; default 0.5]",
                               "a fraction [number in [0, 1); default 0]",
                               "a scale [number >= 1]",
                               "--fast",
                               "--no-gemm",
                               "the mode [one of a, bb or ccc; default a]",
                               "the level [one of low, mid or high; default mid]",
                               "a note [text; default hi]",
                               "-o, --out FILE",
                               "where [path]",
                               "-h, --help",
                               "Exit status: 0"})
    EXPECT_NE(help.find(fragment), std::string::npos) << fragment << "\n" << help;
  // Flags carry no type or default.
  EXPECT_NE(help.find("go fast\n"), std::string::npos) << help;
  Table u;
  testing::internal::CaptureStdout();
  EXPECT_FALSE(u.parse({"-h"}));
  EXPECT_EQ(testing::internal::GetCapturedStdout(), help);
}

TEST(OptionTableTest, RefusesBadDeclarations) {
  OptionTable cli("prog", "");
  int64_t a = 0;
  cli.integer("--a", &a, "N", "");
  EXPECT_THROW(cli.integer("--a", &a, "N", ""), accrue::Error);
  EXPECT_THROW(cli.integer("-a", &a, "N", ""), accrue::Error);
  bool h = false;
  EXPECT_THROW(cli.flag("--help", &h, ""), accrue::Error);
}

TEST(CheckedProductTest, MultipliesOrNamesTheFactors) {
  EXPECT_EQ(checked_product({{"--micro-batch", 8}, {"--k", 4}, {"ranks", 2}}), 64);
  EXPECT_EQ(checked_product(
                {{"--micro-batch", 0}, {"--k", std::numeric_limits<int64_t>::max()}, {"ranks", 2}}),
            0);
  try {
    checked_product({{"--micro-batch", 4611686018427387904}, {"--k", 2}});
    ADD_FAILURE() << "no overflow";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--micro-batch 4611686018427387904 x --k 2 overflows a 64-bit integer");
  }
  EXPECT_EQ(checked_product({{"a", 3037000499}, {"b", 3037000499}}), 9223372030926249001);
  EXPECT_THROW(checked_product({{"a", 3037000500}, {"b", 3037000500}}), UsageError);
  try {
    checked_product({{"--n-embd", 1024}, {"--n-layer", 3}}, 3000);
    ADD_FAILURE() << "no refusal";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--n-embd 1024 x --n-layer 3 exceeds the limit 3000");
  }
  EXPECT_THROW(checked_product({{"a", -1}}), accrue::Error);
}

TEST(RunMainTest, ExitCodesAndOneLineMessages) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", [] { return 0; }), 0);
  EXPECT_EQ(run_main("prog", [] { return 1; }), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { usage_error("--count must be >= 1, got ", 0); }), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "prog: --count must be >= 1, got 0 (see --help)\n");

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { ACCRUE_FAIL("empty: shape ", 3, " is bad"); }), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: empty: shape 3 is bad\n");

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { throw std::runtime_error("first\nsecond\n"); }), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: first; second\n");

  testing::internal::CaptureStderr();
  EXPECT_EQ(run_main("prog", []() -> int { throw 42; }), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: an unknown exception ended the run\n");
}

// Note [Error locations]: the message of an accrue::Error, never its where().
TEST(RunMainTest, UserMessageDropsSourceLocations) {
  EXPECT_EQ(
      user_message(accrue::Error("loading x.bin: bad token", "/work/main/data/shards.cpp:12")),
      "loading x.bin: bad token");
  EXPECT_EQ(user_message(std::runtime_error("ratio (3:4) kept")), "ratio (3:4) kept");
  try {
    ACCRUE_FAIL("kernel: bad launch");
  } catch (const accrue::Error& e) {
    EXPECT_EQ(user_message(e), "kernel: bad launch");
    EXPECT_NE(std::string(e.what()), "kernel: bad launch");  // what() keeps the location
  }
}

// The UsageError probe_output_file throws for `path`, or "" when it accepts it.
std::string probe(const std::string& path) {
  try {
    probe_output_file("--out", path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ProbeOutputFileTest, RefusesWhatCannotBeWrittenAndCreatesNothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("accrue_probe_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string d = dir.string();
  // Creatable, and nothing is created.
  EXPECT_EQ(probe(d + "/new.safetensors"), "");
  EXPECT_FALSE(fs::exists(d + "/new.safetensors"));
  // An existing regular file is overwritten at the end: accepted.
  std::FILE* f = std::fopen((d + "/old.safetensors").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(probe(d + "/old.safetensors"), "");
  EXPECT_EQ(probe(d), "--out " + d + " is a directory");
  EXPECT_EQ(probe(d + "/missing/x"), "--out " + d + "/missing/x: no folder " + d + "/missing");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(probe(d + "/fifo"),
            "--out " + d + "/fifo is not a regular file (a FIFO, socket or device)");
  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(d + "/old.safetensors", fs::perms::owner_read);
    EXPECT_EQ(probe(d + "/old.safetensors"), "--out " + d + "/old.safetensors is not writable");
  }
  fs::remove_all(dir);
}

TEST(JsonObjectTest, WritesOneLine) {
  JsonObject config;
  config.integer("n", -3).boolean("on", true).text("name", "a\"b\\c\n");
  JsonObject line;
  line.number("x", 0.1).number("bad", std::numeric_limits<double>::quiet_NaN()).null("none");
  line.object("config", config);
  EXPECT_EQ(line.str(),
            "{\"x\": 0.1, \"bad\": null, \"none\": null, \"config\": {\"n\": -3, \"on\": true, "
            "\"name\": \"a\\\"b\\\\c\\u000a\"}}");
}

}  // namespace
