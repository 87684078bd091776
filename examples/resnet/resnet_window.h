// What the two ResNet binaries (train_resnet.cpp, bench_resnet.cpp) build
// the same way: the Window over a ResNet, with every BatchNorm listening to it.
#pragma once

#include <vector>

#include "accrue.h"
#include "accrue/nn/resnet.h"

namespace accrue::examples {

// Every BatchNorm of `model`, each added as a listener of `window` so that its
// running statistics move once per window (Note [Window statistics]).
inline std::vector<nn::BatchNorm*> listen_batch_norms(nn::ResNet& model, optim::Window& window) {
  std::vector<nn::BatchNorm*> norms;
  for (nn::Module* m : model.modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(m)) {
      norms.push_back(bn);
      window.add_listener(bn);
    }
  return norms;
}

// One window: K micro-batches from `micro_batch(m)`, their cross-entropy
// accumulated, then the close.
template <class MicroBatch>
void run_window(nn::ResNet& model, optim::Window& window, int64_t k, MicroBatch&& micro_batch) {
  for (int64_t m = 0; m < k; ++m) {
    const auto [x, y] = micro_batch(m);
    window.backward(cross_entropy(model.forward(x), y));
  }
  window.close();
}

}  // namespace accrue::examples
