// dist/ without a GPU: rank discovery from each launcher's variables (and
// every way they can be wrong), the NCCL-id exchange over loopback TCP, bucket
// plans over GPT-2-sized and small arenas, and the world-size-1 communicator.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <optional>
#include <random>
#include <thread>

#include "autograd/grad_arena.h"
#include "autograd/variable.h"
#include "dist/bucket_plan.h"
#include "dist/launch_env.h"
#include "dist/process_group.h"
#include "dist/tcp_exchange.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using Env = std::map<std::string, std::string>;

// ---- rank discovery ---------------------------------------------------------

Env torchrun_env(int rank, int world, int local, int local_world) {
  return {{"RANK", std::to_string(rank)},        {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local)}, {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"MASTER_ADDR", "10.1.2.3"},           {"MASTER_PORT", "29500"}};
}

Env openmpi_env(int rank, int world, int local, int local_world) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(world)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_world)}};
}

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

// ---- TCP exchange -----------------------------------------------------------

Blob random_blob(uint32_t seed) {
  std::mt19937 gen(seed);
  Blob b;
  for (auto& x : b)
    x = static_cast<uint8_t>(gen());
  return b;
}

ExchangeOptions loopback(int rank, int world, int port, uint64_t fingerprint,
                         double timeout_s = 20.0) {
  ExchangeOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = world;
  o.fingerprint = fingerprint;
  o.timeout_s = timeout_s;
  return o;
}

// What one client thread got: its blob or its error message.
struct ClientResult {
  Blob blob{};
  std::string error;
};

std::vector<ClientResult> run_clients(const std::vector<ExchangeOptions>& options) {
  std::vector<ClientResult> results(options.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < options.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        results[i].blob = fetch_blob(options[i]);
      } catch (const Error& e) {
        results[i].error = e.what();
      }
    });
  for (auto& t : threads)
    t.join();
  return results;
}

// A port nothing listens on: bind an ephemeral one and close it.
int unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(TcpExchange, every_client_receives_rank0_blob) {
  const uint64_t fp = 0x1234abcd5678ef00ull;
  const Blob blob = random_blob(7);
  BlobServer server(loopback(0, 4, 0, fp));
  ASSERT_GT(server.port(), 0);
  std::string server_error;
  std::thread serving([&] {
    try {
      server.serve(blob);
    } catch (const Error& e) {
      server_error = e.what();
    }
  });
  auto results = run_clients({loopback(1, 4, server.port(), fp), loopback(2, 4, server.port(), fp),
                              loopback(3, 4, server.port(), fp)});
  serving.join();
  EXPECT_EQ(server_error, "");
  for (const auto& r : results) {
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.blob, blob);
  }
}

TEST(TcpExchange, clients_may_start_before_the_server) {
  const int port = unused_port();
  const Blob blob = random_blob(11);
  std::vector<ClientResult> results;
  std::thread clients([&] { results = run_clients({loopback(1, 2, port, 5)}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the client retries meanwhile
  EXPECT_EQ(serve_blob(loopback(0, 2, port, 5), blob), blob);
  clients.join();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].error, "");
  EXPECT_EQ(results[0].blob, blob);
}

TEST(TcpExchange, client_times_out_when_nobody_listens) {
  const int port = unused_port();
  const auto start = std::chrono::steady_clock::now();
  const std::string peer = "127.0.0.1:" + std::to_string(port);
  EXPECT_ERROR(fetch_blob(loopback(1, 2, port, 0, 1.0)), peer.c_str(), "could not connect",
               "rank 1");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 0.9);
  EXPECT_LT(seconds, 3.0);
}

TEST(TcpExchange, server_times_out_naming_missing_ranks) {
  BlobServer server(loopback(0, 3, 0, 1, 1.5));
  std::string server_error;
  std::thread serving([&] {
    try {
      server.serve(random_blob(3));
    } catch (const Error& e) {
      server_error = e.what();
    }
  });
  auto results = run_clients({loopback(2, 3, server.port(), 1, 5.0)});
  serving.join();
  EXPECT_THAT(server_error, ::testing::HasSubstr("only 1 connected (ranks: 2)"));
  EXPECT_THAT(server_error, ::testing::HasSubstr(std::to_string(server.port())));
  // The client learns that rank 0 gave up (its connection closes) rather than hanging.
  EXPECT_THAT(results[0].error, ::testing::HasSubstr("closed the connection"));
}

TEST(TcpExchange, fingerprint_mismatch_fails_every_rank_naming_both_values) {
  const uint64_t good = 0x00000000000000aaull, bad = 0x00000000000000bbull;
  BlobServer server(loopback(0, 3, 0, good));
  std::string server_error;
  std::thread serving([&] {
    try {
      server.serve(random_blob(1));
    } catch (const Error& e) {
      server_error = e.what();
    }
  });
  auto results =
      run_clients({loopback(1, 3, server.port(), good), loopback(2, 3, server.port(), bad)});
  serving.join();
  for (const std::string& msg : {server_error, results[1].error}) {
    EXPECT_THAT(msg, ::testing::HasSubstr("0x00000000000000aa"));
    EXPECT_THAT(msg, ::testing::HasSubstr("0x00000000000000bb"));
    EXPECT_THAT(msg, ::testing::HasSubstr("layout"));
  }
  EXPECT_THAT(server_error, ::testing::HasSubstr("rank 2"));
  EXPECT_THAT(results[1].error, ::testing::HasSubstr("rank 2"));
  // Rank 1 matched, but the job cannot start: it is told so instead of hanging in NCCL init.
  EXPECT_THAT(results[0].error, ::testing::HasSubstr("another rank does not match"));
}

TEST(TcpExchange, world_size_and_rank_mismatches) {
  {
    BlobServer server(loopback(0, 2, 0, 9));
    std::string server_error;
    std::thread serving([&] {
      try {
        server.serve(random_blob(2));
      } catch (const Error& e) {
        server_error = e.what();
      }
    });
    auto results = run_clients({loopback(1, 3, server.port(), 9)});
    serving.join();
    EXPECT_THAT(server_error, ::testing::HasSubstr("world size 3 but rank 0 has 2"));
    EXPECT_THAT(results[0].error, ::testing::HasSubstr("world size mismatch"));
    EXPECT_THAT(results[0].error, ::testing::HasSubstr("rank 0 at 127.0.0.1"));
  }
  {
    BlobServer server(loopback(0, 3, 0, 9));
    std::string server_error;
    std::thread serving([&] {
      try {
        server.serve(random_blob(2));
      } catch (const Error& e) {
        server_error = e.what();
      }
    });
    auto results =
        run_clients({loopback(1, 3, server.port(), 9), loopback(1, 3, server.port(), 9)});
    serving.join();
    EXPECT_THAT(server_error, ::testing::HasSubstr("claims rank 1"));
    EXPECT_EQ(results[0].error.empty() + results[1].error.empty(), 0);
  }
}

TEST(TcpExchange, options_from_launcher_variables) {
  RankInfo info = discover_rank(torchrun_env(1, 2, 1, 2));
  ExchangeOptions o = exchange_options(info, 42);
  EXPECT_EQ(o.host, "10.1.2.3");
  EXPECT_EQ(o.port, 29501);  // MASTER_PORT + 1: MASTER_PORT is torchrun's store
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.fingerprint, 42u);
  EXPECT_EQ(exchange_options(info, 42, 31000).port, 31000);

  RankInfo no_addr = discover_rank(openmpi_env(1, 2, 1, 2));
  EXPECT_ERROR(exchange_options(no_addr, 42), "MASTER_ADDR is not set", "rank 1 of 2");
  no_addr.master_addr = "node0";
  EXPECT_ERROR(exchange_options(no_addr, 42), "MASTER_PORT is not set");
  EXPECT_EQ(exchange_options(no_addr, 42, 31000).port, 31000);
  // A single process needs neither.
  EXPECT_NO_THROW(exchange_options(discover_rank(Env{}), 42));
  EXPECT_EQ(serve_blob(exchange_options(discover_rank(Env{}), 42), random_blob(4)), random_blob(4));
}

TEST(TcpExchange, bad_options) {
  EXPECT_ERROR(fetch_blob(loopback(0, 2, 1234, 0)), "rank 0 serves");
  EXPECT_ERROR(fetch_blob(loopback(2, 2, 1234, 0)), "rank 2", "world size 2");
  EXPECT_ERROR(fetch_blob(loopback(1, 2, 0, 0)), "port 0");
  EXPECT_ERROR(fetch_blob(loopback(1, 2, 1234, 0, 0.0)), "timeout");
  EXPECT_ERROR(BlobServer(loopback(1, 2, 0, 0)), "only rank 0 serves");
  ExchangeOptions o = loopback(1, 2, 1234, 0);
  o.host = "no-such-host.invalid";
  EXPECT_ERROR(fetch_blob(o), "cannot resolve", "no-such-host.invalid:1234");
}

// ---- bucket plans -----------------------------------------------------------

// Slots laid out as GradArena lays them out: 256-byte aligned, registration order.
struct Layout {
  std::vector<GradArena::Slot> slots;
  int64_t padded_numel = 0;
};

Layout layout(const std::vector<std::pair<std::string, Shape>>& params, size_t element_size = 4) {
  const int64_t per = static_cast<int64_t>(256 / element_size);
  Layout l;
  for (const auto& [name, shape] : params) {
    GradArena::Slot s{name, shape, l.padded_numel, shape_numel(shape)};
    l.padded_numel += (s.numel + per - 1) / per * per;
    l.slots.push_back(s);
  }
  return l;
}

// GPT-2 small (124M) in Hugging Face registration order.
Layout gpt2_layout() {
  const int64_t d = 768;
  std::vector<std::pair<std::string, Shape>> p = {{"wte", {50257, d}}, {"wpe", {1024, d}}};
  for (int i = 0; i < 12; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    p.push_back({h + "ln_1.weight", {d}});
    p.push_back({h + "ln_1.bias", {d}});
    p.push_back({h + "attn.c_attn.weight", {d, 3 * d}});
    p.push_back({h + "attn.c_attn.bias", {3 * d}});
    p.push_back({h + "attn.c_proj.weight", {d, d}});
    p.push_back({h + "attn.c_proj.bias", {d}});
    p.push_back({h + "ln_2.weight", {d}});
    p.push_back({h + "ln_2.bias", {d}});
    p.push_back({h + "mlp.c_fc.weight", {d, 4 * d}});
    p.push_back({h + "mlp.c_fc.bias", {4 * d}});
    p.push_back({h + "mlp.c_proj.weight", {4 * d, d}});
    p.push_back({h + "mlp.c_proj.bias", {d}});
  }
  p.push_back({"ln_f.weight", {d}});
  p.push_back({"ln_f.bias", {d}});
  return layout(p);
}

// Every invariant of Note [Buckets], for any plan.
void expect_plan_invariants(const BucketPlan& plan, const Layout& l, size_t es,
                            const BucketPlanOptions& opt) {
  const auto& buckets = plan.buckets();
  ASSERT_FALSE(buckets.empty());
  // Ranges tile [0, padded_numel) exactly, bucket 0 at the top.
  EXPECT_EQ(buckets.front().offset + buckets.front().numel, l.padded_numel);
  EXPECT_EQ(buckets.back().offset, 0);
  for (size_t b = 0; b + 1 < buckets.size(); ++b)
    EXPECT_EQ(buckets[b + 1].offset + buckets[b + 1].numel, buckets[b].offset) << "bucket " << b;
  // Reverse registration order, every slot exactly once, consecutive slots.
  size_t expected_slot = l.slots.size();
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_EQ(buckets[b].num_params(), static_cast<int64_t>(buckets[b].slots.size()));
    for (size_t s : buckets[b].slots) {
      ASSERT_EQ(s, --expected_slot) << "bucket " << b;
      EXPECT_EQ(plan.bucket_of(s), b);
      // Never split: the whole slot lies inside the bucket's range.
      EXPECT_GE(l.slots[s].offset, buckets[b].offset);
      EXPECT_LE(l.slots[s].offset + l.slots[s].numel, buckets[b].offset + buckets[b].numel);
    }
    // The range starts at its lowest slot (zero-copy: no copy needed to gather it).
    EXPECT_EQ(buckets[b].offset, l.slots[buckets[b].slots.back()].offset);
    // 256-byte boundaries.
    EXPECT_EQ(buckets[b].offset * static_cast<int64_t>(es) % 256, 0);
    EXPECT_EQ(buckets[b].numel * static_cast<int64_t>(es) % 256, 0);
  }
  EXPECT_EQ(expected_slot, 0u);
  // Size limits: over the limit only alone; closed only when full or the next slot did not fit.
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t limit = b == 0 ? opt.first_bucket_bytes : opt.bucket_bytes;
    const int64_t bytes = buckets[b].numel * static_cast<int64_t>(es);
    if (bytes > limit) {
      EXPECT_EQ(buckets[b].num_params(), 1) << "bucket " << b;
    }
    if (b + 1 < buckets.size() && bytes < limit) {
      const size_t next = buckets[b + 1].slots.front();
      const int64_t next_end =
          next + 1 < l.slots.size() ? l.slots[next + 1].offset : l.padded_numel;
      EXPECT_GT(bytes + (next_end - l.slots[next].offset) * static_cast<int64_t>(es), limit)
          << "bucket " << b << " closed early";
    }
  }
}

TEST(BucketPlan, gpt2_buckets_in_backward_order) {
  const Layout l = gpt2_layout();
  int64_t total = 0;
  for (const auto& s : l.slots)
    total += s.numel;
  ASSERT_EQ(total, 124439808);  // GPT-2 small
  const BucketPlanOptions opt;  // 1 MiB, then 25 MiB
  const BucketPlan plan(l.slots, l.padded_numel, 4, opt);
  expect_plan_invariants(plan, l, 4, opt);

  // The first bucket is small and holds the last-registered parameters:
  // ln_f.bias, ln_f.weight, h.11.mlp.c_proj.bias (the 9 MiB c_proj.weight does not fit).
  const size_t n = l.slots.size();
  EXPECT_LE(plan[0].numel * 4, opt.first_bucket_bytes);
  EXPECT_EQ(plan[0].slots, (std::vector<size_t>{n - 1, n - 2, n - 3}));
  // wte (50257 x 768 fp32 = 147 MiB) is larger than a bucket: it gets its own, the last one.
  EXPECT_EQ(plan.buckets().back().slots, std::vector<size_t>{0});
  EXPECT_EQ(plan.bucket_of(0), plan.size() - 1);
  for (size_t b = 1; b + 1 < plan.size(); ++b)
    EXPECT_LE(plan[b].numel * 4, opt.bucket_bytes);
  // ~474 MiB in ~25 MiB buckets.
  EXPECT_GE(plan.size(), 15u);
  EXPECT_LE(plan.size(), 30u);
}

TEST(BucketPlan, gpt2_with_other_bucket_sizes) {
  const Layout l = gpt2_layout();
  for (int64_t first : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24})
    for (int64_t rest : {int64_t{1} << 20, int64_t{25} << 20, int64_t{256} << 20}) {
      const BucketPlanOptions opt{first, rest};
      expect_plan_invariants(BucketPlan(l.slots, l.padded_numel, 4, opt), l, 4, opt);
    }
}

TEST(BucketPlan, small_slots_exact_plan) {
  // f32: 64 elements per 256 bytes. Padded sizes: 64, 320, 64, 64, 1024, 128.
  const Layout l =
      layout({{"a", {10}}, {"b", {300}}, {"c", {5}}, {"d", {8, 8}}, {"e", {1000}}, {"f", {2, 50}}});
  const BucketPlanOptions opt{512, 1024};  // first 128 elements, then 256
  const BucketPlan plan(l.slots, l.padded_numel, 4, opt);
  expect_plan_invariants(plan, l, 4, opt);
  // f (128 elems) fills the first bucket; e (1024) alone; d + c (128) then b (320) does
  // not fit: bucket [d, c]; b alone (over the limit); a.
  ASSERT_EQ(plan.size(), 5u);
  EXPECT_EQ(plan[0].slots, std::vector<size_t>{5});
  EXPECT_EQ(plan[1].slots, std::vector<size_t>{4});
  EXPECT_EQ(plan[2].slots, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(plan[3].slots, std::vector<size_t>{1});
  EXPECT_EQ(plan[4].slots, std::vector<size_t>{0});
  EXPECT_EQ(plan[2].offset, 384);
  EXPECT_EQ(plan[2].numel, 128);
  EXPECT_THAT(plan.describe(), ::testing::HasSubstr("bucket 2: [384, 512) 2 params"));

  // Huge limits: one bucket with everything; the first bucket limit applies to it.
  const BucketPlan one(l.slots, l.padded_numel, 4, {1 << 30, 1 << 30});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].offset, 0);
  EXPECT_EQ(one[0].numel, l.padded_numel);
  EXPECT_EQ(one[0].num_params(), 6);

  // f64 (32 elements per 256 bytes) and a single slot.
  const Layout d = layout({{"w", {33}}}, 8);
  const BucketPlan single(d.slots, d.padded_numel, 8, {8, 8});
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].numel, 64);
}

TEST(BucketPlan, views_are_zero_copy_slices_of_a_real_arena) {
  std::vector<Tensor> params;
  for (const Shape& s : std::vector<Shape>{{7, 3}, {100}, {5}, {16, 16}, {3}})
    params.push_back(requires_grad_(test::random_normal(s)));
  GradArena arena(params, {}, {Device::cpu(), DType::f32, DType::f32, 0});
  const BucketPlanOptions opt{256, 1024};
  const BucketPlan plan(arena, opt);
  Layout l{arena.slots(), arena.padded_numel()};
  expect_plan_invariants(plan, l, 4, opt);
  EXPECT_EQ(plan.padded_numel(), arena.padded_numel());

  int64_t covered = 0;
  for (size_t b = 0; b < plan.size(); ++b) {
    Tensor v = plan.view(arena.grads(), b);
    EXPECT_EQ(v.data_ptr(), static_cast<void*>(arena.grads().data<float>() + plan[b].offset));
    EXPECT_EQ(v.numel(), plan[b].numel);
    covered += v.numel();
  }
  EXPECT_EQ(covered, arena.padded_numel());
  // Writing through a bucket view is writing the parameter's gradient slot.
  const size_t slot = 3;
  Tensor fresh = test::random_normal({16 * 16});
  plan.view(arena.grads(), plan.bucket_of(slot))
      .narrow(0, arena.slots()[slot].offset - plan[plan.bucket_of(slot)].offset, 256)
      .copy_(fresh);
  EXPECT_TRUE(test::all_equal(arena.grad_view(slot).reshape({256}), fresh));

  const std::string size = std::to_string(arena.padded_numel()) + " elements";
  EXPECT_ERROR(plan.view(zeros({arena.padded_numel() + 1}), 0), "BucketPlan::view", size.c_str());
  EXPECT_ERROR(plan.view(zeros({arena.padded_numel()}, DType::f64), 0), "4-byte", "f64");
  EXPECT_ERROR(plan.view(arena.grads(), plan.size()), "bucket", "out of range");
  EXPECT_ERROR(plan.bucket_of(5), "slot 5");
}

TEST(BucketPlan, bad_layouts_and_options) {
  const Layout l = layout({{"a", {10}}, {"b", {20}}});
  EXPECT_ERROR(BucketPlan({}, 0, 4), "no slots");
  EXPECT_ERROR(BucketPlan(l.slots, l.padded_numel, 4, {0, 1024}), "first_bucket_bytes=0");
  EXPECT_ERROR(BucketPlan(l.slots, l.padded_numel, 4, {1024, -1}), "bucket_bytes=-1");
  Layout overlap = l;
  overlap.slots[1].offset = 5;
  EXPECT_ERROR(BucketPlan(overlap.slots, overlap.padded_numel, 4), "slot 0 (a)", "overlaps");
  EXPECT_ERROR(BucketPlan(l.slots, 64, 4), "slot 1 (b)", "arena end 64");
  Layout shifted = l;
  shifted.slots[0].offset = 64;
  EXPECT_ERROR(BucketPlan(shifted.slots, shifted.padded_numel, 4), "slot 0 (a) starts at 64");
}

TEST(LayoutFingerprint, same_layout_same_value_any_difference_changes_it) {
  const Layout a = gpt2_layout();
  const uint64_t fp = layout_fingerprint(a.slots, DType::f32);
  EXPECT_EQ(layout_fingerprint(gpt2_layout().slots, DType::f32), fp);
  EXPECT_NE(layout_fingerprint(a.slots, DType::f64), fp);

  Layout renamed = a;
  renamed.slots[5].name = "h.0.attn.c_attn.weight_";
  EXPECT_NE(layout_fingerprint(renamed.slots, DType::f32), fp);
  Layout reshaped = a;
  reshaped.slots[2].shape = {1, 768};  // same numel, different shape
  EXPECT_NE(layout_fingerprint(reshaped.slots, DType::f32), fp);
  Layout swapped = a;
  std::swap(swapped.slots[3].name, swapped.slots[4].name);
  EXPECT_NE(layout_fingerprint(swapped.slots, DType::f32), fp);
  Layout fewer = a;
  fewer.slots.pop_back();
  EXPECT_NE(layout_fingerprint(fewer.slots, DType::f32), fp);

  // From a real arena: it hashes what the arena registered.
  std::vector<Tensor> params{requires_grad_(test::random_normal({4, 3})),
                             requires_grad_(test::random_normal({5}))};
  GradArena arena(params, {"w", "b"}, {Device::cpu(), DType::f32, DType::f32, 0});
  const Layout same = layout({{"w", {4, 3}}, {"b", {5}}});
  EXPECT_EQ(layout_fingerprint(arena), layout_fingerprint(same.slots, DType::f32));
}

// ---- the world-size-1 communicator -----------------------------------------

TEST(StubCommunicator, collectives_are_the_identity) {
  StubCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.device(), Device::cpu());
  EXPECT_EQ(comm.stream(), nullptr);

  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    Tensor data = test::random_integers({37}, -9, 9, dt == DType::i64 ? DType::f32 : dt).to(dt);
    Tensor before = data.clone();
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      comm.all_reduce(data, op);
      EXPECT_TRUE(test::all_equal(data, before)) << dtype_name(dt) << " " << reduce_op_name(op);
    }
    comm.broadcast(data, 0);
    EXPECT_TRUE(test::all_equal(data, before));
  }

  Tensor input = test::random_normal({64});
  Tensor output = test::random_normal({8, 8});
  comm.reduce_scatter(input, output);
  EXPECT_TRUE(test::all_equal(output.reshape({64}), input));
  Tensor gathered = test::random_normal({64});
  comm.all_gather(input, gathered);
  EXPECT_TRUE(test::all_equal(gathered, input));
  // In place (the ZeRO-1 forms): output is input's own chunk.
  Tensor before = input.clone();
  comm.reduce_scatter(input, input);
  comm.all_gather(input, input);
  EXPECT_TRUE(test::all_equal(input, before));
  comm.synchronize();
  comm.check();
}

TEST(StubCommunicator, bad_tensors_are_errors) {
  StubCommunicator comm;
  Tensor t = test::random_normal({4, 6});
  EXPECT_ERROR(comm.all_reduce(t.transpose(0, 1)), "all_reduce", "data", "[6, 4]", "contiguous");
  EXPECT_ERROR(comm.all_reduce(Tensor()), "all_reduce", "undefined");
  EXPECT_ERROR(comm.broadcast(t, 1), "broadcast", "root 1");
  EXPECT_ERROR(comm.reduce_scatter(t, test::random_normal({5})), "reduce_scatter", "24", "5");
  EXPECT_ERROR(comm.all_gather(t, t.to(DType::f64)), "all_gather", "f32", "f64");
  StubCommunicator gpu(Device::cuda(0));
  EXPECT_ERROR(gpu.all_reduce(t), "all_reduce", "cpu", "cuda:0");
}

}  // namespace
}  // namespace accrue::dist
