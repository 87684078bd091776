// The command line of every example binary: one table of typed options per
// binary, which parses argv and prints --help.
//
//   examples::OptionTable cli("accrue_demo", "Trains an MLP ...");
//   cli.integer("--micro-batch", &o.micro_batch, "B", "items per micro-batch").min(1);
//   cli.choice("--dtype", &o.dtype, {"f32", "bf16", "f16"}, "compute dtype");
//   if (!cli.parse(argc, argv)) return 0;  // --help was printed
//
// Note [Command-line values]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A value is taken whole or refused with a UsageError that names the option
// and the text typed (run_main turns it into one line and exit code 2):
//   - integers are base-10 int64 with no sign but '-', no spaces and no
//     trailing characters ("12x" is refused); one that does not fit 64 bits
//     is refused, never clamped (strtoll would clamp it to INT64_MAX);
//   - numbers are finite doubles ("nan", "inf" and "1e999" are refused),
//     parsed without the locale;
//   - choices are one word of a fixed list; paths are non-empty;
//   - a value may not start with "--": "--metrics --cpu" is a forgotten value,
//     not a file named "--cpu";
//   - every value is checked against its declared range before the run
//     builds anything; products of values (micro-batch x K x ranks) go through
//     checked_product, which refuses an overflow naming the factors.
// A repeated option takes its last value (as GNU getopt does): the benchmark
// scripts append the user's extra options after their own to override them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "accrue/core/error.h"

namespace accrue::examples {

// A bad command line (run_main: "<program>: <message> (see --help)", exit 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void usage_error(const Args&... args) {
  throw UsageError(detail::str_cat(args...));
}

// --help's placeholder for a choice's value: "f32|bf16|f16", or WORD.
std::string choice_metavar(const std::vector<std::string>& words);

// One factor of checked_product: what it is ("--micro-batch", "ranks") and its value.
struct Factor {
  std::string_view name;
  int64_t value;
};

// The product of non-negative factors, or a UsageError naming every factor
// and its value when the product exceeds `limit` (by default, int64's range).
int64_t checked_product(std::initializer_list<Factor> factors,
                        int64_t limit = std::numeric_limits<int64_t>::max());

class OptionTable {
 public:
  // One declared option; the setters refine its range and its --help entry.
  class Option {
   public:
    // Integers and numbers: the value must be >= v (min), > v (above), <= v
    // (max) or < v (below).
    Option& min(double v);
    Option& above(double v);
    Option& max(double v);
    Option& below(double v);
    // --help's "default ..." text, where the declared variable does not say it
    // (an unset optional, a default that depends on the device).
    Option& default_text(std::string text);
    // A second name, e.g. "-h".
    Option& alias(std::string name);

   private:
    friend class OptionTable;
    enum class Kind { flag, integer, number, choice, text, path };
    Kind kind = Kind::flag;
    std::string name, metavar, help, default_text_;
    std::vector<std::string> aliases, words;
    std::optional<double> lo, hi;
    bool lo_open = false, hi_open = false;
    std::string section;
    std::function<void(const std::string&)> set;
    void check_range(const std::string& text, double v) const;
    std::string type_text() const;
  };

  OptionTable(std::string program, std::string summary);
  OptionTable(const OptionTable&) = delete;
  OptionTable& operator=(const OptionTable&) = delete;

  const std::string& program() const { return program_; }

  // A heading in --help for the options declared after it.
  void section(std::string title) { section_ = std::move(title); }
  // Text printed after the options (examples, exit codes).
  void epilog(std::string text) { epilog_ = std::move(text); }

  // A flag sets *out to true (its default is *out, normally false).
  Option& flag(std::string name, bool* out, std::string help);
  // --no-X style: the flag sets *out to false.
  Option& flag_off(std::string name, bool* out, std::string help);
  Option& integer(std::string name, int64_t* out, std::string metavar, std::string help);
  Option& integer(std::string name, uint64_t* out, std::string metavar, std::string help);
  Option& integer(std::string name, std::optional<int64_t>* out, std::string metavar,
                  std::string help);
  Option& number(std::string name, double* out, std::string metavar, std::string help);
  Option& number(std::string name, std::optional<double>* out, std::string metavar,
                 std::string help);
  // One of `words`; *out holds the word.
  Option& choice(std::string name, std::string* out, std::vector<std::string> words,
                 std::string help);
  // One of the words of `values`, stored as its value.
  template <class T>
  Option& choice(std::string name, T* out, std::vector<std::pair<std::string, T>> values,
                 std::string help) {
    std::vector<std::string> words;
    std::string current;
    for (const auto& [word, value] : values) {
      words.push_back(word);
      if (value == *out && current.empty()) current = word;
    }
    Option& o = add(Option::Kind::choice, std::move(name), choice_metavar(words), std::move(help),
                    [out, values](const std::string& w) {
                      for (const auto& [word, value] : values)
                        if (word == w) *out = value;
                    });
    o.words = std::move(words);
    o.default_text_ = current;
    return o;
  }
  // Any text, the empty string included.
  Option& text(std::string name, std::string* out, std::string metavar, std::string help);
  // A file or directory name (or a glob): not empty.
  Option& path(std::string name, std::string* out, std::string metavar, std::string help);

  // Parses argv[1..]. Returns false when -h/--help was given: the help is then
  // on stdout and the program should exit 0. Throws UsageError, see
  // Note [Command-line values].
  bool parse(int argc, const char* const* argv);
  bool parse(const std::vector<std::string>& args);  // without the program name
  // Whether the command line named this option (after parse).
  bool given(std::string_view name) const;
  // The --help text: usage, summary, every option with its type, range and default.
  std::string help() const;

 private:
  Option& add(Option::Kind kind, std::string name, std::string metavar, std::string help,
              std::function<void(const std::string&)> set);
  Option* find(std::string_view name);

  std::string program_, summary_, epilog_, section_;
  std::deque<Option> options_;  // stable addresses: declarations return references
  std::vector<std::string> given_;
};

}  // namespace accrue::examples
