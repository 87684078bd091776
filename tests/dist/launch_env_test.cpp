// Rank discovery from each launcher's variables (dist/launch_env.h), and every
// way they can be wrong.
#include <cstdlib>
#include <optional>

#include "accrue/dist/launch_env.h"
#include "tests/dist/dist_test_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

Env slurm_env(int rank, int world, int local, const std::string& tasks_per_node) {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", std::to_string(world)},
          {"SLURM_LOCALID", std::to_string(local)},
          {"SLURM_TASKS_PER_NODE", tasks_per_node}};
}

Env merged(Env a, const Env& b) {
  a.insert(b.begin(), b.end());
  return a;
}

void expect_rank(const RankInfo& r, int rank, int world, int local, int local_world,
                 const std::string& launcher) {
  EXPECT_EQ(r.rank, rank);
  EXPECT_EQ(r.world_size, world);
  EXPECT_EQ(r.local_rank, local);
  EXPECT_EQ(r.local_world_size, local_world);
  EXPECT_EQ(r.launcher, launcher);
}

TEST(LaunchEnv, no_launcher_is_a_single_process) {
  RankInfo r = discover_rank(Env{});
  expect_rank(r, 0, 1, 0, 1, "none");
  EXPECT_FALSE(r.distributed());
  EXPECT_TRUE(r.master_addr.empty());
  EXPECT_EQ(r.master_port, 0);
  // Allocation variables without SLURM_PROCID (a salloc shell) are not a launch.
  expect_rank(discover_rank(Env{{"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}}), 0, 1, 0, 1,
              "none");
}

TEST(LaunchEnv, torchrun_variables) {
  RankInfo r = discover_rank(torchrun_env(5, 8, 1, 4));
  expect_rank(r, 5, 8, 1, 4, "torchrun");
  EXPECT_TRUE(r.distributed());
  EXPECT_EQ(r.master_addr, "10.1.2.3");
  EXPECT_EQ(r.master_port, 29500);
  EXPECT_EQ(describe(r), "rank 5 of 8 (local 1 of 4) via torchrun, master 10.1.2.3:29500");
}

TEST(LaunchEnv, openmpi_variables) {
  Env env = openmpi_env(3, 4, 1, 2);
  env["MASTER_ADDR"] = "node0";
  expect_rank(discover_rank(env), 3, 4, 1, 2, "openmpi");
  EXPECT_EQ(discover_rank(env).master_addr, "node0");
}

TEST(LaunchEnv, slurm_variables) {
  Env env = slurm_env(6, 8, 2, "4(x2)");
  expect_rank(discover_rank(env), 6, 8, 2, 4, "slurm");
  // SLURM_NTASKS_PER_NODE wins over SLURM_TASKS_PER_NODE when both are set.
  env["SLURM_NTASKS_PER_NODE"] = "4";
  env["SLURM_TASKS_PER_NODE"] = "garbage";
  expect_rank(discover_rank(env), 6, 8, 2, 4, "slurm");
  // Uneven nodes: SLURM_NODEID picks this node's count.
  Env uneven = slurm_env(8, 11, 0, "4(x2),3");
  uneven["SLURM_NODEID"] = "2";
  expect_rank(discover_rank(uneven), 8, 11, 0, 3, "slurm");
  uneven["SLURM_NODEID"] = "1";
  EXPECT_EQ(discover_rank(uneven).local_world_size, 4);
  EXPECT_EQ(discover_rank(slurm_env(0, 2, 0, "2")).local_world_size, 2);
}

TEST(LaunchEnv, missing_variable_is_named) {
  for (const char* drop : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    Env env = torchrun_env(1, 2, 1, 2);
    env.erase(drop);
    EXPECT_ERROR(discover_rank(env), "torchrun", drop, "is not");
  }
  for (const char* drop : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    Env env = openmpi_env(1, 2, 1, 2);
    env.erase(drop);
    EXPECT_ERROR(discover_rank(env), "openmpi", drop, "is not");
  }
  for (const char* drop : {"SLURM_NTASKS", "SLURM_LOCALID"}) {
    Env env = slurm_env(1, 2, 1, "2");
    env.erase(drop);
    EXPECT_ERROR(discover_rank(env), "slurm", drop, "is not");
  }
  Env env = slurm_env(1, 2, 1, "2");
  env.erase("SLURM_TASKS_PER_NODE");
  EXPECT_ERROR(discover_rank(env), "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
}

TEST(LaunchEnv, malformed_numbers_name_variable_and_value) {
  for (const char* bad : {"abc", "", "1x", " 1", "+1", "1.0", "99999999999"}) {
    Env env = torchrun_env(1, 2, 1, 2);
    env["WORLD_SIZE"] = bad;
    EXPECT_ERROR(discover_rank(env), "WORLD_SIZE", bad);
  }
  Env env = openmpi_env(1, 2, 1, 2);
  env["OMPI_COMM_WORLD_RANK"] = "-1";
  EXPECT_ERROR(discover_rank(env), "OMPI_COMM_WORLD_RANK=-1", "negative");
  env = slurm_env(1, 2, 1, "2");
  env["SLURM_LOCALID"] = "-3";
  EXPECT_ERROR(discover_rank(env), "SLURM_LOCALID=-3", "negative");
}

TEST(LaunchEnv, inconsistent_values_are_errors) {
  EXPECT_ERROR(discover_rank(torchrun_env(2, 2, 0, 1)), "RANK=2", "WORLD_SIZE=2");
  EXPECT_ERROR(discover_rank(torchrun_env(0, 0, 0, 1)), "WORLD_SIZE=0", "at least 1");
  EXPECT_ERROR(discover_rank(torchrun_env(0, 2, 0, 0)), "LOCAL_WORLD_SIZE=0", "at least 1");
  EXPECT_ERROR(discover_rank(torchrun_env(1, 4, 2, 2)), "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2");
  EXPECT_ERROR(discover_rank(torchrun_env(1, 2, 1, 4)), "LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2");
  EXPECT_ERROR(discover_rank(openmpi_env(4, 4, 0, 2)), "OMPI_COMM_WORLD_RANK=4",
               "OMPI_COMM_WORLD_SIZE=4");
  EXPECT_ERROR(discover_rank(openmpi_env(1, 4, 3, 2)), "OMPI_COMM_WORLD_LOCAL_RANK=3",
               "OMPI_COMM_WORLD_LOCAL_SIZE=2");
  EXPECT_ERROR(discover_rank(slurm_env(3, 3, 0, "3")), "SLURM_PROCID=3", "SLURM_NTASKS=3");
  EXPECT_ERROR(discover_rank(slurm_env(1, 4, 2, "2(x2)")), "SLURM_LOCALID=2",
               "SLURM_TASKS_PER_NODE=2");
}

TEST(LaunchEnv, bad_slurm_tasks_per_node) {
  for (const char* bad : {"4(x", "4(y2)", "x", "4(x2),", "4(x)"})
    EXPECT_ERROR(discover_rank(slurm_env(0, 4, 0, bad)), "SLURM_TASKS_PER_NODE");
  // Uneven nodes need SLURM_NODEID; a node beyond the list is an error.
  EXPECT_ERROR(discover_rank(slurm_env(0, 7, 0, "4,3")), "SLURM_TASKS_PER_NODE='4,3'",
               "SLURM_NODEID");
  Env env = slurm_env(0, 7, 0, "4,3");
  env["SLURM_NODEID"] = "2";
  EXPECT_ERROR(discover_rank(env), "SLURM_NODEID=2", "2 nodes");
  env["SLURM_NODEID"] = "zero";
  EXPECT_ERROR(discover_rank(env), "SLURM_NODEID", "zero");
}

TEST(LaunchEnv, bad_master_port) {
  for (const char* bad : {"0", "65536", "http", "-5"}) {
    Env env = torchrun_env(0, 2, 0, 2);
    env["MASTER_PORT"] = bad;
    EXPECT_ERROR(discover_rank(env), "MASTER_PORT", bad);
  }
}

TEST(LaunchEnv, nested_launchers_that_agree) {
  // mpirun started every process, and someone also exported matching torchrun variables.
  expect_rank(discover_rank(merged(torchrun_env(3, 4, 1, 2), openmpi_env(3, 4, 1, 2))), 3, 4, 1, 2,
              "torchrun");
  // `mpirun -np 2 torchrun --nproc-per-node=4`: mpirun rank = node index.
  expect_rank(discover_rank(merged(torchrun_env(6, 8, 2, 4), openmpi_env(1, 2, 0, 1))), 6, 8, 2, 4,
              "torchrun");
  // torchrun inside an sbatch script: Slurm's variables describe the allocation (Note
  // [Launcher precedence]) and torchrun's win without a cross-check.
  expect_rank(discover_rank(merged(torchrun_env(3, 8, 3, 8), slurm_env(0, 8, 0, "8"))), 3, 8, 3, 8,
              "torchrun");
  expect_rank(discover_rank(merged(openmpi_env(3, 4, 3, 4), slurm_env(0, 1, 0, "1"))), 3, 4, 3, 4,
              "openmpi");
}

TEST(LaunchEnv, launchers_that_disagree_are_an_error) {
  // A stale `export RANK=0 WORLD_SIZE=1` under `mpirun -np 2`.
  EXPECT_ERROR(discover_rank(merged(torchrun_env(0, 1, 0, 1), openmpi_env(1, 2, 1, 2))),
               "torchrun and openmpi variables disagree", "RANK=0 WORLD_SIZE=1",
               "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2");
  EXPECT_ERROR(discover_rank(merged(torchrun_env(1, 4, 1, 2), openmpi_env(2, 4, 0, 2))),
               "disagree");
}

TEST(LaunchEnv, reads_the_process_environment) {
  // Single-threaded here: set the variables, read them back, restore them.
  const std::vector<std::string> names = {"RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_LOCALID",
                                          "SLURM_NODEID",
                                          "SLURM_NTASKS_PER_NODE",
                                          "SLURM_TASKS_PER_NODE"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const auto& n : names) {
    const char* v = std::getenv(n.c_str());
    saved[n] = v ? std::optional<std::string>(v) : std::nullopt;
    ::unsetenv(n.c_str());
  }
  expect_rank(discover_rank(), 0, 1, 0, 1, "none");
  for (const auto& [n, v] : openmpi_env(2, 4, 0, 2))
    ::setenv(n.c_str(), v.c_str(), 1);
  ::setenv("MASTER_ADDR", "node7", 1);
  RankInfo r = discover_rank();
  for (const auto& [n, v] : saved) {
    if (v)
      ::setenv(n.c_str(), v->c_str(), 1);
    else
      ::unsetenv(n.c_str());
  }
  expect_rank(r, 2, 4, 0, 2, "openmpi");
  EXPECT_EQ(r.master_addr, "node7");
}

}  // namespace
}  // namespace accrue::dist
