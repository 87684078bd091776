#!/usr/bin/env bash
# The one-call check of the close under the forward (Note [Close under the
# forward] in optim/layer_steps.h), of concurrent micro-batches (Note
# [Concurrent micro-batches] in optim/graphed_window.h) and of documents
# within rows (Note [Documents within rows] in nn/llama.h): run it from the
# repo root on an H100/H200.
#
#   tools/overlap_check.sh [options]
#
# Steps: configure (Release, sm_90, tests on, benchmarks on unless
# --skip-stream-gap) and build the
# targets below with all cores; the GPU tests GpuCloseUnderForward* and
# GpuGraphedWindow* (test_optim_gpu) and GpuLlama* (test_nn_llama_gpu); GPT-2
# 124M (accrue_train_gpt2 --bench, bf16, 32,768 tokens a window) at each
# --points B x K, eager and with --cuda-graphs, each without and with
# --close-under-forward in the order A B B A, and with --cuda-graphs without
# and with --concurrent-micro-batches N (--concurrent, where K >= N) in the
# same order: the final loss must be the same bits, and the window times
# stand side by side; llama-125m on shards of the
# Python standard library (tools/make_shards.py) under --cuda-graphs with
# documents within rows against --contiguous-rows (tok/s, peak memory); the
# stream_gap/* cases of accrue_bench (bench/bench_stream_gap.cu: does a second
# stream's work slow the graph replays after it?), each case in its own process
# and once all in one (--skip-stream-gap leaves them out, and the benchmarks
# unbuilt); last,
# compute-sanitizer (memcheck by default) on both test filters through
# tools/gpu_check.sh's sanitizer step, each run bounded by --sanitizer-timeout
# (the runs go one after another on one GPU: four runs of 300 s outlasted a
# lent call's ten minutes). A short summary is printed LAST and written to
# <log dir>/summary.txt; every log goes into <log dir>/logs.tar.gz.
#
# Exit status: 0 when the build, the tests, the sanitizer runs and every
# benchmark run passed and the losses agreed, else 1.
set -u -o pipefail
check_name=overlap_check
# shellcheck source=tools/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'EOF'
usage: tools/overlap_check.sh [options]
  --build-dir DIR       build directory (default: build-gpu)
  --log-dir DIR         where the results go (default: $OUT when set, else
                        <build dir>/overlap_check_results)
  --points LIST         GPT-2 B x K points, comma-separated (default: 8x4,1x32)
  --bench-windows N     timed windows a run (default: 10; 3 untimed first)
  --close-max-blocks N  passed to every --close-under-forward run (default: 0, no cap)
  --concurrent N        micro-steps in flight in the concurrent runs (default: 2; 1: none)
  --skip-build          use the build directory as it is
  --skip-tests          no GPU tests
  --sanitizer-tools L   compute-sanitizer tools, comma-separated (default: memcheck)
  --sanitizer-timeout S each sanitizer run's limit in seconds; reaching it fails (default: 150)
  --skip-sanitizer      no compute-sanitizer runs
  --skip-bench          no benchmark runs
  --skip-stream-gap     no stream_gap/* runs (accrue_bench is then not built)
  -h, --help            this text
EOF
}

build_dir=build-gpu
log_dir=""
points=8x4,1x32
bench_windows=10
max_blocks=0
concurrent=2
sanitizer_tools=memcheck
sanitizer_timeout=150
skip_build=0 skip_tests=0 skip_sanitizer=0 skip_bench=0 skip_stream_gap=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --points) points="$2"; shift 2 ;;
    --bench-windows) bench_windows="$2"; shift 2 ;;
    --close-max-blocks) max_blocks="$2"; shift 2 ;;
    --concurrent) concurrent="$2"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --skip-tests) skip_tests=1; shift ;;
    --sanitizer-tools) sanitizer_tools="$2"; shift 2 ;;
    --sanitizer-timeout) sanitizer_timeout="$2"; shift 2 ;;
    --skip-sanitizer) skip_sanitizer=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --skip-stream-gap) skip_stream_gap=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "overlap_check: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $bench_windows =~ ^[1-9][0-9]*$ ]] ||
  { echo "overlap_check: --bench-windows must be a positive integer, got '$bench_windows'" >&2; exit 2; }
[[ $sanitizer_timeout =~ ^[1-9][0-9]*$ ]] ||
  { echo "overlap_check: --sanitizer-timeout must be a positive integer, got '$sanitizer_timeout'" >&2; exit 2; }
[[ $concurrent =~ ^[1-9][0-9]*$ ]] ||
  { echo "overlap_check: --concurrent must be a positive integer, got '$concurrent'" >&2; exit 2; }
[[ $max_blocks =~ ^[0-9]+$ ]] ||
  { echo "overlap_check: --close-max-blocks must be an integer >= 0, got '$max_blocks'" >&2; exit 2; }
IFS=, read -r -a point_list <<< "$points"
for p in "${point_list[@]}"; do
  [[ $p =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] ||
    { echo "overlap_check: --points takes BxK items, got '$p'" >&2; exit 2; }
done

need_repo_root
no_nvlink_multicast
log_dir=${log_dir:-${OUT:-$build_dir/overlap_check_results}}
make_dirs_absolute
open_details "$build_dir/overlap_check"
look_at_gpus one

# ---- build ---------------------------------------------------------------------
targets=(test_optim_gpu test_nn_llama_gpu accrue_train accrue_train_gpt2)
with_bench=OFF
if [[ $skip_stream_gap -eq 0 && $skip_bench -eq 0 ]]; then
  targets+=(accrue_bench)
  with_bench=ON
fi
if [[ $skip_build -eq 0 ]]; then
  cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CUDA_ARCHITECTURES=90 -DACCRUE_CUDA=ON -DACCRUE_BUILD_TESTS=ON
    -DACCRUE_BUILD_BENCHMARKS=$with_bench)
  add_nvcc
  if configure && run_build cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"; then
    note "build: ok in $build_seconds s, $build_warnings compiler warning lines"
  fi
fi
find_binary() { find "$build_dir" -type f -name "$1" -perm -u+x | head -n 1; }

# ---- tests ---------------------------------------------------------------------------
if [[ $skip_tests -eq 0 && $failed -eq 0 ]]; then
  for spec in "test_optim_gpu:GpuCloseUnderForward*:GpuGraphedWindow*" "test_nn_llama_gpu:GpuLlama*"; do
    bin=$(find_binary "${spec%%:*}")
    log="$details/${spec%%:*}.log"
    if "$bin" --gtest_filter="${spec#*:}" > "$log" 2>&1; then
      note "${spec%%:*} ${spec#*:}: $(grep -E '^\[  PASSED  \]' "$log" | tail -n 1)"
    else
      failed=1
      note "${spec%%:*} ${spec#*:}: FAILED"
      note_each "  " < <(grep -E '^\[  FAILED  \]|Failure' "$log" | head -n 10)
    fi
  done
fi
# ---- benchmarks --------------------------------------------------------------------
json_field() { grep -o "\"$2\": [^,}]*" <<< "$1" | head -n 1 | sed 's/.*: //'; }
bench_rows=()
concurrent_rows=()
gap_rows=()
# bench_run NAME COMMAND...: the JSON line of one --bench run, or FAILED.
bench_run() {
  local name=$1 log="$details/bench_$1.log"
  shift
  if "$@" > "$log" 2>&1; then
    grep '^{"bench"' "$log" | tail -n 1
  else
    failed=1
    note "bench $name: FAILED: $(tail -n 1 "$log")"
  fi
}
# stream_gap_run NAME FILTER [VAR=VALUE...]: sets gap_result to the median
# us_per_kernel of each case the filter matches ("case=value ..."), from
# accrue_bench's JSON, run with those environment variables.
stream_gap_run() {
  local json="$details/stream_gap_$1.json" log="$details/stream_gap_$1.log"
  gap_result=FAILED
  if env "${@:3}" "$bench_bin" --benchmark_filter="$2" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out="$json" \
    --benchmark_out_format=json > "$log" 2>&1; then
    gap_result=$(python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["benchmarks"]
print(" ".join(r["run_name"].split("/")[1] + "=" + format(r["us_per_kernel"], ".3f")
               for r in rows if r.get("aggregate_name") == "median"))' "$json")
  else
    failed=1
    note "stream_gap $1: FAILED: $(tail -n 1 "$log")"
  fi
}
if [[ $skip_bench -eq 0 && $failed -eq 0 ]]; then
  gpt2=$(find_binary accrue_train_gpt2)
  timing=(--bench --bench-warmup 3 --bench-windows "$bench_windows")
  for p in "${point_list[@]}"; do
    b=${p%x*} k=${p#*x}
    for graphs in "" --cuda-graphs; do
      base=(--model d12 --synthetic --dtype bf16 --micro-batch "$b" --total-batch-tokens $((b * k * 1024)) $graphs "${timing[@]}")
      under_args=(--close-under-forward --close-max-blocks "$max_blocks")
      # In the order A B B A: a run's place in the call (the GPU's clocks, its
      # warmth) weighs on both modes alike.
      plain=$(bench_run "gpt2_${p}${graphs}_a" "$gpt2" "${base[@]}")
      under=$(bench_run "gpt2_${p}${graphs}_under_a" "$gpt2" "${base[@]}" "${under_args[@]}")
      under2=$(bench_run "gpt2_${p}${graphs}_under_b" "$gpt2" "${base[@]}" "${under_args[@]}")
      plain2=$(bench_run "gpt2_${p}${graphs}_b" "$gpt2" "${base[@]}")
      [[ -n $plain && -n $under && -n $under2 && -n $plain2 ]] || continue
      lp=$(json_field "$plain" final_loss) lu=$(json_field "$under" final_loss)
      for other in "$under2" "$plain2"; do
        [[ $(json_field "$other" final_loss) == "$lp" ]] || lu="$lu, $(json_field "$other" final_loss)"
      done
      [[ $lp == "$lu" ]] || { failed=1; note "gpt2 $p${graphs:+ graphs}: final loss $lp vs $lu under the forward: DIFFER"; }
      bench_rows+=("| GPT-2 124M $p ${graphs:-eager} | $(json_field "$plain" window_ms_median), $(json_field "$plain2" window_ms_median) | $(json_field "$under" window_ms_median), $(json_field "$under2" window_ms_median) | $(json_field "$plain" window_ms_min) / $(json_field "$under" window_ms_min) | $lp / $lu |")
    done
    # Note [Concurrent micro-batches]: graphs one at a time (A) against N in flight (B).
    [[ $concurrent -gt 1 && $k -ge $concurrent ]] || continue
    base=(--model d12 --synthetic --dtype bf16 --micro-batch "$b" --total-batch-tokens $((b * k * 1024)) --cuda-graphs "${timing[@]}")
    runs=()
    for mode in a n_a n_b b; do
      extra=()
      [[ $mode == n_* ]] && extra=(--concurrent-micro-batches "$concurrent")
      runs+=("$(bench_run "gpt2_${p}_concurrent_$mode" "$gpt2" "${base[@]}" "${extra[@]}")")
    done
    [[ -n ${runs[0]} && -n ${runs[1]} && -n ${runs[2]} && -n ${runs[3]} ]] || continue
    lp=$(json_field "${runs[0]}" final_loss)
    for r in "${runs[@]:1}"; do
      [[ $(json_field "$r" final_loss) == "$lp" ]] ||
        { failed=1; note "gpt2 $p concurrent $concurrent: final loss $(json_field "$r" final_loss) vs $lp: DIFFER"; }
    done
    concurrent_rows+=("| GPT-2 124M $p | $(json_field "${runs[0]}" tokens_per_s_median), $(json_field "${runs[3]}" tokens_per_s_median) | $(json_field "${runs[1]}" tokens_per_s_median), $(json_field "${runs[2]}" tokens_per_s_median) | $(json_field "${runs[0]}" peak_memory_bytes) / $(json_field "${runs[1]}" peak_memory_bytes) | $lp |")
  done
  shards="$build_dir/overlap_shards/text"
  if [[ ! -e "${shards}_train_000000.bin" ]]; then
    mkdir -p "$(dirname "$shards")"
    stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    find "$stdlib" -name '*.py' -not -path '*/site-packages/*' | sort > "$details/shard_files.txt"
    python3 tools/make_shards.py --inputs-from "$details/shard_files.txt" --output-prefix "$shards" \
      --eos-id 256 > "$details/make_shards.log" 2>&1 || { failed=1; note "make_shards: FAILED"; }
  fi
  train=$(find_binary accrue_train)
  llama=(--model llama-125m --train-data "${shards}_train_*.bin" --dtype bf16 --micro-batch 8
    --seq-len 2048 --accum 2 --cuda-graphs "${timing[@]}")
  within=$(bench_run llama_within "$train" "${llama[@]}" --eos-id 256)
  rows=$(bench_run llama_rows "$train" "${llama[@]}" --contiguous-rows)
  for pair in "documents within rows:$within" "contiguous rows:$rows"; do
    [[ -n ${pair#*:} ]] || continue
    note "llama-125m 8 x 2048 x 2, graphs, ${pair%%:*}: $(json_field "${pair#*:}" tokens_per_s_median) tok/s, peak $(json_field "${pair#*:}" peak_memory_bytes) bytes"
  done
fi

# After the training runs (a failure here must not cost them), whatever they gave.
bench_bin=""
[[ $skip_bench -eq 0 && $skip_stream_gap -eq 0 ]] && bench_bin=$(find_binary accrue_bench)
if [[ -n $bench_bin ]]; then
  for c in plain side_wait side_no_wait own_event forked_graph forked_graph_last side_blocked \
    side_blocked_paced side_graph side_memset side_event side_alloc branches; do
    stream_gap_run "$c" "^stream_gap/$c(/|\$)"
    gap_rows+=("own process: $gap_result")
  done
  # One hardware queue for every stream: a blocked stream's wait then sits in
  # the same queue as the current stream's work instead of beside it.
  stream_gap_run side_blocked_1conn '^stream_gap/side_blocked(/|$)' CUDA_DEVICE_MAX_CONNECTIONS=1
  gap_rows+=("own process, CUDA_DEVICE_MAX_CONNECTIONS=1: $gap_result")
  stream_gap_run all '^stream_gap/'
  gap_rows+=("one process: $gap_result")
fi

# ---- sanitizers (last: a lent call may end first, and the timings are in) ----------
# gpu_check.sh's sanitizer step (Note [Sanitizer runs], Note [Sanitizer
# exclusions]): its racecheck classifies the hazards inside cuBLAS and cuDNN.
if [[ $skip_sanitizer -eq 0 && $failed -eq 0 ]]; then
  sanitized="$details/sanitizer"
  if tools/gpu_check.sh --build-dir "$build_dir" --skip-build --skip-tests --skip-bench \
    --log-dir "$sanitized" --details-dir "$sanitized/details" \
    --sanitizer-binaries '^test_(optim|nn_llama)_gpu$' --sanitizer-tools "$sanitizer_tools" \
    --filter 'GpuCloseUnderForward*:GpuGraphedWindow.concurrent*:GpuLlama*' \
    --sanitizer-timeout "$sanitizer_timeout" \
    > "$details/sanitizer.log" 2>&1; then
    note "compute-sanitizer ($sanitizer_tools) on GpuCloseUnderForward*, GpuGraphedWindow.concurrent* and GpuLlama*: passed"
  else
    failed=1
    note "compute-sanitizer ($sanitizer_tools) on GpuCloseUnderForward*, GpuGraphedWindow.concurrent* and GpuLlama*: FAILED"
  fi
  note_each "  " < <(grep -E '(memcheck|racecheck|initcheck|synccheck) test_' "$sanitized/summary.txt" 2> /dev/null)
fi

write_summary() {
  summary_head "GPU: $gpu_model"
  if [[ ${#bench_rows[@]} -gt 0 ]]; then
    echo
    echo "| run (runs in the order A B B A) | window ms, close in place (A, last A) | window ms, close under the forward (B, B) | fastest windows (first A / first B) | final loss |"
    echo "|---|---:|---:|---|---|"
    printf '%s\n' "${bench_rows[@]}"
  fi
  if [[ ${#concurrent_rows[@]} -gt 0 ]]; then
    echo
    echo "| --cuda-graphs (runs in the order A B B A) | tok/s, one at a time (A, last A) | tok/s, --concurrent-micro-batches $concurrent (B, B) | peak bytes A / B | final loss |"
    echo "|---|---:|---:|---|---|"
    printf '%s\n' "${concurrent_rows[@]}"
  fi
  if [[ ${#gap_rows[@]} -gt 0 ]]; then
    echo
    echo "stream_gap/*, median us per kernel (480 kernels x 32 graph replays; bench/bench_stream_gap.cu):"
    printf '  %s\n' "${gap_rows[@]}"
  fi
  echo
  verdict
}
finish write_summary
