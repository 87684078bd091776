// Test entry point shared by every accrue test binary.
//
// ACCRUE_TEST_ALLOCATOR=plain selects plain cudaMalloc so that compute-sanitizer
// sees the exact bounds of every allocation (the pooled allocator hands out
// slices of larger blocks). The library itself takes no environment variables.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "core/allocator.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* mode = std::getenv("ACCRUE_TEST_ALLOCATOR");
  if (mode && std::strcmp(mode, "plain") == 0)
    accrue::set_cuda_allocator_mode(accrue::CudaAllocatorMode::Plain);
  return RUN_ALL_TESTS();
}
