// The trainers' validation loss: the mean next-token loss over a fixed set of
// micro-batches (the same ones every time, so the numbers compare), summed
// over every rank.
#pragma once

#include <cstdint>
#include <functional>

#include "accrue.h"
#include "accrue/dist/reducer.h"  // dist::Communicator

namespace accrue::examples {

// `next_loss` computes the loss (sum, count) of the next validation
// micro-batch; it is called `batches` times under a NoGradGuard, after the
// caller has rewound its data. With `comm` the sums and counts are all-reduced
// (Note [Collective ordering]). Reads back to the host: call between windows.
double validation_loss(const std::function<Loss()>& next_loss, int64_t batches,
                       dist::Communicator* comm, Device device);

}  // namespace accrue::examples
