// accrue: tensors, reverse-mode autograd and gradient accumulation on CPU and CUDA.
//
// The umbrella header. A training step reads:
//
//   accrue::nn::MLP model({64, 256, 10}, {device});
//   accrue::optim::PlainSGD opt(model.parameters(), /*lr=*/0.1);
//   accrue::Loss loss = accrue::cross_entropy(model.forward(x), y);
//   accrue::backward(loss.sum / batch_size);
//   opt.step();
#pragma once

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/checkpoint.h"
#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/fp8_ops.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/core/cuda_graph.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/device.h"
#include "accrue/core/dtype.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor.h"
#include "accrue/core/tensor_io.h"
#include "accrue/data/document_batches.h"
#include "accrue/data/token_shards.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/gpt2.h"
#include "accrue/nn/gpt2_hf.h"
#include "accrue/nn/hf_checkpoint.h"
#include "accrue/nn/llama.h"
#include "accrue/nn/llama_config.h"
#include "accrue/nn/llama_generate.h"
#include "accrue/nn/llama_hf.h"
#include "accrue/nn/module.h"
#include "accrue/nn/transformer.h"
#include "accrue/optim/graphed_window.h"
#include "accrue/optim/layer_monitor.h"
#include "accrue/optim/loss_scaler.h"
#include "accrue/optim/metrics_log.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/planner.h"
#include "accrue/optim/run_window.h"
#include "accrue/optim/sgd.h"
#include "accrue/optim/verify.h"
#include "accrue/optim/window.h"
