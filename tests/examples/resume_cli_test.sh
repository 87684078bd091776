#!/usr/bin/env bash
# Resuming the trainers, as a user does it (Note [Run record] in
# examples/common/checkpoint_file.h, Note [Metrics after resume], Note
# [Honest exit codes] in examples/common/run_guard.h):
#   resume_cli_test.sh BINARY_DIR SOURCE_DIR [PYTHON]
# - a checkpoint resumed by another run (K, micro-batch, seq-len, seed,
#   dropout, data, dtype, optimizer) is refused, exit 1, naming each field
#   as old and new; --allow-changed lets the schedule and the length through
#   and the run says so; a mid-window checkpoint never takes another K;
# - accrue_resnet --resume refuses another --k, --bn, --seed, --micro-batch;
# - --metrics after a resume has one row per window (the killed run's rows
#   after the checkpoint, and a row cut short, are removed);
# - --max-skipped-windows stops a run whose windows keep being skipped, a
#   diverged run fails naming its windows, and a failed run keeps the last
#   checkpoint it wrote; so does accrue_resnet with --lr 1e30, while one NaN
#   pixel in its data only skips the window that holds it (Note [Non-finite
#   window statistics]) and fails --recompute-bn.
#   A GPT-2 run from NaN weights (--init-from) fails too.
# Tiny models on the CPU, about 25 s in all. PYTHON (tools/make_shards.py, the
# NaN-pixel .npy files, the NaN weights) is needed for three cases; without it
# they are skipped.
set -u
dir=$1
source_dir=$2
python=${3:-}
gpt2=$dir/accrue_train_gpt2
resnet=$dir/accrue_resnet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run BINARY ARGS...: sets rc, out, err.
run() {
  "$@" > out.txt 2> err.txt
  rc=$?
  out=$(cat out.txt) err=$(cat err.txt)
}

# expect CODE FRAGMENT... -- BINARY ARGS...: exit code CODE; for 1 and 2, one
# line on stderr holding every FRAGMENT; for 0, stdout holds them.
expect() {
  local code=$1
  shift
  local fragments=()
  while [[ $1 != -- ]]; do
    fragments+=("$1")
    shift
  done
  shift
  run "$@"
  local what="${1##*/} ${*:2}"
  if [[ $rc -ne $code ]]; then
    fail "$what: exit code $rc, expected $code; stderr: $err"
    return
  fi
  local text=$out
  if [[ $code -ne 0 ]]; then
    text=$err
    [[ $(printf '%s\n' "$err" | wc -l) -eq 1 && -n $err ]] ||
      fail "$what: expected one line on stderr, got: $err"
  fi
  local f
  for f in "${fragments[@]}"; do
    [[ $text == *"$f"* ]] || fail "$what: lacks '$f' in: $text"
  done
  echo "ok: $what -> $rc${err:+: $err}"
}

# The windows of a metrics file's rows, in order, on one line.
windows_of() { grep -o '^{"window": [0-9]*' "$1" | grep -o '[0-9]*$' | tr '\n' ' '; }
# The losses of a metrics file's rows, in order, on one line.
losses_of() { grep -o '"loss": [^,]*' "$1" | tr '\n' ' '; }

# --- GPT-2: another run is refused, field by field -------------------------
base=(--model tiny --cpu --synthetic --micro-batch 2 --seq-len 16 --windows 4 --seed 5
  --lr 6e-4)
expect 0 "checkpoint: c.st (window 2; " -- "$gpt2" "${base[@]}" --checkpoint c.st --stop-after 2
cp c.st c.keep
expect 1 "checkpoint c.st is of another run: micro_batch = 2 but this run has 4" \
  -- "$gpt2" "${base[@]}" --resume c.st --micro-batch 4
expect 1 "seq_len = 16 but this run has 8" -- "$gpt2" "${base[@]}" --resume c.st --seq-len 8
expect 1 "micro_steps = 1 but this run has 2" \
  -- "$gpt2" "${base[@]}" --resume c.st --total-batch-tokens 64
expect 1 "seed = 5 but this run has 6" -- "$gpt2" "${base[@]}" --resume c.st --seed 6
expect 1 "dropout = 0 but this run has 0.1" -- "$gpt2" "${base[@]}" --resume c.st --dropout 0.1
expect 1 "dtype = f32 but this run has f16" "loss_scaler = none but this run has dynamic" \
  -- "$gpt2" "${base[@]}" --resume c.st --dtype f16
expect 1 "beta2 = 0.95 but this run has 0.99" "max_grad_norm = 1 but this run has 0.5" \
  -- "$gpt2" "${base[@]}" --resume c.st --beta2 0.99 --max-grad-norm 0.5
expect 1 "config.n_layer = 2 but this run has 3" -- "$gpt2" "${base[@]}" --resume c.st --n-layer 3
expect 1 "fp8 = off but this run has projections e4m3/e5m2, current scaling" \
  -- "$gpt2" "${base[@]}" --resume c.st --fp8
# A 16-bit gradient transport rounds the summed gradients (Note [Gradient transport]).
expect 1 "grad_transport = exact but this run has bf16" \
  -- "$gpt2" "${base[@]}" --resume c.st --grad-transport bf16
# Every difference at once, each named.
expect 1 "micro_batch = 2 but this run has 4" "seed = 5 but this run has 7" \
  -- "$gpt2" "${base[@]}" --resume c.st --micro-batch 4 --seed 7
# The data source: shards instead of the synthetic tokens.
if [[ -n $python ]] && command -v "$python" > /dev/null; then
  "$python" "$source_dir/tools/make_shards.py" "$source_dir/README.md" \
    --output-prefix "$work/readme" --val-fraction 0.1 > /dev/null || fail "make_shards.py"
  expect 1 "data = synthetic but this run has $work/readme_train_*.bin" \
    -- "$gpt2" --model tiny --cpu --train-data "$work/readme_train_*.bin" --micro-batch 2 \
    --seq-len 16 --windows 4 --seed 5 --lr 6e-4 --resume c.st
else
  echo "skip: the data-source case needs python3 (tools/make_shards.py)"
fi

# --- GPT-2: the changes --allow-changed lets through ------------------------
expect 1 "lr = 0.0006 but this run has 0.001" "windows = 4 but this run has 6" \
  "(--allow-changed lr,windows admits these changes)" \
  -- "$gpt2" "${base[@]}" --resume c.st --lr 1e-3 --windows 6
expect 1 "windows = 4 but this run has 6" "(--allow-changed windows admits this change)" \
  -- "$gpt2" "${base[@]}" --resume c.st --lr 1e-3 --windows 6 --allow-changed lr
expect 0 "resume: changed as --allow-changed permits: lr 0.0006 -> 0.001, windows 4 -> 6" \
  "resumed c.st at window 2" "window 3/6" "window 6/6" \
  -- "$gpt2" "${base[@]}" --resume c.st --lr 1e-3 --windows 6 --allow-changed lr,windows
[[ $out != *"window 2/6"* ]] || fail "the resumed run trained window 2 again"
# Only the safe fields: K stays refused whatever the words.
expect 1 "micro_steps = 1 but this run has 2" -- "$gpt2" "${base[@]}" --resume c.st \
  --total-batch-tokens 64 --allow-changed lr,windows,validation,metrics
expect 2 "--allow-changed needs --resume PATH" -- "$gpt2" "${base[@]}" --allow-changed lr
expect 2 "--allow-changed takes a comma-separated list of lr, windows, validation, metrics; got 'seed'" \
  -- "$gpt2" "${base[@]}" --resume c.st --allow-changed lr,seed

# --- GPT-2: a checkpoint inside a window keeps its K ------------------------
expect 0 "checkpoint: mid.st (window 2, micro-step 2; " -- "$gpt2" "${base[@]}" \
  --total-batch-tokens 128 --checkpoint mid.st --stop-after 1 --stop-micro-steps 2
expect 1 "micro_steps = 4 but this run has 8" \
  "the checkpoint is inside window 2, after micro-step 2 of K = 4" \
  -- "$gpt2" "${base[@]}" --total-batch-tokens 256 --resume mid.st
expect 0 "micro-step 2 of window 2" -- "$gpt2" "${base[@]}" --total-batch-tokens 128 \
  --resume mid.st

# --- GPT-2: metrics after a resume, one row per window ----------------------
expect 0 "final: " -- "$gpt2" "${base[@]}" --metrics u.jsonl
# Killed after window 3 with its last checkpoint at window 2 (c.keep), and
# mid-way through writing window 4's row.
expect 0 "" -- "$gpt2" "${base[@]}" --metrics m.jsonl --checkpoint c2.st --stop-after 2
expect 0 "" -- "$gpt2" "${base[@]}" --metrics m.jsonl --checkpoint c3.st --stop-after 3 \
  --resume c2.st
printf '{"window": 4, "loss": 5.' >> m.jsonl
[[ $(windows_of m.jsonl) == "1 2 3 4 " ]] || fail "setup: rows $(windows_of m.jsonl)"
expect 0 "metrics: m.jsonl cut after window 2 (2 later rows removed)" \
  -- "$gpt2" "${base[@]}" --metrics m.jsonl --resume c2.st
[[ $(windows_of m.jsonl) == "1 2 3 4 " ]] || fail "metrics after resume: rows $(windows_of m.jsonl)"
[[ $(wc -l < m.jsonl) -eq 4 ]] || fail "metrics after resume: $(wc -l < m.jsonl) lines"
[[ $(losses_of m.jsonl) == "$(losses_of u.jsonl)" ]] ||
  fail "metrics after resume: losses $(losses_of m.jsonl), uninterrupted $(losses_of u.jsonl)"
echo "ok: metrics after resume: windows $(windows_of m.jsonl)"
# Another metrics file is a change (the old one would miss the windows).
expect 1 "metrics = $work/m.jsonl but this run has $work/other.jsonl" \
  -- "$gpt2" "${base[@]}" --metrics other.jsonl --resume c2.st
expect 0 "resume: changed as --allow-changed permits: metrics $work/m.jsonl -> $work/other.jsonl" \
  -- "$gpt2" "${base[@]}" --metrics other.jsonl --resume c2.st --allow-changed metrics

# --- GPT-2: skipped windows and divergence -----------------------------------
diverge=(--model tiny --cpu --synthetic --micro-batch 2 --seq-len 16 --lr 1e30 --max-grad-norm 0)
expect 1 "the loss is not finite (" "nan) in windows 2 to 3, the last" \
  -- "$gpt2" "${diverge[@]}" --windows 3
expect 1 "2 windows in a row were skipped (windows 2 to 3: " "more than --max-skipped-windows 1" \
  -- "$gpt2" "${diverge[@]}" --windows 50 --max-skipped-windows 1
[[ $out == *"window 3/50"* && $out != *"window 4/50"* ]] || fail "the bound did not stop at window 3"
expect 1 "3 windows in a row were skipped (windows 2 to 4: " -- "$gpt2" "${diverge[@]}" \
  --windows 50 --dtype f16 --max-skipped-windows 2
expect 1 "window 2 was skipped" "more than --max-skipped-windows 0" \
  -- "$gpt2" "${diverge[@]}" --windows 50 --max-skipped-windows 0
expect 1 "33 windows in a row were skipped (windows 2 to 34: " -- "$gpt2" "${diverge[@]}" \
  --windows 50
# --init-from a file of NaN weights (the tiny model's Hugging Face names,
# written by Python): every window is skipped and the run fails.
if [[ -n $python ]] && command -v "$python" > /dev/null; then
  "$python" - <<'PY' || fail "writing nan_init.safetensors"
import json, struct
C, V, S = 64, 256, 64
shapes = {"wte.weight": [V, C], "wpe.weight": [S, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for layer in range(2):
    for name, shape in (("ln_1", [C]), ("ln_2", [C]), ("attn.c_attn", [C, 3 * C]),
                        ("attn.c_proj", [C, C]), ("mlp.c_fc", [C, 4 * C]),
                        ("mlp.c_proj", [4 * C, C])):
        shapes["h.%d.%s.weight" % (layer, name)] = shape
        shapes["h.%d.%s.bias" % (layer, name)] = [shape[-1]]
header, data = {}, b""
for name in sorted(shapes):
    n = 1
    for d in shapes[name]:
        n *= d
    header[name] = {"dtype": "F32", "shape": shapes[name], "data_offsets": [len(data), len(data) + 4 * n]}
    data += struct.pack("<f", float("nan")) * n
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open("nan_init.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + data)
PY
  expect 1 "the loss is not finite (" "nan) in windows 1 to 3, the last" \
    -- "$gpt2" "${base[@]}" --windows 3 --init-from nan_init.safetensors
else
  echo "skip: the NaN-weights case needs python3"
fi
# A failed run keeps the last checkpoint it wrote (window 1's, its loss finite).
expect 1 "2 windows in a row were skipped" -- "$gpt2" "${diverge[@]}" --windows 50 \
  --max-skipped-windows 1 --checkpoint d.st --checkpoint-every 1
[[ $out == *"checkpoint: d.st (window 1; "* && $out == *"checkpoint: not written at window 2"* ]] ||
  fail "diverged run's checkpoints: $out"
expect 0 "resumed d.st at window 1" -- "$gpt2" "${diverge[@]}" --windows 50 \
  --max-skipped-windows 1 --checkpoint d.st --checkpoint-every 1 --resume d.st --stop-after 1
# The skips in a row travel in the checkpoint: f16 from a scale of 2^24 skips
# windows 1 and 2 (a run stopped to be resumed may have taken no step yet),
# and the resumed run's windows 3 and 4 make four in a row.
f16=(--model tiny --cpu --synthetic --micro-batch 4 --seq-len 32 --windows 6 --dtype f16
  --init-scale 16777216)
expect 0 "window 2/6" "skipped 2" -- "$gpt2" "${f16[@]}" --stop-after 2 --checkpoint s.st \
  --max-skipped-windows 3
expect 1 "4 windows in a row were skipped (windows 1 to 4: " "more than --max-skipped-windows 3" \
  -- "$gpt2" "${f16[@]}" --resume s.st --max-skipped-windows 3
expect 1 "every window was skipped (windows 1 to 6)" -- "$gpt2" "${f16[@]}" --resume s.st
expect 2 "--max-skipped-windows must be >= 0, got -1" -- "$gpt2" "${base[@]}" \
  --max-skipped-windows -1

# --- ResNet: another run is refused; divergence fails -------------------------
expect 0 "checkpoint: r.st (after epoch 1)" -- "$resnet" --synthetic --epochs 1 --checkpoint r.st
expect 1 "checkpoint r.st is of another run: k = 16 but this run has 8" \
  -- "$resnet" --synthetic --epochs 2 --resume r.st --k 8
expect 1 "bn = window but this run has per-micro-batch" \
  -- "$resnet" --synthetic --epochs 2 --resume r.st --bn per-micro-batch
expect 1 "seed = 0 but this run has 3" -- "$resnet" --synthetic --epochs 2 --resume r.st --seed 3
expect 1 "micro_batch = 2 but this run has 4" -- "$resnet" --synthetic --epochs 2 --resume r.st \
  --micro-batch 4
expect 1 "lr = 0.05 but this run has 0.01 (--allow-changed lr admits this change)" \
  -- "$resnet" --synthetic --epochs 2 --resume r.st --lr 0.01
expect 0 "resume: changed as --allow-changed permits: lr 0.05 -> 0.01" "epoch 2 | loss " \
  -- "$resnet" --synthetic --epochs 2 --resume r.st --lr 0.01 --allow-changed lr
expect 2 "--allow-changed takes a comma-separated list of lr; got 'k'" \
  -- "$resnet" --synthetic --epochs 2 --resume r.st --allow-changed k
# Each epoch's line and the summary count the skipped windows.
expect 0 "epoch 1 | loss " "| skipped 0" "skipped since window 1" -- "$resnet" --synthetic --epochs 1
# Diverged: every window after the first is skipped (their batch statistics,
# not finite, never reach the running ones), until the bound ends the run.
expect 1 "33 windows in a row were skipped (windows 2 to 34 of epoch 1: " \
  "more than --max-skipped-windows 32" -- "$resnet" --lr 1e30 --epochs 2
expect 1 "window 2 of epoch 1 was skipped (" "more than --max-skipped-windows 0" \
  -- "$resnet" --lr 1e30 --epochs 2 --max-skipped-windows 0
# One NaN pixel in the data (.npy files written by Python without numpy).
if [[ -n $python ]] && command -v "$python" > /dev/null; then
  mkdir -p nan_digits
  "$python" - <<'PY' || fail "writing nan_digits"
import random, struct
def save(path, descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    header += " " * ((64 - (11 + len(header)) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
random.seed(0)
n = 1797
patterns = [[random.gauss(0, 1) for _ in range(64)] for _ in range(10)]
pixels = [patterns[i % 10][j] + 1.5 * random.gauss(0, 1) for i in range(n) for j in range(64)]
pixels[5 * 64 + 27] = float("nan")
save("nan_digits/digits_images.npy", "<f4", (n, 1, 8, 8), struct.pack("<%df" % len(pixels), *pixels))
save("nan_digits/digits_labels.npy", "<i8", (n,), struct.pack("<%dq" % n, *[i % 10 for i in range(n)]))
PY
  # The window holding it is skipped in each epoch; its statistics are
  # dropped, so training and evaluation go on, and an epoch's loss is over the
  # windows that stepped. The precise-BN re-estimate over the same data has no
  # finite statistics: a report says so, --recompute-bn fails.
  expect 0 "epoch 1 | loss 2.2018 | val accuracy 0.5500 | skipped 1" "| skipped 2" \
    "running variance vs the training set's: not computed (" "BatchNorm 0 of 6 saw statistics" \
    "final: val accuracy 0.7600" -- "$resnet" --data nan_digits --epochs 2
  expect 1 "recompute_batch_norm_statistics: BatchNorm 0 of 6 saw statistics that are not finite" \
    -- "$resnet" --data nan_digits --epochs 2 --recompute-bn
else
  echo "skip: the NaN-pixel case needs python3"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
