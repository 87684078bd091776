#!/usr/bin/env bash
# The one-call GPU check: run it from the repo root on a GPU machine.
#
#   tools/gpu_check.sh [options]
#
# Steps: configure (Release, CUDA, tests and benchmarks on) and build with all
# cores; ctest for the labels gpu and cpu; compute-sanitizer memcheck,
# racecheck, initcheck and synccheck on every gpu test binary
# (ACCRUE_TEST_ALLOCATOR=plain, so each allocation is its own cudaMalloc and
# out-of-bounds accesses are seen; ACCRUE_UNDER_SANITIZER=1, so tests that
# provoke a CUDA API error on purpose skip), with no time limit;
# accrue_bench, bench/torch_bench.py, bench/torch_accumulation.py and
# bench/compare.py. A short summary is printed LAST and written to
# <log dir>/summary.txt.
#
# Output, seven files (few enough for a remote run to return them all), in the
# log dir: $OUT when set, else <build dir>/gpu_check_results:
#   <log dir>/summary.txt       the summary printed at the end
#   <log dir>/comparison.md     accrue vs PyTorch, markdown (bench/compare.py)
#   <log dir>/results_rows.md   the same rows in bench/RESULTS.md's format
#   <log dir>/bench.json        Google Benchmark JSON (medians of repetitions)
#   <log dir>/torch_bench.json  bench/torch_bench.py JSON
#   <log dir>/torch_accumulation.json  bench/torch_accumulation.py JSON (window close, wgrad)
#   <log dir>/logs.tar.gz       every log: configure, build, ctest, sanitizers, benches
# The unpacked logs stay in <build dir>/gpu_check/.
#
# A GPU machine without GoogleTest or Google Benchmark: on a machine with apt,
#   mkdir .deps && (cd .deps && apt-get download libgtest-dev libbenchmark-dev libbenchmark1debian)
# (keep .deps out of git: echo /.deps/ >> .git/info/exclude), bring .deps
# along, and run tools/gpu_check.sh --deps .deps.
#
# Exit status: 0 when the build, every test and every sanitizer run passed
# (a sanitizer run that prints no summary line fails), else 1.
#
# A lent machine may cut one call at ten minutes. Run the check under a
# shorter `timeout` (timeout -k 10 540 tools/gpu_check.sh ...): cut short, it
# still packs its logs and writes its summary (Note [Cut short], tools/lib.sh).
# To fit the steps in, split the sanitizer runs
# over calls with --sanitizer-binaries and --sanitizer-tools, e.g.
#   tools/gpu_check.sh --skip-tests --skip-bench --sanitizer-binaries 'test_kernels_gpu'
#   tools/gpu_check.sh --skip-tests --skip-bench --sanitizer-binaries '(autograd|nn|golden)'
# and split a slow binary into gtest shards, some per call, each run bounded:
#   tools/gpu_check.sh --skip-tests --skip-bench --sanitizer-tools initcheck \
#     --sanitizer-binaries test_optim_gpu --sanitizer-shards 8 --sanitizer-shard 0,1,2,3 \
#     --sanitizer-timeout 120
# On a machine of several GPUs the runs go to a pool, one per GPU by default
# (Note [Sanitizer pool]): every tool over every binary, the slow ones in
# shards, three runs per GPU:
#   tools/gpu_check.sh --skip-tests --skip-bench --sanitizer-jobs 12 --sanitizer-timeout 300 \
#     --sanitizer-shards 1,kernels=24,nn=6,optim=8,equivalence=3,golden=2
# (on 4 x H200 each of those runs took under 250 s; bench/RESULTS.md).
set -u -o pipefail
check_name=gpu_check
# shellcheck source=tools/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'EOF'
usage: tools/gpu_check.sh [options]
  --build-dir DIR          build directory (default: build-gpu)
  --log-dir DIR            where the results go (default: $OUT when set, else
                           <build dir>/gpu_check_results)
  --details-dir DIR        where the unpacked logs go (default: <build dir>/gpu_check); two
                           checks sharing a build at once each need their own
  --arch ARCH              CMAKE_CUDA_ARCHITECTURES (default: 90)
  --werror                 configure with -DACCRUE_WERROR=ON
  --jobs N                 build and cpu-test parallelism (default: nproc)
  --gpu-test-jobs N        gpu tests at once on the one device (default 4; the kernel
                           tests come as gtest shards, tests/CMakeLists.txt)
  --filter GTEST_FILTER    gtest filter for both sanitizer tools (default: *:-*out_of_memory*)
  --racecheck-filter F     gtest filter for racecheck only (default: --filter less the two
                           cuDNN convolution tests, Note [Sanitizer exclusions])
  --initcheck-filter F     gtest filter for initcheck only (default: --filter less the
                           engine-policy convolution test, Note [Sanitizer exclusions])
  --sanitizer-tools LIST   comma-separated compute-sanitizer tools
                           (default: memcheck,racecheck,initcheck,synccheck)
  --sanitizer-binaries RE  only the gpu test binaries whose name matches this
                           extended regex (default: all of them)
  --sanitizer-shards SPEC  split each binary's tests into N gtest shards, one sanitizer run
                           each (default 1), so that slow binaries fit a lent machine's call;
                           SPEC is N, or N,RE=M,... for M shards of the binaries matching RE
                           (the first RE that matches), e.g. 1,kernels=12,nn=6
  --sanitizer-shard LIST   run only these shard indices, comma-separated, 0-based (default
                           all; an index past a binary's shard count skips it): the rest go
                           in another call
  --sanitizer-timeout S    time limit of each sanitizer run in seconds; a run that reaches
                           it FAILS the check (default: none)
  --sanitizer-gpus LIST    the GPUs the sanitizer runs use, comma-separated indices
                           (default: every GPU nvidia-smi lists)
  --sanitizer-jobs N       sanitizer runs at once, slot s on the s-th of those GPUs modulo
                           their count (default: one per GPU)
  --bench-filter REGEX     --benchmark_filter for accrue_bench and --filter for the PyTorch
                           scripts (e.g. 'window_close|wgrad' for the accumulation benches)
  --bench-repetitions N    repetitions per benchmark, medians reported (default: 5)
  --bench-shard I/N        only shard I of N (1-based) of the benchmarks --bench-filter
                           selects: every N-th of accrue_bench's list from the I-th, with
                           their PyTorch rows. The whole suite (over 400 benchmarks, about 20
                           minutes on an H200) does not fit one call of a lent machine;
                           shards run in separate calls, or at once on separate GPUs
                           (CUDA_VISIBLE_DEVICES, and a --log-dir and --details-dir each)
  --skip-build             use the build directory as it is: no configure, no build
  --skip-tests             no ctest
  --skip-cpu-tests         ctest -L gpu only (CI runs the cpu label; on a lent machine
                           its minute goes to the GPU steps)
  --skip-sanitizer         no compute-sanitizer runs
  --skip-bench             no benchmarks (also configures with ACCRUE_BUILD_BENCHMARKS=OFF)
  --skip-torch             benchmarks without the PyTorch side
  --deps DIR               unpack the .deb files in DIR (e.g. libgtest-dev, libbenchmark-dev,
                           libbenchmark1debian, from `apt-get download` on a machine that has
                           apt) into the build dir and add them to CMAKE_PREFIX_PATH, for a
                           GPU machine without those packages
  --python-wheels DIR      also build the Python module (pip install ., no network: the build
                           requirements as wheels in DIR, docs/TESTING.md) and run its pytest
                           suite with the system's numpy and torch
  -h, --help               this text
EOF
}

build_dir=build-gpu
log_dir=""
details_dir=""
arch=90
werror=OFF
jobs=$(nproc)
# Note [Sanitizer exclusions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# *out_of_memory* asks the driver for 256 TiB on purpose to test the error
# message; compute-sanitizer reports that failed cudaMalloc as an API error.
# racecheck reports shared-memory hazards inside the closed-source library
# kernels (cuDNN's generated flash attention, cudnn_generated_*_sdpa_*; cuBLAS's
# nvjet_* and cutlass/xmma GEMMs) that accrue's code cannot cause or fix. They
# are not excluded by name (--kernel-name-exclude makes compute-sanitizer 2025
# fail the next cuBLAS launch with "failed to handle a hardware exception", as
# measured on an H200); instead every kernel runs under racecheck and each
# reported hazard is classified: one whose two accesses are both in a library
# kernel is counted and listed in the summary, any other fails the check.
# --print-limit 0 makes every hazard printed, so every one is classified (the
# other tools print their first 100 errors; their summary counts them all).
# initcheck does not see the stores of bf16 cuBLASLt GEMMs and cuDNN graphs,
# so its runs set ACCRUE_INITCHECK_LIBRARY_OUTPUTS=1, see
# Note [Library outputs under initcheck] in core/cuda_runtime.h. synccheck tracks too few
# cuda::barrier objects by default for cuDNN's attention kernels (it warns of
# an overflow, then the launch fails), so it runs with --num-cuda-barriers 1024;
# it then reports "Divergent thread(s) in block" inside cuDNN's flash-attention
# backward (cudnn_generated_*_sdpa_*_bprop_*) and aborts that kernel, and every
# later test of the process fails (4 x H200, bench/RESULTS.md). So synccheck
# runs with ACCRUE_ATTENTION_COMPOSED=1 (Note [Attention paths] in
# kernels/attention.cpp): attention takes accrue's composed path, which
# synccheck then checks, and cuDNN's flash kernels, like any library kernel's
# barrier errors, are not accrue's to fix. A synccheck error that still lies
# wholly in a library kernel is counted apart as racecheck's library hazards
# are; any error in another kernel fails. racecheck runs with the same
# variable: under it cuDNN's flash-attention forward printed hazards (all in
# the library) for over 300 s in one golden test, which then never finished
# (4 x H100, bench/RESULTS.md); the composed path puts accrue's own softmax and
# GEMM glue under racecheck instead.
# racecheck also leaves out the two tests of cuDNN's convolutions
# (GpuConv.conv2d_and_its_gradients_*, GpuConv.cudnn_convolutions_*): inside
# cuDNN's convolution kernels racecheck ran past 470 s per test (H200; 1.5 s
# under memcheck), and the accrue kernels those tests run (random fill,
# copies, axpy) use no shared memory, the only memory racecheck checks; the
# other three tools run them. Every one of accrue's own shared-memory kernels
# stays under racecheck.
# initcheck leaves out GpuConv.cudnn_convolutions_match_the_cpu_reference_under_every_engine_policy:
# its timed policy runs every candidate cuDNN plan of every key up to 100
# times, and under initcheck it ran past 270 s (H200, bench/RESULTS.md; 14 s
# under memcheck). The accrue kernels it runs are those of
# GpuConv.cudnn_convolutions_in_both_layouts_match_the_cpu_reference, which
# initcheck runs; memcheck and synccheck run it. Every other kernel of every
# test stays under the other three tools.
filter='*:-*out_of_memory*'
racecheck_filter=''
initcheck_filter=''
sanitizer_tools=memcheck,racecheck,initcheck,synccheck
sanitizer_binaries=''
sanitizer_shards=1
sanitizer_shard_list=''
sanitizer_timeout=''
sanitizer_jobs=''
sanitizer_gpus=''
bench_filter=''
bench_repetitions=5
bench_shard=""
skip_build=0
skip_tests=0
skip_cpu_tests=0
gpu_test_jobs=4
skip_sanitizer=0
skip_bench=0
skip_torch=0
deps_dir=''
python_wheels=''

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --details-dir) details_dir="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --werror) werror=ON; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --gpu-test-jobs) gpu_test_jobs="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --racecheck-filter) racecheck_filter="$2"; shift 2 ;;
    --initcheck-filter) initcheck_filter="$2"; shift 2 ;;
    --sanitizer-tools) sanitizer_tools="$2"; shift 2 ;;
    --sanitizer-binaries) sanitizer_binaries="$2"; shift 2 ;;
    --sanitizer-shards) sanitizer_shards="$2"; shift 2 ;;
    --sanitizer-shard) sanitizer_shard_list="$2"; shift 2 ;;
    --sanitizer-timeout) sanitizer_timeout="$2"; shift 2 ;;
    --sanitizer-jobs) sanitizer_jobs="$2"; shift 2 ;;
    --sanitizer-gpus) sanitizer_gpus="$2"; shift 2 ;;
    --bench-filter) bench_filter="$2"; shift 2 ;;
    --bench-repetitions) bench_repetitions="$2"; shift 2 ;;
    --bench-shard) bench_shard="$2"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --skip-tests) skip_tests=1; shift ;;
    --skip-cpu-tests) skip_cpu_tests=1; shift ;;
    --skip-sanitizer) skip_sanitizer=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --skip-torch) skip_torch=1; shift ;;
    --deps) deps_dir="$2"; shift 2 ;;
    --python-wheels) python_wheels="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
# --filter with more tests left out (gtest: positive patterns, then -negative ones).
filter_less() {
  if [[ $filter == *-* ]]; then echo "$filter:$1"; else echo "$filter:-$1"; fi
}
if [[ -z "$racecheck_filter" ]]; then  # Note [Sanitizer exclusions]
  racecheck_filter=$(filter_less 'GpuConv.conv2d_and_its_gradients_*:GpuConv.cudnn_convolutions_*')
fi
if [[ -z "$initcheck_filter" ]]; then  # Note [Sanitizer exclusions]
  initcheck_filter=$(filter_less 'GpuConv.cudnn_convolutions_match_the_cpu_reference_under_every_engine_policy')
fi
# --sanitizer-shards N[,RE=M...]: the default count, then per-binary ones.
IFS=',' read -r -a shard_spec <<< "$sanitizer_shards"
default_shards="${shard_spec[0]:-}"
shard_res=()
shard_counts=()
for item in "${shard_spec[@]:1}"; do
  shard_res+=("${item%=*}")
  shard_counts+=("${item##*=}")
  [[ $item == *=* ]] || shard_counts[-1]=x
done
for n in "$default_shards" "${shard_counts[@]}"; do
  if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_check: --sanitizer-shards takes N or N,REGEX=M,... with positive counts, got '$sanitizer_shards'" >&2
    exit 2
  fi
done
# The shard count of a binary (its base name).
shards_for() {
  local i
  for i in "${!shard_res[@]}"; do
    if [[ $1 =~ ${shard_res[$i]} ]]; then
      echo "${shard_counts[$i]}"
      return
    fi
  done
  echo "$default_shards"
}
if [[ -n "$sanitizer_gpus" ]] && ! [[ $sanitizer_gpus =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  echo "gpu_check: --sanitizer-gpus takes comma-separated GPU indices, got '$sanitizer_gpus'" >&2
  exit 2
fi
if [[ -n "$sanitizer_timeout" ]] && ! [[ $sanitizer_timeout =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check: --sanitizer-timeout takes a positive number of seconds, got '$sanitizer_timeout'" >&2
  exit 2
fi
if ! [[ $gpu_test_jobs =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check: --gpu-test-jobs takes a positive integer, got '$gpu_test_jobs'" >&2
  exit 2
fi
if [[ -n "$sanitizer_jobs" ]] && ! [[ $sanitizer_jobs =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check: --sanitizer-jobs takes a positive integer, got '$sanitizer_jobs'" >&2
  exit 2
fi
bench_shard_index=0
bench_shard_count=0
if [[ -n "$bench_shard" ]]; then
  if ! [[ $bench_shard =~ ^([1-9][0-9]*)/([1-9][0-9]*)$ ]] ||
    ((BASH_REMATCH[1] > BASH_REMATCH[2])); then
    echo "gpu_check: --bench-shard takes I/N with 1 <= I <= N (e.g. 2/3), got '$bench_shard'" >&2
    exit 2
  fi
  bench_shard_index=${BASH_REMATCH[1]}
  bench_shard_count=${BASH_REMATCH[2]}
fi
shard_indices=()  # empty: every shard of every binary
if [[ -n "$sanitizer_shard_list" ]]; then
  IFS=',' read -r -a shard_indices <<< "$sanitizer_shard_list"
  for i in "${shard_indices[@]}"; do
    if ! [[ $i =~ ^[0-9]+$ ]]; then
      echo "gpu_check: --sanitizer-shard $sanitizer_shard_list: '$i' is not a shard index" >&2
      exit 2
    fi
  done
fi
log_dir="${log_dir:-${OUT:-$build_dir/gpu_check_results}}"

need_repo_root
no_nvlink_multicast
export PYTHONUNBUFFERED=1

make_dirs_absolute
details="${details_dir:-$build_dir/gpu_check}"
# It is emptied first: never a source tree or a build directory.
if [[ -e "$details/CMakeLists.txt" || -e "$details/CMakeCache.txt" ]]; then
  echo "gpu_check: --details-dir $details holds a source tree or a build; give an empty folder" >&2
  exit 2
fi
open_details "$details"

# ---- the machine -------------------------------------------------------------
look_at_gpus one
say "GPU: $gpu_model"

cmake_args=(-S . -B "$build_dir" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_CUDA_ARCHITECTURES="$arch"
  -DACCRUE_CUDA=ON
  -DACCRUE_BUILD_TESTS=ON
  -DACCRUE_WERROR="$werror")
add_nvcc
sanitizer=$(command -v compute-sanitizer || true)
if [[ -z "$sanitizer" && -n "$cuda_bin" ]]; then
  for s in "$cuda_bin/compute-sanitizer" "$cuda_bin/../compute-sanitizer/compute-sanitizer"; do
    if [[ -x "$s" ]]; then sanitizer="$s"; break; fi
  done
fi

# ---- configure ------------------------------------------------------------------
if [[ $skip_bench -eq 1 ]]; then
  cmake_args+=(-DACCRUE_BUILD_BENCHMARKS=OFF)
else
  cmake_args+=(-DACCRUE_BUILD_BENCHMARKS=ON)
fi
if [[ -n "$deps_dir" ]]; then
  add_deps "$deps_dir"
  say "unpacked $deps_unpacked packages from $deps_dir into $deps_root"
fi
add_nccl_root

if [[ $skip_build -eq 1 ]]; then
  built=1
  note "build: skipped (--skip-build: $build_dir as it is)"
elif ! configure; then
  built=0
else
  found=$(grep -E '^(NCCL|CUDNN)_LIBRARY:' "$build_dir/CMakeCache.txt" | sed 's/:FILEPATH=/ /' |
    paste -sd ';' -)
  note "configure: ok (${found:-no NCCL/CUDNN entries in the cache})"
  # ---- build --------------------------------------------------------------------
  say "build: ninja -j$jobs"
  if run_build ninja -C "$build_dir" -j"$jobs"; then
    built=1
    note "build: ok in $build_seconds s, $build_warnings compiler warning lines"
  else
    built=0
  fi
fi

# ---- tests ------------------------------------------------------------------------
# Prints "passed/total" for one label and leaves the log in ctest_<label>.log.
run_ctest() {
  local label="$1" parallel="$2"
  ctest --test-dir "$build_dir" -L "^${label}\$" -j "$parallel" --timeout 600 \
    --output-on-failure --output-junit "$details/ctest_${label}.xml" \
    > "$details/ctest_${label}.log" 2>&1
  local rc=$?
  local line
  line=$(ctest_passed_line "$details/ctest_${label}.log")
  if [[ -z "$line" ]]; then
    if grep -q 'No tests were found' "$details/ctest_${label}.log"; then
      note "ctest -L $label: no tests"
      return 0
    fi
    note "ctest -L $label: FAILED to run (see ctest_${label}.log)"
    return 1
  fi
  local skipped
  skipped=$(ctest_skipped "$details/ctest_${label}.log")
  note "ctest -L $label: $line$([[ ${skipped:-0} -gt 0 ]] && echo " ($skipped SKIPPED)")"
  note_failed_tests "$details/ctest_${label}.log"
  return $rc
}

if [[ $built -eq 1 && $skip_tests -eq 0 ]]; then
  # GPU tests a few at a time on one device: none times itself against a
  # target, and the largest needs a few GB. The kernel tests' shards
  # (tests/CMakeLists.txt) are what makes this pay: one process of them ran
  # past 275 s.
  say "ctest -L gpu -j $gpu_test_jobs"
  run_ctest gpu "$gpu_test_jobs" || failed=1
  if [[ $skip_cpu_tests -eq 0 ]]; then
    say "ctest -L cpu"
    run_ctest cpu "$jobs" || failed=1
  else
    note "ctest -L cpu: skipped (--skip-cpu-tests)"
  fi
fi

# ---- compute-sanitizer -----------------------------------------------------------
# Note [Sanitizer runs]
# ~~~~~~~~~~~~~~~~~~~~~
# Each selected gpu test binary runs under every selected tool (memcheck:
# out-of-bounds and misaligned accesses, leaks; racecheck: shared-memory
# hazards; initcheck: reads of device memory never written; synccheck: invalid
# barrier use), with the plain cudaMalloc allocator so that every tensor is its
# own allocation. A run has no time limit unless --sanitizer-timeout sets one,
# and a run that reaches it fails: a run cut short would pass code it never
# reached. --sanitizer-shards splits a binary's tests with gtest's own
# sharding (GTEST_TOTAL_SHARDS, GTEST_SHARD_INDEX), so a slow binary runs in
# pieces, over several calls with --sanitizer-shard; together the shards run
# every test once. A run passes only when it exits 0 AND prints its summary line
# (ERROR SUMMARY; racecheck's is RACECHECK SUMMARY); anything else (a crash, a
# kill, a missing summary) fails the check. Note [Sanitizer exclusions] says
# what racecheck leaves out. The gpu label also holds the trainer's scenario
# tests, which ctest runs through `cmake -P`; only the test_* binaries are
# sanitized (each once).

# One sanitizer run: tool, binary, shard index (-1: unsharded), shard count,
# gtest filter, GPU; writes its verdict to $details/result_<id>.txt: "0" or "1" (failed),
# then the summary lines. Runs in a subshell of the pool below.
sanitize_one() {
  local id="$1" tool="$2" bin="$3" shard="$4" shards="$5" tool_filter="$6" gpu="$7"
  local name shard_env=() log limit=() run_start rc result tests took
  name=$(basename "$bin")
  if ((shard >= 0)); then
    name="$name[shard $shard/$shards]"
    shard_env=(GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$shard")
  fi
  log="$details/sanitizer_${tool}_$(basename "$bin")_$( ((shard >= 0)) && echo "$shard" || echo all).log"
  say "$tool $name on GPU $gpu --gtest_filter=$tool_filter"
  run_start=$SECONDS
  if [[ -n "$sanitizer_timeout" ]]; then limit=(timeout -k 10 "$sanitizer_timeout"); fi
  # Note [Sanitizer exclusions]: what each tool needs beyond the defaults.
  local tool_env=() tool_args=(--print-limit 100)
  case $tool in
    racecheck)
      tool_args=(--print-limit 0) # every hazard printed, so every one is classified
      tool_env=(ACCRUE_ATTENTION_COMPOSED=1)
      ;;
    initcheck) tool_env=(ACCRUE_INITCHECK_LIBRARY_OUTPUTS=1) ;;
    synccheck)
      tool_args=(--print-limit 0 --num-cuda-barriers 1024)
      tool_env=(ACCRUE_ATTENTION_COMPOSED=1)
      ;;
  esac
  env CUDA_VISIBLE_DEVICES="$gpu" ACCRUE_TEST_ALLOCATOR=plain ACCRUE_UNDER_SANITIZER=1 \
    "${tool_env[@]}" "${shard_env[@]}" "${limit[@]}" \
    "$sanitizer" --tool "$tool" "${tool_args[@]}" --error-exitcode 86 \
    "$bin" --gtest_filter="$tool_filter" > "$log" 2>&1
  rc=$?
  result=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')
  # A run cut at the time limit fails, whatever it printed: it never reached the rest.
  if [[ -n "$sanitizer_timeout" ]] && ((rc == 124 || rc == 137)); then
    result="TIMEOUT after $sanitizer_timeout s"
  fi
  tests=$(grep -E '^\[  PASSED  \]' "$log" | tail -n 1 | sed 's/^\[  PASSED  \] *//')
  took="$((SECONDS - run_start)) s"
  # A shard of a binary with fewer tests than shards runs none, and the
  # sanitizer fails a program that never touched the GPU; nothing was skipped.
  if grep -q '^\[==========\] 0 tests from 0 test suites ran' "$log" &&
    grep -q 'terminated before first instrumented API call' "$log"; then
    rc=0
    result="an empty shard (0 tests)"
  fi
  # racecheck and synccheck: hazards and barrier errors that lie wholly in
  # library kernels do not fail the run (Note [Sanitizer exclusions]); count
  # them apart.
  local library_hazards=0 own_hazards=0
  if [[ ($tool == racecheck || $tool == synccheck) && $rc -eq 86 && -n "$result" ]]; then
    read -r library_hazards own_hazards < <(python3 - "$log" "$tool" << 'PY'
import re, sys
# A library kernel's name holds one of these and is not in namespace accrue.
library = re.compile(r"(nvjet|cutlass|xmma|cublas|cudnn|sdpa|nchwToNhwc|nhwcToNchw|splitKreduce)")
def in_library(location):
    return bool(library.search(location)) and "accrue::" not in location
lines = open(sys.argv[1], errors="replace").read().splitlines()
lib = own = 0
for i, line in enumerate(lines):
    if sys.argv[2] == "racecheck":
        # A hazard: both of its accesses must lie in library kernels.
        m = re.match(r"=+ (Error|Warning): Race reported between \w+ access at (.*)", line)
        if not m:
            continue
        other = re.match(r"=+\s+and \w+ access at (.*)", lines[i + 1] if i + 1 < len(lines) else "")
        inside = in_library(m.group(2)) and other and in_library(other.group(1))
    else:
        # A synccheck error: its header, then the kernel it happened in.
        if not re.match(r"=+ (Barrier error|Invalid|Error)", line):
            continue
        at = next((re.match(r"=+\s+at (.*)", l) for l in lines[i + 1:i + 4]
                   if re.match(r"=+\s+at ", l)), None)
        inside = at is not None and in_library(at.group(1))
    if inside:
        lib += 1
    else:
        own += 1
print(lib, own)
PY
    )
    # The tests themselves must still have passed.
    if [[ $own_hazards -eq 0 && $library_hazards -gt 0 && -n "$tests" ]] &&
      ! grep -q '^\[  FAILED  \]' "$log"; then
      rc=0
      result="$result; all $library_hazards in library kernels (Note [Sanitizer exclusions])"
    fi
  fi
  {
    if [[ $rc -eq 0 && -n "$result" ]]; then
      echo 0
      echo "$tool $name: $result ($took; ${tests:-no PASSED line})"
    else
      echo 1
      echo "$tool $name: FAILED exit $rc ($took): ${result:-no summary line}"
      grep -m 3 -E '^========= (Invalid|Race|Error|Program hit|Uninitialized|Barrier|Internal)' "$log" |
        sed 's/^/    /'
    fi
  } > "$details/result_$id.txt"
  say "$(sed -n 2p "$details/result_$id.txt")"
}

if [[ $built -eq 1 && $skip_sanitizer -eq 0 ]]; then
  if [[ -z "$sanitizer" ]]; then
    failed=1
    note "compute-sanitizer: NOT FOUND (failed)"
  else
    mapfile -t gpu_bins < <(ctest --test-dir "$build_dir" -N -L '^gpu$' --show-only=json-v1 2> /dev/null |
      python3 -c 'import json,sys,os; cmds=[t["command"][0] for t in json.load(sys.stdin).get("tests",[]) if t.get("command")]; [print(c) for c in dict.fromkeys(cmds) if os.path.basename(c).startswith("test_")]')
    selected=()
    for bin in "${gpu_bins[@]}"; do
      if [[ -z "$sanitizer_binaries" ]] || [[ $(basename "$bin") =~ $sanitizer_binaries ]]; then
        selected+=("$bin")
      fi
    done
    if [[ ${#selected[@]} -eq 0 ]]; then
      failed=1
      note "compute-sanitizer: no gpu test binaries selected (failed)"
    fi
    # Note [Sanitizer pool]
    # ~~~~~~~~~~~~~~~~~~~~~
    # Every (tool, binary, shard) is one run; the runs go to a pool of
    # --sanitizer-jobs slots, slot s pinned to GPU s mod GPUs (of --sanitizer-gpus) through
    # CUDA_VISIBLE_DEVICES, so a machine of several GPUs sanitizes in parallel
    # what one GPU would take a quarter hour or more to do. The heavy runs
    # (racecheck and initcheck of the kernel and nn binaries) start first. Each
    # run reports into its own file; the summary lists them in the order they
    # were queued, so it reads the same however the pool interleaved them.
    if [[ -n "$sanitizer_gpus" ]]; then
      IFS=',' read -r -a gpu_list <<< "$sanitizer_gpus"
    else
      mapfile -t gpu_list < <(nvidia-smi -L 2> /dev/null | sed -n 's/^GPU \([0-9]*\):.*/\1/p')
      ((${#gpu_list[@]} > 0)) || gpu_list=(0)
    fi
    gpus=${#gpu_list[@]}
    jobs_at_once="${sanitizer_jobs:-$gpus}"
    IFS=',' read -r -a tools <<< "$sanitizer_tools"
    runs=()  # "rank|tool|binary|shard|shards"
    for tool in "${tools[@]}"; do
      for bin in "${selected[@]}"; do
        shards=$(shards_for "$(basename "$bin")")
        wanted=("${shard_indices[@]}")
        if [[ ${#wanted[@]} -eq 0 ]]; then
          wanted=()
          for ((i = 0; i < shards; ++i)); do wanted+=("$i"); done
        fi
        for shard in "${wanted[@]}"; do
          ((shard < shards)) || continue
          ((shards > 1)) || shard=-1
          rank=3
          [[ $tool == racecheck || $tool == initcheck ]] && rank=$((rank - 1))
          [[ $(basename "$bin") =~ (kernels|nn) ]] && rank=$((rank - 2))
          runs+=("$rank|$tool|$bin|$shard|$shards")
        done
      done
    done
    mapfile -t runs < <(printf '%s\n' "${runs[@]}" | sort -s -t'|' -k1,1n)
    say "compute-sanitizer: ${#runs[@]} runs, $jobs_at_once at once over GPU(s) ${gpu_list[*]}"
    slot_pid=()
    # Cut short (a lent machine's time limit, an outer timeout, Ctrl-C), the
    # check stops the runs in flight too: each runs under its own `timeout`,
    # in a process group of its own, which a signal to this script or to its
    # group does not reach, and they went on for minutes on the GPUs of the
    # next command (bench/RESULTS.md, "The transformers column explained").
    stop_runs() {
      local pid child
      for pid in "${slot_pid[@]}"; do
        for child in $(pgrep -P "$pid" 2> /dev/null); do
          kill -TERM -- "-$child" 2> /dev/null || kill -TERM "$child" 2> /dev/null
        done
      done
    }
    trap 'stop_runs; cut_short TERM 143' TERM
    trap 'stop_runs; cut_short INT 130' INT
    for id in "${!runs[@]}"; do
      IFS='|' read -r _ tool bin shard shards <<< "${runs[$id]}"
      tool_filter="$filter"
      if [[ $tool == racecheck ]]; then tool_filter="$racecheck_filter"; fi
      if [[ $tool == initcheck ]]; then tool_filter="$initcheck_filter"; fi
      free=""
      while [[ -z $free ]]; do
        for ((s = 0; s < jobs_at_once; ++s)); do
          if [[ -z ${slot_pid[$s]:-} ]] || ! kill -0 "${slot_pid[$s]}" 2> /dev/null; then
            free=$s
            break
          fi
        done
        [[ -n $free ]] || wait -n
      done
      sanitize_one "$id" "$tool" "$bin" "$shard" "$shards" "$tool_filter" "${gpu_list[$((free % gpus))]}" &
      slot_pid[$free]=$!
    done
    wait
    cut_short_on_signals
    for id in "${!runs[@]}"; do
      result_file="$details/result_$id.txt"
      if [[ ! -s $result_file ]]; then
        failed=1
        note "sanitizer run ${runs[$id]}: FAILED (no result)"
        continue
      fi
      [[ $(head -n 1 "$result_file") == 0 ]] || failed=1
      while IFS= read -r line; do summary+=("$line"); done < <(tail -n +2 "$result_file")
    done
  fi
fi

# ---- the Python module (--python-wheels) -----------------------------------------
# The machine has no network: the build requirements come as wheels (docs/TESTING.md),
# numpy and torch from the system's python (--system-site-packages), so that the torch
# tests (DLPack, the accrue.torch bridge) and python/tests/test_cuda.py run here.
if [[ -n "$python_wheels" ]]; then
  pyenv="$build_dir/python-venv"
  # The module is built in the main build's folder, with that build's options, so
  # that only the module's own sources compile: a separate folder recompiled the
  # whole library (over 240 s on 16 cores, with no ccache here).
  python_defines=()
  for option in ACCRUE_BUILD_TESTS ACCRUE_BUILD_BENCHMARKS ACCRUE_BUILD_EXAMPLES ACCRUE_CUDA \
    ACCRUE_WERROR ACCRUE_WITH_MPI CMAKE_CUDA_ARCHITECTURES; do
    value=$(sed -n "s/^$option:[A-Z]*=//p" "$build_dir/CMakeCache.txt" 2> /dev/null)
    [[ -n "$value" ]] && python_defines+=("-Ccmake.define.$option=$value")
  done
  say "python: pip install . (build requirements from $python_wheels), pytest"
  if {
    python3 -m venv --system-site-packages "$pyenv" &&
      # --system-site-packages reaches only the base interpreter's packages:
      # where python3 is itself a virtual environment (numpy and torch in it),
      # its package folders go on the new one's path too.
      python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
        > "$("$pyenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_accrue_system.pth" &&
      "$pyenv/bin/python" -c 'import numpy; print("numpy", numpy.__version__, "from", numpy.__file__)' &&
      # --ignore-installed: python3's own (older) scikit-build-core is on the path too.
      "$pyenv/bin/pip" install -q --no-index --find-links "$python_wheels" --ignore-installed scikit-build-core \
        nanobind pytest &&
      "$pyenv/bin/pip" install -q --no-index --no-build-isolation -Cbuild-dir="$build_dir" \
        "${python_defines[@]}" . &&
      (cd python/tests && "$pyenv/bin/python" -m pytest -q -p no:cacheprovider -rs .)
  } > "$details/python.log" 2>&1; then
    note "python: $(grep -E '[0-9]+ passed' "$details/python.log" | tail -n 1)"
  else
    failed=1
    note "python: FAILED (see python.log): $(tail -n 1 "$details/python.log")"
  fi
fi

# ---- benchmarks -------------------------------------------------------------------
# --bench-shard: the regex that names exactly shard I of N of the benchmarks
# listed on stdin (--benchmark_list_tests, one a line): the k-th name (0-based)
# where k % N == I - 1, in list order, so that a large family (conv's 162) is
# spread over the shards. It serves accrue_bench (POSIX extended) and the
# PyTorch scripts (Python re) alike: special characters escaped, the
# /manual_time suffix optional, and a PyTorch row named as an accrue family
# plus _torch_pattern (bench/torch_bench.py's gpt2_gemm_torch_pattern/...)
# in the shard of its accrue row. Empty when the shard holds nothing.
bench_shard_filter() {
  sed -e 's|/manual_time$||' -e 's/[][\.*^$+?(){}|]/\\&/g' -e 's|/|(_torch_pattern)?/|' |
    awk -v i="$1" -v n="$2" '(NR - 1) % n == i - 1 { names = names (names == "" ? "" : "|") $0 }
      END { if (names != "") print "^(" names ")(/manual_time)?$" }'
}

comparison=""
bench_bin="$build_dir/bench/accrue_bench"
if [[ $built -eq 1 && $skip_bench -eq 0 && $bench_shard_count -gt 0 ]]; then
  list_args=(--benchmark_list_tests)
  if [[ -n "$bench_filter" ]]; then list_args+=(--benchmark_filter="$bench_filter"); fi
  names=$("$bench_bin" "${list_args[@]}" 2> "$details/bench_list.log" || true)
  listed=$(grep -c . <<< "$names" || true)
  bench_filter=$(bench_shard_filter "$bench_shard_index" "$bench_shard_count" <<< "$names")
  if [[ -z "$bench_filter" ]]; then  # no filter would mean the whole suite
    skip_bench=1
    note "bench shard $bench_shard: no benchmark in it ($listed listed): benchmarks skipped"
  else
    note "bench shard $bench_shard: $(((listed - bench_shard_index + bench_shard_count) / bench_shard_count)) of the $listed benchmarks listed"
  fi
fi
if [[ $built -eq 1 && $skip_bench -eq 0 ]]; then
  # Google Benchmark 1.8 wants a unit on --benchmark_min_time (it warns once per
  # benchmark without one); 1.7 (Debian 12) refuses the unit. Ask the binary.
  min_time=0.1
  if "$bench_bin" --benchmark_min_time=0.1s --benchmark_list_tests --benchmark_filter='^$' \
    > /dev/null 2>&1; then min_time=0.1s; fi
  bench_args=(--benchmark_repetitions="$bench_repetitions" --benchmark_report_aggregates_only=true
    --benchmark_min_time="$min_time" --benchmark_out="$log_dir/bench.json" --benchmark_out_format=json)
  if [[ -n "$bench_filter" ]]; then bench_args+=(--benchmark_filter="$bench_filter"); fi
  say "accrue_bench ${bench_args[*]}"
  if "$bench_bin" "${bench_args[@]}" > "$details/bench.log" 2>&1; then
    note "accrue_bench: ok ($(grep -c '"error_occurred": true' "$log_dir/bench.json" || true) benchmarks skipped with an error)"
  else
    failed=1
    note "accrue_bench: FAILED (see bench.log)"
    note_each "  " < <(tail -n 5 "$details/bench.log")
  fi

  compare_args=(--accrue "$log_dir/bench.json" --markdown "$log_dir/comparison.md"
    --results-rows "$log_dir/results_rows.md" --command "tools/gpu_check.sh")
  if [[ $skip_torch -eq 0 ]]; then
    torch_jsons=()
    # Each PyTorch script writes <name>.json; compare.py pairs all of them by name.
    for script in torch_bench torch_accumulation; do
      torch_args=(--json "$log_dir/$script.json")
      if [[ -n "$bench_filter" ]]; then torch_args+=(--filter "$bench_filter"); fi
      say "$script.py ${torch_args[*]}"
      if python3 "bench/$script.py" "${torch_args[@]}" > "$details/$script.log" 2>&1; then
        note "$script.py: ok"
        torch_jsons+=("$log_dir/$script.json")
      else
        note "$script.py: FAILED (see $script.log): $(tail -n 1 "$details/$script.log")"
      fi
    done
    if [[ ${#torch_jsons[@]} -gt 0 ]]; then compare_args+=(--torch "${torch_jsons[@]}"); fi
  fi
  if [[ -s "$log_dir/bench.json" ]]; then
    if python3 bench/compare.py "${compare_args[@]}" > "$details/compare.log" 2>&1; then
      comparison=$(cat "$details/compare.log")
    else
      note "compare.py: FAILED: $(tail -n 1 "$details/compare.log")"
    fi
  fi
fi

# ---- summary (LAST) ------------------------------------------------------------------
# shellcheck disable=SC2317  # called by finish
write_summary() {
  summary_head "GPU: $gpu_model"
  block "$comparison"
  echo
  verdict
}
finish write_summary
