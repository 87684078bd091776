// Rank discovery: who am I, how many are we, from the launcher's variables.
//
// accrue does not start processes; existing launchers do, and each leaves its
// answer in the environment:
//
//   torchrun --no-python   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//                          MASTER_ADDR, MASTER_PORT
//   mpirun (Open MPI)      OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                          OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   srun (Slurm)           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//                          SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE
//
// None of them set: a single process, rank 0 of 1. MASTER_ADDR/MASTER_PORT
// are read whichever launcher it is (mpirun and srun users export them) and
// only the TCP exchange needs them (see dist/tcp_exchange.h).
#pragma once

#include <map>
#include <string>

namespace accrue::dist {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // the GPU this process drives
  int local_world_size = 1;  // processes on this node
  std::string master_addr;   // empty when MASTER_ADDR is not set
  int master_port = 0;       // 0 when MASTER_PORT is not set
  std::string launcher;      // "torchrun", "openmpi", "slurm" or "none"

  bool distributed() const { return world_size > 1; }
};

// Note [Launcher precedence]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Launchers nest (`srun torchrun ...`, `mpirun` inside an sbatch job), so
// several sets may be present. The innermost launcher started this process
// and wins: torchrun, then Open MPI, then Slurm.
//
// torchrun and Open MPI only ever describe processes they started, so when
// both are present they must agree in one of the two ways nesting produces:
//   - mpirun started every process: same rank, world and local sizes; or
//   - mpirun started one torchrun per node: OMPI rank = RANK / LOCAL_WORLD_SIZE
//     and OMPI size = WORLD_SIZE / LOCAL_WORLD_SIZE.
// Anything else (say a stale `export RANK=0 WORLD_SIZE=1` under `mpirun -np 2`)
// is accrue::Error naming both sets: silently training as separate single
// processes would be worse. Slurm's variables are not cross-checked against
// an inner launcher: inside an sbatch script they describe the allocation
// (the script itself is task 0 of it), not the processes torchrun or mpirun
// started, so any disagreement there is legitimate.
//
// Every error names the variable and its value: a set with a variable
// missing, a value that is not a non-negative decimal integer, a world size
// < 1, rank >= world size, local rank >= local world size, local world size
// > world size, MASTER_PORT outside 1..65535, an unparsable
// SLURM_TASKS_PER_NODE, or the two disagreeing launchers above.
RankInfo discover_rank(const std::map<std::string, std::string>& env);
// Reads the process environment (only the variables above).
RankInfo discover_rank();

// "rank 1 of 2 (local 1 of 2) via torchrun, master 10.0.0.1:29500"
std::string describe(const RankInfo& info);

}  // namespace accrue::dist
