// The training run of the nn::Llama goldens (make_llama_hf_golden.py,
// fixtures/llama_hf/<case>/), shared by the CPU tests (llama_hf_golden_test.cpp)
// and the CUDA ones (gpu_llama_hf_golden_test.cpp): the case's model loaded
// from its hf/ directory through Llama::from_hf, trained with the Window on the
// fixture's right-padded variable-length micro-batches (item-count
// normalization, clipping, AdamW with decay on the 2-D weights only).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "accrue/core/device.h"
#include "accrue/core/dtype.h"
#include "accrue/core/tensor.h"

namespace accrue::golden {

// fixtures/llama_hf/<name>.
std::string llama_case_dir(const std::string& name);

struct LlamaRunOptions {
  int64_t micro_steps = 4;  // 4: the fixture's split; 1: a window's 12 sequences at once
  bool checkpointing = false;
  Device device = Device::cpu();
  DType master_dtype = DType::f64;   // the model's parameters and the store's master
  DType compute_dtype = DType::f64;  // the forward's weights (bf16: a compute copy)
  // Windows to train; past the fixture's, its windows again from the first
  // (window w reads the fixture's window w % windows). 0: the fixture's count.
  int64_t windows = 0;
  // Note [FP8 linear]: the decoder layers' projections in FP8, their FP8
  // weights kept by the store (cast once per window) or cast at every call.
  bool fp8 = false;
  bool keep_fp8_copies = true;
};

struct LlamaRun {
  std::vector<double> loss, grad_norm;        // per window
  std::map<std::string, Tensor> final_state;  // the model's parameters after the last window
};

LlamaRun train_llama_case(const std::string& name, const LlamaRunOptions& options);

// B right-padded sequences of T tokens from a fixture's `tokens` (rows of
// T + 1) and `lengths`, starting at sequence `first`: the inputs (0 past a
// sequence's length), the next-token targets (-100 there) and the lengths.
struct PaddedBatch {
  std::vector<int64_t> inputs, targets, lengths;
};
PaddedBatch padded_batch(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths,
                         int64_t first, int64_t B, int64_t T);

// max |a - b| / max |b| over one tensor (NaN anywhere: infinity).
double max_error(const Tensor& a, const Tensor& b);

}  // namespace accrue::golden
