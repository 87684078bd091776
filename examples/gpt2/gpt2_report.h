// What accrue_train_gpt2 prints: the progress line of each window, its
// --metrics row, MFU, and --bench's JSON line.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accrue.h"
#include "accrue/dist/reducer.h"
#include "accrue/nn/gpt2.h"
#include "examples/common/bench_line.h"
#include "examples/common/layer_metrics.h"  // add_layer_extras
#include "examples/common/timing.h"
#include "examples/common/train_model.h"  // flops_per_token, Note [GPT-2 FLOPs per token]
#include "examples/common/window_reporter.h"
#include "examples/gpt2/gpt2_options.h"

namespace accrue::examples {

// --bench's JSON line (bench/gpt2_bench.py parses it).
struct BenchResult {
  std::vector<double> window_ms;
  double final_loss = 0;
  bool cuda_graphs = false;
  std::optional<dist::ReducerTiming> reducer;  // under data parallelism
  bool copy_engine_all_reduce = false;
};
void print_bench_line(const Gpt2Options& o, const nn::GPT2Config& config, const BatchPlan& plan,
                      DType compute, Device device, int world_size, const BenchResult& result);

}  // namespace accrue::examples
