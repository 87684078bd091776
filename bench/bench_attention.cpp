// Attention as research models call it, forward and forward + backward, at a
// Llama-3-8B-like shape (B = 4, 32 query heads over 8 key/value heads, T =
// 2048, head dim 128, bf16): causal, grouped-query (kv heads unexpanded),
// right-padded (each sequence's length drawn in [T/2, T]), a 512-token
// sliding window, an additive [1, H, T, T] bias, and packed documents (the B T
// tokens as one row of seven causal documents of fixed lengths, kDocuments).
// FLOPs count the two matrix products of the unmasked scores (4 B Hq T^2 d
// forward, 3.5x that for forward + backward: the backward's five products),
// halved for causal masking; padding and the window are not discounted, so
// those rows compare only with the same row of PyTorch; packed documents
// count each document's own products (4 Hq d sum L^2, halved).
// bench/torch_bench.py times F.scaled_dot_product_attention(enable_gqa=True)
// under the same names. The path taken (cuDNN or composed) is in the name's
// counter `cudnn` (1 or 0).
#include <string>
#include <vector>

#include "accrue/core/random.h"
#include "accrue/kernels/attention.h"
#include "bench/bench_util.h"

namespace accrue::bench {
namespace {

constexpr int64_t kB = 4, kHq = 32, kHkv = 8, kT = 2048, kD = 128;
// The packed documents' lengths (summing to kB * kT), as bench/torch_bench.py's.
const std::vector<int64_t> kDocuments = {1500, 700, 2048, 300, 1200, 900, 1544};

struct Variant {
  const char* name;
  bool causal;
  bool padded;
  int64_t window;
  bool bias;
  bool packed;
};

// q's shape; packed documents are one row of kB * kT tokens.
Shape shape_of(const Variant& v, int64_t heads) {
  return v.packed ? Shape{1, heads, kB * kT, kD} : Shape{kB, heads, kT, kD};
}

kernels::AttentionOptions options_of(const Variant& v) {
  kernels::AttentionOptions o;
  if (v.causal) o.causal();
  if (v.window > 0) o.window(v.window);
  if (v.padded) {
    const Tensor lens = randint(kT / 2, kT + 1, {kB}, DType::i64, gpu());
    o.seq_lens(lens, lens);
  }
  if (v.bias) o.bias(random_input({1, kHq, kT, kT}, DType::bf16));
  if (v.packed) {
    std::vector<int64_t> cu{0};
    for (int64_t length : kDocuments)
      cu.push_back(cu.back() + length);
    // On the CPU: the offsets cuDNN's padded form takes (Note [Packed
    // documents as padded]); on the device they would take the composed path.
    o.varlen(from_vector(cu, {static_cast<int64_t>(cu.size())}, DType::i64, Device::cpu()));
  }
  return o;
}

double flops(const Variant& v, bool backward) {
  double squares = 1.0 * kB * kT * kT;
  if (v.packed) {
    squares = 0.0;
    for (int64_t length : kDocuments)
      squares += 1.0 * length * length;
  }
  const double forward = 4.0 * kHq * squares * kD * (v.causal ? 0.5 : 1.0);
  return backward ? 3.5 * forward : forward;
}

void run(benchmark::State& state, const Variant& v, bool backward) {
  const Tensor q = random_input(shape_of(v, kHq), DType::bf16);
  const Tensor k = random_input(shape_of(v, kHkv), DType::bf16);
  const Tensor vv = random_input(shape_of(v, kHkv), DType::bf16);
  const kernels::AttentionOptions o = options_of(v);
  const kernels::AttentionResult fwd = kernels::attention(q, k, vv, o);
  const Tensor grad = random_input(fwd.out.shape(), DType::bf16);
  const Tensor dq = empty(q.shape(), DType::bf16, gpu()), dk = empty(k.shape(), DType::bf16, gpu()),
               dv = empty(vv.shape(), DType::bf16, gpu());
  const Tensor dbias = v.bias ? empty({1, kHq, kT, kT}, DType::bf16, gpu()) : Tensor();
  const GpuTime t = time_gpu(state, [&] {
    const kernels::AttentionResult r = kernels::attention(q, k, vv, o);
    if (backward)
      kernels::attention_backward_into(grad, q, k, vv, r.out, r.lse, o, dq, dk, dv, dbias);
  });
  report_flops(state, flops(v, backward), t);
  state.counters["cudnn"] =
      kernels::last_attention_path() == kernels::AttentionPath::cudnn ? 1.0 : 0.0;
}

}  // namespace

void register_attention_benchmarks() {
  static const Variant variants[] = {
      {"causal", true, false, 0, false, false},
      {"padded_causal", true, true, 0, false, false},
      {"window512_causal", true, false, 512, false, false},
      {"bias", false, false, 0, true, false},
      {"packed_causal", true, false, 0, false, true},
  };
  for (const Variant& v : variants)
    for (bool backward : {false, true}) {
      const std::string name = std::string("attention/gqa_") + v.name + "/bf16/4x32x8x2048x128/" +
                               (backward ? "fwd_bwd" : "fwd");
      register_gpu_benchmark(name, [v, backward](benchmark::State& s) { run(s, v, backward); });
    }
}

}  // namespace accrue::bench
