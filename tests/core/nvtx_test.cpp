// Note [NVTX ranges]: off, a range pushes nothing; on (with CUDA), each
// range pushes once and pops at its end, also inside a Window's micro-steps.
#include <gtest/gtest.h>

#include "accrue/core/nvtx.h"

namespace accrue {
namespace {

#ifdef ACCRUE_WITH_CUDA
constexpr int64_t kPushedWhenOn = 1;
#else
constexpr int64_t kPushedWhenOn = 0;  // without CUDA nothing is ever pushed
#endif

TEST(Nvtx, ranges_push_only_when_on) {
  set_nvtx(false);
  EXPECT_FALSE(nvtx_enabled());
  const int64_t before = nvtx_ranges_pushed();
  { const NvtxRange r("off"); }
  EXPECT_EQ(nvtx_ranges_pushed(), before);
  set_nvtx(true);
  EXPECT_TRUE(nvtx_enabled());
  {
    const NvtxRange outer("outer");
    const NvtxRange inner("inner");  // nested: pops in reverse order
  }
  EXPECT_EQ(nvtx_ranges_pushed(), before + 2 * kPushedWhenOn);
  set_nvtx(false);
}

}  // namespace
}  // namespace accrue
