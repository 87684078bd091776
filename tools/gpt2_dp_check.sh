#!/usr/bin/env bash
# The one-call 2-GPU GPT-2 benchmark: run it from the repo root on a machine with two GPUs.
#
#   tools/gpt2_dp_check.sh [options]
#
# Steps: configure (preset gpu, as tools/gpt2_check.sh configures it, tests and
# Google Benchmark off: nothing but the trainer is built here; NCCL from the
# PyTorch environment's wheel when the system has none) and build only
# accrue_train_gpt2 with -j16 (--skip-build: use the build directory as it
# is); then bench/gpt2_dp_bench.py: at (B, K) = (8,4) and (4,8), accrue on 1
# GPU and on 2 (torchrun --standalone --no-python), PyTorch DDP on 2 GPUs and
# PyTorch on 1 (bench/torch_gpt2.py), the same 32 x 1024 tokens per GPU per
# window; tokens/s, the 2/1 and accrue/DDP ratios, the DDP reference figures
# from 2 x H200. A short summary with the table is printed LAST and written to
# <log dir>/summary.txt.
#
# NCCL_NVLS_ENABLE=0 is exported (NVLink multicast stays off on shared
# machines), and gpt2_dp_bench.py sets it again in every child's environment.
#
# Output, in the log dir ($OUT when set, else <build dir>/gpt2_dp_check_results):
#   summary.txt          the summary printed at the end (the tables included)
#   gpt2_dp_bench.md     bench/gpt2_dp_bench.py's tables
#   gpt2_dp_bench.json   every benchmark run, parsed (a list)
#   logs.tar.gz          every log: configure, build, each benchmark run
# The unpacked logs stay in <build dir>/gpt2_dp_check/.
#
# Exit status: 0 when the build and every accrue benchmark run succeeded (a
# failed PyTorch run is reported in the table, not failed), else 1.
set -u -o pipefail

usage() {
  cat <<'EOF'
usage: tools/gpt2_dp_check.sh [options]
  --build-dir DIR     build directory (default: build/gpu, the gpu preset's)
  --log-dir DIR       where the results go (default: $OUT when set, else
                      <build dir>/gpt2_dp_check_results)
  --jobs N            build parallelism (default: 16)
  --skip-build        use the build directory as it is (accrue_train_gpt2 must be built)
  --bench-args "..."  extra options for bench/gpt2_dp_bench.py (e.g. "--points 8x4",
                      "--timeout 240", "--skip-torch", "--warmup 2 --windows 5")
  -h, --help          this text
EOF
}

build_dir=build/gpu
log_dir=""
jobs=16
skip_build=0
bench_args=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --bench-args) bench_args="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpt2_dp_check: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
log_dir="${log_dir:-${OUT:-$build_dir/gpt2_dp_check_results}}"

if [[ ! -f CMakeLists.txt || ! -f accrue.h ]]; then
  echo "gpt2_dp_check: run me from the accrue repository root" >&2
  exit 2
fi

# NVLink multicast stays off on shared machines: a program that uses it can
# take the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

mkdir -p "$build_dir" "$log_dir"
build_dir=$(cd "$build_dir" && pwd)
log_dir=$(cd "$log_dir" && pwd)
details="$build_dir/gpt2_dp_check"
rm -rf "$details"
mkdir -p "$details"
start_time=$SECONDS
failed=0
summary=()  # lines of the final summary

say() { echo "[gpt2_dp_check $((SECONDS - start_time))s] $*"; }
# A line of the final summary, echoed as it happens too.
note() {
  summary+=("$*")
  say "$*"
}

# ---- the machine -------------------------------------------------------------
gpu_model="no nvidia-smi"
gpus=0
if command -v nvidia-smi > /dev/null; then
  gpu_model=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
    head -n 8 | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
  nvidia-smi > "$details/nvidia-smi.txt" 2>&1
  nvidia-smi topo -m > "$details/nvidia-smi-topo.txt" 2>&1
fi
say "GPUs: $gpus ($gpu_model)"
if [[ $gpus -lt 2 ]]; then note "only $gpus GPU(s) visible: the 2-GPU runs will fail"; fi
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2> /dev/null || echo "not importable")
say "PyTorch: $torch_version"

# ---- configure and build ------------------------------------------------------------
bin="$build_dir/examples/accrue_train_gpt2"
built=1
if [[ $skip_build -eq 0 ]]; then
  # As tools/gpt2_check.sh: the cuDNN frontend headers when they can be fetched
  # (else attention takes the composed path), the same preset and options, so
  # that both scripts benchmark one build. Bounded: without network pip may
  # retry for a while.
  timeout 90 tools/fetch_cudnn_frontend.sh > "$details/fetch_cudnn_frontend.log" 2>&1
  cmake_args=(--preset gpu -B "$build_dir" -DACCRUE_WERROR=OFF -DACCRUE_BUILD_BENCHMARKS=OFF
    -DACCRUE_BUILD_TESTS=OFF)
  for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    if [[ -n "$d" && -x "$d/bin/nvcc" ]]; then
      cmake_args+=(-DCMAKE_CUDA_COMPILER="$d/bin/nvcc")
      cuda_include="$d/include"
      break
    fi
  done
  # NCCL from the PyTorch environment's wheel when the system has none (as
  # tools/multi_gpu_check.sh finds it).
  if [[ ! -e /usr/include/nccl.h && ! -e "${cuda_include:-/nonexistent}/nccl.h" ]]; then
    nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2> /dev/null || true)
    if [[ -n "$nccl_root" ]]; then cmake_args+=(-DNCCL_ROOT="$nccl_root"); fi
  fi
  say "configure: cmake ${cmake_args[*]}"
  if ! cmake "${cmake_args[@]}" > "$details/configure.log" 2>&1; then
    failed=1
    built=0
    note "configure: FAILED (last lines of configure.log:)"
    while IFS= read -r line; do note "  $line"; done < <(tail -n 15 "$details/configure.log")
  elif ! grep -q 'accrue: NCCL communicator ON' "$details/configure.log"; then
    failed=1
    built=0
    note "configure: NCCL not found (accrue: NCCL communicator OFF): the trainer cannot run on 2 GPUs"
  else
    attention=$(grep -m 1 -E 'accrue: attention' "$details/configure.log" | sed 's/^-- //')
    nccl=$(grep -E '^NCCL_LIBRARY:' "$build_dir/CMakeCache.txt" | sed 's/.*=//')
    note "configure: ok (NCCL $nccl${attention:+; $attention})"
    build_cmd=(cmake --build "$build_dir" -j "$jobs" --target accrue_train_gpt2)
    say "build: ${build_cmd[*]}"
    build_start=$SECONDS
    if "${build_cmd[@]}" > "$details/build.log" 2>&1; then
      warnings=$(grep -c 'warning:' "$details/build.log" || true)
      note "build: ok in $((SECONDS - build_start)) s, $warnings compiler warning lines"
    else
      built=0
      failed=1
      note "build: FAILED (first errors of build.log:)"
      while IFS= read -r line; do note "  $line"; done < <(grep -m 10 -E 'error|FAILED' "$details/build.log")
    fi
  fi
fi
if [[ $built -eq 1 && ! -x $bin ]]; then
  built=0
  failed=1
  note "accrue_train_gpt2: not found at $bin (build it, or drop --skip-build)"
fi

# ---- the benchmark ----------------------------------------------------------------------
bench_table=""
if [[ $built -eq 1 ]]; then
  # shellcheck disable=SC2206  # --bench-args is a list of options, split on purpose
  extra=($bench_args)
  bench_cmd=(python3 bench/gpt2_dp_bench.py --accrue-bin "$bin"
    --out "$log_dir/gpt2_dp_bench.md" --json "$log_dir/gpt2_dp_bench.json"
    --log-dir "$details/bench" "${extra[@]}")
  say "bench: ${bench_cmd[*]}"
  bench_start=$SECONDS
  if "${bench_cmd[@]}" 2>&1 | tee "$details/gpt2_dp_bench.log"; then
    note "gpt2_dp_bench: ok in $((SECONDS - bench_start)) s"
  else
    failed=1
    note "gpt2_dp_bench: FAILED (an accrue run failed or the script did; see gpt2_dp_bench.log): $(tail -n 1 "$details/gpt2_dp_bench.log")"
  fi
  if [[ -s "$log_dir/gpt2_dp_bench.md" ]]; then bench_table=$(cat "$log_dir/gpt2_dp_bench.md"); fi
fi

# ---- summary (LAST) ----------------------------------------------------------------------
tar -C "$details" -czf "$log_dir/logs.tar.gz" . 2> /dev/null
{
  echo "===================== accrue gpt2_dp_check summary ====================="
  echo "GPUs: $gpus ($gpu_model); PyTorch $torch_version"
  if git rev-parse --verify -q HEAD > /dev/null 2>&1; then
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')"
  elif [[ -n "${ACCRUE_COMMIT:-}" ]]; then
    echo "commit: $ACCRUE_COMMIT (copied tree)"
  fi
  echo "time: $((SECONDS - start_time)) s; logs: $log_dir/logs.tar.gz (unpacked: $details)"
  for line in "${summary[@]}"; do echo "$line"; done
  if [[ -n "$bench_table" ]]; then
    echo
    echo "$bench_table"
  fi
  echo
  if [[ $failed -eq 0 ]]; then echo "gpt2_dp_check: PASSED"; else echo "gpt2_dp_check: FAILED"; fi
} > "$log_dir/summary.txt"
cat "$log_dir/summary.txt"
exit $failed
