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
check_name=gpt2_dp_check
# shellcheck source=tools/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

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

need_repo_root
no_nvlink_multicast
export PYTHONUNBUFFERED=1
make_dirs_absolute
open_details "$build_dir/gpt2_dp_check"

# ---- the machine -------------------------------------------------------------
look_at_gpus all
say "GPUs: $gpus ($gpu_model)"
if [[ $gpus -lt 2 ]]; then note "only $gpus GPU(s) visible: the 2-GPU runs will fail"; fi
torch_version=$(torch_version_or_not)
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
  add_nvcc
  add_nccl_root
  if ! configure; then
    built=0
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
    if run_build "${build_cmd[@]}"; then
      note "build: ok in $build_seconds s, $build_warnings compiler warning lines"
    else
      built=0
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
  run_trainer_bench gpt2_dp_bench "$bin" "$bench_args" live
fi

# ---- summary (LAST) ----------------------------------------------------------------------
# shellcheck disable=SC2317  # called by finish
write_summary() {
  summary_head "GPUs: $gpus ($gpu_model); PyTorch $torch_version"
  block "$bench_table"
  echo
  verdict
}
finish write_summary
