// The body of every example binary's main(): exit codes and one-line errors.
//
//   int main(int argc, char** argv) {
//     return accrue::examples::run_main("accrue_demo", [&] { ... return 0; });
//   }
//
// Note [Exit codes]
// ~~~~~~~~~~~~~~~~~
// 0: the run did what was asked. 2: a bad command line (a UsageError: an
// unknown option, a malformed or out-of-range value, options that exclude
// each other), reported before any work as "<program>: <message> (see
// --help)". 1: the run failed (accrue::Error, any other std::exception, or a
// body that returns 1), reported as "<program>: <message>". Either message is
// one line on stderr, without the build tree's "(file.cpp:123)" location
// that accrue::Error's what() appends (user_message prints its message(),
// Note [Error locations] in core/error.h); nothing escapes main, so no run
// ends in std::terminate's abort.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace accrue::examples {

// An exception's message for a user, on one line: error_message(e) (an
// accrue::Error's message() without its source location), lines joined.
std::string user_message(const std::exception& e);

// Runs `body` under Note [Exit codes]; returns its exit code, or 1 or 2.
int run_main(const char* program, const std::function<int()>& body);

}  // namespace accrue::examples
