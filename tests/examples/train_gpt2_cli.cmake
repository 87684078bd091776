# One scenario of the GPT-2 trainer's command line (tests/examples/CMakeLists.txt):
#   cmake -DTRAINER=... -DSCENARIO=... -DPYTHON=... -DSOURCE_DIR=... -DWORK_DIR=... -P this
#
#   help            --help exits 0 and lists the options
#   bad_option      an unknown option exits 2 with a one-line error naming it
#   bad_value       each malformed or out-of-range value exits 2 with a one-line error
#   k_not_dividing  a total batch that B * T does not divide exits 2 and says so
#   bench           --synthetic --bench on the CPU prints one JSON line; --composed (the
#                   model from the public primitives) gives the fused model's loss
#   make_shards     tools/make_shards.py: --help, the shards it writes, a missing input
#   train           the tiny preset on shards of README.md: finite losses that fall,
#                   validation lines, the --metrics file and its plot
#   resume          a run stopped at window 2 by --stop-after and resumed from its
#                   checkpoint prints exactly the final loss of the uninterrupted run;
#                   so do runs stopped inside a window (--stop-micro-steps); a
#                   checkpoint of another model or dtype is refused
#   gpu_bench       --bench on the GPU (bf16): the JSON line names the device
#   gpu_resume      train and resume on the GPU in bf16 with dropout: falling finite
#                   losses, and the resumed run's final loss equal to the uninterrupted one
# The gpu scenarios print "SKIP: needs a CUDA GPU" and pass when the trainer
# falls back to the CPU; ctest reports them as skipped.

cmake_minimum_required(VERSION 3.25)

# Runs the trainer (or any COMMAND); sets rc, out, err in the caller.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err
                  WORKING_DIRECTORY ${WORK_DIR})
  set(rc "${_rc}" PARENT_SCOPE)
  set(out "${_out}" PARENT_SCOPE)
  set(err "${_err}" PARENT_SCOPE)
endfunction()

function(fail)
  string(JOIN "" _msg ${ARGN})
  message(FATAL_ERROR "${_msg}\n--- exit code: ${rc}\n--- stdout:\n${out}\n--- stderr:\n${err}")
endfunction()

function(expect_rc expected)
  if(NOT "${rc}" STREQUAL "${expected}")
    fail("expected exit code ${expected}")
  endif()
endfunction()

function(expect_contains text fragment)
  string(FIND "${text}" "${fragment}" _at)
  if(_at EQUAL -1)
    fail("expected the output to contain '${fragment}'")
  endif()
endfunction()

# Exit code 2 and exactly one line on stderr that contains every fragment.
function(expect_usage_error)
  expect_rc(2)
  string(REGEX MATCHALL "\n" _newlines "${err}")
  list(LENGTH _newlines _lines)
  if(NOT _lines EQUAL 1)
    fail("expected a one-line error on stderr, got ${_lines} lines")
  endif()
  foreach(_fragment IN LISTS ARGN)
    expect_contains("${err}" "${_fragment}")
  endforeach()
endfunction()

# The loss of every progress line "window N/W | loss X |", in order, into `var`;
# each must be a plain finite number (nan and inf never match).
function(window_losses text var)
  string(REGEX MATCHALL "window [0-9]+/[0-9]+ \\| loss [^ ]+" _lines "${text}")
  set(_losses)
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE ".* loss " "" _loss "${_line}")
    if(NOT _loss MATCHES "^[0-9]+\\.[0-9]+$")
      fail("loss '${_loss}' is not a finite number in '${_line}'")
    endif()
    list(APPEND _losses ${_loss})
  endforeach()
  set(${var} ${_losses} PARENT_SCOPE)
endfunction()

# The one line of `text` that starts with `prefix`, into `var`.
function(line_starting text prefix var)
  string(REGEX MATCH "(^|\n)${prefix}[^\n]*" _line "${text}")
  if(_line STREQUAL "")
    fail("no line starts with '${prefix}'")
  endif()
  string(STRIP "${_line}" _line)
  set(${var} "${_line}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

set(TINY --model tiny --cpu --micro-batch 4 --seq-len 32)

# Byte-level shards of the repository's README and architecture notes.
function(make_readme_shards)
  run(${PYTHON} ${SOURCE_DIR}/tools/make_shards.py ${SOURCE_DIR}/README.md
      ${SOURCE_DIR}/docs/ARCHITECTURE.md --output-prefix ${WORK_DIR}/readme --val-fraction 0.1)
  expect_rc(0)
endfunction()
set(SHARDS --train-data ${WORK_DIR}/readme_train_*.bin --val-data ${WORK_DIR}/readme_val_*.bin)

if(SCENARIO STREQUAL "help")
  run(${TRAINER} --help)
  expect_rc(0)
  foreach(_option --model --n-layer --micro-batch --seq-len --total-batch-tokens --train-data
                  --val-data --synthetic --lr --warmup-windows --windows --min-lr-factor
                  --weight-decay --beta1 --beta2 --eps --max-grad-norm --norm-under-backward --cuda-graphs --composed --gemm-tuning --dtype --init-scale --calibrate-scale --val-every
                  --val-batches --metrics --layer-metrics-every --noise-scale-every --nvtx --checkpoint --checkpoint-every --resume --init-from
                  --activation-checkpointing --seed --cpu --dropout --bench --bench-warmup
                  --bench-windows --peak-tflops --stop-after --stop-micro-steps)
    expect_contains("${out}" "${_option}")
  endforeach()

elseif(SCENARIO STREQUAL "bad_option")
  run(${TRAINER} --synthetic --no-such-option)
  expect_usage_error("unknown option '--no-such-option'" "--help")

elseif(SCENARIO STREQUAL "bad_value")
  run(${TRAINER} --synthetic --micro-batch abc)
  expect_usage_error("--micro-batch expects an integer, got 'abc'")
  run(${TRAINER} --synthetic --micro-batch 0)
  expect_usage_error("--micro-batch must be >= 1, got 0")
  run(${TRAINER} --synthetic --lr 1e-3x)
  expect_usage_error("--lr expects a number, got '1e-3x'")
  run(${TRAINER} --synthetic --dropout 1)
  expect_usage_error("--dropout must be in [0, 1)")
  run(${TRAINER} --synthetic --dtype f64)
  expect_usage_error("--dtype must be f32, bf16 or f16, got 'f64'")
  run(${TRAINER} --synthetic --composed --dropout 0.1)
  expect_usage_error("--composed has no dropout, no activation checkpointing and no FP8")
  run(${TRAINER} --synthetic --composed --fp8)
  expect_usage_error("--composed has no dropout, no activation checkpointing and no FP8")
  run(${TRAINER} ${TINY} --synthetic --noise-scale-every 2)
  expect_usage_error("--noise-scale-every needs K >= 2 micro-batches per window, got K = 1")
  run(${TRAINER} ${TINY} --synthetic --init-scale 1024)
  expect_usage_error("--init-scale applies to --dtype f16 only, the compute dtype is f32")
  run(${TRAINER} ${TINY} --synthetic --calibrate-scale)
  expect_usage_error("--calibrate-scale applies to --dtype f16 only, the compute dtype is f32")
  run(${TRAINER} --synthetic --init-scale 0.5)
  expect_usage_error("--init-scale must be >= 1, got 0.5")
  run(${TRAINER} --synthetic --layer-metrics-every 2)
  expect_usage_error("--layer-metrics-every needs --metrics FILE")
  run(${TRAINER} --synthetic --model d13)
  expect_usage_error("--model must be" "'d13'")
  run(${TRAINER} --synthetic --windows)
  expect_usage_error("--windows needs a value")
  run(${TRAINER} ${TINY})
  expect_usage_error("needs --train-data GLOB or --synthetic")
  run(${TRAINER} ${TINY} --synthetic --n-head 5)
  expect_usage_error("n_embd 64" "n_head 5")
  run(${TRAINER} ${TINY} --synthetic --seq-len 65)
  expect_usage_error("--seq-len 65 exceeds the block size 64")

elseif(SCENARIO STREQUAL "k_not_dividing")
  run(${TRAINER} ${TINY} --synthetic --total-batch-tokens 200)
  expect_usage_error("--total-batch-tokens 200 is not a multiple of" "= 128")

elseif(SCENARIO STREQUAL "bench")
  run(${TRAINER} ${TINY} --synthetic --bench --bench-warmup 1 --bench-windows 2)
  expect_rc(0)
  line_starting("${out}" "{\"bench\": \"accrue_train_gpt2\"" _json)
  foreach(_field "\"tokens_per_s_median\": " "\"window_ms_median\": " "\"peak_memory_bytes\": "
                 "\"mfu\": null" "\"n_layer\": 2" "\"seq_len\": 32")
    expect_contains("${_json}" "${_field}")
  endforeach()
  if(NOT _json MATCHES "\"tokens_per_s_median\": [0-9]")
    fail("tokens/s is not a number")
  endif()
  # The same windows through examples/composed_gpt2: the fused model's loss, up
  # to f32 rounding (the unit test holds them to 1e-12 in f64).
  string(REGEX REPLACE ".*\"final_loss\": ([0-9.e+-]+).*" "\\1" _fused_loss "${_json}")
  run(${TRAINER} ${TINY} --synthetic --bench --bench-warmup 1 --bench-windows 2 --composed)
  expect_rc(0)
  line_starting("${out}" "{\"bench\": \"accrue_train_gpt2\"" _json)
  expect_contains("${_json}" "\"composed\": true")
  string(REGEX REPLACE ".*\"final_loss\": ([0-9.e+-]+).*" "\\1" _composed_loss "${_json}")
  if(PYTHON)
    run(${PYTHON} -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-4 * abs(b))"
        ${_composed_loss} ${_fused_loss})
    if(NOT rc EQUAL 0)
      fail("--composed final loss ${_composed_loss}, fused ${_fused_loss}")
    endif()
  elseif(NOT _composed_loss MATCHES "^[0-9]")
    fail("--composed final loss '${_composed_loss}' is not a number")
  endif()

elseif(SCENARIO STREQUAL "make_shards")
  run(${PYTHON} ${SOURCE_DIR}/tools/make_shards.py --help)
  expect_rc(0)
  expect_contains("${out}" "--val-fraction")
  expect_contains("${out}" "--shard-tokens")
  run(${PYTHON} ${SOURCE_DIR}/tools/make_shards.py ${SOURCE_DIR}/README.md
      --output-prefix ${WORK_DIR}/small --val-fraction 0.25 --shard-tokens 1000)
  expect_rc(0)
  # Every shard it says it wrote is 1024 + 2n bytes, and together they hold the file.
  file(SIZE ${SOURCE_DIR}/README.md _readme_bytes)
  string(REGEX MATCHALL "wrote [^:]+: [0-9]+ tokens" _wrote "${out}")
  set(_sum 0)
  foreach(_line IN LISTS _wrote)
    string(REGEX REPLACE "wrote ([^:]+): ([0-9]+) tokens" "\\1" _path "${_line}")
    string(REGEX REPLACE "wrote ([^:]+): ([0-9]+) tokens" "\\2" _n "${_line}")
    file(SIZE ${_path} _size)
    math(EXPR _expected "1024 + 2 * ${_n}")
    if(NOT _size EQUAL _expected)
      fail("${_path} has ${_size} bytes, expected ${_expected}")
    endif()
    math(EXPR _sum "${_sum} + ${_n}")
  endforeach()
  if(NOT _sum EQUAL _readme_bytes)
    fail("the shards hold ${_sum} tokens, README.md has ${_readme_bytes} bytes")
  endif()
  if(NOT EXISTS ${WORK_DIR}/small_val_000000.bin OR NOT EXISTS ${WORK_DIR}/small_train_000001.bin)
    fail("expected small_val_000000.bin and small_train_000001.bin")
  endif()
  run(${PYTHON} ${SOURCE_DIR}/tools/make_shards.py ${WORK_DIR}/missing.txt
      --output-prefix ${WORK_DIR}/x)
  expect_rc(2)
  expect_contains("${err}" "missing.txt")

elseif(SCENARIO STREQUAL "train")
  make_readme_shards()
  run(${TRAINER} ${TINY} ${SHARDS} --total-batch-tokens 256 --windows 6 --lr 3e-3
      --warmup-windows 1 --val-every 3 --val-batches 2 --metrics ${WORK_DIR}/metrics.jsonl
      --layer-metrics-every 2 --noise-scale-every 3)
  expect_rc(0)
  set(_progress "${out}")
  expect_contains("${out}" "| noise scale ")
  # --metrics: one JSON object per window with the progress line's numbers,
  # validation where it ran; tools/plot_metrics.py reads it (when matplotlib is there).
  run(${PYTHON} -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r['window'] for r in rows] == [1, 2, 3, 4, 5, 6], rows
for r in rows:
    for k in ('loss', 'grad_norm', 'grad_norm_clipped', 'clip_coef', 'lr', 'loss_scale',
              'skipped', 'items', 'tokens_per_s', 'peak_bytes'):
        assert k in r, (k, r)
    assert r['grad_norm_clipped'] <= r['grad_norm'] * (1 + 1e-6), r
    assert r['items'] == 256 and r['skipped'] is False, r
assert [r['window'] for r in rows if r['val_loss'] is not None] == [3, 6], rows
# --layer-metrics-every 2 (Note [Layer monitor]): windows 2, 4, 6 carry each
# layer's gradient norm (their root-sum-square is the window's) and update ratio.
assert [r['window'] for r in rows if 'update_ratio' in r] == [2, 4, 6], rows
for r in rows:
    if 'update_ratio' not in r:
        continue
    norms = [v for k, v in r.items() if k.startswith('grad_norm/')]
    ratios = [v for k, v in r.items() if k.startswith('update_ratio/')]
    assert 'grad_norm/wte' in r and len(norms) == len(ratios) > 4, r
    assert abs(sum(v * v for v in norms) ** 0.5 - r['grad_norm']) <= 1e-5 * r['grad_norm'], r
    assert 0 < r['update_ratio'] < 1 and all(v >= 0 for v in ratios), r
    # Per parameter group (0: decayed Linear weights, 1: the rest): the
    # root-sum-square of the groups' norms is the window's too.
    groups = [v for k, v in r.items() if k.startswith('group_grad_norm/')]
    assert len(groups) == 2 and set(k for k in r if k.startswith('group_update_ratio/')) == {'group_update_ratio/0', 'group_update_ratio/1'}, r
    assert abs(sum(v * v for v in groups) ** 0.5 - r['grad_norm']) <= 1e-5 * r['grad_norm'], r
# --noise-scale-every 3: measured in windows 1 and 4, the EMA reported in
# every window and moves only where a measurement came in.
assert all('noise_scale' in r and 'noise_trace_sigma' in r for r in rows), rows
moved = [r['window'] for p, r in zip(rows, rows[1:]) if r['noise_scale'] != p['noise_scale']]
assert moved == [4], [r['noise_scale'] for r in rows]
print('metrics ok')
" ${WORK_DIR}/metrics.jsonl)
  expect_rc(0)
  expect_contains("${out}" "metrics ok")
  run(${PYTHON} ${SOURCE_DIR}/tools/plot_metrics.py ${WORK_DIR}/metrics.jsonl
      --out ${WORK_DIR}/metrics.png)
  if(rc EQUAL 0)
    expect_contains("${out}" "6 windows -> ${WORK_DIR}/metrics.png")
    if(NOT EXISTS ${WORK_DIR}/metrics.png)
      fail("plot_metrics.py wrote no PNG")
    endif()
  else()
    expect_rc(2)
    expect_contains("${err}" "needs matplotlib")
  endif()
  set(out "${_progress}")
  window_losses("${out}" _losses)
  list(LENGTH _losses _n)
  if(NOT _n EQUAL 6)
    fail("expected 6 progress lines, got ${_n}")
  endif()
  list(GET _losses 0 _first)
  list(GET _losses -1 _last)
  if(NOT _last LESS _first)
    fail("the loss did not fall: ${_first} -> ${_last}")
  endif()
  expect_contains("${out}" "K=2")
  expect_contains("${out}" "MFU n/a")
  # Note [Scale calibration]: f16 from a scale of 2^24 skips every window (a
  # run that never stepped fails, Note [Honest exit codes]); with
  # --calibrate-scale the first window sets the scale and none is skipped.
  run(${TRAINER} ${TINY} --synthetic --total-batch-tokens 256 --windows 4 --dtype f16
      --init-scale 16777216)
  expect_rc(1)
  expect_contains("${err}" "every window was skipped (windows 1 to 4)")
  line_starting("${out}" "window 4/4" _guessed)
  expect_contains("${_guessed}" "skipped 4")
  run(${TRAINER} ${TINY} --synthetic --total-batch-tokens 256 --windows 4 --dtype f16
      --init-scale 16777216 --calibrate-scale)
  expect_rc(0)
  line_starting("${out}" "window 4/4" _calibrated)
  expect_contains("${_calibrated}" "skipped 0")
  set(out "${_progress}")
  string(REGEX MATCHALL "val loss [0-9]+\\.[0-9]+" _val "${out}")
  list(LENGTH _val _n_val)
  if(NOT _n_val EQUAL 2)
    fail("expected validation at windows 3 and 6, got ${_n_val} lines")
  endif()

elseif(SCENARIO STREQUAL "resume")
  make_readme_shards()
  set(_run ${TRAINER} ${TINY} ${SHARDS} --total-batch-tokens 256 --windows 4 --lr 3e-3
      --warmup-windows 1 --dropout 0.1 --val-batches 2 --seed 11)
  run(${_run})
  expect_rc(0)
  line_starting("${out}" "final: " _uninterrupted)
  line_starting("${out}" "window 4/4 \\| val loss" _uninterrupted_val)

  run(${_run} --checkpoint ${WORK_DIR}/ckpt.safetensors --checkpoint-every 2 --stop-after 2)
  expect_rc(0)
  expect_contains("${out}" "checkpoint: ${WORK_DIR}/ckpt.safetensors (window 2; ")
  if(NOT EXISTS ${WORK_DIR}/ckpt.safetensors)
    fail("no checkpoint was written")
  endif()

  run(${_run} --resume ${WORK_DIR}/ckpt.safetensors)
  expect_rc(0)
  expect_contains("${out}" "at window 2")
  window_losses("${out}" _resumed_losses)
  list(LENGTH _resumed_losses _n)
  if(NOT _n EQUAL 2)
    fail("the resumed run should train windows 3 and 4, got ${_n} progress lines")
  endif()
  line_starting("${out}" "final: " _resumed)
  line_starting("${out}" "window 4/4 \\| val loss" _resumed_val)
  if(NOT _resumed STREQUAL _uninterrupted)
    fail("resumed '${_resumed}' differs from uninterrupted '${_uninterrupted}'")
  endif()
  if(NOT _resumed_val STREQUAL _uninterrupted_val)
    fail("resumed '${_resumed_val}' differs from uninterrupted '${_uninterrupted_val}'")
  endif()

  # A checkpoint of another model size or compute dtype is refused, naming the field.
  run(${_run} --n-layer 3 --resume ${WORK_DIR}/ckpt.safetensors)
  expect_rc(1)
  expect_contains("${err}" "config.n_layer = 2 but this run has 3")
  run(${_run} --dtype bf16 --resume ${WORK_DIR}/ckpt.safetensors)
  expect_rc(1)
  expect_contains("${err}" "dtype = f32 but this run has bf16")

  # Note [Mid-window checkpoints]: K = 4; preempted after micro-step 1 and 3
  # (K-1) of window 2, the resumed run finishes that window and ends with the
  # uninterrupted run's loss, to the last digit (dropout on).
  set(_run4 ${TRAINER} ${TINY} ${SHARDS} --total-batch-tokens 512 --windows 3 --lr 3e-3
      --dropout 0.1 --seed 11 --val-batches 2)
  run(${_run4})
  expect_rc(0)
  line_starting("${out}" "final: " _uninterrupted4)
  foreach(_m 1 3)
    run(${_run4} --checkpoint ${WORK_DIR}/mid.safetensors --stop-after 1 --stop-micro-steps ${_m})
    expect_rc(0)
    expect_contains("${out}" "checkpoint: ${WORK_DIR}/mid.safetensors (window 2, micro-step ${_m}; ")
    run(${_run4} --resume ${WORK_DIR}/mid.safetensors)
    expect_rc(0)
    expect_contains("${out}" "micro-step ${_m} of window 2")
    line_starting("${out}" "final: " _resumed4)
    if(NOT _resumed4 STREQUAL _uninterrupted4)
      fail("resumed from micro-step ${_m}: '${_resumed4}' differs from '${_uninterrupted4}'")
    endif()
  endforeach()
  run(${_run4} --checkpoint ${WORK_DIR}/mid.safetensors --stop-after 1 --stop-micro-steps 4)
  expect_usage_error("--stop-micro-steps 4 is not inside a window of K = 4")
  run(${_run4} --stop-micro-steps 2)
  expect_usage_error("--stop-micro-steps needs --stop-after N and --checkpoint PATH")

elseif(SCENARIO STREQUAL "gpu_bench" OR SCENARIO STREQUAL "gpu_resume")
  set(TINY_GPU --model tiny --micro-batch 4 --seq-len 32 --dtype bf16)
  run(${TRAINER} ${TINY_GPU} --synthetic --bench --bench-warmup 1 --bench-windows 3)
  expect_rc(0)
  if(out MATCHES "trainer on cpu")
    message("SKIP: needs a CUDA GPU")
    return()
  endif()
  line_starting("${out}" "{\"bench\": \"accrue_train_gpt2\"" _json)
  if(NOT _json MATCHES "\"device\": \"[^\"]+\"" OR _json MATCHES "\"device\": \"CPU\"")
    fail("the JSON line names no GPU")
  endif()
  if(NOT _json MATCHES "\"tokens_per_s_median\": [0-9]" OR
     NOT _json MATCHES "\"device_memory_in_use_bytes\": [0-9]" OR
     NOT _json MATCHES "\"dtype\": \"bf16\"")
    fail("the JSON line lacks tokens/s, device memory or the dtype")
  endif()
  if(SCENARIO STREQUAL "gpu_resume")
    make_readme_shards()
    set(_run ${TRAINER} ${TINY_GPU} ${SHARDS} --total-batch-tokens 256 --windows 6 --lr 3e-3
        --warmup-windows 1 --dropout 0.1 --val-batches 2 --seed 5)
    run(${_run})
    expect_rc(0)
    window_losses("${out}" _losses)
    list(GET _losses 0 _first)
    list(GET _losses -1 _last)
    if(NOT _last LESS _first)
      fail("the loss did not fall: ${_first} -> ${_last}")
    endif()
    line_starting("${out}" "final: " _uninterrupted)
    run(${_run} --checkpoint ${WORK_DIR}/ckpt.safetensors --stop-after 3)
    expect_rc(0)
    run(${_run} --resume ${WORK_DIR}/ckpt.safetensors)
    expect_rc(0)
    line_starting("${out}" "final: " _resumed)
    if(NOT _resumed STREQUAL _uninterrupted)
      fail("resumed '${_resumed}' differs from uninterrupted '${_uninterrupted}'")
    endif()
    # Note [GEMM autotuning]: the second run reads the first run's choices, so
    # it computes the same bits and records nothing new.
    file(REMOVE ${WORK_DIR}/gemm_tuning.txt)
    run(${_run} --gemm-tuning ${WORK_DIR}/gemm_tuning.txt)
    expect_rc(0)
    line_starting("${out}" "final: " _tuned)
    file(STRINGS ${WORK_DIR}/gemm_tuning.txt _choices)
    list(LENGTH _choices _recorded)
    if(_recorded LESS 1)
      fail("the tuning file holds no choice")
    endif()
    run(${_run} --gemm-tuning ${WORK_DIR}/gemm_tuning.txt)
    expect_rc(0)
    line_starting("${out}" "final: " _retuned)
    file(STRINGS ${WORK_DIR}/gemm_tuning.txt _choices_after)
    list(LENGTH _choices_after _recorded_after)
    if(NOT _retuned STREQUAL _tuned OR NOT _recorded_after EQUAL _recorded)
      fail("with the same tuning file: '${_retuned}' vs '${_tuned}', ${_recorded_after} vs "
           "${_recorded} recorded choices")
    endif()
    # Note [Graphed window]: without dropout, replayed micro-steps and closes
    # give the eager run's final loss to every digit, one micro-step in flight
    # (the default) or two (Note [Concurrent micro-batches]; K = 2 here).
    set(_plain ${TRAINER} ${TINY_GPU} ${SHARDS} --total-batch-tokens 256 --windows 6 --lr 3e-3
        --warmup-windows 1 --val-batches 2 --seed 5)
    run(${_plain})
    expect_rc(0)
    line_starting("${out}" "final: " _eager)
    run(${_plain} --cuda-graphs)
    expect_rc(0)
    line_starting("${out}" "final: " _graphed)
    if(NOT _graphed STREQUAL _eager)
      fail("with --cuda-graphs '${_graphed}', eager '${_eager}'")
    endif()
    if(NOT out MATCHES "; 1 micro-step\\(s\\) in flight")
      fail("--cuda-graphs did not say one micro-step in flight: ${out}")
    endif()
    run(${_plain} --cuda-graphs --concurrent-micro-batches 2)
    expect_rc(0)
    line_starting("${out}" "final: " _two)
    if(NOT _two STREQUAL _eager OR NOT out MATCHES "; 2 micro-step\\(s\\) in flight")
      fail("with --concurrent-micro-batches 2 '${_two}', eager '${_eager}': ${out}")
    endif()
  endif()

else()
  message(FATAL_ERROR "unknown SCENARIO '${SCENARIO}'")
endif()
