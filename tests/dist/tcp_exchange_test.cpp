// The NCCL-id exchange over loopback TCP (dist/tcp_exchange.h): clients and
// server as threads of this process. exchange_messages_test.cpp covers the
// bad-message paths, exchange_processes_test.cpp real processes.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "accrue/dist/launch_env.h"
#include "accrue/dist/tcp_exchange.h"
#include "tests/dist/dist_test_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

Blob random_blob(uint32_t seed) {
  std::mt19937 gen(seed);
  Blob b;
  for (auto& x : b)
    x = static_cast<uint8_t>(gen());
  return b;
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

}  // namespace
}  // namespace accrue::dist
