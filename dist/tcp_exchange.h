// TcpExchange: rank 0 hands a 128-byte blob (the ncclUniqueId) to every other
// rank over plain TCP, and all ranks check they are the same job.
//
//   ExchangeOptions opt = exchange_options(info, layout_fingerprint(arena));
//   Blob id = info.rank == 0 ? serve_blob(opt, make_nccl_id()) : fetch_blob(opt);
//
// Used when the NCCL id cannot travel over MPI (torchrun, srun, or an accrue
// built without MPI). Rank 0 listens on its own port, by default MASTER_PORT + 1:
// MASTER_PORT itself belongs to torchrun's store.
//
// Note [Exchange protocol]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Each client connects (retrying until the deadline: rank 0 may start late)
// and sends a hello {magic, version, rank, world size, layout fingerprint}.
// Rank 0 waits for all world_size - 1 hellos, then answers every client with
// {magic, version, status, world size, its fingerprint} and, if the status is
// ok, the blob. Rank 0 checks every hello before answering anyone, so a
// mismatch (world size, fingerprint, duplicate or out-of-range rank) is an
// accrue::Error on every rank naming both values, not a hang in NCCL init.
// Every blocking socket call is bounded by poll() and the one deadline (name
// resolution excepted: getaddrinfo has no timeout, so where DNS is slow give
// MASTER_ADDR as an IP address); nothing exits; every error names the peer
// (host:port) and the step that failed.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accrue/dist/launch_env.h"

namespace accrue::dist {

// Fixed size: sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES == 128.
inline constexpr size_t kBlobBytes = 128;
using Blob = std::array<uint8_t, kBlobBytes>;

struct ExchangeOptions {
  std::string host;  // rank 0's address as the other ranks reach it (MASTER_ADDR)
  int port = 0;      // rank 0's exchange port (default MASTER_PORT + 1)
  int rank = 0;
  int world_size = 1;
  // Note [Layout fingerprint]: ranks that registered different parameter
  // layouts must not start training together (see dist/bucket_plan.h).
  uint64_t fingerprint = 0;
  double timeout_s = 120.0;  // the whole exchange, connect retries included
};

// Options from the launcher's variables: host = MASTER_ADDR, port = `port`
// if > 0 else MASTER_PORT + 1. Throws accrue::Error when a multi-rank world
// lacks MASTER_ADDR or MASTER_PORT (and no port was given).
ExchangeOptions exchange_options(const RankInfo& info, uint64_t fingerprint, int port = 0,
                                 double timeout_s = 120.0);

// Rank 0's side. The constructor binds and listens at once (so clients that
// start early find the port open and only retry until then); serve() does the
// rest. options.port 0 takes a free port (tests), reported by port().
class BlobServer {
 public:
  explicit BlobServer(const ExchangeOptions& options);
  ~BlobServer();
  BlobServer(const BlobServer&) = delete;
  BlobServer& operator=(const BlobServer&) = delete;

  int port() const { return port_; }
  // Waits for the world_size - 1 hellos, checks them, answers every client.
  // Throws accrue::Error on a timeout or a mismatch (after telling the clients).
  void serve(const Blob& blob);

 private:
  ExchangeOptions options_;
  int fd_ = -1;
  int port_ = 0;
};

// Rank 0: BlobServer(options).serve(blob); returns blob. World size 1 returns at once.
Blob serve_blob(const ExchangeOptions& options, const Blob& blob);
// Ranks > 0: connects to options.host:options.port (retrying until the
// deadline), checks rank 0's answer and returns its blob.
Blob fetch_blob(const ExchangeOptions& options);

// ---- the wire messages (Note [Exchange protocol]) ---------------------------
// What serve() and fetch_blob() send and check, as functions of bytes: the
// tests and the fuzzer (fuzz/fuzz_exchange_message.cpp) drive them without
// sockets. Little-endian, fixed size; there is no length field to trust.
namespace wire {

inline constexpr uint32_t kMagic = 0x58524341;  // "ACRX"
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kHelloBytes = 24;  // magic, version, rank, world size, fingerprint
inline constexpr size_t kReplyBytes = 24;  // magic, version, status, world size, fingerprint
// ...then, only with status ok, the kBlobBytes blob.

enum Status : uint32_t {
  kOk = 0,
  kWorldSizeMismatch = 1,    // this client's world size differs from rank 0's
  kFingerprintMismatch = 2,  // this client's layout differs from rank 0's
  kBadRank = 3,              // out of range, or two clients claim the same rank
  kOtherRankFailed = 4,      // this client is fine; another one is not
};

struct Hello {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t fingerprint = 0;
};

std::array<uint8_t, kHelloBytes> encode_hello(const Hello& hello);
// The hello in `size` received bytes; nullopt when they are not one of ours
// (not kHelloBytes long, wrong magic or version): rank 0 drops that connection.
std::optional<Hello> parse_hello(const uint8_t* data, size_t size);

// Rank 0's check of every hello before it answers anyone: one status per hello
// (kOtherRankFailed never: see reply_status) and, when any is not kOk, the
// problems, each naming the peer and both values. `peers[i]` names hello i.
struct Verdict {
  std::vector<Status> status;
  std::string problems;  // "; rank 2 at host:port has world size 3 but ..."
  bool ok() const { return problems.empty(); }
};
Verdict check_hellos(const std::vector<Hello>& hellos, const std::vector<std::string>& peers,
                     const ExchangeOptions& rank0);
// The status rank 0 sends client i.
Status reply_status(const Verdict& verdict, size_t i);

std::array<uint8_t, kReplyBytes> encode_reply(Status status, const ExchangeOptions& rank0);
// Checks rank 0's reply (the kReplyBytes before the blob) as rank `self.rank`
// sees it: returns when the status is kOk, else throws accrue::Error naming
// `peer` (rank 0's host:port) and, for a mismatch, both values.
void check_reply(const uint8_t* data, size_t size, const ExchangeOptions& self,
                 const std::string& peer);

}  // namespace wire

}  // namespace accrue::dist
