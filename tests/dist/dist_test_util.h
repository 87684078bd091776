// Helpers shared by the dist/ tests on the CPU: launcher environments and
// loopback exchange options.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "accrue/dist/tcp_exchange.h"

namespace accrue::dist {

// A process environment: variable name -> value.
using Env = std::map<std::string, std::string>;

// What torchrun sets for one rank (rendezvous at 10.1.2.3:29500).
inline Env torchrun_env(int rank, int world, int local, int local_world) {
  return {{"RANK", std::to_string(rank)},        {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local)}, {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"MASTER_ADDR", "10.1.2.3"},           {"MASTER_PORT", "29500"}};
}

// What Open MPI's mpirun sets for one rank (no rendezvous address).
inline Env openmpi_env(int rank, int world, int local, int local_world) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(world)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_world)}};
}

// Options for rank `rank` of an exchange on 127.0.0.1.
inline ExchangeOptions loopback(int rank, int world, int port, uint64_t fingerprint,
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

}  // namespace accrue::dist
