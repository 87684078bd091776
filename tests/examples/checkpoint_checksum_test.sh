#!/usr/bin/env bash
# A trainer checkpoint damaged on disk is refused at --resume, naming what is
# damaged, and nothing is overwritten (Note [Tensor checksums] in
# core/safetensors.cpp):
#   checkpoint_checksum_test.sh TRAINER PYTHON WORK_DIR
# Trains the tiny GPT-2 on the CPU for 2 of 3 windows with --checkpoint, then
# resumes from copies with 1 and 100 flipped bits in model.wte's data and one
# flipped bit in a metadata value: each exits 1 with one line on stderr naming
# the tensor (or the header); the intact checkpoint resumes.
set -u
trainer=$1 python=$2 work=$3
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# shellcheck source=tests/examples/fresh_work_dir.sh
source "$(dirname "${BASH_SOURCE[0]}")/fresh_work_dir.sh"
fresh_work_dir "$work" && cd "$work" || exit 1
args=(--model tiny --cpu --synthetic --micro-batch 2 --seq-len 16)

"$trainer" "${args[@]}" --windows 3 --stop-after 2 --checkpoint ck.safetensors > train.log 2>&1 ||
  { cat train.log; echo "FAIL: training for the checkpoint failed"; exit 1; }

# flip FILE TENSOR COUNT: flips COUNT distinct bits of TENSOR's data, found
# through the safetensors header; flip FILE meta KEY flips the lowest bit of
# the first character of metadata value KEY.
flip() {
  "$python" - "$@" << 'PY'
import json, random, struct, sys
path, what, arg = sys.argv[1], sys.argv[2], sys.argv[3]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = f.read(n)
    if what == "meta":
        at = 8 + header.index(b'"%s":"' % arg.encode()) + len(arg) + 4
        bits = [0]
    else:
        begin, end = json.loads(header)[what]["data_offsets"]
        at = 8 + n + begin
        bits = random.Random(1).sample(range((end - begin) * 8), int(arg))
    for bit in bits:
        f.seek(at + bit // 8)
        b = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([b ^ (1 << (bit % 8))]))
PY
}

# refused NAME FRAGMENT: resuming from NAME (with --checkpoint NAME) exits 1
# with one line naming FRAGMENT, and leaves the file as it was.
refused() {
  local name=$1 fragment=$2
  cp "$name" before.safetensors
  "$trainer" "${args[@]}" --windows 3 --resume "$name" --checkpoint "$name" > out.log 2> err.log
  local rc=$? err
  err=$(cat err.log)
  [[ $rc -eq 1 ]] || fail "$name: exit code $rc, expected 1; stderr: $err"
  [[ $(wc -l < err.log) -eq 1 ]] || fail "$name: expected one line on stderr, got: $err"
  [[ $err == *"$fragment"* ]] || fail "$name: stderr lacks '$fragment': $err"
  cmp -s "$name" before.safetensors || fail "$name: the checkpoint was changed"
  echo "ok: $name -> $rc: $err"
}

cp ck.safetensors one_bit.safetensors && flip one_bit.safetensors model.wte 1
refused one_bit.safetensors "tensor 'model.wte' fails its checksum"
cp ck.safetensors hundred_bits.safetensors && flip hundred_bits.safetensors model.wte 100
refused hundred_bits.safetensors "tensor 'model.wte' fails its checksum"
cp ck.safetensors meta_bit.safetensors && flip meta_bit.safetensors meta synthetic.offset
refused meta_bit.safetensors "the header fails its checksum"

"$trainer" "${args[@]}" --windows 3 --resume ck.safetensors > resume.log 2>&1 ||
  fail "the intact checkpoint did not resume: $(cat resume.log)"
grep -q "window 3/3" resume.log || fail "the resumed run did not reach window 3: $(cat resume.log)"

[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
