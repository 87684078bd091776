// Checkpoint files of the trainers: written whole or not at all, and their
// size and time reported.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "accrue.h"

namespace accrue::examples {

// Refuses (UsageError naming `option`) an output path the run could not
// write at its end: a directory, a FIFO or other special file, a file without
// write permission, or a missing or unwritable folder. Nothing is created, so
// a run refused later leaves no empty file behind.
void probe_output_file(const std::string& option, const std::string& path);

// Saves a safetensors file to PATH.tmp and renames it to PATH, so a crash
// mid-write leaves the previous checkpoint as it was.
void save_checkpoint_file(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata = {});

// "1424.6 MiB in 2.61 s": a file's size and the seconds since `since`.
std::string file_report(const std::string& path, std::chrono::steady_clock::time_point since);

}  // namespace accrue::examples
