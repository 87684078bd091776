// The MPI bootstrap: under mpirun, rank 0's 128-byte blob (the ncclUniqueId)
// reaches every rank through MPI instead of the TCP exchange.
//
//   Blob id = mpi_exchange_blob(info, layout_fingerprint(arena),
//                               info.rank == 0 ? make_nccl_id() : Blob{});
//
// mpirun already connected its processes, so this path needs no MASTER_ADDR
// or MASTER_PORT and no free port. connect_nccl (dist/nccl_communicator.h)
// takes it when bootstrap_method(info) says Bootstrap::mpi: accrue was built
// with MPI (ACCRUE_WITH_MPI) and Open MPI's mpirun started this process.
// Everything else (torchrun, srun, a build without MPI) uses the TCP exchange.
// Nothing here needs CUDA or NCCL: it moves bytes, so it is tested on the CPU.
//
// Note [MPI bootstrap]
// ~~~~~~~~~~~~~~~~~~~~
// The contract is Note [Exchange protocol]'s: every rank learns whether the
// ranks are one job before anyone starts NCCL. All ranks all-gather {the rank
// and world size their launcher variables give, their layout fingerprint},
// then each checks every record against MPI_COMM_WORLD (rank r of its size)
// and rank 0's fingerprint. Every rank sees the same records, so a mismatch
// is an accrue::Error on every rank naming the rank(s) and both values, and
// MPI stays usable afterwards (nobody aborted). Only then does rank 0's blob
// go out with MPI_Bcast.
//
// MPI's collectives have no timeout. A rank that dies before the bootstrap
// does not make the others hang forever: mpirun ends the whole job when a
// process exits with a non-zero status or without finalizing MPI.
//
// Note [MPI lifetime]
// ~~~~~~~~~~~~~~~~~~~
// If the application has initialized MPI, accrue uses it as it is (it must
// allow calls from the thread that bootstraps) and never finalizes it. Else
// the first mpi_exchange_blob initializes it (MPI_THREAD_SERIALIZED: accrue's
// MPI calls happen one at a time, from whichever thread connects) and
// finalizes it at exit. MPI's errors become accrue::Error naming the call:
// COMM_WORLD's error handler is MPI_ERRORS_RETURN while accrue uses it, then
// the previous one again.
#pragma once

#include <cstdint>

#include "accrue/core/error.h"
#include "accrue/dist/launch_env.h"
#include "accrue/dist/tcp_exchange.h"

namespace accrue::dist {

// Built with MPI (the ACCRUE_WITH_MPI CMake option found it).
constexpr bool mpi_available() {
#ifdef ACCRUE_WITH_MPI
  return true;
#else
  return false;
#endif
}

// Open MPI's mpirun started this process (Note [Launcher precedence]: an
// mpirun that starts one torchrun per node is torchrun's, not this).
inline bool launched_by_mpi(const RankInfo& info) {
  return info.launcher == "openmpi";
}

// How connect_nccl hands rank 0's NCCL id to the other ranks.
enum class Bootstrap { tcp, mpi };

inline Bootstrap bootstrap_method(const RankInfo& info) {
  return mpi_available() && launched_by_mpi(info) ? Bootstrap::mpi : Bootstrap::tcp;
}

// "tcp" or "mpi".
inline const char* bootstrap_name(Bootstrap b) {
  return b == Bootstrap::mpi ? "mpi" : "tcp";
}

// Collective over MPI_COMM_WORLD: every rank calls it. Checks that the ranks
// are one job (Note [MPI bootstrap]) and returns rank 0's `blob` on every
// rank (the other ranks' `blob` is ignored). Throws accrue::Error naming the
// ranks and values that differ, or the MPI call that failed.
#ifdef ACCRUE_WITH_MPI
Blob mpi_exchange_blob(const RankInfo& info, uint64_t fingerprint, const Blob& blob);
#else
[[noreturn]] inline Blob mpi_exchange_blob(const RankInfo& info, uint64_t, const Blob&) {
  throw Error(describe(info) + ": mpi_exchange_blob: accrue was built without MPI " +
              "(configure with -DACCRUE_WITH_MPI=ON where MPI is installed)");
}
#endif

}  // namespace accrue::dist
