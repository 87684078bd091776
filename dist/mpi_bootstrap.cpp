#include "accrue/dist/mpi_bootstrap.h"

#include <mpi.h>

#include <cstdlib>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "accrue/core/error.h"

namespace accrue::dist {
namespace {

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

void check_mpi(int code, const RankInfo& info, const char* call) {
  ACCRUE_CHECK(code == MPI_SUCCESS, "mpi bootstrap (", describe(info), "): ", call,
               " failed: ", mpi_error_text(code));
}

// Note [MPI lifetime]: only when accrue initialized MPI.
void finalize_mpi_at_exit() {
  int finalized = 1;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
}

void initialize_mpi_once(const RankInfo& info) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), info, "MPI_Initialized");
  if (initialized) return;
  int finalized = 0;
  check_mpi(MPI_Finalized(&finalized), info, "MPI_Finalized");
  ACCRUE_CHECK(!finalized, "mpi bootstrap (", describe(info),
               "): MPI was already finalized and cannot be initialized again");
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), info,
            "MPI_Init_thread");
  std::atexit(finalize_mpi_at_exit);
}

// MPI_ERRORS_RETURN on COMM_WORLD for a scope, then the application's
// handler again (Note [MPI lifetime]).
class ErrorsReturn {
 public:
  explicit ErrorsReturn(const RankInfo& info) {
    check_mpi(MPI_Comm_get_errhandler(MPI_COMM_WORLD, &previous_), info, "MPI_Comm_get_errhandler");
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), info,
              "MPI_Comm_set_errhandler");
  }
  ~ErrorsReturn() {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, previous_);
    MPI_Errhandler_free(&previous_);  // MPI_Comm_get_errhandler handed out a reference
  }
  ErrorsReturn(const ErrorsReturn&) = delete;
  ErrorsReturn& operator=(const ErrorsReturn&) = delete;

 private:
  MPI_Errhandler previous_ = MPI_ERRHANDLER_NULL;
};

// What every rank contributes to the check, in MPI_INT64_T.
enum Field { kRank, kWorldSize, kFingerprint, kFields };

}  // namespace

Blob mpi_exchange_blob(const RankInfo& info, uint64_t fingerprint, const Blob& blob) {
  // MPI_THREAD_SERIALIZED: accrue's MPI calls never overlap.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  initialize_mpi_once(info);
  ErrorsReturn errors_return(info);
  int mpi_rank = 0, mpi_size = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), info, "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), info, "MPI_Comm_size");

  // 1. Every rank's record on every rank, then the same checks everywhere
  //    (Note [MPI bootstrap]): all ranks fail together or none does.
  const int64_t mine[kFields] = {info.rank, info.world_size, static_cast<int64_t>(fingerprint)};
  std::vector<int64_t> all(static_cast<size_t>(mpi_size) * kFields);
  check_mpi(
      MPI_Allgather(mine, kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T, MPI_COMM_WORLD),
      info, "MPI_Allgather of the ranks' world sizes and layout fingerprints");
  const uint64_t rank0_fingerprint = static_cast<uint64_t>(all[kFingerprint]);
  std::string problems;
  for (int r = 0; r < mpi_size; ++r) {
    const int64_t* record = &all[static_cast<size_t>(r) * kFields];
    const uint64_t its_fingerprint = static_cast<uint64_t>(record[kFingerprint]);
    if (record[kWorldSize] != mpi_size) {
      problems += detail::str_cat("; rank ", r, " has world size ", record[kWorldSize],
                                  " but MPI_COMM_WORLD has ", mpi_size, " processes");
    } else if (record[kRank] != r) {
      problems += detail::str_cat("; MPI_COMM_WORLD rank ", r, " is rank ", record[kRank],
                                  " by its launcher variables");
    }
    if (its_fingerprint != rank0_fingerprint) {
      problems +=
          detail::str_cat("; rank ", r, " registered a different parameter layout (fingerprint ",
                          hex(its_fingerprint), ", rank 0 has ", hex(rank0_fingerprint), ")");
    }
  }
  ACCRUE_CHECK(problems.empty(), "mpi bootstrap on rank ", mpi_rank, " of ", mpi_size,
               ": the ranks are not one job: ", problems.substr(problems.empty() ? 0 : 2));

  // 2. Rank 0's blob to everyone.
  Blob result = blob;
  check_mpi(MPI_Bcast(result.data(), static_cast<int>(result.size()), MPI_BYTE, 0, MPI_COMM_WORLD),
            info, "MPI_Bcast of rank 0's blob");
  return result;
}

}  // namespace accrue::dist
