// The opt-in environment switches (core/env_flag.h): on for exactly "1".
// The attention switch's effect is checked in its own process (the flag is
// read once): tests/kernels/CMakeLists.txt runs AttentionPaths.* with
// ACCRUE_ATTENTION_COMPOSED=1.
#include <gtest/gtest.h>

#include <cstdlib>

#include "accrue/core/env_flag.h"

namespace accrue {
namespace {

TEST(EnvFlag, only_exactly_one_turns_a_switch_on) {
  const char* name = "ACCRUE_TEST_ENV_FLAG";
  ::unsetenv(name);
  EXPECT_FALSE(env_flag(name));
  for (const char* off : {"", "0", "yes", "true", "10", " 1"}) {
    ::setenv(name, off, 1);
    EXPECT_FALSE(env_flag(name)) << "'" << off << "'";
  }
  ::setenv(name, "1", 1);
  EXPECT_TRUE(env_flag(name));
  ::unsetenv(name);
}

}  // namespace
}  // namespace accrue
