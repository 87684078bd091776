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

#include "autograd/checkpoint.h"
#include "autograd/conv_ops.h"
#include "autograd/engine.h"
#include "autograd/grad_arena.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/transformer_ops.h"
#include "autograd/variable.h"
#include "core/allocator.h"
#include "core/cuda_graph.h"
#include "core/cuda_runtime.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/random.h"
#include "core/tensor.h"
#include "core/tensor_io.h"
#include "data/token_shards.h"
#include "kernels/ops.h"
#include "nn/gpt2.h"
#include "nn/gpt2_hf.h"
#include "nn/module.h"
#include "nn/transformer.h"
#include "optim/graphed_window.h"
#include "optim/layer_monitor.h"
#include "optim/loss_scaler.h"
#include "optim/metrics_log.h"
#include "optim/optimizer.h"
#include "optim/param_store.h"
#include "optim/planner.h"
#include "optim/run_window.h"
#include "optim/sgd.h"
#include "optim/verify.h"
#include "optim/window.h"
