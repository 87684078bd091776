// The fused ops of a Llama-style block (kernels/fused.h) at Llama-7B sizes:
// 16,384 tokens of width 4,096, 32 heads of 128, an MLP of 11,008. Each is
// bandwidth-bound: the bytes counted are the least that must be read and
// written (an op's [D] weight included), so copy_frac is the fraction of the
// copy-bandwidth floor; the target is copy_frac >= 0.8. bench/torch_bench.py
// times the same formulas under the same names in PyTorch eager, and under
// torch.compile with "/compile" appended.
#include <string>

#include "accrue/core/dtype.h"
#include "accrue/core/random.h"
#include "accrue/kernels/fp8.h"
#include "accrue/kernels/fused.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

constexpr int64_t kTokens = 16384, kWidth = 4096, kHeads = 32, kHeadDim = 128, kFfn = 11008;
constexpr int64_t kBatch = 8, kSeq = kTokens / kBatch;

double bytes_of(const Tensor& t) {
  return static_cast<double>(t.nbytes());
}

Tensor positions() {
  return randint(0, kSeq, {kBatch, kSeq}, DType::i64, gpu());
}

void register_norms() {
  register_gpu_benchmark("fused/rms_norm/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor w = random_input({kWidth}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::rms_norm(x, w, 1e-6); });
    report_bandwidth(s, 2 * bytes_of(x) + bytes_of(w), t);
  });
  // dx and dweight into an fp32 slot: dy and x read, dx written (the second
  // read of dy and x for the column sums is not counted).
  register_gpu_benchmark("fused/rms_norm_backward/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor dy = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor w = random_input({kWidth}, DType::bf16);
    const Tensor rstd = kernels::rms_norm(x, w, 1e-6).rstd;
    const Tensor slot = random_input({kWidth}, DType::f32);
    const GpuTime t = time_gpu(s, [&] { kernels::rms_norm_backward(dy, x, w, rstd, slot, true); });
    report_bandwidth(s, 3 * bytes_of(x) + bytes_of(w) + 2 * bytes_of(slot), t);
  });
  // A Llama-125m row: sub-warp groups, 8,192 partial rows of column sums.
  register_gpu_benchmark("fused/rms_norm_backward/bf16/16384x768", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, 768}, DType::bf16);
    const Tensor dy = random_input({kTokens, 768}, DType::bf16);
    const Tensor w = random_input({768}, DType::bf16);
    const Tensor rstd = kernels::rms_norm(x, w, 1e-6).rstd;
    const Tensor slot = random_input({768}, DType::f32);
    const GpuTime t = time_gpu(s, [&] { kernels::rms_norm_backward(dy, x, w, rstd, slot, true); });
    report_bandwidth(s, 3 * bytes_of(x) + bytes_of(w) + 2 * bytes_of(slot), t);
  });
  register_gpu_benchmark("fused/add_rms_norm/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor res = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor w = random_input({kWidth}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::add_rms_norm(x, res, w, 1e-6); });
    report_bandwidth(s, 4 * bytes_of(x) + bytes_of(w), t);
  });
  // Per-head q norm (Qwen3, OLMo 2): 128-wide rows, one warp each, q read in
  // place from a packed [B, T, 3 * H * D] qkv.
  register_gpu_benchmark("fused/qk_norm/bf16/8x2048x32x128", [](benchmark::State& s) {
    const Tensor qkv = random_input({kBatch, kSeq, 3 * kHeads * kHeadDim}, DType::bf16);
    const Tensor q = qkv.view({kBatch, kSeq, 3, kHeads, kHeadDim}).select(2, 0);
    const Tensor w = random_input({kHeadDim}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::rms_norm(q, w, 1e-6); });
    report_bandwidth(s, 2 * bytes_of(qkv) / 3, t);
  });
}

void register_rope() {
  register_gpu_benchmark("fused/rope/bf16/8x2048x32x128", [](benchmark::State& s) {
    const Tensor q = random_input({kBatch, kSeq, kHeads, kHeadDim}, DType::bf16);
    const Tensor pos = positions();
    const GpuTime t = time_gpu(s, [&] { kernels::rope(q, pos, 500000.0, RopeStyle::RotateHalf); });
    report_bandwidth(s, 2 * bytes_of(q) + bytes_of(pos), t);
  });
  register_gpu_benchmark("fused/rope_llama3/bf16/8x2048x32x128", [](benchmark::State& s) {
    const Tensor q = random_input({kBatch, kSeq, kHeads, kHeadDim}, DType::bf16);
    const Tensor pos = positions();
    const GpuTime t = time_gpu(
        s, [&] { kernels::rope(q, pos, 500000.0, RopeStyle::RotateHalf, RopeScaling::llama3()); });
    report_bandwidth(s, 2 * bytes_of(q) + bytes_of(pos), t);
  });
  // Llama-125m's key heads, 4 of 64 (Note [Rotary kernel]): 4 work items a token.
  register_gpu_benchmark("fused/rope/bf16/8x2048x4x64", [](benchmark::State& s) {
    const Tensor k = random_input({kBatch, kSeq, 4, 64}, DType::bf16);
    const Tensor pos = positions();
    const GpuTime t = time_gpu(s, [&] { kernels::rope(k, pos, 500000.0, RopeStyle::RotateHalf); });
    report_bandwidth(s, 2 * bytes_of(k) + bytes_of(pos), t);
  });
  // q read in place from a packed [B, T, 3 * H * D] qkv.
  register_gpu_benchmark("fused/rope_packed_q/bf16/8x2048x32x128", [](benchmark::State& s) {
    const Tensor qkv = random_input({kBatch, kSeq, 3 * kHeads * kHeadDim}, DType::bf16);
    const Tensor q = qkv.view({kBatch, kSeq, 3, kHeads, kHeadDim}).select(2, 0);
    const Tensor pos = positions();
    const GpuTime t = time_gpu(s, [&] { kernels::rope(q, pos, 500000.0, RopeStyle::RotateHalf); });
    report_bandwidth(s, 2 * bytes_of(qkv) / 3 + bytes_of(pos), t);
  });
}

void register_swiglu() {
  // The output of one gate-and-up GEMM, [tokens, 2F].
  register_gpu_benchmark("fused/swiglu/bf16/16384x11008", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, 2 * kFfn}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::swiglu_packed(x); });
    report_bandwidth(s, 1.5 * bytes_of(x), t);
  });
  register_gpu_benchmark("fused/swiglu_backward/bf16/16384x11008", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, 2 * kFfn}, DType::bf16);
    const Tensor dy = random_input({kTokens, kFfn}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::swiglu_packed_backward(dy, x); });
    report_bandwidth(s, 2 * bytes_of(x) + bytes_of(dy), t);
  });
}

// The casts of an FP8 linear layer's current scaling (Note [FP8 scaling]):
// the amax (x read), the cast (x read, a code an element written) and the
// cast-transpose (x read, the codes and their transpose written).
void register_fp8_casts() {
  register_gpu_benchmark("fused/fp8_amax/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor amax = empty({1}, DType::f32, gpu());
    const GpuTime t = time_gpu(s, [&] { kernels::fp8_amax_into(x, amax); });
    report_bandwidth(s, bytes_of(x), t);
  });
  register_gpu_benchmark("fused/fp8_cast/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor scale = full({1}, 3.0, DType::f32, gpu()), amax = empty({1}, DType::f32, gpu());
    const Tensor q = empty(x.shape(), DType::f8e4m3, gpu());
    const GpuTime t = time_gpu(s, [&] { kernels::cast_to_fp8_into(x, scale, q, amax); });
    report_bandwidth(s, bytes_of(x) + bytes_of(q), t);
  });
  register_gpu_benchmark("fused/fp8_cast_transpose/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const Tensor scale = full({1}, 3.0, DType::f32, gpu()), amax = empty({1}, DType::f32, gpu());
    const Tensor q = empty({kTokens, kWidth}, DType::f8e4m3, gpu());
    const Tensor q_t = empty({kWidth, kTokens}, DType::f8e4m3, gpu());
    const GpuTime t =
        time_gpu(s, [&] { kernels::cast_to_fp8_transpose_into(x, scale, q, q_t, amax); });
    report_bandwidth(s, bytes_of(x) + 2 * bytes_of(q), t);
  });
  // The block recipe's casts (Note [FP8 block cast kernel]): x read, a code an
  // element and an f32 scale a tile written.
  for (int64_t rows : {int64_t{1}, int64_t{128}}) {
    const std::string tile = std::to_string(rows) + "x128";
    register_gpu_benchmark(
        "fused/fp8_cast_blockwise/bf16/16384x4096/" + tile, [rows](benchmark::State& s) {
          const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
          const GpuTime t =
              time_gpu(s, [&] { kernels::cast_to_fp8_blockwise(x, rows, 128, DType::f8e4m3); });
          report_bandwidth(s, bytes_of(x) * 3 / 2 + bytes_of(x) / rows / 64, t);
        });
  }
  // Note [FP8 block cast of a transpose]: x^T's 1 x 128 tiles (the weight
  // gradients' operand) from x itself; the same bytes must move.
  register_gpu_benchmark(
      "fused/fp8_cast_blockwise_of_transpose/bf16/16384x4096/1x128", [](benchmark::State& s) {
        const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
        const Tensor xt = x.transpose(0, 1);
        const GpuTime t =
            time_gpu(s, [&] { kernels::cast_to_fp8_blockwise(xt, 1, 128, DType::f8e4m3); });
        report_bandwidth(s, bytes_of(x) * 3 / 2 + bytes_of(x) / 64, t);
      });
}

}  // namespace

void register_fused_benchmarks() {
  register_norms();
  register_rope();
  register_swiglu();
  register_fp8_casts();
}

}  // namespace accrue::bench
