#include "accrue/dist/tcp_exchange.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "accrue/core/error.h"

namespace accrue::dist {

namespace {

using Clock = std::chrono::steady_clock;
// Note [Exchange protocol]: the wire format is in tcp_exchange.h (namespace wire).
using namespace wire;

// How long a connected peer may take to send its hello: a stray connection
// (a port scanner, a previous job) must not block the exchange.
constexpr auto kHelloLimit = std::chrono::seconds(10);

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// A file descriptor closed on scope exit: no error path leaks a socket.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits until `fd` is ready for `events`; false when the deadline passed first.
bool wait_ready(int fd, short events, Clock::time_point deadline, const std::string& peer,
                const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;  // ready, or an error/hangup the next call reports
    if (n == 0) return false;
    ACCRUE_CHECK(errno == EINTR, "tcp exchange with ", peer, ": poll while ", what,
                 " failed: ", errno_text(errno));
  }
}

void send_all(int fd, const uint8_t* data, size_t size, Clock::time_point deadline,
              const std::string& peer, const char* what) {
  size_t done = 0;
  while (done < size) {
    ACCRUE_CHECK(wait_ready(fd, POLLOUT, deadline, peer, what), "tcp exchange with ", peer,
                 ": timed out ", what);
    // MSG_NOSIGNAL: a peer that died must give an error here, not SIGPIPE.
    const ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    ACCRUE_CHECK(n > 0, "tcp exchange with ", peer, ": ", what, " failed: ", errno_text(errno));
    done += static_cast<size_t>(n);
  }
}

void recv_all(int fd, uint8_t* data, size_t size, Clock::time_point deadline,
              const std::string& peer, const char* what) {
  size_t done = 0;
  while (done < size) {
    ACCRUE_CHECK(wait_ready(fd, POLLIN, deadline, peer, what), "tcp exchange with ", peer,
                 ": timed out ", what);
    const ssize_t n = ::recv(fd, data + done, size - done, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    ACCRUE_CHECK(n != 0, "tcp exchange with ", peer, ": the peer closed the connection while ",
                 what, " (it failed or timed out: see its error)");
    ACCRUE_CHECK(n > 0, "tcp exchange with ", peer, ": ", what, " failed: ", errno_text(errno));
    done += static_cast<size_t>(n);
  }
}

std::string address_text(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(addr, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return std::string(host) + ":" + port;
}

void check_options(const ExchangeOptions& o, const char* op) {
  ACCRUE_CHECK(o.world_size >= 1, op, ": world size ", o.world_size, " must be at least 1");
  ACCRUE_CHECK(o.rank >= 0 && o.rank < o.world_size, op, ": rank ", o.rank,
               " is not in [0, world size ", o.world_size, ")");
  ACCRUE_CHECK(o.port >= 0 && o.port <= 65535, op, ": port ", o.port, " is not in 0..65535");
  ACCRUE_CHECK(o.timeout_s > 0, op, ": timeout ", o.timeout_s, " s must be positive");
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// One connected client on rank 0's side.
struct Client {
  Fd fd;
  std::string peer;  // "ip:port"
  Hello hello;
};

// Dual-stack IPv6 when the host has it (a MASTER_ADDR may resolve to either
// family), else plain IPv4.
Fd listen_on(int port, int backlog, int* bound_port) {
  for (int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) continue;
    int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in);
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      const int err = errno;
      if (family == AF_INET6 && (err == EAFNOSUPPORT || err == EADDRNOTAVAIL)) continue;
      ACCRUE_FAIL("tcp exchange: rank 0 cannot listen on port ", port,
                  ": bind failed: ", errno_text(err),
                  " (another job on this port? pass another exchange port)");
    }
    ACCRUE_CHECK(::listen(fd.get(), backlog) == 0, "tcp exchange: listen on port ", port,
                 " failed: ", errno_text(errno));
    ACCRUE_CHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0,
                 "tcp exchange: getsockname on port ", port, " failed: ", errno_text(errno));
    *bound_port =
        ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return fd;
  }
  ACCRUE_FAIL("tcp exchange: rank 0 cannot create a socket for port ", port, ": ",
              errno_text(errno));
}

// Reads one hello; false (connection dropped) when it is not one of ours.
bool read_hello(Client& c, Clock::time_point deadline) {
  uint8_t buf[kHelloBytes];
  try {
    recv_all(c.fd.get(), buf, sizeof buf, std::min(deadline, Clock::now() + kHelloLimit), c.peer,
             "receiving its hello");
  } catch (const Error&) {
    return false;  // a stray or dying connection: the real rank retries or times out
  }
  const std::optional<Hello> hello = parse_hello(buf, sizeof buf);
  if (!hello) return false;
  c.hello = *hello;
  return true;
}

}  // namespace

namespace wire {

std::array<uint8_t, kHelloBytes> encode_hello(const Hello& hello) {
  std::array<uint8_t, kHelloBytes> b{};
  put_u32(b.data(), kMagic);
  put_u32(b.data() + 4, kVersion);
  put_u32(b.data() + 8, hello.rank);
  put_u32(b.data() + 12, hello.world_size);
  put_u64(b.data() + 16, hello.fingerprint);
  return b;
}

std::optional<Hello> parse_hello(const uint8_t* data, size_t size) {
  if (size != kHelloBytes || get_u32(data) != kMagic || get_u32(data + 4) != kVersion)
    return std::nullopt;
  return Hello{get_u32(data + 8), get_u32(data + 12), get_u64(data + 16)};
}

Verdict check_hellos(const std::vector<Hello>& hellos, const std::vector<std::string>& peers,
                     const ExchangeOptions& rank0) {
  check_options(rank0, "tcp exchange: check_hellos");
  ACCRUE_CHECK(peers.size() == hellos.size(), "tcp exchange: check_hellos: ", hellos.size(),
               " hellos but ", peers.size(), " peer names");
  Verdict v;
  v.status.assign(hellos.size(), kOk);
  std::vector<int> owner(rank0.world_size, -1);
  for (size_t i = 0; i < hellos.size(); ++i) {
    const Hello& c = hellos[i];
    const std::string& peer = peers[i];
    if (c.world_size != static_cast<uint32_t>(rank0.world_size)) {
      v.status[i] = kWorldSizeMismatch;
      v.problems += detail::str_cat("; rank ", c.rank, " at ", peer, " has world size ",
                                    c.world_size, " but rank 0 has ", rank0.world_size);
    } else if (c.rank == 0 || c.rank >= c.world_size || owner[c.rank] >= 0) {
      v.status[i] = kBadRank;
      v.problems += detail::str_cat("; ", peer, " claims rank ", c.rank,
                                    c.rank == 0 || c.rank >= c.world_size
                                        ? " which is out of range"
                                        : " which another process also claims");
    } else if (c.fingerprint != rank0.fingerprint) {
      v.status[i] = kFingerprintMismatch;
      v.problems += detail::str_cat(
          "; rank ", c.rank, " at ", peer, " registered a different parameter layout (fingerprint ",
          hex(c.fingerprint), ", rank 0 has ", hex(rank0.fingerprint), ")");
    }
    if (v.status[i] != kBadRank && c.rank < owner.size()) owner[c.rank] = static_cast<int>(i);
  }
  return v;
}

Status reply_status(const Verdict& verdict, size_t i) {
  return verdict.ok() ? kOk : verdict.status.at(i) != kOk ? verdict.status[i] : kOtherRankFailed;
}

std::array<uint8_t, kReplyBytes> encode_reply(Status status, const ExchangeOptions& rank0) {
  std::array<uint8_t, kReplyBytes> b{};
  put_u32(b.data(), kMagic);
  put_u32(b.data() + 4, kVersion);
  put_u32(b.data() + 8, status);
  put_u32(b.data() + 12, static_cast<uint32_t>(rank0.world_size));
  put_u64(b.data() + 16, rank0.fingerprint);
  return b;
}

void check_reply(const uint8_t* data, size_t size, const ExchangeOptions& o,
                 const std::string& peer) {
  ACCRUE_CHECK(size == kReplyBytes, "fetch_blob: the reply of rank 0 at ", peer, " is ", size,
               " bytes, not ", kReplyBytes);
  ACCRUE_CHECK(get_u32(data) == kMagic && get_u32(data + 4) == kVersion, "fetch_blob: ", peer,
               " is not an accrue exchange of version ", kVersion,
               " (wrong port? torchrun's store is on MASTER_PORT itself)");
  const uint32_t status = get_u32(data + 8);
  const uint32_t world = get_u32(data + 12);
  const uint64_t fingerprint = get_u64(data + 16);
  ACCRUE_CHECK(status != kWorldSizeMismatch, "fetch_blob: world size mismatch: rank 0 at ", peer,
               " has world size ", world, " but rank ", o.rank, " has ", o.world_size);
  ACCRUE_CHECK(status != kFingerprintMismatch, "fetch_blob: parameter layout mismatch: rank 0 at ",
               peer, " has fingerprint ", hex(fingerprint), " but rank ", o.rank, " has ",
               hex(o.fingerprint), " (the ranks registered different parameters, shapes or order)");
  ACCRUE_CHECK(status != kBadRank, "fetch_blob: rank 0 at ", peer, " rejected rank ", o.rank,
               " of world size ", o.world_size, " (out of range or claimed twice)");
  ACCRUE_CHECK(status != kOtherRankFailed, "fetch_blob: rank 0 at ", peer,
               " aborted the exchange because another rank does not match (see rank 0's error)");
  ACCRUE_CHECK(status == kOk, "fetch_blob: rank 0 at ", peer, " answered unknown status ", status);
}

}  // namespace wire

ExchangeOptions exchange_options(const RankInfo& info, uint64_t fingerprint, int port,
                                 double timeout_s) {
  ExchangeOptions o;
  o.rank = info.rank;
  o.world_size = info.world_size;
  o.fingerprint = fingerprint;
  o.timeout_s = timeout_s;
  o.host = info.master_addr;
  o.port = port;
  if (!info.distributed()) return o;
  ACCRUE_CHECK(!info.master_addr.empty(), "exchange_options: MASTER_ADDR is not set (",
               describe(info), "); export MASTER_ADDR=<rank 0's host> and MASTER_PORT");
  if (port <= 0) {
    const bool usable = info.master_port > 0 && info.master_port < 65535;
    const std::string master_port =
        info.master_port > 0 ? std::to_string(info.master_port) : std::string("not set");
    ACCRUE_CHECK(usable, "exchange_options: MASTER_PORT is ", master_port,
                 " and no exchange port was given; the exchange uses MASTER_PORT + 1");
    o.port = info.master_port + 1;
  }
  return o;
}

BlobServer::BlobServer(const ExchangeOptions& options) : options_(options) {
  check_options(options, "BlobServer");
  ACCRUE_CHECK(options.rank == 0, "BlobServer: only rank 0 serves, this is rank ", options.rank);
  if (options.world_size == 1) return;  // nobody to serve: no socket
  fd_ = listen_on(options.port, options.world_size + 16, &port_).release();
}

BlobServer::~BlobServer() {
  if (fd_ >= 0) ::close(fd_);
}

void BlobServer::serve(const Blob& blob) {
  const int expected = options_.world_size - 1;
  if (expected == 0) return;
  ACCRUE_CHECK(fd_ >= 0, "BlobServer::serve on port ", port_, ": already served");
  Fd listener(std::exchange(fd_, -1));  // one exchange per server; closed on every exit
  const auto deadline = deadline_after(options_.timeout_s);

  // 1. Collect one hello per other rank.
  std::vector<Client> clients;
  while (static_cast<int>(clients.size()) < expected) {
    if (!wait_ready(listener.get(), POLLIN, deadline, "port " + std::to_string(port_),
                    "accepting")) {
      std::string seen;
      for (const Client& c : clients)
        seen += detail::str_cat(" ", c.hello.rank);
      ACCRUE_FAIL("tcp exchange: rank 0 waited ", options_.timeout_s, " s on port ", port_, " for ",
                  expected, " ranks but only ", clients.size(),
                  " connected (ranks:", seen.empty() ? " none" : seen,
                  "); are the others running, with MASTER_ADDR reaching this host?");
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    Client c;
    c.fd = Fd(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                        SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (c.fd.get() < 0) {
      ACCRUE_CHECK(
          errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED,
          "tcp exchange: accept on port ", port_, " failed: ", errno_text(errno));
      continue;
    }
    c.peer = address_text(reinterpret_cast<sockaddr*>(&addr), len);
    if (read_hello(c, deadline)) clients.push_back(std::move(c));
  }

  // 2. Check every hello before answering anyone (Note [Exchange protocol]).
  std::vector<Hello> hellos;
  std::vector<std::string> peers;
  for (const Client& c : clients) {
    hellos.push_back(c.hello);
    peers.push_back(c.peer);
  }
  const Verdict verdict = check_hellos(hellos, peers, options_);

  // 3. Answer everyone: the blob, or why the job cannot start.
  for (size_t i = 0; i < clients.size(); ++i) {
    const auto header = encode_reply(reply_status(verdict, i), options_);
    std::vector<uint8_t> reply(header.begin(), header.end());
    if (verdict.ok()) reply.insert(reply.end(), blob.begin(), blob.end());
    try {
      send_all(clients[i].fd.get(), reply.data(), reply.size(), deadline, clients[i].peer,
               "sending the reply");
    } catch (const Error&) {
      if (verdict.ok()) throw;  // a rank died after its hello: NCCL would wait for it forever
    }
  }
  ACCRUE_CHECK(verdict.ok(), "tcp exchange on port ", port_, ": the ranks do not form one job",
               verdict.problems);
}

Blob serve_blob(const ExchangeOptions& options, const Blob& blob) {
  BlobServer server(options);
  server.serve(blob);
  return blob;
}

Blob fetch_blob(const ExchangeOptions& o) {
  check_options(o, "fetch_blob");
  ACCRUE_CHECK(o.rank > 0, "fetch_blob: rank 0 serves the blob, it does not fetch it");
  ACCRUE_CHECK(!o.host.empty(), "fetch_blob: no host for rank 0 (MASTER_ADDR)");
  ACCRUE_CHECK(o.port > 0, "fetch_blob: port ", o.port, " is not in 1..65535");
  const std::string peer = o.host + ":" + std::to_string(o.port);
  const auto deadline = deadline_after(o.timeout_s);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(o.host.c_str(), std::to_string(o.port).c_str(), &hints, &found);
  ACCRUE_CHECK(gai == 0, "fetch_blob: cannot resolve rank 0's host ", peer, ": ",
               ::gai_strerror(gai));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);

  // 1. Connect, retrying: rank 0 may not be listening yet.
  Fd fd;
  std::string last_error = "no address";
  while (fd.get() < 0) {
    for (addrinfo* a = addresses.get(); a && fd.get() < 0; a = a->ai_next) {
      Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
      if (s.get() < 0) {
        last_error = errno_text(errno);
        continue;
      }
      int err = 0;
      if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          err = ETIMEDOUT;
          if (wait_ready(s.get(), POLLOUT, deadline, peer, "connecting")) {
            socklen_t len = sizeof err;
            ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          }
        }
      }
      if (err == 0) {
        fd = std::move(s);
      } else {
        last_error = errno_text(err);
      }
    }
    if (fd.get() >= 0) break;
    ACCRUE_CHECK(Clock::now() < deadline, "fetch_blob: rank ", o.rank,
                 " could not connect to rank 0 at ", peer, " within ", o.timeout_s,
                 " s (last error: ", last_error, "); is rank 0 running and MASTER_ADDR right?");
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - Clock::now()));
  }

  // 2. Hello, then rank 0's verdict.
  const auto hello = encode_hello(
      Hello{static_cast<uint32_t>(o.rank), static_cast<uint32_t>(o.world_size), o.fingerprint});
  send_all(fd.get(), hello.data(), hello.size(), deadline, "rank 0 at " + peer,
           "sending the hello");

  uint8_t reply[kReplyBytes];
  const std::string waiting = detail::str_cat("waiting for the reply (timeout ", o.timeout_s,
                                              " s; rank 0 waits for every rank first)");
  recv_all(fd.get(), reply, sizeof reply, deadline, "rank 0 at " + peer, waiting.c_str());
  check_reply(reply, sizeof reply, o, peer);
  Blob blob;
  recv_all(fd.get(), blob.data(), blob.size(), deadline, "rank 0 at " + peer, "receiving the blob");
  return blob;
}

}  // namespace accrue::dist
