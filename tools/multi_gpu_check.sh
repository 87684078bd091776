#!/usr/bin/env bash
# The one-call 2-GPU check: run it from the repo root on a machine with two GPUs.
#
#   tools/multi_gpu_check.sh [options]
#
# Steps: configure (Release, CUDA, tests and benchmarks on) and build every
# binary the multi_gpu tests run, and accrue_bench_dist (--build-all:
# everything); ctest -L multi_gpu; with --memcheck, compute-sanitizer memcheck
# on the multi-GPU test binary's cases on 2 ranks; the data-parallel
# benchmarks: accrue_bench_dist --mode allreduce on 2 GPUs, --mode scaling on
# 2 GPUs and on 1 GPU, bench/torch_ddp.py under torchrun with 2 and 1
# processes; bench/compare_dist.py. The tables come first in the output, a
# short summary LAST (also in <log dir>/summary.txt).
#
# Output, five files, in the log dir: $OUT when set, else
# <build dir>/multi_gpu_check_results:
#   summary.txt      the summary printed at the end (tables included)
#   tables.md        bench/compare_dist.py's tables, for bench/RESULTS.md
#   accrue_dist.json accrue_bench_dist's runs (allreduce, scaling 2 GPUs, 1 GPU), a list
#   torch_ddp.json   torch_ddp.py's runs (2 GPUs, 1 GPU), a list
#   logs.tar.gz      every log: configure, build, ctest, each benchmark run
# The unpacked logs stay in <build dir>/multi_gpu_check/.
#
# Exit status: 0 when the build, the multi-GPU tests and every benchmark run
# succeeded (a benchmark target MISSed is reported, not failed), else 1.
set -u -o pipefail
check_name=multi_gpu_check
# shellcheck source=tools/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'EOF'
usage: tools/multi_gpu_check.sh [options]
  --build-dir DIR       build directory (default: build-mgpu)
  --log-dir DIR         where the results go (default: $OUT when set, else
                        <build dir>/multi_gpu_check_results)
  --arch ARCH           CMAKE_CUDA_ARCHITECTURES (default: 90)
  --jobs N              build parallelism (default: 16)
  --build-all           build every target, not only the multi-GPU ones
  --skip-tests          no ctest -L multi_gpu
  --memcheck FILTER     also run test_multi_gpu_test's cases matching the gtest FILTER under
                        compute-sanitizer memcheck on 2 ranks (e.g. 'MultiGpu.copy_engine*');
                        NCCL's own API errors are not reported (its start-up meets error
                        209 by design), memory errors are
  --skip-torch          no PyTorch side
  --torch-bf16-compress also run torch_ddp.py on 2 GPUs with DDP's bf16_compress_hook (rows
                        "ddp_bf16", the twin of accrue's ddp_bf16 variant)
  --scaling-args "..."  extra options for accrue_bench_dist --mode scaling AND torch_ddp.py
                        (same names: --width --depth --in --classes --dtype --micro-batch
                        --global-batch --k --tables --warmup --windows --lr)
  --accrue-args "..."   extra options for accrue_bench_dist --mode scaling only (--variants ddp,...)
  --allreduce-args "..."  extra options for accrue_bench_dist --mode allreduce
                        (--bucket-mb LIST --warmup N --repeats N)
  --bench-timeout S     time limit of each benchmark run in seconds (default: 240)
  --deps DIR            unpack the .deb files in DIR (libgtest-dev, libbenchmark-dev,
                        libbenchmark1debian) into the build dir, as tools/gpu_check.sh does
  -h, --help            this text
EOF
}

build_dir=build-mgpu
log_dir=""
arch=90
jobs=16
build_all=0
skip_tests=0
memcheck_filter=""
skip_torch=0
torch_bf16=0
scaling_args=""
accrue_args=""
allreduce_args=""
bench_timeout=240
deps_dir=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build-all) build_all=1; shift ;;
    --skip-tests) skip_tests=1; shift ;;
    --memcheck) memcheck_filter="$2"; shift 2 ;;
    --skip-torch) skip_torch=1; shift ;;
    --torch-bf16-compress) torch_bf16=1; shift ;;
    --scaling-args) scaling_args="$2"; shift 2 ;;
    --accrue-args) accrue_args="$2"; shift 2 ;;
    --allreduce-args) allreduce_args="$2"; shift 2 ;;
    --bench-timeout) bench_timeout="$2"; shift 2 ;;
    --deps) deps_dir="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "multi_gpu_check: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
log_dir="${log_dir:-${OUT:-$build_dir/multi_gpu_check_results}}"

need_repo_root
no_nvlink_multicast
export PYTHONUNBUFFERED=1
make_dirs_absolute
open_details "$build_dir/multi_gpu_check"

# ---- the machine -------------------------------------------------------------
look_at_gpus all
say "GPUs: $gpus ($gpu_model)"
if [[ $gpus -lt 2 ]]; then note "only $gpus GPU(s) visible: the 2-GPU steps will skip or fail"; fi

# ---- configure ------------------------------------------------------------------
cmake_args=(-S . -B "$build_dir" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_CUDA_ARCHITECTURES="$arch"
  -DACCRUE_CUDA=ON
  -DACCRUE_BUILD_TESTS=ON
  -DACCRUE_BUILD_BENCHMARKS=ON)
add_nvcc
if [[ -n "$deps_dir" ]]; then add_deps "$deps_dir"; fi
add_nccl_root

if ! configure; then
  built=0
elif ! grep -q 'accrue: NCCL communicator ON' "$details/configure.log"; then
  built=0
  failed=1
  note "configure: NCCL not found (accrue: NCCL communicator OFF): nothing multi-GPU to build"
else
  note "configure: ok ($(grep -E '^NCCL_LIBRARY:' "$build_dir/CMakeCache.txt" | sed 's/:FILEPATH=/ /'))"
  # ---- build --------------------------------------------------------------------
  # The benchmark and every binary a multi_gpu test runs (the test binaries,
  # accrue_train for the trainer's data-parallel test), not the whole tree:
  # the build dir's paths in the tests' commands that name a target.
  mapfile -t targets < <(ctest --test-dir "$build_dir" -N -V -L '^multi_gpu$' 2> /dev/null |
    grep -o "$build_dir/[^\" ]*" | xargs -r -n 1 basename | sort -u |
    grep -Fx -f <(ninja -C "$build_dir" -t targets all 2> /dev/null | sed -n 's/^\([A-Za-z0-9_]*\): phony$/\1/p'))
  targets+=(accrue_bench_dist)
  if [[ $build_all -eq 1 ]]; then targets=(all); fi
  say "build: ninja -j$jobs ${targets[*]}"
  if run_build ninja -C "$build_dir" -j"$jobs" "${targets[@]}"; then
    built=1
    note "build: ok in $build_seconds s ($build_warnings warning lines)"
  else
    built=0
  fi
fi

# ---- multi-GPU tests ------------------------------------------------------------------
if [[ $built -eq 1 && $skip_tests -eq 0 ]]; then
  say "ctest -L multi_gpu"
  ctest --test-dir "$build_dir" -L '^multi_gpu$' --timeout 600 --output-on-failure \
    --output-junit "$details/ctest_multi_gpu.xml" > "$details/ctest_multi_gpu.log" 2>&1
  rc=$?
  line=$(ctest_passed_line "$details/ctest_multi_gpu.log")
  # A node with too few GPUs makes the tests exit 77, which ctest counts as skipped, not failed.
  skipped=$(ctest_skipped "$details/ctest_multi_gpu.log")
  note "ctest -L multi_gpu: ${line:-FAILED to run (see ctest_multi_gpu.log)}$([[ ${skipped:-0} -gt 0 ]] && echo " ($skipped SKIPPED)")"
  note_failed_tests "$details/ctest_multi_gpu.log"
  if [[ $rc -ne 0 || -z "$line" ]]; then failed=1; fi
fi

# ---- memcheck on 2 ranks ----------------------------------------------------------------
if [[ $built -eq 1 && -n "$memcheck_filter" ]]; then
  say "compute-sanitizer memcheck, 2 ranks: test_multi_gpu_test --gtest_filter=$memcheck_filter"
  ACCRUE_UNDER_SANITIZER=1 MULTI_GPU_TIMEOUT=600 bash tests/dist/multi_gpu_launch.sh 2 \
    compute-sanitizer --tool memcheck --report-api-errors no \
    "$build_dir/tests/dist/test_multi_gpu_test" --gtest_filter="$memcheck_filter" \
    > "$details/memcheck_multi_gpu.log" 2>&1
  rc=$?
  summaries=$(grep -c 'ERROR SUMMARY: 0 errors' "$details/memcheck_multi_gpu.log")
  if [[ $rc -eq 0 && $summaries -eq 2 ]]; then
    note "memcheck, 2 ranks ($memcheck_filter): 0 errors on both"
  else
    failed=1
    note "memcheck, 2 ranks ($memcheck_filter): FAILED, exit $rc (see memcheck_multi_gpu.log):"
    note_each "    " < <(grep -E 'ERROR SUMMARY|FAILED|killed' "$details/memcheck_multi_gpu.log" | head -n 6)
  fi
fi

# ---- benchmarks ---------------------------------------------------------------------
# run_step NAME LOG COMMAND...: runs it under the benchmark time limit, notes ok or FAILED.
run_step() {
  local name="$1" log="$2"
  shift 2
  say "$name: $*"
  local begin=$SECONDS
  timeout -k 10 "$bench_timeout" "$@" > "$details/$log" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    note "$name: ok in $((SECONDS - begin)) s"
  else
    failed=1
    if [[ $rc -eq 124 ]]; then
      note "$name: TIMEOUT after ${bench_timeout}s (see $log):"
    else
      note "$name: FAILED exit $rc (see $log):"
    fi
    note_each "    " < <(grep -v '^\s*$' "$details/$log" | tail -n 4)
  fi
  return $rc
}

# Variables a launcher may have left in this shell: the 1-GPU runs must be world size 1.
launcher_vars=(RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK ROLE_RANK
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE
  SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE SLURM_TASKS_PER_NODE)
unset_launcher=()
for v in "${launcher_vars[@]}"; do unset_launcher+=(-u "$v"); done

# The extra options split into words at spaces.
read -r -a extra_scaling <<< "$scaling_args"
read -r -a extra_accrue <<< "$accrue_args"
read -r -a extra_allreduce <<< "$allreduce_args"
accrue_jsons=()
torch_jsons=()
if [[ $built -eq 1 ]]; then
  bin="$build_dir/bench/accrue_bench_dist"
  launch=(env MULTI_GPU_TIMEOUT="$bench_timeout" bash tests/dist/multi_gpu_launch.sh 2 "$bin")

  if run_step "accrue allreduce, 2 GPUs" accrue_allreduce_2gpu.log "${launch[@]}" --mode allreduce \
    --json "$details/accrue_allreduce_2gpu.json" "${extra_allreduce[@]}"; then
    accrue_jsons+=("$details/accrue_allreduce_2gpu.json")
  fi
  if run_step "accrue scaling, 2 GPUs" accrue_scaling_2gpu.log "${launch[@]}" --mode scaling \
    --json "$details/accrue_scaling_2gpu.json" "${extra_scaling[@]}" "${extra_accrue[@]}"; then
    accrue_jsons+=("$details/accrue_scaling_2gpu.json")
  fi
  if run_step "accrue scaling, 1 GPU" accrue_scaling_1gpu.log env "${unset_launcher[@]}" "$bin" \
    --mode scaling --json "$details/accrue_scaling_1gpu.json" "${extra_scaling[@]}" \
    "${extra_accrue[@]}"; then
    accrue_jsons+=("$details/accrue_scaling_1gpu.json")
  fi
fi

if [[ $skip_torch -eq 0 ]]; then
  torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)
  say "PyTorch $torch_version"
  for nproc in 2 1; do
    if run_step "torch_ddp.py, $nproc GPU(s)" "torch_ddp_${nproc}gpu.log" env "${unset_launcher[@]}" \
      python3 -m torch.distributed.run --standalone --nproc-per-node="$nproc" bench/torch_ddp.py \
      --json "$details/torch_ddp_${nproc}gpu.json" "${extra_scaling[@]}"; then
      torch_jsons+=("$details/torch_ddp_${nproc}gpu.json")
    fi
  done
  if [[ $torch_bf16 -eq 1 ]] && run_step "torch_ddp.py bf16_compress_hook, 2 GPUs" \
    torch_ddp_bf16_2gpu.log env "${unset_launcher[@]}" python3 -m torch.distributed.run \
    --standalone --nproc-per-node=2 bench/torch_ddp.py --bf16-compress \
    --json "$details/torch_ddp_bf16_2gpu.json" "${extra_scaling[@]}"; then
    torch_jsons+=("$details/torch_ddp_bf16_2gpu.json")
  fi
fi

# ---- results ----------------------------------------------------------------------------
# One list per side: a run object per benchmark run.
merge_json() {
  local out="$1"
  shift
  python3 -c 'import json, sys; json.dump([json.load(open(p)) for p in sys.argv[2:]], open(sys.argv[1], "w"), indent=1)' \
    "$out" "$@"
}
tables=""
if [[ ${#accrue_jsons[@]} -gt 0 ]]; then
  merge_json "$log_dir/accrue_dist.json" "${accrue_jsons[@]}"
  compare_args=(--accrue "$log_dir/accrue_dist.json" --markdown "$log_dir/tables.md")
  if [[ ${#torch_jsons[@]} -gt 0 ]]; then
    merge_json "$log_dir/torch_ddp.json" "${torch_jsons[@]}"
    compare_args+=(--torch "$log_dir/torch_ddp.json")
  fi
  if python3 bench/compare_dist.py "${compare_args[@]}" > "$details/compare.log" 2>&1; then
    tables=$(cat "$details/compare.log")
    note_each "" < <(grep -E '^(targets:|MISS:|below target)' "$details/compare.log")
  else
    failed=1
    note "compare_dist.py: FAILED: $(tail -n 1 "$details/compare.log")"
  fi
fi

# ---- summary (LAST) ------------------------------------------------------------------
# shellcheck disable=SC2317  # called by finish
write_summary() {
  if [[ -n "$tables" ]]; then
    echo "$tables"
    echo
  fi
  summary_head "GPUs: $gpus ($gpu_model)"
  verdict
}
finish write_summary
