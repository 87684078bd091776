#!/usr/bin/env bash
# Starts NPROC copies of a test binary as the ranks of one world on this node,
# with the variables torchrun sets, waits for all of them and fails if any
# fails. Exits 77 (ctest's SKIP_RETURN_CODE) when the binary says the node has
# too few GPUs.
#
#   multi_gpu_launch.sh NPROC BINARY [ARGS...]
#
# Each rank's output goes to its own log, printed when all have finished, so
# the ranks' lines do not interleave. MULTI_GPU_TIMEOUT (seconds, default 300)
# bounds each rank: the watchdog should fail a stuck rank long before.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 NPROC BINARY [ARGS...]" >&2
  exit 2
fi
nproc=$1
binary=$2
shift 2

# NVLink multicast (NVLS) stays off on the shared machines.
export NCCL_NVLS_ENABLE=0
export MASTER_ADDR=127.0.0.1
# A port per run: the exchange listens on MASTER_PORT + 1.
export MASTER_PORT=$((20000 + ($$ % 20000) * 2))
export WORLD_SIZE=$nproc LOCAL_WORLD_SIZE=$nproc
limit=${MULTI_GPU_TIMEOUT:-300}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((r = 0; r < nproc; r++)); do
  RANK=$r LOCAL_RANK=$r timeout -k 10 "$limit" "$binary" "$@" >"$logs/rank$r.log" 2>&1 &
  pids+=($!)
done

status=0
skipped=0
for ((r = 0; r < nproc; r++)); do
  wait "${pids[$r]}"
  rc=$?
  echo "==================== rank $r: exit code $rc ===================="
  cat "$logs/rank$r.log"
  if [ "$rc" -eq 77 ]; then
    skipped=1
  elif [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "rank $r: killed after ${limit} s"
    status=1
  fi
done
if [ "$status" -eq 0 ] && [ "$skipped" -eq 1 ]; then exit 77; fi
exit "$status"
