#!/usr/bin/env bash
# The one-call GPT-2 check: run it from the repo root on an H100/H200.
#
#   tools/gpt2_check.sh [options]
#
# Steps: configure (preset gpu: Release, sm_90, tests and benchmarks) and build
# the GPT-2 targets with -j16 (--build-all: everything); make the GPT-2 golden
# fixtures with PyTorch when tests/golden/fixtures/gpt2/ lacks them
# (tests/golden/make_gpt2_golden.py); ctest for the GPT-2 related binaries
# (label gpu: kernels, autograd, nn; label cpu: the same folders and data); the
# GPT-2 golden tests, run directly so that their comparisons (the per-window
# tables, the bf16 loss curves side by side) land in the summary;
# bench/gpt2_bench.py (accrue_train_gpt2 --bench beside PyTorch eager and
# torch.compile, the llm.c figures, the ncu time breakdown). A short summary is
# printed LAST and written to <log dir>/summary.txt.
#
# Output, in the log dir ($OUT when set, else <build dir>/gpt2_check_results):
#   summary.txt        the summary printed at the end (golden results and the tables)
#   gpt2_bench.md      bench/gpt2_bench.py's tables
#   gpt2_bench.json    every benchmark run, parsed (a list)
#   gpt2_fixtures/     the GPT-2 golden fixtures used (to commit under tests/golden/fixtures/gpt2)
#   logs.tar.gz        every log: configure, build, ctest, fixtures, golden tests, benchmark runs
# The unpacked logs stay in <build dir>/gpt2_check/.
#
# One call may be cut at ten minutes on a lent machine: split it, e.g.
#   tools/gpt2_check.sh --skip-bench
#   tools/gpt2_check.sh --skip-build --skip-tests --skip-golden
#
# Exit status: 0 when the build, every test and every accrue benchmark run
# succeeded (a benchmark target MISSed is reported, not failed), else 1.
set -u -o pipefail
check_name=gpt2_check
# shellcheck source=tools/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'EOF'
usage: tools/gpt2_check.sh [options]
  --build-dir DIR     build directory (default: build/gpu, the gpu preset's)
  --log-dir DIR       where the results go (default: $OUT when set, else
                      <build dir>/gpt2_check_results)
  --jobs N            build and cpu-test parallelism (default: 16)
  --werror            configure with -DACCRUE_WERROR=ON
  --build-all         build every target (Google Benchmark binaries included), not only
                      the GPT-2 ones (which need no Google Benchmark)
  --skip-build        use the build directory as it is
  --skip-tests        no ctest
  --skip-golden       no fixtures, no golden tests
  --regen-fixtures    remake the GPT-2 golden fixtures even when present
  --skip-bench        no benchmarks
  --bench-args "..."  extra options for bench/gpt2_bench.py (e.g. "--skip-ncu",
                      "--points 32x1,1x32 --compile-points ''", "--d48 4")
  --deps DIR          unpack the .deb files in DIR (libgtest-dev, ...) into the build dir
                      and add them to CMAKE_PREFIX_PATH, as tools/gpu_check.sh does
  -h, --help          this text
EOF
}

build_dir=build/gpu
log_dir=""
jobs=16
werror=OFF
build_all=0
skip_build=0
skip_tests=0
skip_golden=0
regen_fixtures=0
skip_bench=0
bench_args=""
deps_dir=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --werror) werror=ON; shift ;;
    --build-all) build_all=1; shift ;;
    --skip-build) skip_build=1; shift ;;
    --skip-tests) skip_tests=1; shift ;;
    --skip-golden) skip_golden=1; shift ;;
    --regen-fixtures) regen_fixtures=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --bench-args) bench_args="$2"; shift 2 ;;
    --deps) deps_dir="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpt2_check: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
log_dir="${log_dir:-${OUT:-$build_dir/gpt2_check_results}}"

need_repo_root
export PYTHONUNBUFFERED=1
make_dirs_absolute
open_details "$build_dir/gpt2_check"

# The GPT-2 related test binaries (ctest names) and the targets to build.
gpu_tests=(test_kernels_gpu test_autograd_gpu test_nn_gpu)
cpu_tests=(test_kernels_cpu test_autograd_cpu test_nn_cpu test_data_cpu)
golden_bins=(test_golden_cpu test_golden_gpu)
targets=("${gpu_tests[@]}" "${cpu_tests[@]}" "${golden_bins[@]}" accrue_train_gpt2)

# ---- the machine -------------------------------------------------------------
look_at_gpus one
say "GPU: $gpu_model"
torch_version=$(torch_version_or_not)
say "PyTorch: $torch_version"

# ---- configure and build ------------------------------------------------------------
built=1
if [[ $skip_build -eq 0 ]]; then
  # The cuDNN frontend headers, when they can be fetched (else attention takes the composed path).
  tools/fetch_cudnn_frontend.sh > "$details/fetch_cudnn_frontend.log" 2>&1
  cmake_args=(--preset gpu -B "$build_dir" -DACCRUE_WERROR="$werror")
  if [[ $build_all -eq 0 ]]; then cmake_args+=(-DACCRUE_BUILD_BENCHMARKS=OFF); fi
  add_nvcc
  if [[ -n "$deps_dir" ]]; then add_deps "$deps_dir"; fi
  if ! configure; then
    built=0
  else
    attention=$(grep -m 1 -E 'accrue: attention' "$details/configure.log" | sed 's/^-- //')
    note "configure: ok${attention:+ ($attention)}"
    build_cmd=(cmake --build "$build_dir" -j "$jobs")
    if [[ $build_all -eq 0 ]]; then build_cmd+=(--target "${targets[@]}"); fi
    say "build: ${build_cmd[*]}"
    if run_build "${build_cmd[@]}"; then
      note "build: ok in $build_seconds s, $build_warnings compiler warning lines"
    else
      built=0
    fi
  fi
fi

# ---- golden fixtures ------------------------------------------------------------------
fixtures=tests/golden/fixtures/gpt2
if [[ $skip_golden -eq 0 ]]; then
  if [[ $regen_fixtures -eq 1 || ! -f $fixtures/cuda_bf16.safetensors ]]; then
    say "fixtures: python3 tests/golden/make_gpt2_golden.py --out $fixtures"
    if python3 tests/golden/make_gpt2_golden.py --out "$fixtures" > "$details/fixtures.log" 2>&1; then
      note "fixtures: made in $fixtures ($(du -sh "$fixtures" | cut -f1))"
      note_each "  " < <(sed -n '/^summary:/,$p' "$details/fixtures.log" | tail -n +2)
    else
      failed=1
      note "fixtures: FAILED (last lines of fixtures.log:)"
      note_each "  " < <(tail -n 8 "$details/fixtures.log")
    fi
  else
    note "fixtures: present in $fixtures"
  fi
  if [[ -d $fixtures ]]; then
    rm -rf "$log_dir/gpt2_fixtures"
    cp -r "$fixtures" "$log_dir/gpt2_fixtures"
  fi
fi

# ---- tests ----------------------------------------------------------------------------
# Prints "passed/total" for one label and set of tests; leaves the log in ctest_<label>.log.
run_ctest() {
  local label="$1" parallel="$2" regex="$3"
  ctest --test-dir "$build_dir" -L "^${label}\$" -R "$regex" -j "$parallel" --timeout 600 \
    --output-on-failure > "$details/ctest_${label}.log" 2>&1
  local rc=$?
  local line
  line=$(ctest_passed_line "$details/ctest_${label}.log")
  if [[ -z "$line" ]]; then
    note "ctest -L $label: FAILED to run (see ctest_${label}.log)"
    return 1
  fi
  note "ctest -L $label ($regex): $line"
  note_failed_tests "$details/ctest_${label}.log"
  return $rc
}
# A name, or its gtest shards' entries (name_shard_<i>, tests/CMakeLists.txt).
regex_of() { local IFS='|'; echo "^($*)(_shard_[0-9]+)?\$"; }

if [[ $built -eq 1 && $skip_tests -eq 0 ]]; then
  # GPU tests four at a time on one device, as tools/gpu_check.sh runs them.
  say "ctest -L gpu -j 4"
  run_ctest gpu 4 "$(regex_of "${gpu_tests[@]}")" || failed=1
  say "ctest -L cpu"
  run_ctest cpu "$jobs" "$(regex_of "${cpu_tests[@]}")" || failed=1
fi

# ---- golden tests -----------------------------------------------------------------------
# Run directly: their [gpt2 golden] lines are the comparison with PyTorch.
golden_lines=()
run_golden() {
  local name="$1" bin="$2" filter="$3"
  local log="$details/golden_${name}.log"
  if [[ ! -x $bin ]]; then
    failed=1
    note "golden $name: FAILED ($bin not built)"
    return
  fi
  say "golden $name: $bin --gtest_filter=$filter"
  "$bin" --gtest_filter="$filter" > "$log" 2>&1
  local rc=$?
  local result
  result=$(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ tests?|^\[  SKIPPED \] [0-9]+ tests?' "$log" |
    sed -E 's/^\[ *([A-Z]+) *\] ([0-9]+) tests?.*/\2 \1/' | paste -sd ',' -)
  if [[ $rc -eq 0 ]]; then
    note "golden $name: ok (${result:-no gtest summary})"
  else
    failed=1
    note "golden $name: FAILED exit $rc (${result:-no gtest summary})"
    note_each "    " < <(grep -m 6 -E 'Failure|error|Expected|Which is' "$log")
  fi
  while IFS= read -r line; do golden_lines+=("$line"); done < <(grep -E '^\[gpt2 golden\]' "$log")
  # Why a test skipped (no GPU, no fixtures): the line after gtest's "Skipped".
  note_each "    skipped: " < <(grep -A1 -E ': Skipped$' "$log" | grep -vE ': Skipped$|^--$' | sort -u)
}
if [[ $built -eq 1 && $skip_golden -eq 0 ]]; then
  run_golden cpu "$build_dir/tests/golden/test_golden_cpu" 'Gpt2GoldenCpu.*:Gpt2FixtureCpu.*'
  run_golden gpu "$build_dir/tests/golden/test_golden_gpu" '*'
fi

# ---- benchmarks -------------------------------------------------------------------------
bench_table=""
if [[ $built -eq 1 && $skip_bench -eq 0 ]]; then
  run_trainer_bench gpt2_bench "$build_dir/examples/accrue_train_gpt2" "$bench_args" quiet
fi

# ---- summary (LAST) ----------------------------------------------------------------------
# shellcheck disable=SC2317  # called by finish
write_summary() {
  summary_head "GPU: $gpu_model; PyTorch $torch_version"
  block "$(printf '%s\n' "${golden_lines[@]}")"
  block "$bench_table"
  echo
  verdict
}
finish write_summary
