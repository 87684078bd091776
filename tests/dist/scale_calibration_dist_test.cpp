// Note [Scale calibration] under data parallelism, on the host world
// (tests/dist/host_world.h): each rank's first window sees its own largest
// f16 gradient, and the scale every rank takes is the one the world's largest
// gives (GradientSync::all_reduce_max), so the ranks' seeds agree. Rank r's loss
// is k_r * sum(p * x): the gradient into p * x is k_r times the seed, so the
// ranks' amax are k_0 = 2 and k_1 = 40 at the calibration scale 1.
#include <cmath>
#include <memory>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/dist/reducer.h"
#include "accrue/optim/window.h"
#include "tests/dist/host_world.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

using host::HostCommunicator;
using host::HostWorld;

constexpr double kFactor[] = {2.0, 40.0};

// The calibrated scale after one window of rank `rank` (comm null: rank 0 alone).
double calibrated_scale(int rank, Communicator* comm) {
  Tensor p = requires_grad_(from_vector<double>({0.5, -1.0, 0.25, 2.0}, {4}, DType::f32));
  optim::ParamStore arena({{"p", p}}, optim::ParamStoreOptions().compute_dtype(DType::f16));
  std::unique_ptr<Reducer> reducer;
  if (comm) reducer = std::make_unique<Reducer>(arena, *comm);
  optim::Optimizer opt(optim::AdamWOptions(1e-3));
  optim::Window window(
      arena, opt,
      optim::WindowOptions().micro_steps(1).scaler(optim::LossScalerOptions::dynamic().calibrate()),
      reducer.get());
  const Tensor x = from_vector<double>({1.0, 2.0, 3.0, 4.0}, {4}, DType::f16);
  // p now reads as its f16 compute copy (Note [Grad arena]).
  window.backward({sum(mul(p, x)) * kFactor[rank], full({}, 1.0, DType::i64)});
  window.close();
  EXPECT_FALSE(window.report().skipped);
  return window.report().loss_scale;
}

TEST(HostWorld, the_calibrated_scale_is_the_worlds_and_every_rank_takes_it) {
  // 2^floor(log2(65504 / (amax * 8))): rank 0 alone (amax 2) 2048; the world (amax 40) 128.
  EXPECT_EQ(calibrated_scale(0, nullptr), 2048.0);
  HostWorld world(2);
  std::vector<double> scales(2);
  host::on_ranks(2, [&](int r) {
    HostCommunicator comm(world, r);
    scales[static_cast<size_t>(r)] = calibrated_scale(r, &comm);
  });
  EXPECT_EQ(scales[0], 128.0);
  EXPECT_EQ(scales[1], 128.0);
}

}  // namespace
}  // namespace accrue::dist
