#!/usr/bin/env bash
# A change measured against an earlier commit on the same GPUs, in one call:
# builds REV (a git worktree) and the working tree side by side, then runs
# each measurement alternately on both, --repeats times, and prints a table of
# medians and after/before ratios LAST. A refactor is held to "none slower by
# more than 2%" with it (bench/RESULTS.md has its tables).
#
#   tools/before_after.sh --base 400c16d                       # one GPU
#   tools/before_after.sh --base 400c16d --dp-gpt2 8:4         # plus 2 GPUs (torchrun)
#
# Measurements (each optional; the defaults are the house refactor's set):
#   --gpt2 "32:1 8:4 1:32"  accrue_train_gpt2 d12, synthetic, 32768 tokens per
#                           window, CUDA graphs: tok/s of the windows after --warmup
#                           (--gpt2-model d48 for 1.5B, --gpt2-args "--fp8" to add options)
#   --resnet "64:4"         accrue_resnet_bench resnet50 bf16 channels-last: images/s
#   --close                 accrue_bench --benchmark_filter=window_close (needs Google
#                           Benchmark: --deps with libbenchmark-dev on a bare machine)
#   --dp-gpt2 "8:4"         the GPT-2 point on 2 GPUs under torchrun, eager (the
#                           trainer's --cuda-graphs under data parallelism fails
#                           its first capture, at the base as after: bench/RESULTS.md)
set -u -o pipefail
check_name=before_after
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=tools/lib.sh
source tools/lib.sh
need_repo_root

base="" gpt2_points="32:1 8:4 1:32" gpt2_model=d12 gpt2_args="" resnet_points="64:4" close=1 dp_points="" repeats=2
warmup=4 windows=8 build_dir=build/before_after deps="" dry_run=0
usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  cat << 'EOF'
options:
  --base REV         the commit to compare against (required)
  --gpt2 POINTS      "B:K ..." GPT-2 points, or "" for none
  --gpt2-model SIZE  the GPT-2 size of those points: d12 (default), d24, d36 or d48
  --gpt2-args ARGS   more accrue_train_gpt2 options for them, e.g. "--fp8"
  --resnet POINTS    "B:K ..." ResNet-50 points, or "" for none
  --no-close         no window-close microbenchmark
  --dp-gpt2 POINTS   "B:K ..." GPT-2 points on 2 GPUs (default none)
  --repeats N        alternating runs per side (default 2)
  --build-dir DIR    where both builds go (default build/before_after)
  --deps DIR         .deb files (libgtest-dev, libbenchmark-dev, ...) for a bare machine
  --dry-run          print the commands, run nothing
EOF
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --base) base=$2; shift 2 ;;
    --gpt2) gpt2_points=$2; shift 2 ;;
    --gpt2-model) gpt2_model=$2; shift 2 ;;
    --gpt2-args) gpt2_args=$2; shift 2 ;;
    --resnet) resnet_points=$2; shift 2 ;;
    --no-close) close=0; shift ;;
    --dp-gpt2) dp_points=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --deps) deps=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "$check_name: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $base ]] || { echo "$check_name: --base REV is required (see --help)" >&2; exit 2; }
[[ $repeats =~ ^[1-9][0-9]?$ ]] || { echo "$check_name: --repeats must be 1..99" >&2; exit 2; }
[[ $gpt2_model =~ ^d(12|24|36|48)$ ]] ||
  { echo "$check_name: --gpt2-model '$gpt2_model' is not d12, d24, d36 or d48" >&2; exit 2; }
read -r -a gpt2_extra <<< "$gpt2_args"
git rev-parse --verify --quiet "$base^{commit}" > /dev/null ||
  { echo "$check_name: '$base' is not a commit of this repository" >&2; exit 2; }

log_dir=${OUT:-$build_dir/results}
make_dirs_absolute
open_details "$log_dir/details"
no_nvlink_multicast

# ---- the two builds ------------------------------------------------------------
base_src="$build_dir/base-src"
if [[ $dry_run -eq 0 ]]; then
  git worktree remove --force "$base_src" > /dev/null 2>&1
  git worktree add --detach --force "$base_src" "$base" > "$details/worktree.log" 2>&1 ||
    { note "worktree: FAILED ($(tail -n 1 "$details/worktree.log"))"; exit 1; }
  [[ -d third_party ]] && ln -sfn "$PWD/third_party" "$base_src/third_party"
fi
targets=(accrue_train_gpt2 accrue_resnet_bench)
[[ $close -eq 1 ]] && targets+=(accrue_bench)
build_side() {  # build_side NAME SOURCE
  cmake_args=(-S "$2" -B "$build_dir/$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES=90 -DACCRUE_BUILD_TESTS=OFF "-DACCRUE_BUILD_BENCHMARKS=$close")
  add_nvcc
  [[ -n $deps ]] && add_deps "$deps"
  if [[ $dry_run -eq 1 ]]; then
    echo "+ cmake ${cmake_args[*]} && cmake --build $build_dir/$1 -j$(nproc) --target ${targets[*]}"
    return 0
  fi
  configure || return 1
  run_build cmake --build "$build_dir/$1" -j"$(nproc)" --target "${targets[@]}" || return 1
  note "build $1: ok in ${build_seconds} s"
}
build_side before "$base_src" || exit 1
build_side after "$PWD" || exit 1

# ---- the measurements --------------------------------------------------------------
rows=()
# measure LABEL COMMAND...: runs COMMAND with before/ and after/ binaries
# alternately ({} in COMMAND stands for the side's build dir), each printing
# one number per line; the medians and their ratio become a row.
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
measure() {
  local label=$1
  shift
  local side r before="" after=""
  for ((r = 1; r <= repeats; r++)); do
    for side in before after; do
      local cmd=("${@//\{\}/$build_dir/$side}")
      if [[ $dry_run -eq 1 ]]; then echo "+ ${cmd[*]}"; continue; fi
      local out
      out=$("${cmd[@]}" 2> "$details/${label//[^A-Za-z0-9]/_}.$side.$r.err")
      [[ $side == before ]] && before+="$out"$'\n' || after+="$out"$'\n'
    done
  done
  [[ $dry_run -eq 1 ]] && return 0
  local b a
  b=$(grep -E '^[0-9.]+$' <<< "$before" | median)
  a=$(grep -E '^[0-9.]+$' <<< "$after" | median)
  rows+=("$(printf '| %s | %s | %s | %s |' "$label" "$b" "$a" "$(awk -v a="$a" -v b="$b" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "nan"}')")")
}
gpt2_rate() {  # tok/s of the windows after the warm-up, one a line
  "$@" | sed -nE "s/^window ([0-9]+)\/[0-9]+ .*\| ([0-9]+) tok\/s.*/\1 \2/p" |
    awk -v w="$warmup" '$1 > w {print $2}'
}
for p in $gpt2_points; do
  measure "GPT-2 $gpt2_model ${p/:/ x }${gpt2_args:+ $gpt2_args}" gpt2_rate \
    "{}/examples/accrue_train_gpt2" --model "$gpt2_model" --synthetic --micro-batch "${p%%:*}" \
    --seq-len 1024 --total-batch-tokens 32768 --windows "$windows" --cuda-graphs "${gpt2_extra[@]}"
done
resnet_rate() { "$@" | sed -nE 's/.*"images_per_s_median": ([0-9.]+).*/\1/p'; }
for p in $resnet_points; do
  measure "ResNet-50 ${p/:/ x } images/s" resnet_rate "{}/examples/accrue_resnet_bench" --model resnet50 \
    --image-size 224 --dtype bf16 --channels-last --micro-batch "${p%%:*}" --k "${p##*:}" \
    --warmup 2 --windows 5
done
close_times() {  # real time in ms of every window_close benchmark, one a line
  "$@" --benchmark_filter=window_close --benchmark_format=csv 2> /dev/null |
    awk -F, 'NR > 1 && $1 !~ /_(mean|median|stddev|cv)"?$/ {
      ms = $5 == "ns" ? 1e-6 : $5 == "us" ? 1e-3 : $5 == "s" ? 1e3 : 1
      print $3 * ms }'
}
close_total() { close_times "$@" | awk '{s += $1} END {print s}'; }
if [[ $close -eq 1 ]]; then
  measure "window close ms (sum over benchmarks)" close_total "{}/bench/accrue_bench"
fi
for p in $dp_points; do
  measure "GPT-2 124M ${p/:/ x } on 2 GPUs" gpt2_rate torchrun --nproc-per-node=2 --no-python \
    "{}/examples/accrue_train_gpt2" --model d12 --synthetic --micro-batch "${p%%:*}" --seq-len 1024 \
    --total-batch-tokens $((32768 * 2)) --windows "$windows"
done

[[ $dry_run -eq 1 ]] && exit 0
look_at_gpus one
note "before $base ($(git rev-parse --short "$base")), after the working tree at $(git rev-parse --short HEAD); $gpu_model; medians of $repeats alternating runs per side"
note "| measurement | before | after | after / before |"
note "|---|---|---|---|"
for r in "${rows[@]}"; do note "$r"; done
printf '%s\n' "${summary[@]}" > "$log_dir/summary.md"
exit "$failed"
