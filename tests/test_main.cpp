// Test entry point shared by every accrue test binary.
//
// ACCRUE_TEST_ALLOCATOR=plain selects plain cudaMalloc so that compute-sanitizer
// sees the exact bounds of every allocation (the pooled allocator hands out
// slices of larger blocks). The library itself takes no environment variables.
//
// Note [Skipped test binaries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A GTEST_SKIP'd test passes as far as the exit status goes, so without help
// ctest would count a gpu binary on a machine without a GPU as passed. When
// every test that ran was skipped (and none failed), main prints "accrue: all
// N tests skipped" and, if given --accrue_all_skipped_exit_code=C, exits with
// C. accrue_test() in tests/CMakeLists.txt passes 77 and declares
// SKIP_RETURN_CODE 77, so ctest reports such a binary as skipped. A binary in
// which some tests ran counts as passed, whatever else skipped. Run by hand
// (or by a script, or under compute-sanitizer), a binary exits 0 as gtest
// does.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "accrue/core/allocator.h"

namespace {

constexpr const char* kSkipCodeFlag = "--accrue_all_skipped_exit_code=";

// The exit code asked for by kSkipCodeFlag, or 0. InitGoogleTest has already
// removed gtest's own flags from argv.
int all_skipped_exit_code(int argc, char** argv) {
  const size_t n = std::strlen(kSkipCodeFlag);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kSkipCodeFlag, n) != 0) continue;
    const char* value = argv[i] + n;
    char* end = nullptr;
    const long code = std::strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || code <= 0 || code > 255) {
      std::fprintf(stderr, "accrue: %s expects an exit code in [1, 255], got '%s'\n", kSkipCodeFlag,
                   value);
      std::exit(2);
    }
    return static_cast<int>(code);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int skip_code = all_skipped_exit_code(argc, argv);
  const char* mode = std::getenv("ACCRUE_TEST_ALLOCATOR");
  if (mode && std::strcmp(mode, "plain") == 0)
    accrue::set_cuda_allocator_mode(accrue::CudaAllocatorMode::Plain);
  const int result = RUN_ALL_TESTS();
  // See Note [Skipped test binaries].
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  const int ran = unit.test_to_run_count();
  if (result == 0 && ran > 0 && unit.skipped_test_count() == ran) {
    std::printf("accrue: all %d tests skipped\n", ran);
    if (skip_code != 0) return skip_code;
  }
  return result;
}
