// What the timed choices share (GEMM algorithms, Note [GEMM autotuning]; the
// convolutions' paths, Note [Per-shape convolution paths]): timing candidates
// by CUDA events, and the tuning file that makes a choice repeatable.
//
// Note [Tuning file]
// ~~~~~~~~~~~~~~~~~~
// A choice is appended to the file as one line: the problem's key, the
// deciding library's version and the GPU's name, then the choice. A later
// process with the same file reads the line instead of timing, so it runs
// the same candidate and computes the same bits; a line written under another
// library version or GPU does not match and is ignored. With no file, a
// choice is kept in memory for the process. Timing waits for the GPU, so it
// happens on a problem's first call only, never inside a CUDA graph capture:
// there the caller's default runs, unrecorded.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace accrue::kernels::cuda {

// Each candidate's best time in ms over the rounds (one untimed run, then the
// timed repeats, between two CUDA events on `stream`), the candidates taken in
// turn each round so that one slow moment (a clock step, another process)
// cannot decide alone. Infinity where run(i) declined (returned false).
std::vector<float> time_candidates(cudaStream_t stream, int count,
                                   const std::function<bool(int)>& run);

// The first fastest of `ms` (ties keep the candidates' order).
int fastest_index(const std::vector<float>& ms);

// The GPU's name as a tuning line has it (spaces as underscores).
std::string tuning_gpu_name(int device);

// Whether `stream` is recording a CUDA graph.
bool stream_capturing(cudaStream_t stream);

// The choice `file` records for `line` (the key, versions and GPU name,
// ending in a comma); else choose()'s answer, appended to the file (kept in
// memory when `file` is empty). nullopt, recording nothing, when choose()
// gives nullopt (inside a capture). One choice is made at a time (its timing
// may make another, for a different line), so a problem is timed once.
std::optional<int> tuned_choice(const std::string& file, const std::string& line,
                                const std::function<std::optional<int>()>& choose);

// How many choices tuned_choice knows for `file` ("": those kept in memory).
size_t tuned_choice_count(const std::string& file);

}  // namespace accrue::kernels::cuda
