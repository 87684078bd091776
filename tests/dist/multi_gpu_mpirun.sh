#!/usr/bin/env bash
# Runs a multi-GPU test binary under mpirun and checks that its ranks joined
# the NCCL world through the MPI bootstrap (dist/mpi_bootstrap.h): each rank's
# main() prints "bootstrap: mpi" or "bootstrap: tcp" once connected.
#
#   multi_gpu_mpirun.sh NPROC MPIEXEC [MPIEXEC ARGS...] BINARY [ARGS...]
#
# Everything after NPROC is the complete mpirun command line. MASTER_ADDR and
# MASTER_PORT are removed first: the MPI bootstrap must not need them (the TCP
# exchange would fail without them). Exits 77 (ctest's SKIP_RETURN_CODE) when
# the ranks say the node has too few GPUs (mpirun passes their exit code on),
# non-zero when mpirun fails or fewer than NPROC ranks used the MPI bootstrap.
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 NPROC MPIEXEC [MPIEXEC ARGS...] BINARY [ARGS...]" >&2
  exit 2
fi
nproc=$1
shift
unset MASTER_ADDR MASTER_PORT

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "+ $*"
timeout -k 10 "${MULTI_GPU_TIMEOUT:-300}" "$@" >"$log" 2>&1
rc=$?
cat "$log"
if [ "$rc" -eq 77 ]; then exit 77; fi
if [ "$rc" -ne 0 ]; then
  echo "mpirun exited with $rc"
  exit 1
fi
mpi=$(grep -c "bootstrap: mpi" "$log")
if [ "$mpi" -ne "$nproc" ]; then
  echo "expected $nproc ranks to report 'bootstrap: mpi', found $mpi"
  exit 1
fi
echo "all $nproc ranks bootstrapped over MPI"
