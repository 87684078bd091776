// The per-shape choice of a convolution's path (Note [Per-shape convolution
// paths] in kernels/conv_per_shape.cpp), timed and recorded as GEMM
// algorithms are (Note [Tuning file]).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <optional>
#include <sstream>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/device_scope.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/cuda/tuning.h"
#include "accrue/kernels/ops.h"

#ifdef ACCRUE_WITH_CUDNN_FRONTEND
#include <cudnn.h>
#endif

namespace accrue::kernels::cuda {

namespace {

// The libraries whose kernels the paths run: a choice made under other
// versions is not read back.
std::string library_versions() {
  std::ostringstream s;
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  s << "cudnn" << cudnnGetVersion() << ",";
#endif
  s << "cublasLt" << cublasLtGetVersion() << ",";
  return s.str();
}

}  // namespace

int choose_conv_path(const std::string& key, int device, int count,
                     const std::function<bool(int)>& run) {
  ::accrue::cuda::DeviceScope scope(device);
  const auto stream = static_cast<cudaStream_t>(current_stream(device));
  const std::string line = key + library_versions() + tuning_gpu_name(device) + ",";
  const std::optional<int> choice =
      tuned_choice(gemm_tuning_file(), line, [&]() -> std::optional<int> {
        if (stream_capturing(stream)) return std::nullopt;
        return fastest_index(time_candidates(stream, count, run));
      });
  return choice && *choice >= 0 && *choice < count ? *choice : -1;
}

}  // namespace accrue::kernels::cuda
