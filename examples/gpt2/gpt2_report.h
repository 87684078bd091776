// What accrue_train_gpt2 prints: the progress line of each window, its
// --metrics row, MFU, and --bench's JSON line.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accrue.h"
#include "accrue/nn/gpt2.h"
#include "examples/common/bench_line.h"
#include "examples/common/layer_metrics.h"  // add_layer_extras
#include "examples/common/timing.h"
#include "examples/common/train_model.h"  // flops_per_token, Note [GPT-2 FLOPs per token]
#include "examples/gpt2/gpt2_options.h"

namespace accrue::examples {

// The progress line of each window, and its --metrics row.
class WindowReporter {
 public:
  WindowReporter(int64_t windows, int64_t window_tokens, DType compute, Device device,
                 double flops_token, double peak_flops, int world_size)
      : windows_(windows),
        window_tokens_(window_tokens),
        compute_(compute),
        device_(device),
        flops_token_(flops_token),
        peak_(peak_flops),
        world_size_(world_size) {}

  // Model FLOPs utilization at this rate, NaN when the peak is unknown.
  double mfu(double tokens_per_s) const;

  // Prints window w's progress line (rate since the previous call); an ALERT
  // when the loss or gradient norm is 3 standard deviations off the last 128
  // windows.
  void print(int64_t w, const optim::WindowReport& r, double lr);

  // The --metrics extras of the window print() showed.
  std::vector<std::pair<std::string, double>> extras(double val_loss) const;

 private:
  int64_t windows_, window_tokens_;
  DType compute_;
  Device device_;
  double flops_token_, peak_;
  int world_size_;
  Stopwatch clock_;
  optim::ZScore loss_z_score_, norm_z_score_;
  double lr_ = 0, tokens_per_s_ = 0, loss_z_ = 0, norm_z_ = 0;
};

// --bench's JSON line (bench/gpt2_bench.py parses it).
struct BenchResult {
  std::vector<double> window_ms;
  double final_loss = 0;
  bool cuda_graphs = false;
};
void print_bench_line(const Gpt2Options& o, const nn::GPT2Config& config, const BatchPlan& plan,
                      DType compute, Device device, int world_size, const BenchResult& result);

}  // namespace accrue::examples
