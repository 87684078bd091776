#!/usr/bin/env bash
# accrue_train data parallel on two GPUs of this node (label multi_gpu):
#   train_dp_test.sh TRAINER LAUNCH WORK_DIR PYTHON SOURCE_DIR
# LAUNCH is tests/dist/multi_gpu_launch.sh (torchrun's variables, one process
# per rank). Exits 77 (skip) with fewer than 2 GPUs.
#  - Two ranks of micro-batch 2 read the rows one process of micro-batch 4
#    reads (Note [Document batches]: rank r takes rows r * B.. of each step)
#    and the loss is the mean over the window's real tokens of all ranks
#    (Note [Normalization]): the final losses agree to f32 rounding.
#  - --zero1 (Note [ZeRO-1]) shards the moments and gives the same losses.
#  - --grad-transport bf16 with small buckets ends near the exact run.
#  - --bench under two ranks: world_size 2, the moments sharded.
#  - A checkpoint of the two-rank run is refused by a one-process resume.
#  - gpt2-tiny on two ranks with ZeRO-1 ends where one process does.
set -u
trainer=$1 launch=$2 work=$3 python=$4 source_dir=$5
gpus=$(nvidia-smi -L 2> /dev/null | grep -c "^GPU")
if [[ ${gpus:-0} -lt 2 ]]; then
  echo "SKIP: needs 2 GPUs, found ${gpus:-0}"
  exit 77
fi
# shellcheck source=tests/examples/fresh_work_dir.sh
source "$(dirname "${BASH_SOURCE[0]}")/fresh_work_dir.sh"
fresh_work_dir "$work" || exit 1
fail() {
  echo "FAIL: $*"
  exit 1
}
final_loss() { sed -n 's/^final: window [0-9]* loss //p' "$1"; }
close() { # close A B: |A - B| <= 1e-4 |B|
  "$python" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-4 * abs(b))" \
    "$1" "$2"
}
"$python" "$source_dir/tools/make_shards.py" "$source_dir/README.md" \
  "$source_dir/docs/ARCHITECTURE.md" --output-prefix "$work/text" > /dev/null || fail "make_shards"
common=(--model llama-tiny --train-data "$work/text_train_*.bin" --eos-id 10 --seq-len 64
  --accum 2 --windows 4 --dtype f32 --lr 1e-3)

"$trainer" "${common[@]}" --micro-batch 4 > "$work/one.txt" 2>&1 ||
  fail "one process: $(cat "$work/one.txt")"
bash "$launch" 2 "$trainer" "${common[@]}" --micro-batch 2 \
  --checkpoint "$work/two.safetensors" > "$work/two.txt" 2>&1 || fail "two ranks: $(cat "$work/two.txt")"
grep -q "x 2 rank(s) x K=2 = 512 tokens per window" "$work/two.txt" ||
  fail "two ranks: no batch line: $(cat "$work/two.txt")"
grep -q "^data parallel: " "$work/two.txt" || fail "two ranks: no data-parallel line"
one=$(final_loss "$work/one.txt") two=$(final_loss "$work/two.txt")
[[ -n $one && -n $two ]] || fail "no final loss: '$one' '$two'"
close "$two" "$one" || fail "two ranks x micro-batch 2 ended at $two, one process x 4 at $one"

bash "$launch" 2 "$trainer" "${common[@]}" --micro-batch 2 --zero1 > "$work/zero1.txt" 2>&1 ||
  fail "--zero1: $(cat "$work/zero1.txt")"
grep -q "^memory per rank: .*moments [^,]*(sharded)" "$work/zero1.txt" ||
  fail "--zero1: the moments are not sharded: $(grep "^memory" "$work/zero1.txt")"
zero1=$(final_loss "$work/zero1.txt")
close "$zero1" "$two" || fail "--zero1 ended at $zero1, without it at $two"

# --grad-transport bf16 (Note [Gradient transport]) rounds each rank's buckets
# before the sum: near the exact run, not equal; --bucket-mb sets the buckets.
bash "$launch" 2 "$trainer" "${common[@]}" --micro-batch 2 --grad-transport bf16 --bucket-mb 0.5 \
  > "$work/bf16.txt" 2>&1 || fail "--grad-transport bf16: $(cat "$work/bf16.txt")"
grep -q "^data parallel: .* buckets of up to 0.5 MiB, bf16 transport" "$work/bf16.txt" ||
  fail "--grad-transport bf16: $(grep "^data parallel" "$work/bf16.txt")"
bf16=$(final_loss "$work/bf16.txt")
"$python" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-2 * abs(b))" \
  "$bf16" "$two" || fail "--grad-transport bf16 ended at $bf16, the exact transport at $two"

bash "$launch" 2 "$trainer" --model llama-tiny --synthetic --synthetic-documents full \
  --seq-len 64 --micro-batch 2 --accum 2 --dtype bf16 --zero1 --bench --bench-warmup 1 \
  --bench-windows 2 > "$work/bench.txt" 2>&1 || fail "--bench: $(cat "$work/bench.txt")"
"$python" - "$work/bench.txt" << 'PY' || fail "--bench: $(cat "$work/bench.txt")"
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
assert len(lines) == 1, lines  # rank 0 prints it; the other ranks' stdout is silenced
j = json.loads(lines[0])
assert j["world_size"] == 2 and j["tokens_per_s_median"] > 0, j
assert j["config"]["tokens_per_window"] == 2 * 2 * 64 * 2, j
assert j["store_memory_bytes"]["moments_sharded"] is True and j["config"]["zero1"] is True, j
PY

err=$("$trainer" "${common[@]}" --micro-batch 2 --resume "$work/two.safetensors" 2>&1 > /dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"world_size = 2 but this run has 1"* ]] ||
  fail "a one-process resume of a two-rank checkpoint: exit code $rc: $err"
# GPT-2 through the same trainer reads contiguous rows (Note [GPT-2 rows]):
# rank r the rows r * B.. of each step (Note [Loader positions]), so two
# ranks of micro-batch 2 read what one process of micro-batch 4 reads.
gpt2=(--model gpt2-tiny --train-data "$work/text_train_*.bin" --seq-len 64 --accum 2 --windows 4
  --dtype f32 --lr 1e-3)
"$trainer" "${gpt2[@]}" --micro-batch 4 > "$work/gone.txt" 2>&1 ||
  fail "gpt2-tiny, one process: $(cat "$work/gone.txt")"
bash "$launch" 2 "$trainer" "${gpt2[@]}" --micro-batch 2 --zero1 > "$work/gtwo.txt" 2>&1 ||
  fail "gpt2-tiny, two ranks: $(cat "$work/gtwo.txt")"
gone=$(final_loss "$work/gone.txt") gtwo=$(final_loss "$work/gtwo.txt")
[[ -n $gone && -n $gtwo ]] || fail "gpt2-tiny: no final loss: '$gone' '$gtwo'"
close "$gtwo" "$gone" || fail "gpt2-tiny: two ranks (ZeRO-1) ended at $gtwo, one process at $gone"
echo "ok: two ranks end at $two (one process: $one, ZeRO-1: $zero1); gpt2-tiny $gtwo ($gone)"
