#!/usr/bin/env bash
# The sanitizer half of tools/gpu_check.sh on a machine without a GPU: stub
# compute-sanitizer, ctest and nvidia-smi, and stub test binaries, so that
# what the script decides (Note [Sanitizer runs], Note [Sanitizer pool],
# Note [Sanitizer exclusions]) is checked in CI:
#  - every (tool, binary, shard) runs once, with per-binary shard counts, each
#    pinned to one of the --sanitizer-gpus;
#  - racecheck hazards and synccheck barrier errors wholly inside library
#    kernels pass and are counted; one in an accrue kernel fails the check;
#  - a run cut by --sanitizer-timeout, or one without its summary line, fails;
#  - a check stopped by a signal stops its runs in flight, and still writes
#    its summary and packs its logs (Note [Cut short]);
#  - initcheck runs with ACCRUE_INITCHECK_LIBRARY_OUTPUTS=1 and racecheck and
#    synccheck with ACCRUE_ATTENTION_COMPOSED=1, the others without.
#
#   tests/tools/gpu_check_sanitizer_test.sh <source dir>
set -u -o pipefail
src="${1:?usage: gpu_check_sanitizer_test.sh <source dir>}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/build"

# compute-sanitizer --tool T [options] --error-exitcode 86 BINARY ARGS: runs the
# binary, then reports what STUB_<tool>_<binary> asks for.
cat > "$work/bin/compute-sanitizer" << 'EOF'
#!/usr/bin/env bash
tool=$2
while [[ $1 != --error-exitcode ]]; do shift; done
shift 2
name=$(basename "$1")
"$@"
echo "tool $tool initcheck-outputs ${ACCRUE_INITCHECK_LIBRARY_OUTPUTS:-unset} composed-attention ${ACCRUE_ATTENTION_COMPOSED:-unset} gpu $CUDA_VISIBLE_DEVICES"
what_var="STUB_${tool}_${name}"
case "${!what_var:-clean}" in
  clean)
    if [[ $tool == racecheck ]]; then
      echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    else
      echo "========= ERROR SUMMARY: 0 errors"
    fi
    exit 0 ;;
  library_race)
    echo "========= Error: Race reported between Write access at nvjet_hsh_256x128_2cta+0x1a0"
    echo "=========     and Read access at nvjet_hsh_256x128_2cta+0x2c0 [16 hazards]"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    exit 86 ;;
  own_race)
    echo "========= Error: Race reported between Write access at void accrue::kernels::cuda::block_sum<float>(float*)+0x40"
    echo "=========     and Read access at void accrue::kernels::cuda::block_sum<float>(float*)+0x80 [2 hazards]"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    exit 86 ;;
  library_barrier)
    echo "========= Barrier error detected. Divergent thread(s) in block."
    echo "=========     at cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26+0x10"
    echo "========= ERROR SUMMARY: 1 error"
    exit 86 ;;
  own_barrier)
    echo "========= Barrier error detected. Divergent thread(s) in block."
    echo "=========     at void accrue::kernels::cuda::layer_norm_kernel<float>(float*)+0x10"
    echo "========= ERROR SUMMARY: 1 error"
    exit 86 ;;
  hang)
    [[ -n ${STUB_PIDS:-} ]] && echo $$ >> "$STUB_PIDS"
    sleep 30 ;;
  no_summary) exit 0 ;;
esac
EOF
# ctest -N --show-only=json-v1: the gpu label's commands; only test_* binaries are sanitized.
cat > "$work/bin/ctest" << EOF
#!/usr/bin/env bash
[[ -n \${STUB_CTEST_HANG:-} && " \$* " == *" -L "* ]] && exec sleep 30
if [[ -n \${STUB_CTEST_LOG:-} && " \$* " == *" -L "* ]]; then
  echo "\$*" >> "\$STUB_CTEST_LOG"
  echo "100% tests passed, 0 tests failed out of 2"
  exit 0
fi
echo '{"tests":[{"command":["$work/build/test_a_gpu"]},{"command":["$work/build/test_b_gpu"]},{"command":["/usr/bin/cmake","-P","scenario.cmake"]}]}'
EOF
cat > "$work/bin/nvidia-smi" << 'EOF'
#!/usr/bin/env bash
if [[ ${1:-} == -L ]]; then printf 'GPU 0: stub\nGPU 1: stub\nGPU 2: stub\n'; else echo "stub GPU"; fi
EOF
for t in test_a_gpu test_b_gpu; do
  cat > "$work/build/$t" << 'EOF'
#!/usr/bin/env bash
echo "shard ${GTEST_SHARD_INDEX:-none} of ${GTEST_TOTAL_SHARDS:-none}"
echo "[  PASSED  ] 2 tests."
EOF
done
chmod +x "$work/bin/"* "$work/build/"*

failures=0
# run NAME EXPECTED_EXIT ARGS...: gpu_check's sanitizer step alone; its summary in $work/NAME.txt.
run() {
  local name="$1" expected="$2"
  shift 2
  (cd "$src" && PATH="$work/bin:$PATH" bash tools/gpu_check.sh --build-dir "$work/build" \
    --skip-build --skip-tests --skip-bench --details-dir "$work/details_$name" \
    --log-dir "$work/out_$name" "$@") > "$work/$name.txt" 2>&1
  local rc=$?
  if [[ $rc -ne $expected ]]; then
    echo "FAIL $name: exit $rc, expected $expected"
    tail -n 20 "$work/$name.txt"
    failures=$((failures + 1))
  fi
}
# expect NAME REGEX: the summary of run NAME has a line matching REGEX.
expect() {
  if ! grep -Eq -- "$2" "$work/out_$1/summary.txt"; then
    echo "FAIL $1: no summary line matches '$2'"
    cat "$work/out_$1/summary.txt"
    failures=$((failures + 1))
  fi
}
# count NAME REGEX N: N summary lines of run NAME match REGEX.
count() {
  local n
  n=$(grep -Ec -- "$2" "$work/out_$1/summary.txt")
  if [[ $n -ne $3 ]]; then
    echo "FAIL $1: $n summary lines match '$2', expected $3"
    failures=$((failures + 1))
  fi
}

# Every tool over both binaries, test_b in 3 shards, 4 runs at once on GPUs 1 and 2.
export STUB_racecheck_test_a_gpu=library_race STUB_synccheck_test_b_gpu=library_barrier
run pool 0 --sanitizer-shards 1,_b_=3 --sanitizer-jobs 4 --sanitizer-gpus 1,2
unset STUB_racecheck_test_a_gpu STUB_synccheck_test_b_gpu
count pool '^(memcheck|racecheck|initcheck|synccheck) test_a_gpu: ' 4
count pool '^(memcheck|racecheck|initcheck|synccheck) test_b_gpu\[shard [0-2]/3\]: ' 12
expect pool '^racecheck test_a_gpu: .*all 1 in library kernels'
count pool '^synccheck test_b_gpu\[shard [0-2]/3\]: .*all 1 in library kernels' 3
expect pool '^gpu_check: PASSED'
logs="$work/details_pool"
if grep -h '^tool ' "$logs"/sanitizer_*.log | grep -Evq 'gpu [12]$'; then
  echo "FAIL pool: a run left GPUs 1 and 2"
  failures=$((failures + 1))
fi
if [[ $(grep -h '^tool initcheck initcheck-outputs 1 ' "$logs"/sanitizer_*.log | wc -l) -ne 4 ]] ||
  grep -h '^tool ' "$logs"/sanitizer_*.log | grep -v '^tool initcheck' | grep -vq 'outputs unset'; then
  echo "FAIL pool: ACCRUE_INITCHECK_LIBRARY_OUTPUTS is not set for initcheck alone"
  failures=$((failures + 1))
fi
if [[ $(grep -hE '^tool (racecheck|synccheck) .* composed-attention 1 ' "$logs"/sanitizer_*.log | wc -l) -ne 8 ]] ||
  grep -h '^tool ' "$logs"/sanitizer_*.log | grep -Ev '^tool (racecheck|synccheck)' | grep -vq 'composed-attention unset'; then
  echo "FAIL pool: ACCRUE_ATTENTION_COMPOSED is not set for racecheck and synccheck alone"
  failures=$((failures + 1))
fi
if ! grep -q '^shard 2 of 3$' "$logs"/sanitizer_memcheck_test_b_gpu_2.log; then
  echo "FAIL pool: test_b's shard 2 did not run as gtest shard 2 of 3"
  failures=$((failures + 1))
fi

# A hazard or barrier error in an accrue kernel fails the check.
export STUB_racecheck_test_a_gpu=own_race STUB_synccheck_test_b_gpu=own_barrier
run own 1 --sanitizer-tools racecheck,synccheck
unset STUB_racecheck_test_a_gpu STUB_synccheck_test_b_gpu
expect own '^racecheck test_a_gpu: FAILED exit 86'
expect own '^synccheck test_b_gpu: FAILED exit 86'
expect own '^gpu_check: FAILED'

# A run cut at the time limit fails, and so does one without its summary line.
export STUB_memcheck_test_a_gpu=hang STUB_memcheck_test_b_gpu=no_summary
run limits 1 --sanitizer-tools memcheck --sanitizer-timeout 2
unset STUB_memcheck_test_a_gpu STUB_memcheck_test_b_gpu
expect limits '^memcheck test_a_gpu: FAILED exit 124 .*TIMEOUT after 2 s'
expect limits '^memcheck test_b_gpu: FAILED exit 0 .*no summary line'

# Cut short, the check stops its runs in flight (each in its own timeout's
# process group) instead of leaving them on the GPUs.
export STUB_memcheck_test_a_gpu=hang STUB_memcheck_test_b_gpu=hang STUB_PIDS="$work/pids"
(cd "$src" && PATH="$work/bin:$PATH" exec bash tools/gpu_check.sh --build-dir "$work/build" \
  --skip-build --skip-tests --skip-bench --details-dir "$work/details_cut" \
  --log-dir "$work/out_cut" --sanitizer-tools memcheck --sanitizer-timeout 60 \
  --sanitizer-jobs 2) > "$work/cut.txt" 2>&1 &
check_pid=$!
for _ in $(seq 100); do
  [[ -f $work/pids && $(wc -l < "$work/pids") -ge 2 ]] && break
  sleep 0.1
done
kill -TERM "$check_pid"
wait "$check_pid"
cut_rc=$?
unset STUB_memcheck_test_a_gpu STUB_memcheck_test_b_gpu STUB_PIDS
sleep 1
if [[ $cut_rc -ne 143 || ! -f $work/pids || $(wc -l < "$work/pids") -ne 2 ]]; then
  echo "FAIL cut: exit $cut_rc (expected 143), $(cat "$work/pids" 2> /dev/null | wc -l) runs started"
  failures=$((failures + 1))
fi
for pid in $(cat "$work/pids" 2> /dev/null); do
  if kill -0 "$pid" 2> /dev/null; then
    echo "FAIL cut: sanitizer run $pid still running after the check was stopped"
    kill -KILL "$pid" 2> /dev/null
    failures=$((failures + 1))
  fi
done
# Note [Cut short]: the cut check still writes its summary, saying where it
# was cut, and packs the logs it has.
expect cut '^cut short by SIGTERM after: (memcheck|compute-sanitizer)'
expect cut '^gpu_check: FAILED'
if ! tar -tzf "$work/out_cut/logs.tar.gz" > /dev/null 2>&1; then
  echo "FAIL cut: no logs.tar.gz"
  failures=$((failures + 1))
fi

# Cut by an outer timeout in another step (ctest, here), the same: the
# timeout signals the check's process group, the step ends, the check says so
# (--preserve-status: the check's own status, not the timeout's 124).
(cd "$src" && PATH="$work/bin:$PATH" STUB_CTEST_HANG=1 timeout --preserve-status -k 10 3 bash tools/gpu_check.sh \
  --build-dir "$work/build" --skip-build --skip-sanitizer --skip-bench \
  --details-dir "$work/details_cut_tests" --log-dir "$work/out_cut_tests") \
  > "$work/cut_tests.txt" 2>&1
cut_rc=$?
if [[ $cut_rc -ne 143 ]]; then
  echo "FAIL cut_tests: exit $cut_rc (expected 143)"
  failures=$((failures + 1))
fi
expect cut_tests '^cut short by SIGTERM after: ctest -L gpu'
expect cut_tests '^gpu_check: FAILED'

# --skip-cpu-tests: ctest runs the gpu label alone.
for cpu_too in 1 0; do
  : > "$work/ctest_calls"
  args=(--skip-sanitizer)
  [[ $cpu_too -eq 0 ]] && args+=(--skip-cpu-tests)
  (cd "$src" && PATH="$work/bin:$PATH" STUB_CTEST_LOG="$work/ctest_calls" bash tools/gpu_check.sh \
    --build-dir "$work/build" --skip-build --skip-bench --details-dir "$work/details_labels" \
    --log-dir "$work/out_labels" "${args[@]}") > "$work/labels.txt" 2>&1
  labels=$(grep -o -- '-L [^ ]*' "$work/ctest_calls" | tr '\n' ' ')
  expected="-L ^gpu\$ $([[ $cpu_too -eq 1 ]] && echo '-L ^cpu$ ')"
  if [[ $labels != "$expected" ]]; then
    echo "FAIL labels (cpu tests $cpu_too): ctest ran '$labels', expected '$expected'"
    failures=$((failures + 1))
  fi
done
expect labels '^ctest -L cpu: skipped \(--skip-cpu-tests\)'

# Bad options are refused before anything runs.
run bad_shards 2 --sanitizer-shards 1,_b_=x
run bad_gpus 2 --sanitizer-gpus one

if [[ $failures -ne 0 ]]; then
  echo "gpu_check_sanitizer_test: $failures failures"
  exit 1
fi
echo "gpu_check_sanitizer_test: ok"
