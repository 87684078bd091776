#!/usr/bin/env bash
# Kills a small GPT-2 training run at random times and resumes it until it
# completes, then checks that its final checkpoint equals, bit for bit, the
# checkpoint of the same run left alone (Note [Trainer checkpoint] in
# examples/gpt2/gpt2_checkpoint.h: a resumed run is the uninterrupted one).
#
#   tools/chaos.sh                         # 5 trials of 20 windows on the CPU
#   tools/chaos.sh --trials 20 --seed 7    # the run bench/RESULTS.md records
#   tools/chaos.sh --gpu                   # the same on GPU 0 (bf16)
#   tools/chaos.sh --dp                    # 2 GPUs: one rank killed mid-window
#
# Options:
#   --trials N        trials (default 5)
#   --windows N       windows per run (default 20)
#   --kills N         at most N kills per trial; the run after the last one
#                     finishes undisturbed (default 6)
#   --seed S          seed of the kill times and preemption points (default 1)
#   --binary PATH     the trainer (default build/ci/examples/accrue_train_gpt2)
#   --train-args "…"  extra trainer options, e.g. "--train-data 'shards/*.bin'"
#                     instead of --synthetic (tools/make_shards.py writes shards)
#   --work-dir DIR    where runs, logs and checkpoints go (default a temporary
#                     folder, removed at the end unless --keep)
#   --keep            keep the work folder
#   --gpu             run on the GPU (the trainer without --cpu); needs one
#   --dp              the 2-GPU variant (below); needs two GPUs
#   --dp-timeout S    --dp: the surviving rank must exit within S seconds of
#                     the kill (default 150: the communicator's 60 s timeout
#                     and the teardown)
#   -h, --help        this text
#
# One trial: the tiny preset, K = 4 micro-steps per window, dropout 0.1, a
# checkpoint after every window. Each run is started with --resume from the
# checkpoint when there is one (fresh otherwise) and SIGKILLed after a delay
# drawn uniformly over 85% of what is left of the run (its start-up plus the
# windows not yet closed, both timed on the uninterrupted run: the timing is
# noisy, and a run that ends before its kill ends the trial), so kills land in the
# start-up and resume, in the micro-steps, in the window close and in the
# saves. One run in four (at most two a trial) is preempted instead with
# --stop-after W --stop-micro-steps M, which saves inside a window (Note
# [Mid-window checkpoints] in optim/window.h), so later kills and resumes
# start from a mid-window checkpoint too. After --kills kills the last run
# goes to the end undisturbed. Per kill it prints the delay, where the kill
# landed and the run's last line before it; per trial the kills, preemptions
# and runs and the verdict; a summary line last.
# Where a kill landed, from the run's line-buffered output: "start-up" before
# its first window (the resume's load included), "micro-steps or close of
# window W" after window W-1's checkpoint line (the two are not told apart),
# "save of window W" after window W's progress line and before its
# checkpoint line ("PATH.tmp left" when the kill cut the write itself: the
# old checkpoint is kept).
#
# --dp: two ranks started with torchrun's environment (RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR, MASTER_PORT) but without torchrun, whose own
# teardown would kill the survivor and hide the trainer's error. Per trial one
# rank (drawn) is SIGKILLed at a random time after the start-up, inside the
# windows (micro-steps, close or save); the other must exit non-zero on
# its own, with an error line, within --dp-timeout seconds; the pair is then
# resumed from the last checkpoint (saved between windows: mid-window saves
# are one-process only) and run to the end, and its final checkpoint must
# equal the uninterrupted 2-GPU run's bit for bit. A survivor that exits 0
# passes only when rank 0 had printed its final line before the kill; one
# killed by a signal fails. Not run on two GPUs yet: its control flow was
# tried here with a stand-in for the ranks (rank 0 the CPU trainer alone,
# rank 1 a script that fails when rank 0 vanishes). Needs two GPUs (exit 77,
# skip, without them).
#
# The comparison reads both safetensors files (Python, standard library only):
# same tensor names, dtypes, shapes and bytes, same metadata (a per-tensor
# checksum in the metadata is a function of the bytes, so it agrees when they
# do). It also says whether the files are byte-identical.
#
# Exit status: 0 every trial's final checkpoint equal to the uninterrupted
# one; 1 a trial differed or a run failed (other than by our kill); 2 bad
# usage; 77 --gpu or --dp without the GPUs they need.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trials=5
windows=20
max_kills=6
seed=1
binary="$ROOT/build/ci/examples/accrue_train_gpt2"
train_args=""
work_dir=""
keep=0
gpu=0
dp=0
dp_timeout=150

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die_usage() {
  echo "chaos.sh: $*" >&2
  exit 2
}
positive() { [[ "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || die_usage "$1 expects a positive integer, got '$2'"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --trials | --windows | --kills | --seed | --binary | --train-args | --work-dir | --dp-timeout)
      [[ $# -ge 2 ]] || die_usage "$1 needs a value"
      case "$1" in
        --trials) positive "$1" "$2" && trials="$2" ;;
        --windows) positive "$1" "$2" && windows="$2" ;;
        --kills) [[ "$2" =~ ^[0-9]+$ ]] || die_usage "--kills expects an integer >= 0, got '$2'"
                 max_kills="$2" ;;
        --seed) [[ "$2" =~ ^[0-9]+$ ]] || die_usage "--seed expects an integer >= 0, got '$2'"
                seed="$2" ;;
        --binary) binary="$2" ;;
        --train-args) train_args="$2" ;;
        --work-dir) work_dir="$2" ;;
        --dp-timeout) positive "$1" "$2" && dp_timeout="$2" ;;
      esac
      shift 2 ;;
    --keep) keep=1; shift ;;
    --gpu) gpu=1; shift ;;
    --dp) dp=1; gpu=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$windows" -ge 3 ]] || die_usage "--windows must be >= 3, got $windows"
[[ -x "$binary" ]] || die_usage "no trainer at '$binary' (build accrue_train_gpt2 or pass --binary)"
command -v python3 >/dev/null 2>&1 || die_usage "python3 is needed to compare checkpoints"
command -v timeout >/dev/null 2>&1 || die_usage "timeout (coreutils) is needed"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [[ $dp -eq 1 && $gpus -lt 2 ]]; then
  echo "chaos.sh: SKIP: --dp needs 2 GPUs, found $gpus"
  exit 77
fi
if [[ $gpu -eq 1 && $gpus -lt 1 ]]; then
  echo "chaos.sh: SKIP: --gpu needs a GPU, found none"
  exit 77
fi

if [[ -z "$work_dir" ]]; then
  work_dir=$(mktemp -d "${TMPDIR:-/tmp}/accrue_chaos.XXXXXX")
  [[ $keep -eq 1 ]] || trap 'rm -rf "$work_dir"' EXIT
else
  mkdir -p "$work_dir" || die_usage "cannot create --work-dir '$work_dir'"
fi
work_dir=$(cd "$work_dir" && pwd)

# Line-buffered output, so the last line before a kill is the run's last step.
linebuf=()
command -v stdbuf >/dev/null 2>&1 && linebuf=(stdbuf -oL -eL)

# The run: K = 128 / (2 x 16) = 4 micro-steps a window (x ranks under --dp:
# the global batch stays 128 tokens per rank).
ranks=1
[[ $dp -eq 1 ]] && ranks=2
K=4
run_args=(--model tiny --micro-batch 2 --seq-len 16 --total-batch-tokens $((128 * ranks))
          --windows "$windows" --lr 3e-3 --warmup-windows 2 --dropout 0.1 --seed 11
          --checkpoint-every 1)
if [[ -n "$train_args" ]]; then
  eval "extra=($train_args)" || die_usage "--train-args '$train_args' is not a word list"
  run_args+=("${extra[@]}")
  [[ " $train_args " == *" --train-data "* ]] || run_args+=(--synthetic)
else
  run_args+=(--synthetic)
fi
[[ $gpu -eq 1 ]] || run_args+=(--cpu)

# The kill times and preemption points: bash's generator from --seed. Drawn
# in this shell only (bash reseeds RANDOM in a subshell, so never in $(...)).
RANDOM=$seed
# rand N: sets R to an integer in [0, N) (N <= 2^30).
R=0
rand() { R=$(((RANDOM << 15 | RANDOM) % $1)); }

# compare A B: the verdict line; exit 0 when bitwise equal.
compare() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys

def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n :]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        tensors[name] = (info["dtype"], tuple(info["shape"]), body[begin:end])
    return data, meta, tensors

a_bytes, a_meta, a = read(sys.argv[1])
b_bytes, b_meta, b = read(sys.argv[2])
problems = []
for name in sorted(set(a) | set(b)):
    if name not in a or name not in b:
        problems.append(f"tensor {name} only in {'the reference' if name in a else 'the resumed run'}")
    elif a[name][:2] != b[name][:2]:
        problems.append(f"tensor {name}: {a[name][:2]} vs {b[name][:2]}")
    elif a[name][2] != b[name][2]:
        x, y = a[name][2], b[name][2]
        first = next(i for i in range(len(x)) if x[i] != y[i])
        problems.append(f"tensor {name}: bytes differ from byte {first} of {len(x)}")
for key in sorted(set(a_meta) | set(b_meta)):
    if a_meta.get(key) != b_meta.get(key):
        problems.append(f"metadata {key}: {a_meta.get(key)!r} vs {b_meta.get(key)!r}")
if problems:
    print("DIFFERENT: " + "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""))
    sys.exit(1)
size = sum(len(t[2]) for t in a.values())
same_file = "byte-identical files" if a_bytes == b_bytes else "files differ outside the tensors"
print(f"bitwise equal ({len(a)} tensors, {size} bytes, {len(a_meta)} metadata keys; {same_file})")
EOF
}

# meta_field FILE KEY: a checkpoint's metadata value (empty when absent or unreadable).
meta_field() {
  python3 - "$1" "$2" <<'EOF' 2>/dev/null
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    print(json.loads(f.read(n)).get("__metadata__", {}).get(sys.argv[2], ""))
EOF
}

# last_line LOG: the run's last non-empty output line, shortened.
last_line() {
  local line
  line=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -1)
  [[ ${#line} -gt 90 ]] && line="${line:0:87}..."
  echo "${line:-<no output>}"
}

# landing LOG TMP_BEFORE TMP RESUMED: where a kill landed (see --help).
landing() {
  local log=$1 tmp_before=$2 tmp=$3 resumed=$4 line w
  line=$(grep -E '^(window [0-9]+/[0-9]+ \| loss|checkpoint: )' "$log" 2>/dev/null | tail -1)
  if [[ -z "$line" ]]; then
    w=$(sed -n 's/^resumed .* at window \([0-9]*\).*/\1/p' "$log" | tail -1)
    if [[ -n "$w" ]]; then
      echo "micro-steps or close of window $((w + 1)) (the first after the resume)"
    elif [[ $resumed -eq 1 ]]; then
      echo "start-up (before the resume was loaded)"
    else
      echo "start-up (before the first window)"
    fi
  elif [[ "$line" == checkpoint:* ]]; then
    w=$(sed -n 's/.*(window \([0-9]*\).*/\1/p' <<<"$line")
    echo "micro-steps or close of window $((w + 1))"
  else
    w=$(sed -n 's/^window \([0-9]*\)\/.*/\1/p' <<<"$line")
    local now=""
    [[ -e "$tmp" ]] && now=$(stat -c '%i %.Y' "$tmp")
    if [[ -n "$now" && "$now" != "$tmp_before" ]]; then
      echo "save of window $w (PATH.tmp left)"
    else
      echo "save of window $w"
    fi
  fi
}

# ---- the uninterrupted reference --------------------------------------------
dp_env() {  # dp_env RANK PORT: torchrun's environment for one of two ranks
  echo "RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$2"
}
rand 2000
port=$((29500 + R))

# run_pair OUTLOG ERRLOG ARGS...: both ranks to the end; rank 0's status.
run_pair() {
  local out=$1 err=$2
  shift 2
  port=$((port + 1))
  # shellcheck disable=SC2046
  env $(dp_env 1 $port) "$binary" "$@" >/dev/null 2>"$err.rank1" &
  local p1=$!
  # shellcheck disable=SC2046
  env $(dp_env 0 $port) "${linebuf[@]}" "$binary" "$@" >"$out" 2>"$err"
  local rc=$?
  wait $p1 || rc=1
  return $rc
}

echo "chaos.sh: $trials trial(s) of $windows windows, up to $max_kills kills each, seed $seed;" \
  "$([[ $dp -eq 1 ]] && echo "2 GPUs" || { [[ $gpu -eq 1 ]] && echo "GPU" || echo "CPU"; })"
echo "chaos.sh: trainer $binary ${run_args[*]}"
echo "chaos.sh: work folder $work_dir"
ref="$work_dir/reference.safetensors"
# now_s: seconds since the epoch, to the nanosecond.
now_s() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.3f", b - a }'; }
# The start-up and one window's time, from a run of one window and the whole run.
t0=$(now_s)
if [[ $dp -eq 1 ]]; then
  run_pair "$work_dir/one.log" "$work_dir/one.err" "${run_args[@]}" --stop-after 1 \
    --checkpoint "$work_dir/one.safetensors"
else
  "$binary" "${run_args[@]}" --stop-after 1 --checkpoint "$work_dir/one.safetensors" \
    >"$work_dir/one.log" 2>"$work_dir/one.err"
fi
rc=$?
one_s=$(elapsed "$t0")
t0=$(now_s)
if [[ $rc -eq 0 && $dp -eq 1 ]]; then
  run_pair "$work_dir/reference.log" "$work_dir/reference.err" "${run_args[@]}" --checkpoint "$ref"
  rc=$?
elif [[ $rc -eq 0 ]]; then
  "$binary" "${run_args[@]}" --checkpoint "$ref" >"$work_dir/reference.log" 2>"$work_dir/reference.err"
  rc=$?
fi
ref_s=$(elapsed "$t0")
if [[ $rc -ne 0 || ! -f "$ref" ]]; then
  echo "chaos.sh: the uninterrupted run failed (exit $rc):" >&2
  tail -5 "$work_dir"/one.{log,err} "$work_dir"/reference.{log,err} >&2 2>/dev/null
  exit 1
fi
# In ms: a window, and the start-up (process, model, the first load).
window_ms=$(awk -v a="$one_s" -v b="$ref_s" -v n="$windows" \
  'BEGIN { w = (b - a) / (n - 1) * 1000; print (w < 1 ? 1 : int(w)) }')
startup_ms=$(awk -v a="$one_s" -v w="$window_ms" 'BEGIN { s = a * 1000 - w; print (s < 1 ? 1 : int(s)) }')
echo "chaos.sh: uninterrupted run: ${ref_s} s (start-up ~${startup_ms} ms, ~${window_ms} ms a" \
  "window), final checkpoint $(stat -c %s "$ref") bytes"

# ---- trials ------------------------------------------------------------------
passed=0
total_kills=0
killed_trials=0
total_preempt=0
declare -A landed=()

one_trial_single() {  # the CPU / one-GPU trial; sets kills, preempts, runs, verdict
  local dir=$1 ckpt="$1/ckpt.safetensors" n=0 rc delay_ms delay tmp_before where closed
  kills=0
  preempts=0
  runs=0
  verdict=""
  while true; do
    n=$((n + 1))
    runs=$((runs + 1))
    local args=("${run_args[@]}" --checkpoint "$ckpt")
    [[ -f "$ckpt" ]] && args+=(--resume "$ckpt")
    local log="$dir/run$n.log" err="$dir/run$n.err"
    tmp_before=""
    [[ -e "$ckpt.tmp" ]] && tmp_before=$(stat -c '%i %.Y' "$ckpt.tmp")
    if [[ $kills -ge $max_kills ]]; then  # the last run: to the end, undisturbed
      "${linebuf[@]}" "$binary" "${args[@]}" >"$log" 2>"$err"
      rc=$?
      if [[ $rc -ne 0 ]]; then
        verdict="FAILED: the final run exited $rc: $(last_line "$err")"
      fi
      return
    fi
    rand 4
    if [[ $R -eq 0 && $preempts -lt 2 ]]; then  # a preemption inside a window instead of a kill
      closed=0
      [[ -f "$ckpt" ]] && closed=$(meta_field "$ckpt" windows_closed)
      closed=${closed:-0}
      rand 3
      local stop=$((closed + 1 + R))
      rand $((K - 1))
      if [[ $stop -lt $windows ]]; then
        args+=(--stop-after "$stop" --stop-micro-steps $((1 + R)))
        "${linebuf[@]}" "$binary" "${args[@]}" >"$log" 2>"$err"
        rc=$?
        if [[ $rc -ne 0 ]]; then
          verdict="FAILED: the preempted run exited $rc: $(last_line "$err")"
          return
        fi
        preempts=$((preempts + 1))
        echo "    preempted: $(grep '^checkpoint: ' "$log" | tail -1 | sed 's/^checkpoint: [^ ]* (\([^;]*\);.*/\1/')"
        continue
      fi
    fi
    # Uniform over what is left of the run, so most runs are cut before the end.
    closed=0
    [[ -f "$ckpt" ]] && closed=$(meta_field "$ckpt" windows_closed)
    rand $(((startup_ms + (windows - ${closed:-0}) * window_ms) * 85 / 100 + 1))
    delay_ms=$((1 + R))
    delay=$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')
    # In a subshell whose stderr is dropped: timeout re-raises the KILL on
    # itself, and the shell would print "Killed" for it.
    (timeout -s KILL "$delay" "${linebuf[@]}" "$binary" "${args[@]}" >"$log" 2>"$err"
     exit $?) 2>/dev/null
    rc=$?
    if [[ $rc -eq 0 ]]; then  # finished before the kill came
      return
    fi
    if [[ $rc -ne 137 && $rc -ne 124 ]]; then
      verdict="FAILED: run $n exited $rc (not our kill): $(last_line "$err")"
      return
    fi
    kills=$((kills + 1))
    local resumed=0
    [[ " ${args[*]} " == *" --resume "* ]] && resumed=1
    where=$(landing "$log" "$tmp_before" "$ckpt.tmp" $resumed)
    local kind=${where%% (*}
    kind=${kind%% of *}
    [[ $where == *"PATH.tmp left"* ]] && kind="save (write cut)"
    landed[$kind]=$((${landed[$kind]:-0} + 1))
    printf '    kill %d after %s s: %s | last line: %s\n' "$kills" "$delay" "$where" "$(last_line "$log")"
  done
}

one_trial_dp() {  # the 2-GPU trial; sets kills, preempts, runs, verdict
  local dir=$1 ckpt="$1/ckpt.safetensors" rc
  kills=0
  preempts=0
  runs=0
  verdict=""
  local victim delay_ms delay
  rand 2
  victim=$R
  # After the start-up (NCCL's set-up included), inside the windows.
  rand $((windows * window_ms * 85 / 100 + 1))
  delay_ms=$((startup_ms + R))
  delay=$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')
  port=$((port + 1))
  local -a pids=()
  for r in 0 1; do
    # shellcheck disable=SC2046
    env $(dp_env $r $port) "${linebuf[@]}" "$binary" "${run_args[@]}" --checkpoint "$ckpt" \
      >"$dir/run1.rank$r.log" 2>"$dir/run1.rank$r.err" &
    pids[r]=$!
  done
  runs=1
  sleep "$delay"
  local survivor=$((1 - victim))
  local finished_before=0  # rank 0 had printed its final line before the kill
  grep -q '^final: ' "$dir/run1.rank0.log" 2>/dev/null && finished_before=1
  # A rank that has exited is a zombie until waited for, and kill succeeds on it.
  if [[ "$(awk '/^State:/ { print $2 }' "/proc/${pids[victim]}/status" 2>/dev/null)" == Z ]] ||
    ! kill -KILL "${pids[victim]}" 2>/dev/null; then
    wait "${pids[0]}" "${pids[1]}"
    echo "    the run ended before the kill at $delay s"
  else
    kills=1
    local t_kill=$SECONDS
    landed["rank $victim"]=$((${landed["rank $victim"]:-0} + 1))
    printf '    kill rank %d after %s s | last line of rank 0: %s\n' "$victim" "$delay" \
      "$(last_line "$dir/run1.rank0.log")"
    wait "${pids[victim]}" 2>/dev/null
    # The survivor must leave by itself, within the bound.
    local waited=0
    while kill -0 "${pids[survivor]}" 2>/dev/null && [[ $waited -lt $dp_timeout ]]; do
      sleep 1
      waited=$((SECONDS - t_kill))
    done
    if kill -0 "${pids[survivor]}" 2>/dev/null; then
      kill -KILL "${pids[survivor]}"
      wait "${pids[survivor]}" 2>/dev/null
      verdict="FAILED: rank $survivor still ran ${dp_timeout} s after rank $victim was killed"
      return
    fi
    wait "${pids[survivor]}"
    rc=$?
    local why
    why=$(last_line "$dir/run1.rank$survivor.err")
    if [[ $rc -eq 0 ]]; then
      # Only when the run had ended first (the kill came late, rank 0 done).
      if [[ $finished_before -eq 0 ]]; then
        verdict="FAILED: rank $survivor exited 0 after rank $victim was killed"
        return
      fi
    elif [[ $rc -gt 128 ]]; then
      verdict="FAILED: rank $survivor died of signal $((rc - 128)), not an error: $why"
      return
    else
      echo "    rank $survivor exited $rc after $((SECONDS - t_kill)) s: $why"
    fi
  fi
  runs=2
  local args=("${run_args[@]}" --checkpoint "$ckpt")
  [[ -f "$ckpt" ]] && args+=(--resume "$ckpt")
  if ! run_pair "$dir/run2.log" "$dir/run2.err" "${args[@]}"; then
    verdict="FAILED: the resumed 2-rank run failed: $(last_line "$dir/run2.err")"
  fi
}

for ((trial = 1; trial <= trials; ++trial)); do
  dir="$work_dir/trial$trial"
  mkdir -p "$dir"
  echo "  trial $trial:"
  start=$(now_s)
  # (stderr dropped under --dp: the shell reports the killed rank as "Killed")
  if [[ $dp -eq 1 ]]; then one_trial_dp "$dir" 2>/dev/null; else one_trial_single "$dir"; fi
  if [[ -z "$verdict" ]]; then
    if [[ -f "$dir/ckpt.safetensors" ]]; then
      verdict=$(compare "$ref" "$dir/ckpt.safetensors") && passed=$((passed + 1))
    else
      verdict="FAILED: no final checkpoint"
    fi
  fi
  seconds=$(awk -v s="$(elapsed "$start")" 'BEGIN { printf "%.1f", s }')
  total_kills=$((total_kills + kills))
  [[ $kills -gt 0 ]] && killed_trials=$((killed_trials + 1))
  total_preempt=$((total_preempt + preempts))
  printf '  trial %d: %d kills, %d mid-window preemptions, %d runs, %s s: %s\n' \
    "$trial" "$kills" "$preempts" "$runs" "$seconds" "$verdict"
done

where_list=""
for k in "${!landed[@]}"; do
  where_list+="${where_list:+, }$k ${landed[$k]}"
done
echo "chaos.sh: summary: $passed/$trials trials bitwise equal to the uninterrupted run;" \
  "$total_kills kills in $killed_trials trials (${where_list:-none}), $total_preempt mid-window" \
  "preemptions; seed $seed," \
  "$windows windows, $([[ $dp -eq 1 ]] && echo "2 GPUs" || { [[ $gpu -eq 1 ]] && echo GPU || echo CPU; })"
[[ $passed -eq $trials ]]
