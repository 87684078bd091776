#!/usr/bin/env bash
# accrue_train resumes bit-exactly (Note [Llama trainer checkpoint] in
# examples/train/train.cpp):
#   train_resume_test.sh TRAINER WORK_DIR [PYTHON SOURCE_DIR]
# llama-tiny on synthetic packed documents, 6 windows uninterrupted; the same
# run stopped after window 3 (a periodic checkpoint at 3 too) and resumed; the
# final checkpoints must be the same bytes, and so must the final loss line.
# With PYTHON, the same on byte-token shards of README.md (tools/make_shards.py)
# where a newline ends a document: the DocumentBatches position is restored;
# and gpt2-tiny on the same shards (contiguous rows), resumed, against
# accrue_train_gpt2 (in the trainer's folder) on the same run, validation too.
set -u
trainer=$1 work=$2 python=${3:-} source_dir=${4:-}
# shellcheck source=tests/examples/fresh_work_dir.sh
source "$(dirname "${BASH_SOURCE[0]}")/fresh_work_dir.sh"
fresh_work_dir "$work" || exit 1
args=(--model llama-tiny --synthetic --cpu --windows 6 --micro-batch 2 --seq-len 32 --accum 2
  --warmup-windows 2 --seed 7)
fail() {
  echo "FAIL: $*"
  exit 1
}
"$trainer" "${args[@]}" --checkpoint "$work/full.safetensors" > "$work/full.txt" ||
  fail "uninterrupted run: exit code $?"
"$trainer" "${args[@]}" --checkpoint "$work/part.safetensors" --checkpoint-every 3 \
  --stop-after 3 > "$work/first.txt" || fail "first half: exit code $?"
grep -q "^checkpoint: .*part.safetensors (window 3" "$work/first.txt" || fail "no checkpoint at 3"
"$trainer" "${args[@]}" --checkpoint "$work/part.safetensors" \
  --resume "$work/part.safetensors" > "$work/second.txt" || fail "resumed run: exit code $?"
grep -q "^resumed .* at window 3" "$work/second.txt" || fail "did not resume at window 3"
cmp "$work/full.safetensors" "$work/part.safetensors" ||
  fail "the resumed run's final checkpoint differs from the uninterrupted run's"
full=$(grep "^final:" "$work/full.txt") resumed=$(grep "^final:" "$work/second.txt")
[[ -n $full && $full == "$resumed" ]] || fail "final lines differ: '$full' vs '$resumed'"
# Another K is another run: refused naming the field, exit 1 (Note [Run record]).
err=$("$trainer" "${args[@]}" --accum 3 --resume "$work/full.safetensors" 2>&1 >/dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"micro_steps = 2 but this run has 3"* ]] ||
  fail "a resume with another K: exit code $rc: $err"
# --fp8 (Note [Window FP8 weights]): the weights' FP8 copies are recast from
# the resumed weights, so the resumed run ends on the uninterrupted one's bytes;
# a resume without --fp8 is another run.
fp8=("${args[@]}" --dtype bf16 --fp8)
"$trainer" "${fp8[@]}" --checkpoint "$work/fp8_full.safetensors" > /dev/null ||
  fail "--fp8 uninterrupted run: exit code $?"
"$trainer" "${fp8[@]}" --checkpoint "$work/fp8_part.safetensors" --stop-after 3 > /dev/null ||
  fail "--fp8 first half: exit code $?"
"$trainer" "${fp8[@]}" --checkpoint "$work/fp8_part.safetensors" \
  --resume "$work/fp8_part.safetensors" > /dev/null || fail "--fp8 resumed run: exit code $?"
cmp "$work/fp8_full.safetensors" "$work/fp8_part.safetensors" ||
  fail "--fp8: the resumed run's final checkpoint differs from the uninterrupted run's"
err=$("$trainer" "${args[@]}" --dtype bf16 --resume "$work/fp8_full.safetensors" 2>&1 >/dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"fp8 = "*"but this run has off"* ]] ||
  fail "a resume of an --fp8 checkpoint without --fp8: exit code $rc: $err"
# --fp8-scaling delayed (Note [FP8 delayed scaling]): the scales and amax
# histories are in the checkpoint; resumed inside window 4 (after 1 of its 2
# micro-steps, its running amaxes saved), the same final bytes.
delayed=("${fp8[@]}" --fp8-scaling delayed --fp8-amax-history 2)
"$trainer" "${delayed[@]}" --checkpoint "$work/delayed_full.safetensors" > /dev/null ||
  fail "--fp8-scaling delayed uninterrupted run: exit code $?"
"$trainer" "${delayed[@]}" --checkpoint "$work/delayed_part.safetensors" --stop-after 3 \
  --stop-micro-steps 1 > /dev/null || fail "--fp8-scaling delayed first half: exit code $?"
"$trainer" "${delayed[@]}" --checkpoint "$work/delayed_part.safetensors" \
  --resume "$work/delayed_part.safetensors" > /dev/null ||
  fail "--fp8-scaling delayed resumed run: exit code $?"
cmp "$work/delayed_full.safetensors" "$work/delayed_part.safetensors" ||
  fail "--fp8-scaling delayed: the resumed run's final checkpoint differs"
cmp -s "$work/delayed_full.safetensors" "$work/fp8_full.safetensors" &&
  fail "--fp8-scaling delayed ended on current scaling's bytes"
err=$("$trainer" "${fp8[@]}" --resume "$work/delayed_full.safetensors" 2>&1 >/dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"delayed scaling"* ]] ||
  fail "a resume of a delayed-scaling checkpoint with current scaling: exit code $rc: $err"
# The gradients' codes are part of the run (Note [Run record]).
err=$("$trainer" "${fp8[@]}" --fp8-grad-dtype e4m3 --resume "$work/fp8_full.safetensors" 2>&1 >/dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"projections e4m3/e5m2"*"but this run has projections e4m3/e4m3"* ]] ||
  fail "a resume of an e5m2-gradient checkpoint with --fp8-grad-dtype e4m3: exit code $rc: $err"
# --stop-micro-steps (Note [Mid-window checkpoints]): saved inside window 4
# after 1 of 2 micro-steps, resumed there: the same final checkpoint.
"$trainer" "${args[@]}" --checkpoint "$work/mid.safetensors" --stop-after 3 \
  --stop-micro-steps 1 > "$work/mid.txt" || fail "--stop-micro-steps 1: exit code $?"
grep -q "^checkpoint: .*mid.safetensors (window 4, micro-step 1" "$work/mid.txt" ||
  fail "no checkpoint inside window 4: $(cat "$work/mid.txt")"
out=$("$trainer" "${args[@]}" --checkpoint "$work/mid.safetensors" \
  --resume "$work/mid.safetensors") || fail "resumed inside window 4: exit code $?"
[[ $out == *"at window 3, inside window 4 after micro-step 1"* ]] ||
  fail "did not resume inside window 4: $out"
cmp "$work/full.safetensors" "$work/mid.safetensors" ||
  fail "the run resumed inside window 4 ends with another checkpoint"
# Note [Concurrent micro-batches]: a checkpoint inside a window first runs the
# micro-steps whose group is not whole (GraphedWindow::flush); on the CPU the
# groups run eagerly with the same bookkeeping.
conc=("${args[@]}" --cuda-graphs --concurrent-micro-batches 2)
"$trainer" "${conc[@]}" --checkpoint "$work/cfull.safetensors" > /dev/null ||
  fail "--concurrent-micro-batches 2 uninterrupted: exit code $?"
"$trainer" "${conc[@]}" --checkpoint "$work/cmid.safetensors" --stop-after 3 \
  --stop-micro-steps 1 > "$work/cmid.txt" || fail "--concurrent-micro-batches 2 stopped: exit code $?"
grep -q "^checkpoint: .*cmid.safetensors (window 4, micro-step 1" "$work/cmid.txt" ||
  fail "--concurrent-micro-batches 2: no checkpoint after micro-step 1: $(cat "$work/cmid.txt")"
"$trainer" "${conc[@]}" --checkpoint "$work/cmid.safetensors" \
  --resume "$work/cmid.safetensors" > /dev/null || fail "--concurrent-micro-batches 2 resumed: exit code $?"
cmp "$work/cfull.safetensors" "$work/cmid.safetensors" ||
  fail "--concurrent-micro-batches 2: the run resumed inside window 4 ends with another checkpoint"
# --allow-changed lr,windows: a longer run at another learning rate goes on
# from the finished one (Note [Run record]); without it, refused naming lr.
err=$("$trainer" "${args[@]}" --windows 8 --lr 1e-3 --resume "$work/full.safetensors" 2>&1 \
  >/dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"lr = "*" but this run has 0.001"* ]] ||
  fail "a resume with another --lr: exit code $rc: $err"
out=$("$trainer" "${args[@]}" --windows 8 --lr 1e-3 --allow-changed lr,windows \
  --resume "$work/full.safetensors") || fail "--allow-changed lr,windows: exit code $?"
[[ $out == *"resumed "*" at window 6"* && $out == *"final: window 8 loss "* ]] ||
  fail "--allow-changed lr,windows: $out"
if [[ -n $python ]]; then
  "$python" "$source_dir/tools/make_shards.py" "$source_dir/README.md" \
    --output-prefix "$work/readme" > /dev/null || fail "make_shards.py"
  shards=(--model llama-tiny --train-data "$work/readme_train_*.bin" --eos-id 10 --cpu --windows 6
    --micro-batch 2 --seq-len 32 --accum 2)
  "$trainer" "${shards[@]}" --checkpoint "$work/sfull.safetensors" > /dev/null ||
    fail "shards, uninterrupted: exit code $?"
  "$trainer" "${shards[@]}" --checkpoint "$work/spart.safetensors" --stop-after 3 > /dev/null ||
    fail "shards, first half: exit code $?"
  "$trainer" "${shards[@]}" --checkpoint "$work/spart.safetensors" \
    --resume "$work/spart.safetensors" > /dev/null || fail "shards, resumed: exit code $?"
  cmp "$work/sfull.safetensors" "$work/spart.safetensors" ||
    fail "shards: the resumed run's final checkpoint differs from the uninterrupted run's"
  echo "ok: shards resumed after window 3, final checkpoint identical"
  # GPT-2 reads contiguous rows of the same shards (Note [GPT-2 rows]): resumed
  # bit-exactly, the loss falls on text, and accrue_train_gpt2 beside it (same
  # model, seed, rows and optimizer) ends at the same loss to the last bit.
  gpt2=(--train-data "$work/readme_train_*.bin" --cpu --windows 6 --micro-batch 2 --seq-len 32
    --lr 3e-3 --seed 7)
  "$trainer" --model gpt2-tiny --accum 2 "${gpt2[@]}" --checkpoint "$work/gfull.safetensors" \
    > "$work/gfull.txt" || fail "gpt2-tiny shards, uninterrupted: exit code $?"
  "$trainer" --model gpt2-tiny --accum 2 "${gpt2[@]}" --checkpoint "$work/gpart.safetensors" \
    --stop-after 3 > /dev/null || fail "gpt2-tiny shards, first half: exit code $?"
  "$trainer" --model gpt2-tiny --accum 2 "${gpt2[@]}" --checkpoint "$work/gpart.safetensors" \
    --resume "$work/gpart.safetensors" > /dev/null || fail "gpt2-tiny shards, resumed: exit code $?"
  cmp "$work/gfull.safetensors" "$work/gpart.safetensors" ||
    fail "gpt2-tiny shards: the resumed run's final checkpoint differs"
  read -r first last < <(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\) over.*/\1 \2/p' "$work/gfull.txt")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b + 0 < a + 0) }' ||
    fail "gpt2-tiny shards: loss '$first' -> '$last' does not fall"
  ours=$(grep "^final:" "$work/gfull.txt")
  theirs=$("$(dirname "$trainer")/accrue_train_gpt2" --model tiny --total-batch-tokens 128 \
    "${gpt2[@]}" | grep "^final:") || fail "accrue_train_gpt2 on the shards: exit code $?"
  [[ -n $ours && $ours == "$theirs" ]] ||
    fail "gpt2-tiny shards: accrue_train '$ours' vs accrue_train_gpt2 '$theirs'"
  # Validation (--val-data): the same rows, so the same validation losses as
  # accrue_train_gpt2's; a Llama model validates on packed documents.
  val=(--val-data "$work/readme_val_*.bin" --val-every 3 --val-batches 3)
  ours=$("$trainer" --model gpt2-tiny --accum 2 "${gpt2[@]}" "${val[@]}" | grep "val loss")
  theirs=$("$(dirname "$trainer")/accrue_train_gpt2" --model tiny --total-batch-tokens 128 \
    "${gpt2[@]}" "${val[@]}" | grep "val loss")
  [[ $(wc -l <<< "$ours") -eq 2 && $ours == "$theirs" ]] ||
    fail "gpt2-tiny --val-data: accrue_train '$ours' vs accrue_train_gpt2 '$theirs'"
  llama=$("$trainer" --model llama-tiny --eos-id 10 --accum 2 "${gpt2[@]}" "${val[@]}" |
    grep -c "^window [36]/6 | val loss [0-9]")
  [[ $llama -eq 2 ]] || fail "llama-tiny --val-data: $llama validation lines, expected 2"
  # --contiguous-rows: a Llama model reads the rows GPT-2 reads (no offsets),
  # so its losses differ from the packed run's, and its resume is bit-exact.
  rows=(--model llama-tiny --contiguous-rows --accum 2 "${gpt2[@]}")
  "$trainer" "${rows[@]}" --checkpoint "$work/rfull.safetensors" > "$work/rfull.txt" ||
    fail "llama-tiny --contiguous-rows: exit code $?"
  grep -qF "data: $work/readme_train_*.bin (contiguous rows)" "$work/rfull.txt" ||
    fail "llama-tiny --contiguous-rows: the banner does not say contiguous rows"
  packed=$("$trainer" --model llama-tiny --eos-id 10 --accum 2 "${gpt2[@]}" | grep "^final:")
  [[ $(grep "^final:" "$work/rfull.txt") != "$packed" ]] ||
    fail "llama-tiny --contiguous-rows ends where the packed documents do: '$packed'"
  "$trainer" "${rows[@]}" --checkpoint "$work/rpart.safetensors" --stop-after 3 > /dev/null ||
    fail "llama-tiny --contiguous-rows, first half: exit code $?"
  "$trainer" "${rows[@]}" --checkpoint "$work/rpart.safetensors" \
    --resume "$work/rpart.safetensors" > /dev/null ||
    fail "llama-tiny --contiguous-rows, resumed: exit code $?"
  cmp "$work/rfull.safetensors" "$work/rpart.safetensors" ||
    fail "llama-tiny --contiguous-rows: the resumed run's final checkpoint differs"
  # With dropout (its generator's offset is in the checkpoint) and validation
  # (dropout off) at the stop: resumed to the same bytes.
  drop=(--model gpt2-tiny --accum 2 "${gpt2[@]}" --dropout 0.2 --val-data "$work/readme_val_*.bin"
    --val-batches 2)
  "$trainer" "${drop[@]}" --checkpoint "$work/dfull.safetensors" > /dev/null ||
    fail "gpt2-tiny --dropout, uninterrupted: exit code $?"
  "$trainer" "${drop[@]}" --checkpoint "$work/dpart.safetensors" --stop-after 3 > /dev/null ||
    fail "gpt2-tiny --dropout, first half: exit code $?"
  "$trainer" "${drop[@]}" --checkpoint "$work/dpart.safetensors" \
    --resume "$work/dpart.safetensors" > /dev/null || fail "gpt2-tiny --dropout, resumed: exit code $?"
  cmp "$work/dfull.safetensors" "$work/dpart.safetensors" ||
    fail "gpt2-tiny --dropout: the resumed run's final checkpoint differs"
  echo "ok: gpt2-tiny on shards resumed identically, loss $first -> $last, as accrue_train_gpt2"
  # --init-from: Hugging Face weights into the model before the store copies
  # them. A GPT2LMHeadModel file written here; both trainers start from it and
  # end at the same loss (not the seed's), as does --model hf:DIR on the
  # directory that holds it with a transformers-style config.json; a Llama
  # directory of another size is refused naming the field.
  mkdir -p "$work/hf_gpt2"
  "$python" - "$work/hf_gpt2/model.safetensors" << 'PY' || fail "writing the GPT-2 file"
import json, random, struct, sys
# A GPT2LMHeadModel file of gpt2-tiny's shapes (C 64, 2 layers, vocab 256, block 64).
C, L, V, P = 64, 2, 256, 64
shapes = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C],
          "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
for i in range(L):
    h = "transformer.h.%d." % i
    shapes.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C], h + "ln_2.weight": [C],
                   h + "ln_2.bias": [C], h + "attn.c_attn.weight": [C, 3 * C],
                   h + "attn.c_attn.bias": [3 * C], h + "attn.c_proj.weight": [C, C],
                   h + "attn.c_proj.bias": [C], h + "mlp.c_fc.weight": [C, 4 * C],
                   h + "mlp.c_fc.bias": [4 * C], h + "mlp.c_proj.weight": [4 * C, C],
                   h + "mlp.c_proj.bias": [C]})
rng = random.Random(5)
header, blobs, offset = {}, [], 0
for name in sorted(shapes):
    n = 1
    for d in shapes[name]:
        n *= d
    base = 1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight") else 0.0
    blob = struct.pack("<%df" % n, *[base + rng.gauss(0, 0.05) for _ in range(n)])
    header[name] = {"dtype": "F32", "shape": shapes[name], "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
PY
  cat > "$work/hf_gpt2/config.json" << 'JSON'
{
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_embd": 64,
  "n_head": 4,
  "n_inner": null,
  "n_layer": 2,
  "n_positions": 64,
  "reorder_and_upcast_attn": false,
  "resid_pdrop": 0.1,
  "scale_attn_by_inverse_layer_idx": false,
  "scale_attn_weights": true,
  "summary_activation": null,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "torch_dtype": "float32",
  "transformers_version": "4.57.0",
  "use_cache": true,
  "vocab_size": 256
}
JSON
  synth=(--cpu --synthetic --windows 3 --micro-batch 2 --seq-len 32 --seed 7 --lr 1e-3)
  ours=$("$trainer" --model gpt2-tiny --accum 2 "${synth[@]}" \
    --init-from "$work/hf_gpt2/model.safetensors" | grep "^final:")
  theirs=$("$(dirname "$trainer")/accrue_train_gpt2" --model tiny --total-batch-tokens 128 \
    "${synth[@]}" --init-from "$work/hf_gpt2/model.safetensors" | grep "^final:")
  from_dir=$("$trainer" --model "hf:$work/hf_gpt2" --accum 2 "${synth[@]}" | grep "^final:")
  seeded=$("$trainer" --model gpt2-tiny --accum 2 "${synth[@]}" | grep "^final:")
  [[ -n $ours && $ours == "$theirs" && $ours == "$from_dir" && $ours != "$seeded" ]] ||
    fail "--init-from: accrue_train '$ours', accrue_train_gpt2 '$theirs', --model hf:DIR '$from_dir', from the seed '$seeded'"
  err=$("$trainer" --model llama-tiny "${synth[@]}" \
    --init-from "$source_dir/tests/nn/fixtures/hf_llama_tiny" 2>&1 >/dev/null)
  rc=$?
  [[ $rc -eq 1 && $err == *"vocab_size = 128 where this model has 256"* ]] ||
    fail "--init-from a Llama directory of another size: exit code $rc: $err"
  echo "ok: --init-from an HF GPT-2 file and --model hf:DIR: $ours, as accrue_train_gpt2"
fi
echo "ok: resumed after window 3, final checkpoint identical ($full)"
