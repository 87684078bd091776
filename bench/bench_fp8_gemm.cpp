// The FP8 GEMMs of a GPT-2 124M Linear beside each other: per-tensor
// scales (kernels::fp8_matmul, Note [FP8 GEMM]) and per-tile scales
// (kernels::fp8_block_matmul, Note [FP8 block GEMM]), for the three GEMMs of
// a layer as fp8_linear issues them, at M = 8192 and 32768 tokens:
//   fwd    y [M, out] = x [M, in] W^T        bf16 out; block: x 1 x 128, W 128 x 128
//   dgrad  dx [M, in] = dy [M, out] W        bf16 out; block: dy 1 x 128, W^T 128 x 128
//   wgrad  dW [out, in] += dy^T x            f32 out, beta 1; block: both 1 x 128 along M
// FLOP = 2 M out in; the bf16 rows of the same shapes are gpt2_gemm/... .
// The operands are codes of random normal data cast as the recipes cast them.
#include <string>

#include "accrue/kernels/fp8.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"
#include "bench/gpt2_layout.h"

namespace accrue::bench {
namespace {

constexpr int64_t kTokens[] = {8192, 32768};
enum class Pass { Fwd, Dgrad, Wgrad };
constexpr const char* kPassNames[] = {"fwd", "dgrad", "wgrad"};

// rows x k codes of random normal data with their per-tensor scale_inv.
struct TensorCast {
  Tensor q, scale_inv;
};
TensorCast tensor_cast(int64_t rows, int64_t k, DType dtype) {
  const Tensor x = random_input({rows, k}, DType::bf16);
  const kernels::Fp8Scale s = kernels::fp8_scale_from_amax(kernels::fp8_amax(x), dtype);
  return {kernels::cast_to_fp8(x, s.scale, dtype).q, s.scale_inv};
}

kernels::Fp8BlockCast block_cast(int64_t rows, int64_t k, kernels::Fp8Tiles tiles, DType dtype) {
  const int64_t tile_rows = tiles == kernels::Fp8Tiles::block ? 128 : 1;
  return kernels::cast_to_fp8_blockwise(random_input({rows, k}, DType::bf16), tile_rows, 128,
                                        dtype);
}

// out = a @ b^T with a [m, k], b [n, k]: the GEMM of `pass` (Note [FP8 GEMM]'s forms).
void fp8_gemm(benchmark::State& state, LinearShape s, int64_t tokens, Pass pass, bool block) {
  using kernels::Fp8Tiles;
  int64_t m = tokens, n = s.out, k = s.in;
  if (pass == Pass::Dgrad) n = s.in, k = s.out;
  if (pass == Pass::Wgrad) m = s.out, n = s.in, k = tokens;
  const DType a_dtype = pass == Pass::Fwd ? DType::f8e4m3 : DType::f8e5m2;  // x, or dy
  const bool wgrad = pass == Pass::Wgrad;
  const Tensor out = wgrad ? random_input({m, n}, DType::f32) : empty({m, n}, DType::bf16, gpu());
  GpuTime t;
  if (block) {
    const Fp8Tiles tb = wgrad ? Fp8Tiles::row : Fp8Tiles::block;
    const auto a = block_cast(m, k, Fp8Tiles::row, a_dtype);
    const auto b = block_cast(n, k, tb, DType::f8e4m3);
    t = time_gpu(state, [&] {
      kernels::fp8_block_matmul_into(a.q, a.scale_inv, Fp8Tiles::row, b.q, b.scale_inv, tb, out,
                                     wgrad);
    });
  } else {
    const TensorCast a = tensor_cast(m, k, a_dtype), b = tensor_cast(n, k, DType::f8e4m3);
    t = time_gpu(state,
                 [&] { kernels::fp8_matmul_into(a.q, b.q, a.scale_inv, b.scale_inv, out, wgrad); });
  }
  report_flops(state, 2.0 * static_cast<double>(tokens) * s.out * s.in, t);
}

// Names read fp8_gemm/<layer>_<out>x<in>/M=<tokens>/<pass>/<tensor|block>.
[[maybe_unused]] const bool registered = [] {
  for (const LinearShape& s : kGpt2Linears) {
    if (std::string(s.layer) == "logits") continue;  // the classifier stays in bf16
    for (int64_t m : kTokens)
      for (Pass p : {Pass::Fwd, Pass::Dgrad, Pass::Wgrad})
        for (bool block : {false, true}) {
          const std::string name = std::string("fp8_gemm/") + s.layer + "_" +
                                   std::to_string(s.out) + "x" + std::to_string(s.in) +
                                   "/M=" + std::to_string(m) + "/" +
                                   kPassNames[static_cast<int>(p)] + (block ? "/block" : "/tensor");
          register_gpu_benchmark(
              name, [s, m, p, block](benchmark::State& state) { fp8_gemm(state, s, m, p, block); });
        }
  }
  return true;
}();

}  // namespace
}  // namespace accrue::bench
