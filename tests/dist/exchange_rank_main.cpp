// One rank of the TCP exchange as a process of its own, for
// exchange_processes_test.cpp: reads its rank from torchrun's variables,
// exchanges a blob with rank 0 (10 s at most) and says what happened.
// Exit 0: it has rank 0's blob; 3: accrue::Error, its message on stderr.
#include <cstdio>

#include "accrue/core/error.h"
#include "accrue/dist/launch_env.h"
#include "accrue/dist/tcp_exchange.h"

int main() {
  using namespace accrue::dist;
  try {
    const RankInfo info = discover_rank();
    const ExchangeOptions options =
        exchange_options(info, /*fingerprint=*/7, /*port=*/0, /*timeout_s=*/10.0);
    Blob blob{};
    blob.fill(0x5a);
    const Blob got = info.rank == 0 ? serve_blob(options, blob) : fetch_blob(options);
    std::printf("%s: received the blob (first byte 0x%02x)\n", describe(info).c_str(), got[0]);
    return 0;
  } catch (const accrue::Error& e) {
    std::fprintf(stderr, "accrue::Error: %s\n", e.what());
    return 3;
  }
}
