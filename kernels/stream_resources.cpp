#include "accrue/kernels/stream_resources.h"

#include "accrue/core/error.h"
#include "accrue/kernels/backend.h"

namespace accrue::kernels {

void prepare_stream(Device device, StreamHandle stream) {
  if (!device.is_cuda()) return;
  ACCRUE_CHECK(stream != nullptr, "prepare_stream: a null stream on ", device.str());
  cuda::prepare_stream(device.index, stream);
}

}  // namespace accrue::kernels
