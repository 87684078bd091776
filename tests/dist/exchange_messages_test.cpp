// The TCP exchange's bad-message paths (Note [Exchange protocol]): the wire
// functions on bytes, then a real BlobServer or fetch_blob facing a scripted
// peer on loopback that sends bad, truncated, oversized or no messages. Every
// case must end in an accrue::Error naming the peer, never a hang or a crash.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "accrue/dist/tcp_exchange.h"
#include "tests/dist/dist_test_util.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using namespace wire;

// A scripted peer answers at once: a client that waits longer has hung.
constexpr double kTimeout = 5.0;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- the messages as bytes ----------------------------------------------------

TEST(ExchangeMessages, hello_round_trip_and_rejects) {
  const Hello h{3, 4, 0x0123456789abcdefull};
  auto bytes = encode_hello(h);
  const auto back = parse_hello(bytes.data(), bytes.size());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 3u);
  EXPECT_EQ(back->world_size, 4u);
  EXPECT_EQ(back->fingerprint, 0x0123456789abcdefull);
  // Truncated and oversized messages are not hellos.
  EXPECT_FALSE(parse_hello(bytes.data(), bytes.size() - 1).has_value());
  std::vector<uint8_t> longer(bytes.begin(), bytes.end());
  longer.push_back(0);
  EXPECT_FALSE(parse_hello(longer.data(), longer.size()).has_value());
  // Bad magic, bad version.
  auto bad = bytes;
  bad[0] ^= 1;
  EXPECT_FALSE(parse_hello(bad.data(), bad.size()).has_value());
  bad = bytes;
  bad[4] = 2;
  EXPECT_FALSE(parse_hello(bad.data(), bad.size()).has_value());
}

TEST(ExchangeMessages, check_hellos_names_every_problem) {
  const ExchangeOptions rank0 = loopback(0, 3, 0, 0xaa);
  const std::vector<std::string> peers = {"p1", "p2"};
  const Verdict good = check_hellos({{1, 3, 0xaa}, {2, 3, 0xaa}}, peers, rank0);
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(reply_status(good, 0), kOk);
  // Oversized counts: a world size and a rank far beyond rank 0's.
  const Verdict huge = check_hellos({{0xffffffffu, 0xffffffffu, 0xaa}, {2, 3, 0xaa}}, peers, rank0);
  EXPECT_FALSE(huge.ok());
  EXPECT_EQ(huge.status[0], kWorldSizeMismatch);
  EXPECT_THAT(huge.problems, ::testing::HasSubstr("rank 4294967295 at p1 has world size "
                                                  "4294967295 but rank 0 has 3"));
  EXPECT_EQ(reply_status(huge, 0), kWorldSizeMismatch);
  EXPECT_EQ(reply_status(huge, 1), kOtherRankFailed);
  const Verdict ranks = check_hellos({{7, 3, 0xaa}, {0, 3, 0xaa}}, peers, rank0);
  EXPECT_THAT(ranks.problems, ::testing::HasSubstr("p1 claims rank 7 which is out of range"));
  EXPECT_THAT(ranks.problems, ::testing::HasSubstr("p2 claims rank 0 which is out of range"));
  const Verdict twice = check_hellos({{1, 3, 0xaa}, {1, 3, 0xaa}}, peers, rank0);
  EXPECT_THAT(twice.problems, ::testing::HasSubstr("p2 claims rank 1 which another process"));
  const Verdict layout = check_hellos({{1, 3, 0xaa}, {2, 3, 0xbb}}, peers, rank0);
  EXPECT_EQ(layout.status[1], kFingerprintMismatch);
  EXPECT_THAT(layout.problems, ::testing::HasSubstr("0x00000000000000bb, rank 0 has "
                                                    "0x00000000000000aa"));
  EXPECT_ERROR(check_hellos({{1, 3, 0xaa}}, peers, rank0), "check_hellos", "1 hellos but 2");
}

TEST(ExchangeMessages, check_reply_rejects_bad_replies) {
  const ExchangeOptions self = loopback(1, 2, 1, 0xaa);
  const ExchangeOptions rank0 = loopback(0, 2, 0, 0xbb);
  auto ok = encode_reply(kOk, rank0);
  check_reply(ok.data(), ok.size(), self, "h:1");  // no throw
  EXPECT_ERROR(check_reply(ok.data(), ok.size() - 5, self, "h:1"), "h:1", "is 19 bytes, not 24");
  auto bad = ok;
  bad[3] = 0;
  EXPECT_ERROR(check_reply(bad.data(), bad.size(), self, "h:1"), "h:1",
               "not an accrue exchange of version 1");
  auto layout = encode_reply(kFingerprintMismatch, rank0);
  EXPECT_ERROR(check_reply(layout.data(), layout.size(), self, "h:1"), "layout mismatch",
               "0x00000000000000bb", "0x00000000000000aa", "rank 1");
  auto unknown = encode_reply(static_cast<Status>(99), rank0);
  EXPECT_ERROR(check_reply(unknown.data(), unknown.size(), self, "h:1"), "h:1",
               "unknown status 99");
}

// ---- a scripted peer on loopback ----------------------------------------------

// A listening socket on 127.0.0.1 that plays rank 0: accepts one client, reads
// its hello and runs `script` on the connection, then closes it.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> script) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, script] {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;  // the client never came: its test fails
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      uint8_t hello[kHelloBytes];
      size_t got = 0;
      while (got < sizeof hello) {
        const ssize_t n = ::recv(c, hello + got, sizeof hello - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      script(c);
      ::close(c);
    });
  }
  ~FakeServer() {
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

void send_bytes(int fd, const void* data, size_t size) {
  ASSERT_EQ(::send(fd, data, size, MSG_NOSIGNAL), static_cast<ssize_t>(size));
}

TEST(ExchangeMessages, client_rejects_bad_magic) {
  FakeServer server([](int fd) {
    const char http[] = "HTTP/1.1 400 Bad Request\r\n\r\n";  // torchrun's store, say
    send_bytes(fd, http, sizeof http - 1);
  });
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  EXPECT_ERROR(fetch_blob(loopback(1, 2, server.port(), 5, kTimeout)), peer.c_str(),
               "is not an accrue exchange", "wrong port?");
}

TEST(ExchangeMessages, silent_server_times_out_naming_peer_and_timeout) {
  FakeServer server([](int) { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); });
  const std::string peer = "rank 0 at 127.0.0.1:" + std::to_string(server.port());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ERROR(fetch_blob(loopback(1, 2, server.port(), 5, 0.5)), peer.c_str(),
               "timed out waiting for the reply", "timeout 0.5 s");
  EXPECT_LT(seconds_since(start), 1.4);
}

TEST(ExchangeMessages, client_rejects_bad_reply) {
  FakeServer server([](int fd) {
    const auto reply = encode_reply(static_cast<Status>(1234), loopback(0, 2, 0, 5));
    send_bytes(fd, reply.data(), reply.size());
  });
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  EXPECT_ERROR(fetch_blob(loopback(1, 2, server.port(), 5, kTimeout)), peer.c_str(),
               "unknown status 1234");
}

TEST(ExchangeMessages, client_reports_truncated_reply_and_blob) {
  {
    FakeServer server([](int fd) {
      const auto reply = encode_reply(kOk, loopback(0, 2, 0, 5));
      send_bytes(fd, reply.data(), 10);  // then closes
    });
    const std::string peer = "rank 0 at 127.0.0.1:" + std::to_string(server.port());
    EXPECT_ERROR(fetch_blob(loopback(1, 2, server.port(), 5, kTimeout)), peer.c_str(),
                 "closed the connection while waiting for the reply");
  }
  {
    FakeServer server([](int fd) {
      const auto reply = encode_reply(kOk, loopback(0, 2, 0, 5));
      send_bytes(fd, reply.data(), reply.size());
      const Blob half{};
      send_bytes(fd, half.data(), half.size() / 2);
    });
    const std::string peer = "rank 0 at 127.0.0.1:" + std::to_string(server.port());
    EXPECT_ERROR(fetch_blob(loopback(1, 2, server.port(), 5, kTimeout)), peer.c_str(),
                 "closed the connection while receiving the blob");
  }
}

TEST(ExchangeMessages, client_takes_only_its_bytes_from_an_oversized_reply) {
  Blob blob;
  for (size_t i = 0; i < blob.size(); ++i)
    blob[i] = static_cast<uint8_t>(3 * i + 1);
  FakeServer server([&](int fd) {
    const auto reply = encode_reply(kOk, loopback(0, 2, 0, 5));
    send_bytes(fd, reply.data(), reply.size());
    send_bytes(fd, blob.data(), blob.size());
    const std::vector<uint8_t> extra(4096, 0xff);  // no length field: trailing bytes stay unread
    send_bytes(fd, extra.data(), extra.size());
  });
  EXPECT_EQ(fetch_blob(loopback(1, 2, server.port(), 5, kTimeout)), blob);
}

TEST(ExchangeMessages, client_reports_fingerprint_mismatch) {
  FakeServer server([](int fd) {
    const auto reply = encode_reply(kFingerprintMismatch, loopback(0, 2, 0, 0x77));
    send_bytes(fd, reply.data(), reply.size());
  });
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  EXPECT_ERROR(fetch_blob(loopback(1, 2, server.port(), 0x66, kTimeout)), peer.c_str(),
               "layout mismatch", "0x0000000000000077", "0x0000000000000066");
}

// ---- a scripted client against a real BlobServer ------------------------------

// Connects to 127.0.0.1:port, sends `bytes` and keeps the connection open for
// `hold`; returns what the server answered (empty if it closed without one).
std::vector<uint8_t> raw_client(int port, const std::vector<uint8_t>& bytes,
                                std::chrono::milliseconds hold) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::vector<uint8_t> answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    if (!bytes.empty()) ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    const auto end = std::chrono::steady_clock::now() + hold;
    uint8_t buf[512];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      answer.insert(answer.end(), buf, buf + n);
    }
  }
  ::close(fd);
  return answer;
}

// Serves a world of 2 with a short timeout while `client` runs; the server's error.
std::string serve_against(const std::function<void(int port)>& client, double timeout_s = 1.0) {
  BlobServer server(loopback(0, 2, 0, 0xaa, timeout_s));
  std::string error;
  std::thread serving([&] {
    try {
      server.serve(Blob{});
    } catch (const Error& e) {
      error = e.what();
    }
  });
  client(server.port());
  serving.join();
  return error;
}

std::vector<uint8_t> hello_bytes(Hello h) {
  const auto b = encode_hello(h);
  return {b.begin(), b.end()};
}

TEST(ExchangeMessages, server_drops_bad_magic_truncated_and_silent_peers) {
  // None of these is a rank: rank 0 drops each and times out naming the port,
  // its timeout and that no rank came, rather than answering or hanging.
  std::vector<uint8_t> bad_magic = hello_bytes({1, 2, 0xaa});
  bad_magic[1] ^= 0x40;
  std::vector<uint8_t> truncated = hello_bytes({1, 2, 0xaa});
  truncated.resize(kHelloBytes - 4);
  for (const auto& bytes : {bad_magic, truncated, std::vector<uint8_t>{}}) {
    std::vector<uint8_t> answer;
    const auto start = std::chrono::steady_clock::now();
    const std::string error = serve_against(
        [&](int port) { answer = raw_client(port, bytes, std::chrono::milliseconds(1500)); });
    EXPECT_THAT(error, ::testing::HasSubstr("waited 1 s on port"));
    EXPECT_THAT(error, ::testing::HasSubstr("only 0 connected (ranks: none)"));
    EXPECT_TRUE(answer.empty()) << answer.size() << " bytes answered to a stray peer";
    EXPECT_LT(seconds_since(start), 4.0);
  }
}

TEST(ExchangeMessages, server_rejects_oversized_rank_and_world_size) {
  std::vector<uint8_t> answer;
  const std::string error = serve_against([&](int port) {
    answer = raw_client(port, hello_bytes({0xffffffffu, 0xffffffffu, 0xaa}),
                        std::chrono::milliseconds(3000));
  });
  EXPECT_THAT(error, ::testing::HasSubstr("do not form one job"));
  EXPECT_THAT(error, ::testing::HasSubstr("world size 4294967295 but rank 0 has 2"));
  ASSERT_EQ(answer.size(), kReplyBytes);  // the verdict, without the blob
  EXPECT_ERROR(check_reply(answer.data(), answer.size(), loopback(1, 2, 1, 0xaa), "r0"),
               "world size mismatch", "r0");
}

TEST(ExchangeMessages, server_rejects_fingerprint_mismatch) {
  std::vector<uint8_t> answer;
  const std::string error = serve_against([&](int port) {
    answer = raw_client(port, hello_bytes({1, 2, 0xbb}), std::chrono::milliseconds(3000));
  });
  EXPECT_THAT(error, ::testing::HasSubstr("fingerprint 0x00000000000000bb, rank 0 has "
                                          "0x00000000000000aa"));
  ASSERT_EQ(answer.size(), kReplyBytes);
  EXPECT_ERROR(check_reply(answer.data(), answer.size(), loopback(1, 2, 1, 0xbb), "r0"),
               "layout mismatch", "0x00000000000000aa", "0x00000000000000bb");
}

}  // namespace
}  // namespace accrue::dist
