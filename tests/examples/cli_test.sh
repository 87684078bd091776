#!/usr/bin/env bash
# The example binaries' command lines, as a user types them (Note [Exit codes]
# in examples/common/run_main.h, Note [Command-line values] in
# examples/common/options.h):
#   cli_test.sh BINARY_DIR NAME
# NAME is one of demo, verify, resnet, resnet_bench, train_gpt2, llama_tiny, train, generate. Each case runs
# the binary and checks its exit code (0 for --help, 2 for a bad command line,
# 1 for a failed run) and that stderr is one line naming the cause, with no
# build-tree "file.cpp:123" and no std::terminate.
set -u
dir=$1
name=$2
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run ARGS...: sets rc, out, err.
run() {
  local o e
  o=$(mktemp) e=$(mktemp)
  "$bin" "$@" > "$o" 2> "$e"
  rc=$?
  out=$(cat "$o") err=$(cat "$e")
  rm -f "$o" "$e"
}

# expect CODE FRAGMENT ARGS...: exit code CODE, one line on stderr containing FRAGMENT.
expect() {
  local code=$1 fragment=$2
  shift 2
  run "$@"
  local what="$name $*"
  if [[ $rc -ne $code ]]; then
    fail "$what: exit code $rc, expected $code; stderr: $err"
    return
  fi
  if [[ $(printf '%s\n' "$err" | wc -l) -ne 1 || -z $err ]]; then
    fail "$what: expected one line on stderr, got: $err"
  fi
  [[ $err == *"$fragment"* ]] || fail "$what: stderr lacks '$fragment': $err"
  [[ $err == "$prog: "* ]] || fail "$what: stderr does not start with '$prog: ': $err"
  if [[ $err =~ \.(cpp|h|cu):[0-9]+ ]]; then fail "$what: a source location in: $err"; fi
  [[ $err != *terminate* ]] || fail "$what: std::terminate: $err"
  [[ $code -ne 2 || $err == *"(see --help)" ]] || fail "$what: no hint to --help: $err"
  echo "ok: $what -> $rc: $err"
}

# help OPTION...: --help exits 0 and lists every OPTION; so does -h.
help() {
  run --help
  [[ $rc -eq 0 ]] || fail "$name --help: exit code $rc"
  [[ -z $err ]] || fail "$name --help: stderr: $err"
  [[ $out == "usage: $prog [options]"* ]] || fail "$name --help: no usage line"
  local option
  for option in "$@" --help; do
    grep -q -- "^ *\(-[a-z], \)\?$option\b" <<< "$out" || fail "$name --help does not list $option"
  done
  local full=$out
  run -h
  [[ $rc -eq 0 && $out == "$full" ]] || fail "$name -h differs from --help"
  echo "ok: $name --help lists $# options"
}

# Refusals every binary shares: the option table's.
common_refusals() {
  expect 2 "unknown option '--no-such-option'" --no-such-option
  expect 2 "unexpected argument 'stray'" stray
  expect 2 "--windows needs a value" --windows
  expect 2 "--windows expects an integer, got '12x'" --windows 12x
  expect 2 "--windows 99999999999999999999 does not fit a 64-bit integer" \
    --windows 99999999999999999999
  expect 2 "--windows must be >= 1, got 0" --windows 0
}

case $name in
  demo)
    bin=$dir/accrue_demo prog=accrue_demo
    help --micro-batch --accum --windows --optimizer --lr --clip --scaler --dtype --zero1 --cpu \
      --metrics
    common_refusals
    expect 2 "--accum expects an integer, got 'four'" --accum four
    expect 2 "--lr must be > 0, got 0" --lr 0
    expect 2 "--lr expects a finite number, got 'nan'" --lr nan
    expect 2 "--optimizer must be sgd, adam or adamw, got 'lion'" --optimizer lion
    expect 2 "--dtype must be f32, bf16 or f16, got 'f64'" --dtype f64
    expect 2 "--metrics needs a value, got the option '--cpu'" --metrics --cpu
    expect 2 "--metrics needs a non-empty path" --metrics ""
    expect 2 "--micro-batch 4611686018427387904 x --accum 2 overflows a 64-bit integer" \
      --cpu --micro-batch 4611686018427387904 --accum 2
    expect 2 "--metrics /tmp is a directory" --cpu --metrics /tmp
    expect 2 "--metrics /no-such-dir/m.jsonl: no folder /no-such-dir" --cpu --metrics \
      /no-such-dir/m.jsonl
    # One window has nothing to compare its loss with: it succeeds.
    run --cpu --windows 1
    [[ $rc -eq 0 ]] || fail "demo --windows 1: exit code $rc: $err"
    ;;
  verify)
    bin=$dir/accrue_verify prog=accrue_verify
    help --K --windows --batch --normalization --dtype --cpu
    common_refusals
    expect 2 "--K must be >= 2, got 1" --K 1
    expect 2 "--batch 32 does not split into K = 3 micro-batches" --K 3 --batch 32
    expect 2 "--normalization must be item or mean, got 'sum'" --normalization sum
    expect 2 "overflows a 64-bit integer" --cpu --K 4611686018427387904 \
      --batch 4611686018427387904 --windows 1
    # Far too large to allocate: a failed run (1) with one line naming the op,
    # the shape and the bytes (Note [Checked sizes] in core/tensor.cpp), not
    # std::terminate.
    expect 1 "empty: shape [100000000000, 16] of f64 needs 12800000000000 bytes" \
      --cpu --batch 100000000000 --K 2 --windows 1
    ;;
  llama_tiny)
    bin=$dir/accrue_llama_tiny prog=accrue_llama_tiny
    help --micro-batch --accum --windows --seq-len --min-len --seed --lr --dtype --cpu
    common_refusals
    expect 2 "--seq-len must be in [2, 256], got 300" --seq-len 300
    expect 2 "--min-len 70 is longer than --seq-len 64" --min-len 70
    expect 2 "--dtype must be f32, bf16 or f64, got 'f16'" --dtype f16
    run --cpu --windows 2 --micro-batch 2 --seq-len 16 --min-len 4
    [[ $rc -eq 0 ]] || fail "llama_tiny --windows 2: exit code $rc: $err"
    ;;
  train)
    bin=$dir/accrue_train prog=accrue_train
    help --model --train-data --eos-id --synthetic --micro-batch --seq-len --accum --windows \
      --stop-after --lr --warmup-windows --weight-decay --max-grad-norm --dtype --seed \
      --cuda-graphs --cpu --checkpoint --checkpoint-every --resume --metrics --max-skipped-windows \
      --layer-metrics-every --val-data --val-every --val-batches --min-lr-factor --beta1 --beta2 \
      --eps --noise-scale-every --init-scale --calibrate-scale --total-batch-tokens --init-from \
      --allow-changed --norm-under-backward --dropout --stop-micro-steps --n-layer --n-head \
      --n-embd --vocab-size --block-size --composed \
      --synthetic-documents --activation-checkpointing --gemm-tuning --nvtx --zero1 --bench \
      --bench-warmup --bench-windows --peak-tflops --fp8 --contiguous-rows --close-under-forward \
      --close-layer-elements --close-max-blocks --concurrent-micro-batches --weight-grad-branch \
      --bucket-mb --grad-transport
    common_refusals
    expect 2 "--model 'gpt9' is not one of gpt2-tiny, gpt2-d12, gpt2-d24, gpt2-d36, gpt2-d48, llama-125m" \
      --synthetic --model gpt9
    for preset in gpt2-tiny gpt2-d12 gpt2-d24 gpt2-d36 gpt2-d48 llama-tiny qwen3-0.6b; do
      run --help
      [[ $out == *"$preset"* ]] || fail "train --help does not list the preset $preset"
    done
    # Note [GPT-2 rows]: full rows only, contiguous rows of the shards.
    expect 2 "--model gpt2-tiny takes full rows only (--synthetic-documents full), not packed" \
      --model gpt2-tiny --synthetic --synthetic-documents random
    expect 2 "--model gpt2-d12 takes no --eos-id: GPT-2 reads contiguous rows" \
      --model gpt2-d12 --train-data '/tmp/x_*.bin' --eos-id 50256
    expect 2 "--seq-len 100 is longer than gpt2-tiny's block size 64" --model gpt2-tiny \
      --synthetic --cpu --seq-len 100
    expect 2 "give exactly one of --train-data and --synthetic" --cpu
    expect 2 "--train-data needs --eos-id" --train-data '/tmp/x_*.bin'
    expect 2 "--contiguous-rows takes no --eos-id: rows run across document boundaries" \
      --train-data '/tmp/x_*.bin' --eos-id 2 --contiguous-rows
    expect 2 "--contiguous-rows reads --train-data; with --synthetic, rows are" --synthetic \
      --contiguous-rows
    # Note [Close under the forward]: the same bits; what it does not run beside is refused.
    for other in --zero1; do
      expect 2 "--close-under-forward is not taken with $other" --synthetic --close-under-forward \
        $other
    done
    expect 2 "--close-layer-elements needs --close-under-forward" --synthetic \
      --close-layer-elements 64
    expect 2 "--close-layer-elements must be >= 1, got 0" --synthetic --close-under-forward \
      --close-layer-elements 0
    expect 2 "--close-max-blocks needs --close-under-forward" --synthetic --close-max-blocks 8
    # Note [Concurrent micro-batches]: inside graphs only, and not beside what it cannot order.
    expect 2 "--concurrent-micro-batches 2 needs --cuda-graphs" --synthetic \
      --concurrent-micro-batches 2
    expect 2 "--concurrent-micro-batches must be in [1, 64], got 0" --synthetic --cuda-graphs \
      --concurrent-micro-batches 0
    for other in --close-under-forward --zero1; do
      expect 2 "--concurrent-micro-batches is not taken with $other" --synthetic --cuda-graphs \
        --concurrent-micro-batches 2 $other
    done
    # The data-parallel knobs: their ranges, and on one process nothing to sum (the same bits).
    expect 2 "--bucket-mb must be in [0.001, 4096], got 0" --synthetic --bucket-mb 0
    expect 2 "--grad-transport must be exact, bf16 or f16, got 'f8'" --synthetic --grad-transport f8
    run --cpu --synthetic --windows 2 --micro-batch 2 --seq-len 32 --accum 2
    exact=$(grep "^final:" <<< "$out")
    expect 2 "--gemm-sm-margin must be in [0, 1023], got 1024" --synthetic --gemm-sm-margin 1024
    expect 2 "--nccl-max-ctas must be in [0, 64], got 65" --synthetic --nccl-max-ctas 65
    run --cpu --synthetic --windows 2 --micro-batch 2 --seq-len 32 --accum 2 --bucket-mb 0.5 \
      --grad-transport bf16 --gemm-sm-margin 16 --nccl-max-ctas 16
    [[ $rc -eq 0 && -n $exact && $(grep "^final:" <<< "$out") == "$exact" &&
      $out == *"--gemm-sm-margin, --nccl-max-ctas: one process, no gradients to sum"* ]] ||
      fail "train --grad-transport bf16 on one process: exit code $rc: $out"
    # Note [Weight gradients on a branch]: inside graphs only, one micro-step at a time.
    expect 2 "--weight-grad-branch 2 needs --cuda-graphs" --synthetic --weight-grad-branch 2
    expect 2 "--weight-grad-branch is not taken with --concurrent-micro-batches 2" --synthetic \
      --cuda-graphs --concurrent-micro-batches 2 --weight-grad-branch 2
    expect 2 "--weight-grad-branch must be in [0, 64], got -1" --synthetic --cuda-graphs \
      --weight-grad-branch -1
    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 2
    plain=$(grep "^final:" <<< "$out")
    # On the CPU the branch is never used (graphs only): the same bits.
    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 2 --cuda-graphs \
      --weight-grad-branch 2
    [[ $rc -eq 0 && -n $plain && $(grep "^final:" <<< "$out") == "$plain" ]] ||
      fail "train --weight-grad-branch 2: exit code $rc, '$plain' vs '$(grep "^final:" <<< "$out")'"
    # On the CPU the graphs run eagerly: a group's micro-steps one after another, the same bits.
    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 3 --cuda-graphs \
      --concurrent-micro-batches 2
    grouped=$(grep "^final:" <<< "$out")
    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 3
    [[ $rc -eq 0 && -n $grouped && $(grep "^final:" <<< "$out") == "$grouped" ]] ||
      fail "train --concurrent-micro-batches 2: exit code $rc, '$grouped' vs '$(grep "^final:" <<< "$out")'"
    # FP8 layers take part, delayed scaling too (Note [Concurrent micro-batches]).
    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 3 --cuda-graphs \
      --concurrent-micro-batches 2 --fp8 --fp8-scaling delayed
    grouped=$(grep "^final:" <<< "$out")
    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 3 --fp8 --fp8-scaling delayed
    [[ $rc -eq 0 && -n $grouped && $(grep "^final:" <<< "$out") == "$grouped" ]] ||
      fail "train --concurrent-micro-batches 2 --fp8: exit code $rc, '$grouped' vs '$(grep "^final:" <<< "$out")'"

    run --cpu --synthetic --windows 4 --micro-batch 2 --seq-len 32 --accum 2 \
      --close-under-forward --close-layer-elements 2000
    [[ $rc -eq 0 && -n $plain && $(grep "^final:" <<< "$out") == "$plain" ]] ||
      fail "train --close-under-forward: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$plain'"
    expect 2 "--dtype must be f32, bf16, f16 or f64, got 'f8'" --synthetic --dtype f8
    expect 2 "--init-scale applies to --dtype f16 only, the compute dtype is f32" --synthetic \
      --init-scale 8
    expect 2 "--calibrate-scale applies to --dtype f16 only, the compute dtype is bf16" \
      --synthetic --dtype bf16 --calibrate-scale
    expect 2 "--fp8 computes in FP8 over f32, bf16 or f16 activations; not with --dtype f64" \
      --synthetic --dtype f64 --fp8
    expect 2 "--lr must be > 0, got 0" --synthetic --lr 0
    expect 2 "--stop-after 5 is past --windows 3" --synthetic --windows 3 --stop-after 5
    expect 2 "--seq-len 1000 is longer than llama-tiny's max_position_embeddings 128" \
      --synthetic --cpu --seq-len 1000
    expect 1 "window 2 was skipped" --synthetic --cpu --lr 1e30 --windows 3 \
      --max-skipped-windows 0
    expect 2 "--bench-windows must be >= 1, got 0" --synthetic --bench --bench-windows 0
    expect 2 "--bench-warmup must be >= 0, got -1" --synthetic --bench --bench-warmup -1
    expect 2 "--bench-warmup expects an integer, got 'x'" --synthetic --bench --bench-warmup x
    expect 2 "--peak-tflops must be > 0, got 0" --synthetic --bench --peak-tflops 0
    expect 2 "--synthetic-documents must be random or full, got 'half'" --synthetic \
      --synthetic-documents half
    expect 2 "--synthetic-documents needs --synthetic" --train-data '/tmp/x_*.bin' --eos-id 2 \
      --synthetic-documents full
    expect 2 "--bench takes no --checkpoint or --resume" --synthetic --bench \
      --checkpoint /tmp/unused.safetensors
    expect 2 "--bench takes no --stop-after" --synthetic --bench --stop-after 1
    expect 2 "--zero1 takes no --checkpoint or --resume" --synthetic --zero1 \
      --resume /tmp/unused.safetensors
    expect 2 "--gemm-tuning /no-such-dir/t.txt: no folder /no-such-dir" --synthetic --cpu \
      --gemm-tuning /no-such-dir/t.txt
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2
    [[ $rc -eq 0 ]] || fail "train --windows 3: exit code $rc: $err"
    grep -q "^window 3/3 | loss " <<< "$out" || fail "train: no progress line for window 3: $out"
    # --cuda-graphs pads the document offsets to fixed-shape inputs; on the CPU
    # it runs eagerly through them and must give the same loss to the last bit.
    plain=$(grep "^final:" <<< "$out")
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --cuda-graphs
    [[ $rc -eq 0 && -n $plain && $(grep "^final:" <<< "$out") == "$plain" ]] ||
      fail "train --cuda-graphs --cpu: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$plain'"
    # Recomputing each block in backward gives the same gradients; --zero1
    # without a launcher is one process, whose one shard is the whole state.
    for extra in --activation-checkpointing --zero1; do
      run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
        "$extra"
      [[ $rc -eq 0 && $(grep "^final:" <<< "$out") == "$plain" ]] ||
        fail "train $extra --cpu: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$plain'"
    done
    # Note [FP8 linear]: the projections in FP8 train (another loss than bf16's;
    # the HF goldens bound it), the weights' FP8 copies counted in --bench's memory.
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8
    [[ $rc -eq 0 ]] || fail "train --fp8: exit code $rc: $err"
    grep -q "^final: window 3 loss " <<< "$out" || fail "train --fp8: no final line: $out"
    run --cpu --model llama-tiny --synthetic --micro-batch 2 --seq-len 32 --accum 2 --dtype bf16 \
      --fp8 --bench --bench-warmup 1 --bench-windows 1
    grep -q '"fp8": [1-9]' <<< "$out" && grep -q '"fp8": true' <<< "$out" ||
      fail "train --fp8 --bench: no FP8 copies in the JSON line: $out"
    # Casting the weights at every micro-batch gives the same bits (Note
    # [Window FP8 weights]), and keeps no copies.
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8
    kept=$(grep "^final:" <<< "$out")
    # Note [FP8 codes in the compute slots]: with a bf16 compute copy the codes
    # live there; casting at every micro-batch below reads the weights from the
    # compute copy instead, and gives the same bits.
    grep -q "fp8 copies .* (codes in the compute slots)" <<< "$out" ||
      fail "train --fp8 --dtype bf16: the codes are not in the compute slots: $out"
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8 --fp8-cast-every-micro-batch
    [[ $rc -eq 0 && -n $kept && $(grep "^final:" <<< "$out") == "$kept" ]] ||
      fail "train --fp8-cast-every-micro-batch: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$kept'"
    # Recomputing the blocks in backward recasts the same codes: the same bits.
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8 --activation-checkpointing
    [[ $rc -eq 0 && $(grep "^final:" <<< "$out") == "$kept" ]] ||
      fail "train --fp8 --activation-checkpointing: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$kept'"
    expect 2 "--fp8-cast-every-micro-batch needs --fp8" --synthetic --fp8-cast-every-micro-batch
    # The CPU reference sums exactly with or without fast accumulation: the same bits.
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8 --fp8-fast-forward
    [[ $rc -eq 0 && $(grep "^final:" <<< "$out") == "$kept" ]] ||
      fail "train --fp8-fast-forward on the CPU: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$kept'"
    expect 2 "--fp8-fast-forward needs --fp8 with --fp8-recipe tensor" --synthetic --fp8-fast-forward
    expect 2 "--fp8-fast-forward needs --fp8 with --fp8-recipe tensor" --synthetic --fp8 \
      --fp8-recipe block --fp8-fast-forward
    # Note [FP8 block recipe]: per-tile scales, another loss; the weights' block
    # copies kept once per window give the bits of casting at every call.
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8 --fp8-recipe block
    block=$(grep "^final:" <<< "$out")
    [[ $rc -eq 0 && -n $block && $block != "$kept" ]] ||
      fail "train --fp8-recipe block: exit code $rc, '$block' vs tensor '$kept'"
    run --cpu --model llama-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8 --fp8-recipe block --fp8-cast-every-micro-batch
    [[ $rc -eq 0 && $(grep "^final:" <<< "$out") == "$block" ]] ||
      fail "train --fp8-recipe block --fp8-cast-every-micro-batch: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$block'"
    expect 2 "--fp8-recipe needs --fp8" --synthetic --fp8-recipe block
    expect 2 "--fp8-recipe must be tensor or block, got 'tile'" --synthetic --fp8 --fp8-recipe tile
    # GPT-2's four projections per block too (the tied classifier stays bf16).
    run --cpu --model gpt2-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16
    plain=$(grep "^final:" <<< "$out")
    run --cpu --model gpt2-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8
    [[ $rc -eq 0 && -n $plain && $(grep "^final:" <<< "$out") != "$plain" ]] ||
      fail "train gpt2-tiny --fp8: exit code $rc, '$(grep "^final:" <<< "$out")' vs bf16 '$plain'"
    e5m2=$(grep "^final:" <<< "$out")
    # --fp8-grad-dtype e4m3: dy in e4m3 (3 mantissa bits where e5m2 has 2), another
    # loss; under delayed scaling the rows are kept in the layers' dtypes.
    run --cpu --model gpt2-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
      --dtype bf16 --fp8 --fp8-grad-dtype e4m3
    [[ $rc -eq 0 && $(grep "^final:" <<< "$out") =~ ^final:\ window\ 3\ loss\ [0-9]+\.[0-9]+$ &&
      $(grep "^final:" <<< "$out") != "$e5m2" ]] ||
      fail "train --fp8-grad-dtype e4m3: exit code $rc, '$(grep "^final:" <<< "$out")' vs e5m2 '$e5m2'"
    for recipe in "--fp8-scaling delayed" "--fp8-recipe block"; do
      # shellcheck disable=SC2086  # two words each
      run --cpu --model gpt2-tiny --synthetic --windows 3 --micro-batch 2 --seq-len 32 --accum 2 \
        --dtype bf16 --fp8 --fp8-grad-dtype e4m3 $recipe
      [[ $rc -eq 0 && $(grep "^final:" <<< "$out") =~ ^final:\ window\ 3\ loss\ [0-9]+\.[0-9]+$ ]] ||
        fail "train --fp8-grad-dtype e4m3 $recipe: exit code $rc: $err"
    done
    # --bench's JSON config names the choice.
    run --cpu --model gpt2-tiny --synthetic --micro-batch 2 --seq-len 32 --accum 2 --dtype bf16 \
      --fp8 --fp8-grad-dtype e4m3 --fp8-scaling delayed --bench --bench-warmup 1 --bench-windows 1
    grep -q '"fp8_scaling": "delayed", "fp8_grad_dtype": "e4m3"' <<< "$out" ||
      fail "train --fp8-grad-dtype e4m3 --bench: the JSON config does not name the choice: $out"
    expect 2 "--fp8-grad-dtype needs --fp8" --synthetic --fp8-grad-dtype e4m3
    expect 2 "--fp8-grad-dtype must be e5m2 or e4m3, got 'e3m4'" --synthetic --fp8 \
      --fp8-grad-dtype e3m4
    # GPT-2 through the same trainer: Note [Synthetic rows] draws accrue_train_gpt2's
    # tokens, so the two trainers on the same model, seed and batch end at the
    # same loss to the last bit. The tokens are uniform (nothing to learn), so
    # the loss only has to be finite here; tests/examples/train_resume_test.sh
    # trains on text.
    gpt2=(--cpu --synthetic --windows 3 --micro-batch 2 --seq-len 32 --lr 1e-2 --seed 7)
    run --model gpt2-tiny --synthetic-documents full --accum 2 "${gpt2[@]}"
    [[ $rc -eq 0 ]] || fail "train --model gpt2-tiny: exit code $rc: $err"
    ours=$(grep "^final:" <<< "$out")
    [[ $out == *"GPT-2, 2 layers, 4 heads, width 64"* ]] || fail "train gpt2-tiny banner: $out"
    [[ $ours =~ ^final:\ window\ 3\ loss\ [0-9]+\.[0-9]+$ ]] ||
      fail "train gpt2-tiny: no finite final loss: '$ours'"
    bin=$dir/accrue_train_gpt2
    run --model tiny --total-batch-tokens 128 "${gpt2[@]}"
    theirs=$(grep "^final:" <<< "$out")
    [[ $rc -eq 0 && -n $ours && $ours == "$theirs" ]] ||
      fail "train gpt2-tiny '$ours' vs accrue_train_gpt2 tiny '$theirs' (exit code $rc)"
    echo "ok: accrue_train --model gpt2-tiny ends where accrue_train_gpt2 does: $ours"
    # The optimizer options and the noise scale: the same run, the same figures.
    final=() noise=$(mktemp)
    for trainer in accrue_train:gpt2-tiny:--accum:2 accrue_train_gpt2:tiny:--total-batch-tokens:128; do
      IFS=: read -r b m k n <<< "$trainer"
      bin=$dir/$b
      run --model "$m" "$k" "$n" "${gpt2[@]}" --beta1 0.8 --beta2 0.99 --eps 1e-6 \
        --min-lr-factor 0.5 --noise-scale-every 1 --metrics "$noise"
      [[ $rc -eq 0 ]] || fail "$b --noise-scale-every 1: exit code $rc: $err"
      final+=("$(grep "^final:" <<< "$out") $(grep -o '"noise_scale": [^,]*' "$noise" |
        tr '\n' ' ')")
    done
    rm -f "$noise"
    [[ ${final[0]} == *'"noise_scale": '*'"noise_scale": '*'"noise_scale": '* &&
      ${final[0]} == "${final[1]}" ]] ||
      fail "train gpt2-tiny with betas, eps, min-lr-factor, noise scale: '${final[0]}' vs '${final[1]}'"
    # f16 with dynamic loss scaling (examples/common/loss_scaling.h): the same
    # scale, the same run, from 65536 / (B * T), calibrated or given.
    for scale in --calibrate-scale "--init-scale 8" ""; do
      final=()
      for trainer in accrue_train:gpt2-tiny:--accum:2 accrue_train_gpt2:tiny:--total-batch-tokens:128; do
        IFS=: read -r b m k n <<< "$trainer"
        bin=$dir/$b
        run --model "$m" "$k" "$n" "${gpt2[@]}" --dtype f16 $scale
        final+=("$(grep "^final:" <<< "$out") $(grep -o "scale [0-9]*$" <<< "$out" | tail -1)")
      done
      [[ $rc -eq 0 && ${final[0]} == *"scale "[0-9]* && ${final[0]} == "${final[1]}" ]] ||
        fail "train gpt2-tiny --dtype f16 $scale: '${final[0]}' vs '${final[1]}' (exit code $rc)"
    done
    bin=$dir/accrue_train
    run --model llama-tiny --accum 2 "${gpt2[@]}" --dtype f16
    [[ $rc -eq 0 && $out == *"window 3/3 | loss "[0-9]*"| scale "* ]] ||
      fail "train llama-tiny --dtype f16: exit code $rc: $out"
    expect 2 "--noise-scale-every needs K >= 2 micro-batches per window, got K = 1" --synthetic \
      --cpu --accum 1 --noise-scale-every 1
    expect 2 "give --accum or --total-batch-tokens, not both" --synthetic --accum 2 \
      --total-batch-tokens 128
    expect 2 "--total-batch-tokens 100 is not a multiple of micro-batch 2 x seq-len 32 x 1 ranks = 64" \
      --synthetic --cpu --micro-batch 2 --seq-len 32 --total-batch-tokens 100
    # --total-batch-tokens 128 of micro-batch 2 x seq-len 32 is K = 2.
    run --model gpt2-tiny --total-batch-tokens 128 "${gpt2[@]}"
    [[ $rc -eq 0 && $out == *"K=2 = 128 tokens per window"* &&
      $(grep "^final:" <<< "$out") == "$ours" ]] ||
      fail "train --total-batch-tokens 128: exit code $rc, $(grep "^final:" <<< "$out") vs $ours"
    # The layer monitor (Note [Layer monitor]): each parameter's and group's
    # figures in the --metrics rows it measures, the run's loss unchanged.
    bin=$dir/accrue_train
    expect 2 "--layer-metrics-every needs --metrics FILE" --synthetic --layer-metrics-every 2
    expect 2 "--val-data needs --eos-id" --synthetic --val-data '/tmp/x_*.bin'
    expect 2 "--val-every and --val-batches need --val-data GLOB" --synthetic --val-every 2
    # As for Llama above: graphs run eagerly on the CPU, recomputation and
    # one-process ZeRO-1 change nothing.
    run --model gpt2-tiny --accum 2 "${gpt2[@]}"
    plain=$(grep "^final:" <<< "$out")
    expect 2 "--allow-changed needs --resume FILE" --synthetic --allow-changed lr
    expect 2 "--stop-micro-steps needs --stop-after N and --checkpoint FILE" --synthetic \
      --stop-micro-steps 1
    expect 2 "--stop-micro-steps 2 is not inside a window of K = 2 micro-steps" --synthetic \
      --cpu --accum 2 --windows 3 --stop-after 1 --checkpoint /tmp/unused.safetensors \
      --stop-micro-steps 2
    expect 2 "--dropout: llama-tiny has no dropout (GPT-2 only)" --synthetic --cpu \
      --dropout 0.1
    # GPT-2's dropout masks from the seed + 1 + rank stream, as accrue_train_gpt2 draws them.
    run --model gpt2-tiny --accum 2 "${gpt2[@]}" --dropout 0.1
    ours=$(grep "^final:" <<< "$out")
    bin=$dir/accrue_train_gpt2
    run --model tiny --total-batch-tokens 128 "${gpt2[@]}" --dropout 0.1
    [[ -n $ours && $ours == "$(grep "^final:" <<< "$out")" ]] ||
      fail "train gpt2-tiny --dropout 0.1: '$ours' vs accrue_train_gpt2 '$(grep "^final:" <<< "$out")'"
    # The size overrides, and --composed: the same model and run as accrue_train_gpt2's.
    bin=$dir/accrue_train_gpt2
    run --model tiny --total-batch-tokens 128 "${gpt2[@]}" --composed
    theirs=$(grep "^final:" <<< "$out")
    bin=$dir/accrue_train
    run --model gpt2-tiny --accum 2 "${gpt2[@]}" --composed
    [[ $rc -eq 0 && -n $theirs && $(grep "^final:" <<< "$out") == "$theirs" ]] ||
      fail "train gpt2-tiny --composed: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$theirs'"
    expect 2 "--composed: llama-tiny has no composed form (GPT-2 only)" --synthetic \
      --cpu --composed
    expect 2 "--composed has no dropout, no activation checkpointing and no FP8" --synthetic --composed \
      --model gpt2-tiny --dropout 0.1
    expect 2 "--composed has no dropout, no activation checkpointing and no FP8" --synthetic \
      --composed --model gpt2-tiny --fp8
    bin=$dir/accrue_train_gpt2
    sizes=(--n-layer 3 --n-head 2 --n-embd 32 --vocab-size 300 --block-size 40)
    run --model tiny --total-batch-tokens 128 "${gpt2[@]}" "${sizes[@]}"
    theirs=$(grep "^final:" <<< "$out")
    bin=$dir/accrue_train
    run --model gpt2-tiny --accum 2 "${gpt2[@]}" "${sizes[@]}"
    [[ $rc -eq 0 && $out == *"GPT-2, 3 layers, 2 heads, width 32, vocab 300 (padded 384), block 40"* &&
      -n $theirs && $(grep "^final:" <<< "$out") == "$theirs" ]] ||
      fail "train gpt2-tiny ${sizes[*]}: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$theirs'"
    expect 2 "override a GPT-2 preset's sizes, not llama-tiny's" --synthetic --n-layer 3
    expect 2 "GPT2Config: n_embd 64 must be a positive multiple of n_head 5" --model gpt2-tiny \
      --synthetic --cpu --n-head 5
    run --model gpt2-tiny --accum 2 "${gpt2[@]}"
    ours=$(grep "^final:" <<< "$out")
    expect 2 "--allow-changed" --synthetic --resume /tmp/unused.safetensors --allow-changed seed
    for extra in --cuda-graphs --activation-checkpointing --zero1 --norm-under-backward; do
      run --model gpt2-tiny --accum 2 "${gpt2[@]}" "$extra"
      [[ $rc -eq 0 && -n $plain && $(grep "^final:" <<< "$out") == "$plain" ]] ||
        fail "train gpt2-tiny $extra: exit code $rc, '$(grep "^final:" <<< "$out")' vs '$plain'"
    done
    metrics=$(mktemp)
    for model in gpt2-tiny:h.1.mlp.c_proj.weight llama-tiny:model.layers.1.mlp.down_proj.weight; do
      run --model "${model%%:*}" --accum 2 "${gpt2[@]}" --metrics "$metrics" \
        --layer-metrics-every 2
      [[ $rc -eq 0 ]] || fail "train --layer-metrics-every 2 ($model): exit code $rc: $err"
      measured=$(grep -c "\"grad_norm/${model#*:}\"" "$metrics")
      [[ $measured -eq 1 && $(wc -l < "$metrics") -eq 3 ]] ||
        fail "train --layer-metrics-every 2 ($model): $measured of 3 rows measured: $(cat "$metrics")"
      grep -q '"group_update_ratio/1"' "$metrics" || fail "train $model: no group figures"
      with=$(grep "^final:" <<< "$out")
      run --model "${model%%:*}" --accum 2 "${gpt2[@]}"
      [[ -n $with && $with == "$(grep "^final:" <<< "$out")" ]] ||
        fail "train $model: the layer monitor changed the run: '$with'"
    done
    rm -f "$metrics"
    ;;
  resnet)
    bin=$dir/accrue_resnet prog=accrue_resnet
    help --data --synthetic --micro-batch --k --epochs --bn --recompute-bn --lr --seed \
      --checkpoint --resume --cuda
    expect 2 "unknown option '--no-such-option'" --no-such-option
    expect 2 "--epochs must be >= 1, got 0" --epochs 0
    expect 2 "--micro-batch 99999999999999999999 does not fit a 64-bit integer" \
      --micro-batch 99999999999999999999 --epochs 1
    expect 2 "--micro-batch 4611686018427387904 x --k 2 overflows a 64-bit integer" \
      --micro-batch 4611686018427387904 --k 2 --epochs 1
    expect 2 "--bn must be window, window-compound or per-micro-batch, got 'sometimes'" \
      --bn sometimes
    expect 2 "--seed must be >= 0, got -1" --seed -1
    expect 2 "--lr must be > 0, got -0.1" --lr -0.1
    expect 2 "--synthetic and --data exclude each other" --synthetic --data /tmp
    expect 2 "--resume needs a non-empty path" --resume ""
    expect 2 "--checkpoint / is a directory" --checkpoint / --epochs 1
    expect 1 "images are too few" --micro-batch 1000 --k 2 --epochs 1
    expect 1 "no-such-dir/digits_images.npy" --data /no-such-dir --epochs 1
    ;;
  resnet_bench)
    bin=$dir/accrue_resnet_bench prog=accrue_resnet_bench
    help --model --image-size --micro-batch --k --dtype --channels-last --no-pointwise-gemm \
      --conv-timed --conv-nondeterministic --conv-16-bit-wgrad --conv-fixed-paths --tuning \
      --classes --warmup --windows --cpu --close-under-forward --close-layer-elements \
      --close-max-blocks
    common_refusals
    expect 2 "--model must be resnet50 or resnet18, got 'vgg'" --model vgg
    expect 2 "--close-layer-elements needs --close-under-forward" --close-layer-elements 8
    # Note [Close under the forward]: the same bits (the final loss) as the close.
    small=(--cpu --model resnet18 --image-size 32 --micro-batch 2 --k 2 --warmup 1 --windows 1
      --classes 10)
    run "${small[@]}"
    plain=$(grep -o '"final_loss": [^,]*' <<< "$out")
    run "${small[@]}" --close-under-forward --close-layer-elements 100000 --close-max-blocks 4
    [[ $rc -eq 0 && -n $plain && $(grep -o '"final_loss": [^,]*' <<< "$out") == "$plain" ]] ||
      fail "resnet_bench --close-under-forward: exit code $rc, $(grep -o '"final_loss": [^,]*' <<< "$out") vs $plain"
    expect 2 "--image-size must be >= 32, got 16" --image-size 16
    expect 2 "--classes must be >= 2, got 1" --classes 1
    expect 2 "--conv-fixed-paths and --conv-per-shape exclude each other" \
      --conv-fixed-paths --conv-per-shape
    expect 2 "overflows a 64-bit integer" --cpu --model resnet18 --image-size 32 \
      --micro-batch 2 --classes 4611686018427387904
    expect 2 "overflows a 64-bit integer" --cpu --model resnet18 --image-size 32 \
      --micro-batch 4611686018427387904 --k 1
    # Within the options' ranges but beyond any host: refused before allocating.
    expect 1 "shape [1000000000000, 512] of f64 needs 4096000000000000 bytes" --cpu \
      --model resnet18 --image-size 32 --micro-batch 2 --dtype f32 --classes 1000000000000
    ;;
  train_gpt2)
    bin=$dir/accrue_train_gpt2 prog=accrue_train_gpt2
    help --model --n-layer --n-head --n-embd --vocab-size --block-size --dropout \
      --activation-checkpointing --composed --init-from --train-data --val-data --synthetic \
      --micro-batch --seq-len --total-batch-tokens --windows --stop-after --stop-micro-steps --lr \
      --warmup-windows --min-lr-factor --weight-decay --beta1 --beta2 --eps --max-grad-norm \
      --norm-under-backward --gemm-tuning --cuda-graphs --dtype --init-scale --calibrate-scale \
      --seed --val-every --val-batches --nvtx --metrics --layer-metrics-every \
      --noise-scale-every --checkpoint --checkpoint-every --resume --bench --bench-warmup \
      --bench-windows --peak-tflops --cpu --close-under-forward --close-layer-elements \
      --close-max-blocks --concurrent-micro-batches --weight-grad-branch --copy-engine-all-reduce \
      --copy-engine-whole-buckets --bucket-mb --grad-transport
    tiny=(--model tiny --cpu --synthetic)
    # The data-parallel knobs: their ranges, the copy engines' f32 sums, and on one
    # process nothing to sum (the same bits, and the JSON line says what was asked).
    expect 2 "--bucket-mb must be in [0.001, 4096], got 5000" "${tiny[@]}" --bucket-mb 5000
    expect 2 "--grad-transport must be exact, bf16 or f16, got 'fp16'" "${tiny[@]}" \
      --grad-transport fp16
    expect 2 "--copy-engine-all-reduce sums f32 buckets; it is not taken with --grad-transport bf16" \
      "${tiny[@]}" --copy-engine-all-reduce --grad-transport bf16
    expect 2 "--copy-engine-whole-buckets is a form of --copy-engine-all-reduce; give both" \
      "${tiny[@]}" --copy-engine-whole-buckets
    run "${tiny[@]}" --micro-batch 2 --seq-len 16 --windows 2
    exact=$(grep "^final:" <<< "$out")
    expect 2 "--gemm-sm-margin must be in [0, 1023], got -1" "${tiny[@]}" --gemm-sm-margin -1
    run "${tiny[@]}" --micro-batch 2 --seq-len 16 --windows 2 --grad-transport f16 --bucket-mb 2 \
      --gemm-sm-margin 8
    [[ $rc -eq 0 && -n $exact && $(grep "^final:" <<< "$out") == "$exact" &&
      $out == *"--gemm-sm-margin, --nccl-max-ctas: one process, no gradients to sum"* ]] ||
      fail "train_gpt2 --grad-transport f16 on one process: exit code $rc: $out"
    run "${tiny[@]}" --micro-batch 2 --seq-len 16 --bench --bench-warmup 1 --bench-windows 1 \
      --grad-transport bf16 --bucket-mb 8
    python3 -c 'import json, sys; c = json.loads(sys.argv[1].splitlines()[-1])["config"]; sys.exit(not (c["grad_transport"] == "bf16" and c["bucket_mb"] == 8))' "$out" ||
      fail "train_gpt2 --bench: the JSON line lacks grad_transport bf16 / bucket_mb 8: $out"
    expect 2 "--weight-grad-branch 3 needs --cuda-graphs" "${tiny[@]}" --weight-grad-branch 3
    expect 2 "--weight-grad-branch is not taken with --concurrent-micro-batches 2" "${tiny[@]}" \
      --cuda-graphs --concurrent-micro-batches 2 --weight-grad-branch 1
    expect 2 "--concurrent-micro-batches 4 needs --cuda-graphs" "${tiny[@]}" \
      --concurrent-micro-batches 4
    expect 2 "--concurrent-micro-batches is not taken with --close-under-forward" "${tiny[@]}" \
      --cuda-graphs --concurrent-micro-batches 2 --close-under-forward
    expect 2 "--close-under-forward is not taken with --composed" "${tiny[@]}" \
      --close-under-forward --composed
    expect 2 "unknown option '--no-such-option'" "${tiny[@]}" --no-such-option
    expect 2 "--windows 99999999999999999999 does not fit a 64-bit integer" "${tiny[@]}" \
      --windows 99999999999999999999
    expect 2 "--lr expects a finite number, got 'inf'" "${tiny[@]}" --lr inf
    expect 2 "--beta2 must be in [0, 1), got 1" "${tiny[@]}" --beta2 1
    expect 2 "--resume needs a non-empty path" "${tiny[@]}" --resume ""
    expect 2 "--checkpoint needs a value, got the option '--windows'" "${tiny[@]}" \
      --checkpoint --windows 3
    expect 2 "--n-embd 4611686018427387904 x --n-embd 4611686018427387904" "${tiny[@]}" \
      --n-embd 4611686018427387904 --n-head 1
    expect 2 "--micro-batch 4611686018427387904 x --seq-len 16 x ranks 1 overflows" "${tiny[@]}" \
      --micro-batch 4611686018427387904 --seq-len 16
    # A model within the options' ranges but beyond any host (wte alone is
    # 64 TiB): a failed run naming the shape and the bytes, before allocating.
    expect 1 "zeros: shape [65536, 268435456] of f32 needs 70368744177664 bytes" "${tiny[@]}" \
      --n-embd 268435456 --n-head 1 --vocab-size 65536
    expect 2 "--stop-micro-steps 2 is not inside a window of K = 1 micro-steps" "${tiny[@]}" \
      --micro-batch 2 --seq-len 16 --windows 3 --stop-after 1 --stop-micro-steps 2 \
      --checkpoint /tmp/unused.safetensors
    # Output paths are probed before the run: a directory, a FIFO, a missing folder.
    expect 2 "--checkpoint /tmp is a directory" "${tiny[@]}" --checkpoint /tmp
    fifo=$(mktemp -u)
    mkfifo "$fifo"
    expect 2 "--metrics $fifo is not a regular file" "${tiny[@]}" --metrics "$fifo"
    rm -f "$fifo"
    expect 2 "--gemm-tuning /no-such-dir/t.txt: no folder /no-such-dir" "${tiny[@]}" \
      --gemm-tuning /no-such-dir/t.txt
    # A diverged run fails (1) naming the window, rather than exiting 0.
    expect 1 "the loss is not finite" "${tiny[@]}" --micro-batch 2 --seq-len 16 --windows 3 \
      --lr 1e30 --max-grad-norm 0
    ;;
  generate)
    bin=$dir/accrue_generate prog=accrue_generate
    fixtures=$(cd "$(dirname "${BASH_SOURCE[0]}")/../nn/fixtures" && pwd)
    llama=$fixtures/hf_llama_tiny # vocab 128, 256 positions
    help --model --prompt-ids --new-tokens --dtype --stop-at-eos --stop-ids --no-cache --cpu
    expect 2 "unknown option '--no-such-option'" --no-such-option
    expect 2 "unexpected argument 'stray'" stray
    expect 2 "--model DIR is required" --prompt-ids 1,2
    expect 2 "--prompt-ids is required" --model "$llama"
    expect 2 "--new-tokens needs a value" --model "$llama" --prompt-ids 1 --new-tokens
    expect 2 "--new-tokens expects an integer, got '12x'" --new-tokens 12x
    expect 2 "--new-tokens must be >= 1, got 0" --model "$llama" --prompt-ids 1 --new-tokens 0
    expect 2 "--dtype must be f32, bf16 or f64, got 'f16'" --dtype f16
    expect 2 "--prompt-ids expects comma-separated token ids (integers >= 0), got '1,,2'" \
      --model "$llama" --prompt-ids 1,,2
    expect 2 "(bad item '-3')" --model "$llama" --prompt-ids 1,-3
    expect 2 "--prompt-ids: token 1 = 128 is outside the vocabulary [0, 128)" --cpu \
      --model "$llama" --prompt-ids 1,128
    expect 2 "--prompt-ids (250 tokens) and --new-tokens 8 need 250 + 8 - 1 positions, more than max_position_embeddings = 256" \
      --cpu --model "$llama" --prompt-ids "$(seq -s, 1 250 | sed 's/[0-9]*/7/g')" --new-tokens 8
    expect 2 "--stop-ids expects comma-separated token ids (integers >= 0), got '2,x'" \
      --model "$llama" --prompt-ids 1 --stop-ids 2,x
    expect 2 "--stop-ids: id 1 = 500 is outside the vocabulary [0, 128)" --cpu \
      --model "$llama" --prompt-ids 1 --stop-ids 2,500
    expect 1 "/no-such-dir" --cpu --model /no-such-dir --prompt-ids 1
    # transformers' generate(do_sample=False) gives these (fixtures/generate_golden.txt).
    for cache in "" --no-cache; do
      run --cpu --model "hf:$llama" --prompt-ids 1,17,42,99,5,63 --new-tokens 12 $cache
      [[ $rc -eq 0 ]] || fail "generate $cache: exit code $rc: $err"
      grep -qx "generated: 68,36,100,118,23,48,36,100,118,23,48,36" <<< "$out" ||
        fail "generate $cache: not transformers' tokens: $out"
    done
    # transformers' default generate stops after the config's eos id 2 (52 of 60 tokens).
    run --cpu --model "$fixtures/hf_llama_gen" --prompt-ids 1,9,33,50,12,7,61,20,3,44 \
      --new-tokens 60 --stop-at-eos
    [[ $rc -eq 0 ]] || fail "generate --stop-at-eos: exit code $rc: $err"
    grep -qx "generated: 41,72,39,72,72,83,20,42,81,8,88,71,8,49,11,72,7,33,6,27,72,49,87,49,49,49,41,81,27,22,72,91,7,72,49,1,81,27,9,40,49,62,73,42,7,36,50,35,27,81,19,2" \
      <<< "$out" || fail "generate --stop-at-eos: not transformers' tokens: $out"
    ;;
  *)
    echo "unknown binary '$name'"
    exit 2
    ;;
esac

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
