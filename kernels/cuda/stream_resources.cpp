// kernels::prepare_stream's CUDA side (kernels/stream_resources.h): each
// library's per-stream state made ahead of a capture.
#include "accrue/core/device_scope.h"
#include "accrue/kernels/attention_backend.h"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/cuda/cublaslt_state.h"

namespace accrue::kernels::cuda {

void prepare_stream(int device, StreamHandle stream) {
  const ::accrue::cuda::DeviceScope scope(device);
  cublaslt::LtState::instance().prepare(device, stream);
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  cudnn::prepare_attention_stream(device, stream);
  cudnn::prepare_conv_stream(device, stream);
#endif
}

}  // namespace accrue::kernels::cuda
