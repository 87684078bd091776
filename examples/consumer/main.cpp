// The smallest program built against the installed accrue package: it makes
// two tensors, multiplies and adds them through kernels/ops.h, and checks the
// result exactly. Exits 1 on a wrong result so that a packaging test fails.
//
// Integer-valued inputs keep every product and sum exact in f32, so the check
// is an equality, not a tolerance.
#include <accrue.h>
#include <accrue/core/tensor.h>  // Note [Include paths]: a header by its own path works too

#include <cstdio>
#include <exception>
#include <vector>

namespace {

// c = a @ b + a[:, :2] for a [2,3] and b [3,2], computed on `device`.
std::vector<float> compute(accrue::Device device) {
  using namespace accrue;
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to(device);
  Tensor b = from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2}).to(device);
  Tensor product = kernels::matmul(a, b);
  Tensor c = kernels::binary(kernels::BinaryOp::Add, product, a.narrow(1, 0, 2));
  return c.to_vector<float>();
}

bool check(const char* where, const std::vector<float>& got) {
  // [[1,2,3],[4,5,6]] @ [[7,8],[9,10],[11,12]] = [[58,64],[139,154]], plus [[1,2],[4,5]].
  const std::vector<float> expected = {59, 66, 143, 159};
  std::printf("%s: [[%g, %g], [%g, %g]]\n", where, got.at(0), got.at(1), got.at(2), got.at(3));
  if (got != expected) {
    std::printf("%s: WRONG, expected [[59, 66], [143, 159]]\n", where);
    return false;
  }
  return true;
}

}  // namespace

int main() {
  try {
    bool ok = check("cpu", compute(accrue::Device::cpu()));
    if (accrue::cuda_available()) {
      ok = check("cuda:0", compute(accrue::Device::cuda(0))) && ok;
    } else {
      std::printf("cuda: skipped (%s)\n", accrue::cuda_unavailable_reason());
    }
    std::printf("%s\n", ok ? "accrue consumer: OK" : "accrue consumer: FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("accrue consumer: error: %s\n", e.what());
    return 1;
  }
}
