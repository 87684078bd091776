// Note [Crash-safe saves]: a process killed (SIGKILL) at any moment of a save
// leaves the previous checkpoint whole. A child saves 8 MiB checkpoints in a
// loop; it is killed after a varying delay, many times, and every time the
// file loads and is consistent, and the steps never go back.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "accrue/core/tensor_io.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(CrashSafeSave, a_killed_save_leaves_the_previous_checkpoint_whole) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("accrue_crash_safe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "checkpoint.safetensors").string();
  std::string binary = ACCRUE_SAVE_LOOP_BINARY;
  double last_step = 0;
  int mid_save = 0, loaded = 0;
  constexpr int kTrials = 30;
  for (int trial = 0; trial < kTrials; ++trial) {
    pid_t pid = 0;
    char* argv[] = {binary.data(), const_cast<char*>(path.c_str()), nullptr};
    ASSERT_EQ(::posix_spawn(&pid, binary.c_str(), nullptr, nullptr, argv, environ), 0)
        << binary << ": " << std::strerror(errno);
    // Delays that cross save boundaries at different phases: 20 to 79 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + (trial * 37) % 60));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    // A leftover temporary file: the kill landed inside a save.
    if (std::filesystem::exists(path + ".tmp")) ++mid_save;
    if (!std::filesystem::exists(path)) continue;  // killed before its first save finished
    std::map<std::string, Tensor> t;
    ASSERT_NO_THROW(t = load_safetensors(path)) << "trial " << trial;
    ++loaded;
    const double step = t.at("step").item();
    const Tensor& values = t.at("values");
    ASSERT_EQ(values.numel(), int64_t{1} << 21);
    EXPECT_TRUE(test::all_equal(values, full(values.shape(), step, DType::f32)))
        << "trial " << trial << ": a checkpoint mixes two saves";
    EXPECT_GE(step, last_step) << "trial " << trial << ": the checkpoint went back";
    last_step = step;
  }
  std::printf(
      "[crash-safe] %d kills, %d inside a save; the checkpoint loaded %d times, whole "
      "each time, at step %.0f at the end\n",
      kTrials, mid_save, loaded, last_step);
  EXPECT_GT(loaded, kTrials / 2);
  EXPECT_GT(mid_save, 0) << "no kill landed inside a save: the test proved nothing";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace accrue
