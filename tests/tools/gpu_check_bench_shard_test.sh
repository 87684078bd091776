#!/usr/bin/env bash
# tools/gpu_check.sh --bench-shard I/N on a machine without a GPU: a stub
# accrue_bench lists its benchmarks and records which ones a run's filter
# selects, so that the shards are checked in CI:
#  - shard I of N runs the k-th listed benchmark (0-based) where k % N == I - 1,
#    of those --bench-filter selects, and the shards together run each once;
#  - the filter also names the PyTorch rows of a shard (a family plus
#    _torch_pattern, as bench/torch_bench.py's gpt2_gemm_torch_pattern/...);
#  - a shard past the end of the list runs nothing and says so;
#  - bad values are refused before anything runs.
#
#   tests/tools/gpu_check_bench_shard_test.sh <source dir>
set -u -o pipefail
src="${1:?usage: gpu_check_bench_shard_test.sh <source dir>}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/build/bench"

cat > "$work/bin/nvidia-smi" << 'EOF'
#!/usr/bin/env bash
if [[ ${1:-} == -L ]]; then printf 'GPU 0: stub\n'; else echo "stub GPU"; fi
EOF
# accrue_bench: --benchmark_list_tests prints the names its --benchmark_filter
# selects (all without one); a run appends them to $STUB_RAN and writes an
# empty JSON result.
cat > "$work/build/bench/accrue_bench" << 'EOF'
#!/usr/bin/env bash
names='window_close/gpt2_124M/close/manual_time
gpt2_gemm/qkv_2304x768/M=1024/fwd/manual_time
gpt2_gemm/qkv_2304x768/M=1024/wgrad/manual_time
conv/bf16/64to64_3x3_s1_56/B=32/fwd/manual_time
conv/bf16/64to64_3x3_s1_56/B=32/dgrad/manual_time
conv/bf16/64to64_3x3_s1_56/B=32/wgrad_f32/manual_time
add/bf16/n=268435456/manual_time'
filter="" list=0 out=""
for a in "$@"; do
  case "$a" in
    --benchmark_filter=*) filter="${a#--benchmark_filter=}" ;;
    --benchmark_list_tests) list=1 ;;
    --benchmark_out=*) out="${a#--benchmark_out=}" ;;
  esac
done
selected=$(grep -E -- "${filter:-.}" <<< "$names")
if [[ $list -eq 1 ]]; then
  [[ -n $selected ]] && echo "$selected"
  exit 0
fi
echo "$selected" >> "$STUB_RAN"
echo '{"context": {}, "benchmarks": []}' > "$out"
EOF
chmod +x "$work/bin/"* "$work/build/bench/accrue_bench"

failures=0
fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}
# run NAME EXPECTED_EXIT ARGS...: gpu_check's benchmark step alone, without
# the PyTorch side; what the stub ran in $work/ran_NAME.
run() {
  local name="$1" expected="$2"
  shift 2
  : > "$work/ran_$name"
  (cd "$src" && PATH="$work/bin:$PATH" STUB_RAN="$work/ran_$name" bash tools/gpu_check.sh \
    --build-dir "$work/build" --skip-build --skip-tests --skip-sanitizer --skip-torch \
    --details-dir "$work/details_$name" --log-dir "$work/out_$name" "$@") > "$work/$name.txt" 2>&1
  local rc=$?
  if [[ $rc -ne $expected ]]; then
    fail "$name: exit $rc, expected $expected"
    tail -n 20 "$work/$name.txt"
  fi
}
all=$("$work/build/bench/accrue_bench" --benchmark_list_tests)

# Three shards of the seven: 0, 3, 6 / 1, 4 / 2, 5; together each once.
for i in 1 2 3; do
  run "shard$i" 0 --bench-shard "$i/3"
  want=$(awk -v i="$i" '(NR - 1) % 3 == i - 1' <<< "$all")
  [[ $(cat "$work/ran_shard$i") == "$want" ]] ||
    fail "shard $i/3 ran '$(cat "$work/ran_shard$i")', expected '$want'"
  grep -q "^bench shard $i/3: $(grep -c . <<< "$want") of the 7 benchmarks listed" \
    "$work/out_shard$i/summary.txt" || fail "shard $i/3: no count in the summary"
done
[[ $(cat "$work"/ran_shard{1,2,3} | sort) == "$(sort <<< "$all")" ]] ||
  fail "the three shards did not run each benchmark once"

# The PyTorch side's names: shard 2/3 holds gpt2_gemm's fwd, so its filter
# (the one accrue_bench got, as the PyTorch scripts do) takes the
# torch_pattern row of that one and not of wgrad.
filter=$(grep -o -- "--benchmark_filter=[^ ]*" "$work/shard2.txt" | sed 's/^--benchmark_filter=//' |
  head -n 1)
grep -Eq -- "$filter" <<< "gpt2_gemm_torch_pattern/qkv_2304x768/M=1024/fwd" ||
  fail "shard 2/3's filter '$filter' misses the torch_pattern row of its gpt2_gemm benchmark"
grep -Eq -- "$filter" <<< "gpt2_gemm_torch_pattern/qkv_2304x768/M=1024/wgrad" &&
  fail "shard 2/3's filter '$filter' takes the torch_pattern row of another shard's benchmark"

# With --bench-filter, the shards are of what it selects: conv's three, 2 of 2.
run filtered 0 --bench-filter '^conv/' --bench-shard 2/2
[[ $(cat "$work/ran_filtered") == "conv/bf16/64to64_3x3_s1_56/B=32/dgrad/manual_time" ]] ||
  fail "--bench-filter '^conv/' --bench-shard 2/2 ran '$(cat "$work/ran_filtered")'"

# A shard past the end of the list runs nothing (not the whole suite).
run past_end 0 --bench-filter '^conv/' --bench-shard 5/5
[[ -s $work/ran_past_end ]] && fail "shard 5/5 of three benchmarks ran '$(cat "$work/ran_past_end")'"
grep -q '^bench shard 5/5: no benchmark in it (3 listed)' "$work/out_past_end/summary.txt" ||
  fail "shard 5/5 of three: the summary does not say it holds nothing"

# Bad values are refused before anything runs.
for bad in 0/3 4/3 x 1/0 2/3x; do
  run "bad_${bad//\//_}" 2 --bench-shard "$bad"
  [[ -s $work/ran_bad_${bad//\//_} ]] && fail "--bench-shard $bad ran benchmarks"
done

if [[ $failures -ne 0 ]]; then
  echo "gpu_check_bench_shard_test: $failures failures"
  exit 1
fi
echo "gpu_check_bench_shard_test: ok"
