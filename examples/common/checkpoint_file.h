// Checkpoint files of the trainers: written whole or not at all, and their
// size and time reported.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// The tensors of a training checkpoint: "model.<slot>" each parameter's
// master, "optim.<key>" the window's state but its master (the same tensors).
// Inline: the rest of this file depends on core alone (the fuzzers link it
// without optim).
inline std::map<std::string, Tensor> training_tensors(const optim::ParamStore& store,
                                                      const optim::Window& window) {
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < store.size(); ++i)
    tensors["model." + store.slots()[i].name] = store.master_view(i);
  for (const auto& [key, t] : window.state_dict())
    if (key != "master") tensors["optim." + key] = t;
  return tensors;
}

// "1424.6 MiB in 2.61 s": a file's size and the seconds since `since`.
std::string file_report(const std::string& path, std::chrono::steady_clock::time_point since);

// An integer of a checkpoint's metadata, refused with the file's name when
// absent or not an integer.
int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key,
                 const std::string& path);

// A path as a run record holds it: absolute, so a run resumed from another
// folder with the same files compares equal (empty stays empty).
std::string absolute_path(const std::string& path);

}  // namespace accrue::examples

namespace accrue::examples {

// Note [Run record]
// ~~~~~~~~~~~~~~~~~
// A trainer's checkpoint records every setting that defines its trajectory
// (model sizes, K, micro-batch, sequence length, world size, seeds, dropout,
// data source, optimizer and loss-scaler options, compute dtype), one
// metadata entry "accrue.run.<field>" each (apart from the tensor checksums'
// "accrue.crc32c.*"). On resume the trainer builds the same record from its
// own command line before it builds the model and compares field by field:
// every field that differs is refused in one accrue::Error (exit 1: the
// command line is well-formed; it disagrees with a file, as a bad shard
// would), each named as "<field> = <checkpoint's> but this run has <this
// run's>". A resumed run with another K, micro-batch or seed would otherwise
// be a different run that looks like the old one continued.
// Some fields carry a change word: with --allow-changed WORD they may differ,
// because they only act from the next window close on (the learning-rate
// schedule, the number of windows or epochs, the validation cadence, the
// metrics file) and so are safe at a window boundary; the run prints each
// such change. K is never among them: a checkpoint inside a window holds the
// sum of its first micro-steps' gradients, which belong to a window of the
// old K. Numbers are written as the shortest text that reads back as the same
// double, so a value compares equal exactly when it is the same double. A checkpoint written before
// the record has no accrue.run.* entries: the fields found under their older keys (the trainer
// names them) are compared, and the run prints which it could not check.
class RunRecord {
 public:
  // `change`: the --allow-changed word that admits a new value; empty: none does.
  RunRecord& text(const std::string& field, const std::string& value,
                  const std::string& change = {}, const std::string& legacy_key = {});
  RunRecord& integer(const std::string& field, int64_t value, const std::string& change = {},
                     const std::string& legacy_key = {});
  RunRecord& number(const std::string& field, double value, const std::string& change = {});

  // Adds "accrue.run.<field>" = value for every field.
  void write(std::map<std::string, std::string>* metadata) const;

  // Compares with a checkpoint's metadata (Note [Run record]): throws an Error
  // naming every differing field whose change word is not in `allowed` (with
  // `note` appended, when not empty); returns the lines to print: the allowed
  // changes, and the fields an older checkpoint does not record.
  std::vector<std::string> compare(const std::string& path,
                                   const std::map<std::string, std::string>& metadata,
                                   const std::vector<std::string>& allowed,
                                   const std::string& note = {}) const;

  // The value this run records for `field` ("" when it has none).
  std::string value(const std::string& field) const;

 private:
  struct Field {
    std::string name, value, change, legacy_key;
  };
  std::vector<Field> fields_;
};

// --allow-changed's comma-separated words, each one of `words` (a UsageError
// naming `option` and the word otherwise).
std::vector<std::string> parse_change_words(const std::string& option, const std::string& list,
                                            const std::vector<std::string>& words);

// Note [Metrics after resume]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A run killed after window 7 wrote its metrics row for window 7 but its last
// checkpoint may be of window 5; the resumed run computes windows 6 and 7
// again and writes their rows again. So before a resumed run appends to its
// --metrics file, the file is cut after the last row of a window at or before
// the checkpoint's (rows are in window order: every run appends after such a
// cut). A row cut short by the kill, or one that does not start with
// {"window": N, ends the kept part too. The file is shortened in place
// (resize_file), so a crash during the cut leaves either the old or the cut
// file, never a rewritten half.

// Cuts the metrics file at `path` after its rows of windows <= `windows`;
// returns the number of rows removed (0 when the file does not exist).
int64_t truncate_metrics_log(const std::string& path, int64_t windows);

}  // namespace accrue::examples
