#include "examples/common/options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace accrue::examples {

namespace {

// A bound as --help and the errors print it: an integer option's bounds as integers.
std::string bound_str(double v, bool integer) {
  std::ostringstream os;
  if (integer)
    os << static_cast<long long>(v);
  else
    os << v;
  return os.str();
}

// "a, b or c"
std::string word_list(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) s += i + 1 == words.size() ? " or " : ", ";
    s += words[i];
  }
  return s;
}

// `text` wrapped to `width` columns, every line after the first indented by `indent`.
std::string wrap(const std::string& text, size_t indent, size_t first_column, size_t width) {
  std::string out;
  size_t column = first_column;
  std::istringstream words(text);
  std::string word;
  bool first = true;
  while (words >> word) {
    if (!first && column + 1 + word.size() > width) {
      out.append("\n").append(indent, ' ');
      column = indent;
    } else if (!first) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    first = false;
  }
  return out;
}

}  // namespace

// "f32|bf16|f16", or WORD when the words are many or long.
std::string choice_metavar(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words)
    s += (s.empty() ? "" : "|") + w;
  return s.size() <= 24 ? s : "WORD";
}

namespace {

int64_t parse_integer(const std::string& name, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range)
    usage_error(name, " ", text, " does not fit a 64-bit integer");
  if (text.empty() || ec != std::errc() || ptr != end)
    usage_error(name, " expects an integer, got '", text, "'");
  return v;
}

double parse_number(const std::string& name, const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range)
    usage_error(name, " ", text, " is out of the range of a double");
  if (text.empty() || ec != std::errc() || ptr != end)
    usage_error(name, " expects a number, got '", text, "'");
  if (!std::isfinite(v)) usage_error(name, " expects a finite number, got '", text, "'");
  return v;
}

}  // namespace

int64_t checked_product(std::initializer_list<Factor> factors, int64_t limit) {
  int64_t product = 1;
  bool overflow = false;
  for (const Factor& f : factors) {
    ACCRUE_CHECK(f.value >= 0, "checked_product: ", f.name, " is negative (", f.value, ")");
    if (f.value != 0 && product > limit / f.value) overflow = true;
    if (!overflow) product *= f.value;
  }
  for (const Factor& f : factors)
    if (f.value == 0) return 0;
  if (!overflow) return product;
  std::string terms;
  for (const Factor& f : factors)
    terms += detail::str_cat(terms.empty() ? "" : " x ", f.name, " ", f.value);
  if (limit == std::numeric_limits<int64_t>::max())
    usage_error(terms, " overflows a 64-bit integer");
  usage_error(terms, " exceeds the limit ", limit);
}

// ---- Option ----------------------------------------------------------------

OptionTable::Option& OptionTable::Option::min(double v) {
  lo = v;
  lo_open = false;
  return *this;
}
OptionTable::Option& OptionTable::Option::above(double v) {
  lo = v;
  lo_open = true;
  return *this;
}
OptionTable::Option& OptionTable::Option::max(double v) {
  hi = v;
  hi_open = false;
  return *this;
}
OptionTable::Option& OptionTable::Option::below(double v) {
  hi = v;
  hi_open = true;
  return *this;
}
OptionTable::Option& OptionTable::Option::default_text(std::string text) {
  default_text_ = std::move(text);
  return *this;
}
OptionTable::Option& OptionTable::Option::alias(std::string a) {
  aliases.push_back(std::move(a));
  return *this;
}

void OptionTable::Option::check_range(const std::string& text, double v) const {
  // An integer is compared as a double: exact up to 2^53, and the declared
  // bounds are far below that.
  const bool below_lo = lo && (lo_open ? v <= *lo : v < *lo);
  const bool above_hi = hi && (hi_open ? v >= *hi : v > *hi);
  if (!below_lo && !above_hi) return;
  const bool integer = kind == Kind::integer;
  if (lo && hi)
    usage_error(name, " must be in ", lo_open ? "(" : "[", bound_str(*lo, integer), ", ",
                bound_str(*hi, integer), hi_open ? ")" : "]", ", got ", text);
  if (lo)
    usage_error(name, " must be ", lo_open ? "> " : ">= ", bound_str(*lo, integer), ", got ", text);
  usage_error(name, " must be ", hi_open ? "< " : "<= ", bound_str(*hi, integer), ", got ", text);
}

std::string OptionTable::Option::type_text() const {
  std::string range;
  const bool integer = kind == Kind::integer;
  if (lo && hi)
    range = detail::str_cat(" in ", lo_open ? "(" : "[", bound_str(*lo, integer), ", ",
                            bound_str(*hi, integer), hi_open ? ")" : "]");
  else if (lo)
    range = detail::str_cat(lo_open ? " > " : " >= ", bound_str(*lo, integer));
  else if (hi)
    range = detail::str_cat(hi_open ? " < " : " <= ", bound_str(*hi, integer));
  switch (kind) {
    case Kind::flag:
      return "";
    case Kind::integer:
      return "integer" + range;
    case Kind::number:
      return "number" + range;
    case Kind::choice:
      return "one of " + word_list(words);
    case Kind::text:
      return "text";
    case Kind::path:
      return "path";
  }
  return "";
}

// ---- OptionTable -----------------------------------------------------------

OptionTable::OptionTable(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

OptionTable::Option& OptionTable::add(Option::Kind kind, std::string name, std::string metavar,
                                      std::string help,
                                      std::function<void(const std::string&)> set) {
  ACCRUE_CHECK(name.rfind("--", 0) == 0 && name.size() > 2, "OptionTable: option '", name,
               "' does not start with --");
  ACCRUE_CHECK(find(name) == nullptr && name != "--help", "OptionTable: ", name,
               " is declared twice");
  Option& o = options_.emplace_back();
  o.kind = kind;
  o.name = std::move(name);
  o.metavar = std::move(metavar);
  o.help = std::move(help);
  o.section = section_;
  o.set = std::move(set);
  return o;
}

OptionTable::Option* OptionTable::find(std::string_view name) {
  for (Option& o : options_) {
    if (o.name == name) return &o;
    for (const std::string& a : o.aliases)
      if (a == name) return &o;
  }
  return nullptr;
}

OptionTable::Option& OptionTable::flag(std::string name, bool* out, std::string help) {
  return add(Option::Kind::flag, std::move(name), "", std::move(help),
             [out](const std::string&) { *out = true; });
}

OptionTable::Option& OptionTable::flag_off(std::string name, bool* out, std::string help) {
  return add(Option::Kind::flag, std::move(name), "", std::move(help),
             [out](const std::string&) { *out = false; });
}

OptionTable::Option& OptionTable::integer(std::string name, int64_t* out, std::string metavar,
                                          std::string help) {
  Option& o = add(Option::Kind::integer, name, std::move(metavar), std::move(help), {});
  o.set = [out, &o](const std::string& text) {
    const int64_t v = parse_integer(o.name, text);
    o.check_range(text, static_cast<double>(v));
    *out = v;
  };
  o.default_text_ = std::to_string(*out);
  return o;
}

OptionTable::Option& OptionTable::integer(std::string name, uint64_t* out, std::string metavar,
                                          std::string help) {
  Option& o = add(Option::Kind::integer, name, std::move(metavar), std::move(help), {});
  o.lo = 0;
  o.set = [out, &o](const std::string& text) {
    const int64_t v = parse_integer(o.name, text);
    o.check_range(text, static_cast<double>(v));
    *out = static_cast<uint64_t>(v);
  };
  o.default_text_ = std::to_string(*out);
  return o;
}

OptionTable::Option& OptionTable::integer(std::string name, std::optional<int64_t>* out,
                                          std::string metavar, std::string help) {
  Option& o = add(Option::Kind::integer, name, std::move(metavar), std::move(help), {});
  o.set = [out, &o](const std::string& text) {
    const int64_t v = parse_integer(o.name, text);
    o.check_range(text, static_cast<double>(v));
    *out = v;
  };
  if (*out) o.default_text_ = std::to_string(**out);
  return o;
}

OptionTable::Option& OptionTable::number(std::string name, double* out, std::string metavar,
                                         std::string help) {
  Option& o = add(Option::Kind::number, name, std::move(metavar), std::move(help), {});
  o.set = [out, &o](const std::string& text) {
    const double v = parse_number(o.name, text);
    o.check_range(text, v);
    *out = v;
  };
  std::ostringstream os;
  os << *out;
  o.default_text_ = os.str();
  return o;
}

OptionTable::Option& OptionTable::number(std::string name, std::optional<double>* out,
                                         std::string metavar, std::string help) {
  Option& o = add(Option::Kind::number, name, std::move(metavar), std::move(help), {});
  o.set = [out, &o](const std::string& text) {
    const double v = parse_number(o.name, text);
    o.check_range(text, v);
    *out = v;
  };
  return o;
}

OptionTable::Option& OptionTable::choice(std::string name, std::string* out,
                                         std::vector<std::string> words, std::string help) {
  Option& o = add(Option::Kind::choice, name, choice_metavar(words), std::move(help),
                  [out](const std::string& w) { *out = w; });
  o.words = std::move(words);
  o.default_text_ = *out;
  return o;
}

OptionTable::Option& OptionTable::text(std::string name, std::string* out, std::string metavar,
                                       std::string help) {
  Option& o = add(Option::Kind::text, std::move(name), std::move(metavar), std::move(help),
                  [out](const std::string& v) { *out = v; });
  o.default_text_ = *out;
  return o;
}

OptionTable::Option& OptionTable::path(std::string name, std::string* out, std::string metavar,
                                       std::string help) {
  Option& o = add(Option::Kind::path, std::move(name), std::move(metavar), std::move(help),
                  [out](const std::string& v) { *out = v; });
  o.default_text_ = *out;
  return o;
}

bool OptionTable::parse(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i)
    args.emplace_back(argv[i]);
  return parse(args);
}

bool OptionTable::parse(const std::vector<std::string>& args) {
  given_.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      const std::string text = help();
      std::fwrite(text.data(), 1, text.size(), stdout);
      return false;
    }
    // --name=value is --name value.
    std::string name = arg;
    std::optional<std::string> value;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    Option* o = find(name);
    if (o == nullptr) {
      if (arg.empty() || arg[0] != '-') usage_error("unexpected argument '", arg, "'");
      usage_error("unknown option '", name, "'");
    }
    given_.push_back(o->name);
    if (o->kind == Option::Kind::flag) {
      if (value) usage_error(o->name, " takes no value, got '", arg, "'");
      o->set("");
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) usage_error(o->name, " needs a value");
      value = args[++i];
    }
    if (value->rfind("--", 0) == 0 && value->size() > 2)
      usage_error(o->name, " needs a value, got the option '", *value, "'");
    if (o->kind == Option::Kind::choice) {
      bool known = false;
      for (const std::string& w : o->words)
        known = known || w == *value;
      if (!known) usage_error(o->name, " must be ", word_list(o->words), ", got '", *value, "'");
    }
    if (o->kind == Option::Kind::path && value->empty())
      usage_error(o->name, " needs a non-empty path");
    o->set(*value);
  }
  return true;
}

bool OptionTable::given(std::string_view name) const {
  for (const std::string& g : given_)
    if (g == name) return true;
  return false;
}

std::string OptionTable::help() const {
  constexpr size_t kColumn = 31, kWidth = 100;
  std::string out = "usage: " + program_ + " [options]\n";
  // append(), not "\n" + a string: g++ 12 warns falsely on that here (-Wrestrict).
  if (!summary_.empty()) out.append("\n").append(wrap(summary_, 0, 0, kWidth)).append("\n");
  std::string section = "\x01";  // no option has this section: the first one prints its own
  auto entry = [&](const std::string& left, const std::string& text) {
    std::string line = "  " + left;
    if (line.size() + 2 > kColumn) {
      line.append("\n").append(kColumn, ' ');
    } else {
      line += std::string(kColumn - line.size(), ' ');
    }
    out += line + wrap(text, kColumn, kColumn, kWidth) + "\n";
  };
  for (const Option& o : options_) {
    if (o.section != section) {
      section = o.section;
      out += "\n";
      if (!section.empty()) out += section + "\n";
    }
    std::string left = o.name;
    for (const std::string& a : o.aliases)
      left = a + ", " + left;
    if (!o.metavar.empty()) left += " " + o.metavar;
    std::string text = o.help;
    std::string facts = o.type_text();
    if (o.kind != Option::Kind::flag && !o.default_text_.empty())
      facts += (facts.empty() ? "" : "; ") + std::string("default ") + o.default_text_;
    if (!facts.empty()) text += " [" + facts + "]";
    entry(left, text);
  }
  if (!section.empty() && section != "\x01") out += "\n";
  entry("-h, --help", "print this help and exit");
  out +=
      "\nA repeated option takes its last value. Exit status: 0 done, 1 the run failed, "
      "2 a bad command line.\n";
  if (!epilog_.empty()) out += epilog_ + (epilog_.back() == '\n' ? "" : "\n");
  return out;
}

}  // namespace accrue::examples
