#include "accrue/core/nvtx.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef ACCRUE_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace accrue {
namespace {

// -1: not decided yet (the environment decides at the first range).
std::atomic<int> g_enabled{-1};
std::atomic<int64_t> g_pushed{0};

bool decide() {
  int state = g_enabled.load(std::memory_order_relaxed);
  if (state < 0) {
    const char* env = std::getenv("ACCRUE_NVTX");
    int wanted = env != nullptr && std::strcmp(env, "0") != 0 && env[0] != '\0' ? 1 : 0;
    g_enabled.compare_exchange_strong(state, wanted);
    state = g_enabled.load(std::memory_order_relaxed);
  }
  return state == 1;
}

}  // namespace

void set_nvtx(bool on) {
  g_enabled.store(on ? 1 : 0);
}

bool nvtx_enabled() {
  return decide();
}

int64_t nvtx_ranges_pushed() {
  return g_pushed.load();
}

NvtxRange::NvtxRange(const char* name) {
#ifdef ACCRUE_WITH_CUDA
  if (!decide()) return;
  nvtxRangePushA(name);
  pushed_ = true;
  g_pushed.fetch_add(1, std::memory_order_relaxed);
#else
  (void)name;
#endif
}

NvtxRange::~NvtxRange() {
#ifdef ACCRUE_WITH_CUDA
  if (pushed_) nvtxRangePop();
#endif
}

}  // namespace accrue
