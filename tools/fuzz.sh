#!/usr/bin/env bash
# Builds accrue's libFuzzer targets (fuzz/: clang++ -fsanitize=fuzzer with
# AddressSanitizer, LeakSanitizer and UBSan, CPU-only) and runs each for N
# executions over a fresh copy of its seed corpus, in one process (no forks).
#
#   tools/fuzz.sh                      # 100000 executions per target
#   tools/fuzz.sh --runs 1000000       # the long run docs/FUZZING.md records
#   tools/fuzz.sh --runs 100000000 --seconds 10 --build-dir build/ci/fuzz
#                                      # ctest's smoke run: 10 s per target
#   --seconds S                        # also stop each target after S seconds
#   tools/fuzz.sh --targets "npy token_shards"
#   tools/fuzz.sh --targets window_state   # not in the default list: it builds
#                                          # the whole CPU library (minutes)
#
# Prints per target: executions, seconds, new corpus entries, result. Exits 0
# when every target finished clean, 1 on any crash, leak, UBSan report or
# timeout (the reproducer is kept under <build-dir>/artifacts/), 77 (skip)
# when clang++ or libFuzzer is not available, 2 on bad usage or a failed build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=100000
SECONDS_PER_TARGET=0  # 0: no time box, --runs alone bounds a target
BUILD_DIR="$ROOT/build/fuzz"
TARGETS="safetensors npy token_shards exchange_message options run_record metrics_log hf_config"
CXX_BIN="${FUZZ_CXX:-clang++}"

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --seconds) SECONDS_PER_TARGET="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$RUNS" =~ ^[0-9]+$ && "$RUNS" -gt 0 ]] || { echo "fuzz.sh: --runs '$RUNS' is not a positive integer" >&2; exit 2; }
[[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --seconds '$SECONDS_PER_TARGET' is not a whole number" >&2; exit 2; }
[[ "$BUILD_DIR" = /* ]] || BUILD_DIR="$ROOT/$BUILD_DIR"

# ---- can we build fuzzers here? (skip, not fail, when not) ---------------------
if ! command -v "$CXX_BIN" >/dev/null 2>&1; then
  echo "fuzz.sh: SKIP: $CXX_BIN not found (libFuzzer needs clang; set FUZZ_CXX to another clang++)"
  exit 77
fi
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  >"$probe_dir/probe.cpp"
if ! "$CXX_BIN" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" \
    >"$probe_dir/log" 2>&1; then
  echo "fuzz.sh: SKIP: $CXX_BIN cannot link -fsanitize=fuzzer,address,undefined (libFuzzer or" \
       "the sanitizer runtimes are not installed):"
  sed 's/^/  /' "$probe_dir/log" | head -5
  exit 77
fi
for tool in cmake ninja; do
  command -v "$tool" >/dev/null 2>&1 || { echo "fuzz.sh: SKIP: $tool not found"; exit 77; }
done

# ---- build ---------------------------------------------------------------------
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
echo "fuzz.sh: building into $BUILD_DIR with $("$CXX_BIN" --version | head -1)"
mkdir -p "$BUILD_DIR"
window_state=OFF
[[ " $TARGETS " == *" window_state "* ]] && window_state=ON
if ! cmake -S "$ROOT/fuzz" -B "$BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_BIN" \
       -DACCRUE_FUZZ_WINDOW_STATE=$window_state "${launcher[@]}" >"$BUILD_DIR/configure.log" 2>&1 ||
   ! cmake --build "$BUILD_DIR" -j2 >"$BUILD_DIR/build.log" 2>&1; then
  echo "fuzz.sh: the build failed:" >&2
  tail -40 "$BUILD_DIR/configure.log" "$BUILD_DIR/build.log" >&2 2>/dev/null || true
  exit 2
fi

# ---- run -----------------------------------------------------------------------
# Leaks are findings (LeakSanitizer through libFuzzer's -detect_leaks=1, the
# default); UBSan stops at the first report (-fno-sanitize-recover) with a trace.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p "$BUILD_DIR/artifacts"
failed=0
summary=()
for t in $TARGETS; do
  bin="$BUILD_DIR/fuzz_$t"
  seeds="$ROOT/fuzz/corpus/$t"
  [[ -x "$bin" && -d "$seeds" ]] || { echo "fuzz.sh: no target '$t' (fuzz_$t, fuzz/corpus/$t)" >&2; exit 2; }
  work="$BUILD_DIR/work/$t"
  rm -rf "$work" && mkdir -p "$work" && cp "$seeds"/* "$work/"
  before=$(find "$work" -type f | wc -l)
  log="$BUILD_DIR/fuzz_$t.log"
  echo "fuzz.sh: fuzz_$t: $RUNS executions over a copy of fuzz/corpus/$t ($before seeds); log $log"
  start=$(date +%s.%N)
  rc=0
  # In-process, one worker: no -jobs/-workers (those fork children that log to
  # fuzz-N.log in the working directory). Run from the build dir all the same.
  (cd "$BUILD_DIR" && "$bin" -runs="$RUNS" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD_DIR/artifacts/${t}-" "$work") >"$log" 2>&1 || rc=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  after=$(find "$work" -type f | wc -l)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [[ $rc -eq 0 ]] && grep -q "^Done [0-9]* runs" "$log"; then
    result="ok (0 crashes, 0 leaks, 0 UB reports)"
  else
    failed=1
    kind="crash"
    grep -q "LeakSanitizer" "$log" && kind="leak"
    grep -q "runtime error:" "$log" && kind="UB"
    grep -q "ERROR: libFuzzer: timeout" "$log" && kind="timeout"
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    result="FAILED: $kind (exit $rc), reproducer ${artifact:-none}; see $log"
    grep -m3 -E "ERROR: |runtime error:|fuzz invariant broken" "$log" | sed 's/^/    /' || true
  fi
  line=$(printf '%-22s executions %-9s seconds %-7s new corpus entries %-5s %s' \
    "fuzz_$t" "${execs:-?}" "$seconds" "$((after - before))" "$result")
  echo "  $line"
  summary+=("$line")
done

echo "fuzz.sh: summary ($RUNS executions requested per target$( [[ $SECONDS_PER_TARGET -gt 0 ]] && echo ", at most $SECONDS_PER_TARGET s each"))"
printf '  %s\n' "${summary[@]}"
exit $failed
