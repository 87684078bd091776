// libFuzzer target: the TCP exchange's messages (dist/tcp_exchange.h,
// namespace wire; Note [Exchange protocol]) as bytes, without sockets.
//
// The input is read three ways: (1) whole, as the reply a client receives
// (check_reply: an accrue::Error or a clean return, whatever the size); (2)
// byte 0 picks rank 0's world size (1..8) and the rest is cut into 24-byte
// messages that rank 0 parses as hellos (parse_hello) and judges together
// (check_hellos); (3) every verdict goes back through encode_reply and
// check_reply, which must throw exactly when the status is not ok.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/dist/tcp_exchange.h"
#include "fuzz/fuzz_util.h"

using namespace accrue;
using namespace accrue::dist;
using namespace accrue::dist::wire;

namespace {

constexpr uint64_t kFingerprint = 0x0123456789abcdefull;

ExchangeOptions options(int rank, int world_size, uint64_t fingerprint) {
  ExchangeOptions o;
  o.host = "127.0.0.1";
  o.port = 29501;
  o.rank = rank;
  o.world_size = world_size;
  o.fingerprint = fingerprint;
  return o;
}

// True when check_reply accepted the reply, false when it threw accrue::Error.
bool reply_accepted(const uint8_t* data, size_t size, const ExchangeOptions& self) {
  try {
    check_reply(data, size, self, "127.0.0.1:29501");
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // (1) The bytes as rank 0's reply.
  const bool accepted = reply_accepted(data, size, options(1, 2, kFingerprint));
  fuzz::require(!accepted || size == kReplyBytes, "check_reply accepted a reply of the wrong size");
  if (size == 0) return 0;

  // (2) The rest as the hellos of a world of 1..8 ranks.
  const int world = 1 + data[0] % 8;
  const ExchangeOptions rank0 = options(0, world, kFingerprint);
  std::vector<Hello> hellos;
  std::vector<std::string> peers;
  for (size_t at = 1; at < size; at += kHelloBytes) {
    const size_t n = std::min(kHelloBytes, size - at);
    const std::optional<Hello> hello = parse_hello(data + at, n);
    if (!hello) {
      fuzz::require(n != kHelloBytes || data[at] != 0x41 || data[at + 1] != 0x43 ||
                        data[at + 2] != 0x52 || data[at + 3] != 0x58 || data[at + 4] != 1 ||
                        data[at + 5] != 0 || data[at + 6] != 0 || data[at + 7] != 0,
                    "parse_hello rejected a well-formed hello");
      continue;
    }
    fuzz::require(n == kHelloBytes, "parse_hello accepted a message of the wrong size");
    const auto again = encode_hello(*hello);
    fuzz::require(std::equal(again.begin(), again.end(), data + at),
                  "encode_hello(parse_hello(b)) != b");
    hellos.push_back(*hello);
    peers.push_back("10.0.0." + std::to_string(hellos.size()) + ":4000");
  }
  const Verdict verdict = check_hellos(hellos, peers, rank0);
  fuzz::require(verdict.status.size() == hellos.size(), "one status per hello");

  // (3) Every client's verdict, as that client reads it.
  bool all_ok = true;
  for (size_t i = 0; i < hellos.size(); ++i) {
    all_ok = all_ok && verdict.status[i] == kOk;
    const Status status = reply_status(verdict, i);
    fuzz::require(verdict.ok() == (status == kOk), "a client is told ok in a failed exchange");
    const auto reply = encode_reply(status, rank0);
    const Hello& h = hellos[i];
    // The client's own options, made valid, as fetch_blob would hold them.
    const int client_world = static_cast<int>(std::max<uint32_t>(2, h.world_size % 64));
    const int client_rank = static_cast<int>(1 + h.rank % static_cast<uint32_t>(client_world - 1));
    const bool ok = reply_accepted(reply.data(), reply.size(),
                                   options(client_rank, client_world, h.fingerprint));
    fuzz::require(ok == (status == kOk), "check_reply disagrees with rank 0's status");
  }
  fuzz::require(verdict.ok() == all_ok, "Verdict::ok() disagrees with the statuses");
  return 0;
}
