// Note [Norm under the backward] under data parallelism on the CPU: two ranks
// as threads with the host communicator (tests/dist/host_world.h), plain data
// parallelism, ZeRO-1 and a 16-bit transport.
#include <optional>

#include "tests/dist/host_world.h"
#include "tests/dist/norm_rows_dist_cases.h"

namespace accrue::dist {
namespace {

void run_on_host_ranks(int world, bool zero1, std::optional<DType> transport) {
  host::HostWorld host(world);
  host::on_ranks(world, [&](int rank) {
    host::HostCommunicator comm(host, rank);
    test::dist_norm_rows_under_the_backward_match_a_close_time_pass(Device::cpu(), comm, zero1,
                                                                    transport);
  });
}

TEST(HostWorldNormRows, plain_data_parallelism_matches_a_close_time_pass) {
  run_on_host_ranks(2, false, std::nullopt);
}

TEST(HostWorldNormRows, zero1_matches_a_close_time_pass) {
  run_on_host_ranks(2, true, std::nullopt);
}

TEST(HostWorldNormRows, a_16_bit_transport_keeps_the_pass_at_the_close) {
  run_on_host_ranks(2, false, DType::bf16);
  run_on_host_ranks(2, true, DType::bf16);
}

}  // namespace
}  // namespace accrue::dist
