# What the one-call GPU scripts (tools/gpu_check.sh, gpt2_check.sh,
# gpt2_dp_check.sh, multi_gpu_check.sh, overlap_check.sh) share: the progress and summary
# lines, the log folders, the machine's description, configure and build with
# their logs, the GPT-2 benchmark step, the reading of ctest's output, and the
# summary printed LAST.
# Sourced, never run: each script sets `check_name` (its name, the prefix of
# every message) before it calls anything here, and the functions read and
# set these globals:
#   build_dir, log_dir  the build directory and where the results go (absolute
#                       after make_dirs_absolute)
#   details             the unpacked logs (open_details)
#   summary             the lines of the final summary
#   failed              1 once any step failed: the exit status
#   cmake_args          the configure command line, which the add_* functions extend
# shellcheck shell=bash disable=SC2034,SC2154  # globals set for, and by, the scripts

# ---- messages ----------------------------------------------------------------
say() {
  last_said="$*"
  echo "[$check_name $((SECONDS - start_time))s] $*"
}
# A line of the final summary, echoed as it happens too.
note() {
  summary+=("$*")
  say "$*"
}
# note_each PREFIX: a summary line for every line of stdin, after PREFIX.
note_each() {
  local line
  while IFS= read -r line; do note "$1$line"; done
}

# ---- start -------------------------------------------------------------------
need_repo_root() {
  if [[ ! -f CMakeLists.txt || ! -f accrue.h ]]; then
    echo "$check_name: run me from the accrue repository root" >&2
    exit 2
  fi
}

# NVLink multicast stays off on shared machines: a program that uses it can
# take the host's GPUs out of service.
no_nvlink_multicast() {
  export NCCL_NVLS_ENABLE=0
  export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  export NVSHMEM_DISABLE_NVLS=1
}

make_dirs_absolute() {
  mkdir -p "$build_dir" "$log_dir"
  build_dir=$(cd "$build_dir" && pwd)
  log_dir=$(cd "$log_dir" && pwd)
}

# open_details DIR: DIR (emptied) takes the logs; the clock and the summary
# start, and from here a signal cuts the check short (Note [Cut short]).
open_details() {
  details="$1"
  rm -rf "$details"
  mkdir -p "$details"
  start_time=$SECONDS
  failed=0
  summary=()
  last_said=""
  cut_short_on_signals
}

# Note [Cut short]
# ~~~~~~~~~~~~~~~~
# A lent machine's call ends at its time limit, and a check killed there
# returns nothing (its logs are packed and its summary written
# only by `finish`). Run under an outer `timeout` shorter than the call's
# (`timeout -k 10 540 tools/gpu_check.sh ...`), the check that the timeout's
# SIGTERM reaches (it signals the check's whole process group, so the step in
# flight ends first) says where it was cut, packs the logs it has and writes
# its summary, then exits 143 (130 after SIGINT), failed. A step that starts
# its own process groups (the sanitizer pool) stops them first and calls
# cut_short itself.
cut_short_on_signals() {
  trap 'cut_short TERM 143' TERM
  trap 'cut_short INT 130' INT
}
# cut_short SIGNAL STATUS
cut_short() {
  failed=1
  note "cut short by SIG$1 after: ${last_said:-the start}; nothing after that ran"
  finish cut_summary "$2"
}
# shellcheck disable=SC2317  # called by cut_short
cut_summary() {
  summary_head "${gpu_model:-(the GPUs were not looked at yet)}"
  echo
  verdict
}

# ---- the machine -------------------------------------------------------------
# look_at_gpus one|all: gpu_model, the name, memory and driver of the first
# four GPUs (one) or of each kind among the first eight, counted (all);
# nvidia-smi's report in $details; for all, also gpus (how many nvidia-smi
# lists) and the topology.
look_at_gpus() {
  gpu_model="no nvidia-smi"
  gpus=0
  command -v nvidia-smi > /dev/null || return 0
  local query
  query=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)
  if [[ $1 == all ]]; then
    gpu_model=$(head -n 8 <<< "$query" | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
  else
    gpu_model=$(head -n 4 <<< "$query" | paste -sd ';' -)
  fi
  nvidia-smi > "$details/nvidia-smi.txt" 2>&1
  if [[ $1 == all ]]; then
    gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
    nvidia-smi topo -m > "$details/nvidia-smi-topo.txt" 2>&1
  fi
}

torch_version_or_not() {
  python3 -c 'import torch; print(torch.__version__)' 2> /dev/null || echo "not importable"
}

# ---- configure and build -----------------------------------------------------
# add_nvcc: cuda_bin, the folder of CUDA_HOME's or /usr/local/cuda's nvcc (empty
# when neither has one), and that nvcc as the CUDA compiler.
add_nvcc() {
  cuda_bin=""
  local d
  for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    if [[ -n "$d" && -x "$d/bin/nvcc" ]]; then cuda_bin="$d/bin"; break; fi
  done
  if [[ -n "$cuda_bin" ]]; then cmake_args+=(-DCMAKE_CUDA_COMPILER="$cuda_bin/nvcc"); fi
}

# add_deps DIR: unpacks the .deb files in DIR (libgtest-dev, libbenchmark-dev,
# ...) into <build dir>/deps for a GPU machine without those packages, and
# puts them on CMAKE_PREFIX_PATH; deps_unpacked counts them.
add_deps() {
  deps_root="$build_dir/deps"
  rm -rf "$deps_root"
  mkdir -p "$deps_root"
  deps_unpacked=0
  local deb
  for deb in "$1"/*.deb; do
    [[ -e "$deb" ]] || { echo "$check_name: no .deb files in $1" >&2; exit 2; }
    dpkg -x "$deb" "$deps_root"
    deps_unpacked=$((deps_unpacked + 1))
  done
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps_root/usr")
}

# add_nccl_root: NCCL from the PyTorch environment's wheel when the system has
# none (after add_nvcc, whose CUDA may have it).
add_nccl_root() {
  if [[ ! -e /usr/include/nccl.h && ! -e "${cuda_bin:-/nonexistent}/../include/nccl.h" ]]; then
    local nccl_root
    nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2> /dev/null || true)
    if [[ -n "$nccl_root" ]]; then cmake_args+=(-DNCCL_ROOT="$nccl_root"); fi
  fi
}

# configure: cmake with cmake_args into configure.log; on failure the summary
# gets its last lines and the check fails.
configure() {
  say "configure: cmake ${cmake_args[*]}"
  if cmake "${cmake_args[@]}" > "$details/configure.log" 2>&1; then return 0; fi
  failed=1
  note "configure: FAILED (last lines of configure.log:)"
  note_each "  " < <(tail -n 15 "$details/configure.log")
  return 1
}

# run_build COMMAND...: the build into build.log. Success sets build_seconds and
# build_warnings (compiler warning lines) for the caller's summary line; on
# failure the summary gets the first errors and the check fails.
run_build() {
  local begin=$SECONDS
  if "$@" > "$details/build.log" 2>&1; then
    build_seconds=$((SECONDS - begin))
    build_warnings=$(grep -c 'warning:' "$details/build.log" || true)
    return 0
  fi
  failed=1
  note "build: FAILED (first errors of build.log:)"
  note_each "  " < <(grep -m 10 -E 'error|FAILED' "$details/build.log")
  return 1
}

# ---- the GPT-2 benchmarks ---------------------------------------------------------
# run_trainer_bench NAME TRAINER OPTIONS quiet|live: python3 bench/NAME.py (gpt2_bench,
# gpt2_dp_bench) against the trainer binary, its tables in <log dir>/NAME.md (also in
# bench_table, for the summary) and its runs in NAME.json; OPTIONS, a string, is split
# at spaces after the script's own. Its output goes to NAME.log (live: to stdout too).
run_trainer_bench() {
  local name="$1" trainer="$2" show="$4" extra
  # shellcheck disable=SC2206  # the options are a list, split on purpose
  extra=($3)
  local cmd=(python3 "bench/$name.py" --accrue-bin "$trainer" --out "$log_dir/$name.md"
    --json "$log_dir/$name.json" --log-dir "$details/bench" "${extra[@]}")
  say "bench: ${cmd[*]}"
  local begin=$SECONDS rc
  if [[ $show == live ]]; then
    "${cmd[@]}" 2>&1 | tee "$details/$name.log"
    rc=$?
  else
    "${cmd[@]}" > "$details/$name.log" 2>&1
    rc=$?
  fi
  if [[ $rc -eq 0 ]]; then
    note "$name: ok in $((SECONDS - begin)) s"
  else
    failed=1
    note "$name: FAILED (an accrue run failed or the script did; see $name.log): $(tail -n 1 "$details/$name.log")"
  fi
  if [[ -s "$log_dir/$name.md" ]]; then bench_table=$(cat "$log_dir/$name.md"); fi
}

# ---- ctest's output ----------------------------------------------------------
# ctest_passed_line LOG: CMake 3 prints "100% tests passed, 0 tests failed out
# of 3"; CMake 4 may drop the middle part. Empty when ctest printed neither.
ctest_passed_line() {
  grep -E 'tests passed(, [0-9]+ tests? failed)? out of' "$1" | tail -n 1
}
# ctest_skipped LOG: ctest counts a skipped test (exit 77 or a skip message)
# among the passed ones; this counts them apart.
ctest_skipped() {
  grep -c '\*\*\*Skipped' "$1" || true
}
# note_failed_tests LOG: a summary line for each name under "The following tests FAILED:".
note_failed_tests() {
  local t
  while IFS= read -r t; do note "    ${t#"${t%%[![:space:]]*}"}"; done < <(
    grep -E '^[[:space:]]+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Exception|Child aborted|Not Run)' \
      "$1")
}

# ---- the summary (LAST) --------------------------------------------------------
# summary_head MACHINE: the banner, MACHINE, the commit, the time and the summary lines.
summary_head() {
  echo "===================== accrue $check_name summary ====================="
  echo "$1"
  if git rev-parse --verify -q HEAD > /dev/null 2>&1; then
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')"
  elif [[ -n "${ACCRUE_COMMIT:-}" ]]; then
    echo "commit: $ACCRUE_COMMIT (copied tree)"
  fi
  echo "time: $((SECONDS - start_time)) s; logs: $log_dir/logs.tar.gz (unpacked: $details)"
  local line
  for line in "${summary[@]}"; do echo "$line"; done
}

# block TEXT: a blank line, then TEXT (nothing when TEXT is empty).
block() {
  if [[ -n "$1" ]]; then
    echo
    echo "$1"
  fi
}

verdict() {
  if [[ $failed -eq 0 ]]; then echo "$check_name: PASSED"; else echo "$check_name: FAILED"; fi
}

# finish WRITER [STATUS]: packs the logs into logs.tar.gz, writes WRITER's
# output (a function) to summary.txt, prints it, and exits with STATUS, else
# the check's status.
finish() {
  trap - TERM INT
  tar -C "$details" -czf "$log_dir/logs.tar.gz" . 2> /dev/null
  "$1" > "$log_dir/summary.txt"
  cat "$log_dir/summary.txt"
  exit "${2:-$failed}"
}
