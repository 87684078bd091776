// CPU reference of dropout: the mask of kernels/dropout_backend.h, element by
// element (Note [Dropout mask from the counter]).
#include "accrue/kernels/cpu/cpu_util.h"
#include "accrue/kernels/dropout_backend.h"

namespace accrue::kernels::cpu {

void dropout(const Tensor& in, const DropoutMask& mask, const Tensor& out) {
  visit_float(in.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* pi = ptr<T>(in);
    T* po = ptr<T>(out);
    const M scale = static_cast<M>(mask.scale);
    const int64_t n = in.numel();
    for (int64_t j = 0; 2 * j < n; ++j) {
      bool keep[2];
      dropout_keep_pair(mask.seed, mask.offset, j, mask.threshold, &keep[0], &keep[1]);
      for (int64_t i = 2 * j; i < 2 * j + 2 && i < n; ++i)
        po[i] = keep[i - 2 * j] ? store<T>(load(pi[i]) * scale) : store<T>(M(0));
    }
  });
}

}  // namespace accrue::kernels::cpu
