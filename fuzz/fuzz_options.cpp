// libFuzzer target: the example binaries' command-line parser,
// OptionTable::parse (examples/common/options.h), over an argv split from the
// input at NUL bytes. One table declares an option of every kind with ranges,
// as the trainers do. A bad command line must throw UsageError (or
// accrue::Error from checked_product), never crash, and a command line it
// accepts must leave every value inside its declared range
// (Note [Command-line values]); checked_product of the parsed integers must
// be exact or refused, never wrapped.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "accrue/core/error.h"
#include "examples/common/options.h"
#include "fuzz/fuzz_util.h"

namespace {

enum class Mode { sum, max };

struct Values {
  bool cpu = false, overlap = true;
  int64_t micro_batch = 4, warmup = 0;
  uint64_t seed = 1337;
  std::optional<int64_t> stop_after;
  double lr = 6e-4, dropout = 0.0;
  std::optional<double> init_scale;
  std::string dtype = "f32", name, data;
  Mode mode = Mode::sum;
};

void declare(accrue::examples::OptionTable& cli, Values& v) {
  cli.section("section");
  cli.flag("--cpu", &v.cpu, "a flag");
  cli.flag_off("--no-overlap", &v.overlap, "a flag that clears");
  cli.integer("--micro-batch", &v.micro_batch, "B", "an integer >= 1").min(1);
  cli.integer("--warmup", &v.warmup, "N", "an integer in [0, 1000]").min(0).max(1000);
  cli.integer("--seed", &v.seed, "S", "an unsigned integer");
  cli.integer("--stop-after", &v.stop_after, "N", "an optional integer > 0").above(0);
  cli.number("--lr", &v.lr, "LR", "a number > 0").above(0);
  cli.number("--dropout", &v.dropout, "P", "a number in [0, 1)").min(0).below(1);
  cli.number("--init-scale", &v.init_scale, "S", "an optional number").min(1);
  cli.choice("--dtype", &v.dtype, {"f32", "bf16", "f16"}, "a choice of words");
  cli.choice<Mode>("--mode", &v.mode, {{"sum", Mode::sum}, {"max", Mode::max}}, "a typed choice");
  cli.text("--name", &v.name, "TEXT", "any text").alias("-n");
  cli.path("--data", &v.data, "GLOB", "a path");
  cli.epilog("epilog");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // --help prints the table on stdout: keep it out of libFuzzer's output.
  if (!std::freopen("/dev/null", "w", stdout)) std::perror("/dev/null");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  using examples::checked_product;
  std::vector<std::string> args;
  std::string arg;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(arg);
      arg.clear();
    } else {
      arg += static_cast<char>(data[i]);
    }
  }
  if (!arg.empty() || args.empty()) args.push_back(arg);

  Values v;
  examples::OptionTable cli("fuzz_options", "The parser under the fuzzer.");
  declare(cli, v);
  bool run = false;
  try {
    run = cli.parse(args);
  } catch (const examples::UsageError&) {
    return 0;  // refused with a message: the expected outcome for most inputs
  }
  if (!run) return 0;  // --help was printed
  fuzz::require(v.micro_batch >= 1, "--micro-batch below its minimum");
  fuzz::require(v.warmup >= 0 && v.warmup <= 1000, "--warmup outside [0, 1000]");
  fuzz::require(!v.stop_after || *v.stop_after > 0, "--stop-after not above 0");
  fuzz::require(std::isfinite(v.lr) && v.lr > 0, "--lr not a finite number > 0");
  fuzz::require(std::isfinite(v.dropout) && v.dropout >= 0 && v.dropout < 1,
                "--dropout outside [0, 1)");
  fuzz::require(!v.init_scale || (std::isfinite(*v.init_scale) && *v.init_scale >= 1),
                "--init-scale not a finite number >= 1");
  fuzz::require(v.dtype == "f32" || v.dtype == "bf16" || v.dtype == "f16",
                "--dtype not one of its words");
  fuzz::require(!cli.given("--data") || !v.data.empty(), "--data accepted empty");
  fuzz::require(cli.given("--cpu") == v.cpu, "--cpu given but not set, or set but not given");

  // The product of the parsed integers: exact, or refused naming the factors.
  // The reference: one factor at a time with the compiler's overflow check
  // (the factors are >= 0, so a product past the range stays past it).
  const int64_t factors[] = {v.micro_batch, v.warmup, v.stop_after.value_or(1)};
  int64_t exact = 1;
  bool overflow = false, zero = false;
  for (const int64_t f : factors) {
    zero = zero || f == 0;
    overflow = overflow || __builtin_mul_overflow(exact, f, &exact);
  }
  try {
    const int64_t p = checked_product(
        {{"--micro-batch", factors[0]}, {"--warmup", factors[1]}, {"--stop-after", factors[2]}});
    fuzz::require(zero ? p == 0 : !overflow && p == exact,
                  "checked_product returned a wrong product");
  } catch (const examples::UsageError&) {
    fuzz::require(overflow && !zero, "checked_product refused a product that fits");
  }
  return 0;
}
