// The CUDA backend of a build without CUDA (ACCRUE_CUDA=OFF or no nvcc),
// generated from the backend function lists (Note [Backend function lists]):
// every ACCRUE_BACKEND_FN and ACCRUE_CUDA_FN line becomes a function that
// throws, so dispatch links with no #ifdef. No CUDA tensor can exist in such
// a build (the allocator refuses one), so reaching one of these means a bug,
// reported rather than crashing.
#include "accrue/kernels/attention_backend.h"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/batch_norm_backend.h"
#include "accrue/kernels/classifier_backend.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/dropout_backend.h"
#include "accrue/kernels/fp8_backend.h"
#include "accrue/kernels/fused_backend.h"
#include "accrue/kernels/index_checks_backend.h"
#include "accrue/kernels/indexing_backend.h"
#include "accrue/kernels/window_close_backend.h"

// The stubs name their parameters (the lines are declarations first) and use none.
#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace accrue::kernels::cuda {

namespace {

[[noreturn]] void unavailable(const char* name) {
  ACCRUE_FAIL(name, ": accrue was built without CUDA");
}

}  // namespace

#undef ACCRUE_BACKEND_FN
#undef ACCRUE_CPU_FN
#undef ACCRUE_CUDA_FN
#define ACCRUE_BACKEND_FN(ret, name, params) \
  ret name params {                          \
    unavailable(#name);                      \
  }
#define ACCRUE_CUDA_FN ACCRUE_BACKEND_FN
#define ACCRUE_CPU_FN(ret, name, params)

#include "accrue/kernels/attention_functions.inc"
#include "accrue/kernels/backend_functions.inc"
#include "accrue/kernels/batch_norm_functions.inc"
#include "accrue/kernels/classifier_functions.inc"
#include "accrue/kernels/conv_functions.inc"
#include "accrue/kernels/dropout_functions.inc"
#include "accrue/kernels/fp8_functions.inc"
#include "accrue/kernels/fused_functions.inc"
#include "accrue/kernels/index_checks_functions.inc"
#include "accrue/kernels/indexing_functions.inc"
#include "accrue/kernels/window_close_functions.inc"

}  // namespace accrue::kernels::cuda
