// The pointwise, shape and index ops a Llama- or MoE-style model adds to
// GPT-2's set, at activation sizes of such a model (16,384 tokens of width
// 4,096; attention scores 8 x 16 x 1024 x 1024; a 32,000-row embedding
// table; a 128-expert router). Each is bandwidth-bound: the bytes counted are
// what must be read and written (index tensors included), so copy_frac is the
// fraction of the copy-bandwidth floor. bench/torch_bench.py times the same
// ops under the same names in PyTorch eager.
#include "accrue/core/dtype.h"
#include "accrue/core/random.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

constexpr int64_t kTokens = 16384, kWidth = 4096;
const Shape kScores{8, 16, 1024, 1024};
constexpr int64_t kVocab = 32000, kEmbed = 2048, kExperts = 128;

double bytes_of(const Tensor& t) {
  return static_cast<double>(t.nbytes());
}

Tensor indices(int64_t high, const Shape& shape) {
  return randint(0, high, shape, DType::i64, gpu());
}

void unary(benchmark::State& state, kernels::UnaryOp op, DType dtype) {
  const Tensor x = random_input({kTokens, kWidth}, dtype);
  const GpuTime t = time_gpu(state, [&] { kernels::unary(op, x); });
  report_bandwidth(state, 2 * bytes_of(x), t);
}

void register_pointwise() {
  register_gpu_benchmark("model_ops/silu/bf16/16384x4096", [](benchmark::State& s) {
    unary(s, kernels::UnaryOp::Silu, DType::bf16);
  });
  register_gpu_benchmark("model_ops/rsqrt/f32/16384x4096", [](benchmark::State& s) {
    unary(s, kernels::UnaryOp::Rsqrt, DType::f32);
  });
  register_gpu_benchmark("model_ops/clamp/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::clamp(x, -1.0, 1.0); });
    report_bandwidth(s, 2 * bytes_of(x), t);
  });
  register_gpu_benchmark("model_ops/maximum/bf16/16384x4096", [](benchmark::State& s) {
    const Tensor a = random_input({kTokens, kWidth}, DType::bf16),
                 b = random_input({kTokens, kWidth}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::binary(kernels::BinaryOp::Max, a, b); });
    report_bandwidth(s, 3 * bytes_of(a), t);
  });
  // A causal mask applied to attention scores: the [T, T] mask broadcast.
  register_gpu_benchmark("model_ops/masked_fill/bf16/8x16x1024x1024", [](benchmark::State& s) {
    const Tensor scores = random_input(kScores, DType::bf16);
    const Tensor mask =
        kernels::compare(kernels::CompareOp::Gt, random_input({1024, 1024}, DType::f32),
                         random_input({1024, 1024}, DType::f32));
    const GpuTime t = time_gpu(s, [&] { kernels::masked_fill(scores, mask, -1e4); });
    report_bandwidth(s, 2 * bytes_of(scores) + bytes_of(mask), t);
  });
  register_gpu_benchmark("model_ops/triu/f32/8x16x1024x1024", [](benchmark::State& s) {
    const Tensor x = random_input(kScores, DType::f32);
    const GpuTime t = time_gpu(s, [&] { kernels::triu(x, 1); });
    report_bandwidth(s, 2 * bytes_of(x), t);
  });
}

void register_shape_and_index() {
  register_gpu_benchmark("model_ops/cat/bf16/2x16384x2048", [](benchmark::State& s) {
    const Tensor a = random_input({kTokens, kWidth / 2}, DType::bf16),
                 b = random_input({kTokens, kWidth / 2}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::cat({a, b}, 1); });
    report_bandwidth(s, 4 * bytes_of(a), t);
  });
  // Grouped-query attention's kv heads expanded for a composed path: 8 -> 32 heads.
  register_gpu_benchmark("model_ops/repeat_interleave/bf16/8x8x2048x128", [](benchmark::State& s) {
    const Tensor k = random_input({8, 8, 2048, 128}, DType::bf16);
    const GpuTime t = time_gpu(s, [&] { kernels::repeat_interleave(k, 4, 1); });
    report_bandwidth(s, 5 * bytes_of(k), t);
  });
  register_gpu_benchmark("model_ops/index_select/bf16/32000x2048", [](benchmark::State& s) {
    const Tensor table = random_input({kVocab, kEmbed}, DType::bf16);
    const Tensor idx = indices(kVocab, {kTokens});
    const GpuTime t = time_gpu(s, [&] { kernels::index_select(table, 0, idx); });
    report_bandwidth(s, 2.0 * kTokens * kEmbed * 2 + bytes_of(idx), t);
  });
  // An embedding's weight gradient: rows of src added into the table.
  register_gpu_benchmark("model_ops/index_add/f32/32000x2048", [](benchmark::State& s) {
    const Tensor table = random_input({kVocab, kEmbed}, DType::f32);
    const Tensor src = random_input({kTokens, kEmbed}, DType::f32);
    const Tensor idx = indices(kVocab, {kTokens});
    const GpuTime t = time_gpu(s, [&] { kernels::index_add(table, 0, idx, src); });
    // Out of place: the table is read and written whole, src and idx read.
    report_bandwidth(s, 2 * bytes_of(table) + bytes_of(src) + bytes_of(idx), t);
  });
  register_gpu_benchmark("model_ops/gather/f32/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::f32);
    const Tensor idx = indices(kWidth, {kTokens, kWidth});
    const GpuTime t = time_gpu(s, [&] { kernels::gather(x, 1, idx); });
    report_bandwidth(s, 2 * bytes_of(x) + bytes_of(idx), t);
  });
  register_gpu_benchmark("model_ops/cumsum/f32/16384x4096", [](benchmark::State& s) {
    const Tensor x = random_input({kTokens, kWidth}, DType::f32);
    const GpuTime t = time_gpu(s, [&] { kernels::cumsum(x, 1); });
    report_bandwidth(s, 2 * bytes_of(x), t);
  });
  // A mixture-of-experts router: the top 8 of 128 experts per token.
  register_gpu_benchmark("model_ops/topk/f32/16384x128/k=8", [](benchmark::State& s) {
    const Tensor logits = random_input({kTokens, kExperts}, DType::f32);
    const GpuTime t = time_gpu(s, [&] { kernels::topk(logits, 8, 1); });
    report_bandwidth(s, bytes_of(logits) + kTokens * 8.0 * (4 + 8), t);
  });
  register_gpu_benchmark("model_ops/argsort/f32/16384x128", [](benchmark::State& s) {
    const Tensor logits = random_input({kTokens, kExperts}, DType::f32);
    const GpuTime t = time_gpu(s, [&] { kernels::argsort(logits, 1, true); });
    report_bandwidth(s, bytes_of(logits) + kTokens * kExperts * 8.0, t);
  });
}

}  // namespace

void register_model_op_benchmarks() {
  register_pointwise();
  register_shape_and_index();
}

}  // namespace accrue::bench
