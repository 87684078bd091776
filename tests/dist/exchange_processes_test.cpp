// The TCP exchange between real processes, as a launcher starts them: two
// copies of exchange_rank_main.cpp with torchrun's variables. The in-process
// TcpExchange tests (tcp_exchange_test.cpp) cover the protocol with threads; this
// proves that two processes whose launcher variables disagree on the world
// size both stop with an accrue::Error naming both sizes, instead of one of
// them hanging.
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tests/test_util.h"

extern char** environ;

namespace accrue::dist {
namespace {

// What a finished rank left: its exit code (128 + signal if killed) and its
// stdout and stderr together.
struct Outcome {
  int exit_code = -1;
  std::string output;
};

struct Child {
  pid_t pid = -1;
  int output_fd = -1;
};

// True for the variables of every launcher launch_env.h reads: a child must
// see only the ones a test gives it, not the environment ctest ran in.
bool launcher_variable(const std::string& entry) {
  for (const char* prefix : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                             "MASTER_ADDR=", "MASTER_PORT=", "OMPI_", "PMIX_", "SLURM_"})
    if (entry.rfind(prefix, 0) == 0) return true;
  return false;
}

// Starts the exchange_rank binary as `rank` of `world_size` with torchrun's
// variables, its output going to a pipe.
Child start_rank(int rank, int world_size, int master_port) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!launcher_variable(*e)) env.emplace_back(*e);
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(world_size));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(world_size));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(master_port));
  std::vector<char*> envp;
  for (std::string& s : env)
    envp.push_back(s.data());
  envp.push_back(nullptr);

  // Close-on-exec, so that the other child does not hold this pipe open.
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::string binary = ACCRUE_EXCHANGE_RANK_BINARY;
  char* argv[] = {binary.data(), nullptr};
  Child child;
  const int err = ::posix_spawn(&child.pid, binary.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  EXPECT_EQ(err, 0) << "posix_spawn " << binary << ": " << std::strerror(err);
  child.output_fd = fds[0];
  return child;
}

// Reads the child's output to the end, then reaps it. The ranks bound their
// own exchange (10 s), so this does not wait forever.
Outcome finish(Child child) {
  Outcome out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(child.output_fd, buf, sizeof buf);
    if (n > 0) {
      out.output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(child.output_fd);
  int status = 0;
  if (child.pid > 0 && ::waitpid(child.pid, &status, 0) == child.pid)
    out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

// A MASTER_PORT whose exchange port (MASTER_PORT + 1) nothing listens on:
// take a free ephemeral port, release it, use the one below it as MASTER_PORT.
int free_master_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port) - 1;
}

// Both ranks of one exchange, each with its own WORLD_SIZE.
std::vector<Outcome> run_two_ranks(int world_size_rank0, int world_size_rank1) {
  const int port = free_master_port();
  std::vector<Child> children{start_rank(0, world_size_rank0, port),
                              start_rank(1, world_size_rank1, port)};
  std::vector<Outcome> outcomes;
  for (Child& c : children)
    outcomes.push_back(finish(c));
  return outcomes;
}

TEST(TcpExchangeProcesses, matching_ranks_receive_the_blob) {
  const std::vector<Outcome> out = run_two_ranks(2, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ":\n" << out[r].output;
    EXPECT_THAT(out[r].output, ::testing::HasSubstr("received the blob (first byte 0x5a)"));
  }
}

TEST(TcpExchangeProcesses, mismatched_world_sizes_give_clear_errors_on_both_ranks) {
  const std::vector<Outcome> out = run_two_ranks(2, 3);
  // 3: each rank caught an accrue::Error (not a crash, not a timeout's kill).
  EXPECT_EQ(out[0].exit_code, 3) << "rank 0:\n" << out[0].output;
  EXPECT_EQ(out[1].exit_code, 3) << "rank 1:\n" << out[1].output;
  EXPECT_THAT(out[0].output, ::testing::HasSubstr("accrue::Error"));
  EXPECT_THAT(out[0].output, ::testing::HasSubstr("has world size 3 but rank 0 has 2"));
  EXPECT_THAT(out[1].output, ::testing::HasSubstr("accrue::Error"));
  EXPECT_THAT(out[1].output, ::testing::HasSubstr("world size mismatch"));
  EXPECT_THAT(out[1].output, ::testing::HasSubstr("has world size 2 but rank 1 has 3"));
}

}  // namespace
}  // namespace accrue::dist
