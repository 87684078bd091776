// Attention on CUDA (kernels/attention.h) against the CPU reference computed in
// f64 from the very same (rounded) inputs: forward out and lse, backward dq, dk
// and dv, through every path of Note [Attention paths]: the composed one (f32,
// f64, dropout, unaligned or odd-sized heads) and cuDNN's fused one (bf16/f16
// when cudnn_attention_available(); otherwise the composed path runs the same
// tests). Packed qkv views go through without copies, the cuDNN graph cache is
// hit and missed, and dropout on the GPU draws the CPU's mask.
#include <gmock/gmock.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/attention.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::close;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

struct Config {
  int64_t B, H, Tq, Tk, d;
  bool causal;
};

std::string name(const Config& c, DType dt) {
  return std::string(dtype_name(dt)) + " B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) +
         " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) +
         " d=" + std::to_string(c.d) + (c.causal ? " causal" : "");
}

// d = 64 and 128, T from 64 to 1024, Tq != Tk (full, and bottom-right causal).
const Config kConfigs[] = {{2, 3, 64, 64, 64, false},   {2, 3, 64, 64, 64, true},
                           {1, 4, 256, 256, 128, true}, {2, 2, 128, 320, 64, false},
                           {1, 2, 96, 160, 128, true},  {1, 2, 1024, 1024, 64, true}};

Tensor reference_copy(const Tensor& t) {
  return t.to(kCpu).to(DType::f64);
}

// Bottom-right, as these configurations (Tq <= Tk) were written for.
kernels::AttentionOptions causal_options(bool causal) {
  kernels::AttentionOptions o;
  if (causal) o.causal(kernels::MaskAlignment::bottom_right);
  return o;
}

struct Results {
  Tensor out, lse, dq, dk, dv, dbias;
  kernels::AttentionPath forward_path = kernels::AttentionPath::none;
  kernels::AttentionPath backward_path = kernels::AttentionPath::none;
};

// Forward, then backward of grad_out, on whatever device the inputs are on.
Results run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
            const kernels::AttentionOptions& o) {
  kernels::AttentionResult r = kernels::attention(q, k, v, o);
  Results res;
  res.out = r.out;
  res.lse = r.lse;
  res.dq = empty(q.shape(), q.dtype(), q.device());
  res.dk = empty(k.shape(), k.dtype(), k.device());
  res.dv = empty(v.shape(), v.dtype(), v.device());
  res.forward_path = kernels::last_attention_path();
  test::poison(res.dq);
  test::poison(res.dk);
  test::poison(res.dv);
  if (o.get_bias().defined()) {
    res.dbias = empty(o.get_bias().shape(), q.dtype(), q.device());
    test::poison(res.dbias);
  }
  kernels::attention_backward_into(grad_out, q, k, v, r.out, r.lse, o, res.dq, res.dk, res.dv,
                                   res.dbias);
  res.backward_path = kernels::last_attention_path();
  return res;
}

// The options with their bias moved to the CPU in f64 (lengths, offsets
// and masks may stay where they are: they are read from the CPU too).
kernels::AttentionOptions reference_options(const kernels::AttentionOptions& o) {
  kernels::AttentionOptions r = o;
  if (o.get_bias().defined()) r.bias(reference_copy(o.get_bias()));
  if (o.get_mask().defined()) r.mask(o.get_mask().to(kCpu));
  if (o.seq_len_q().defined())
    r.seq_lens(o.seq_len_q().to(kCpu),
               o.seq_len_kv().defined() ? o.seq_len_kv().to(kCpu) : Tensor());
  if (o.cu_seqlens_q().defined())
    r.varlen(o.cu_seqlens_q().to(kCpu),
             o.cu_seqlens_kv().defined() ? o.cu_seqlens_kv().to(kCpu) : Tensor());
  return r;
}

// The CPU reference in f64 of the same inputs.
Results reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                  const kernels::AttentionOptions& o) {
  return run(reference_copy(q), reference_copy(k), reference_copy(v), reference_copy(grad_out),
             reference_options(o));
}

// out and the gradients within `tol` (normalized), lse elementwise within lse_tol.
// lse with its -inf (empty rows) where the reference has them, then 0 at
// those places so that the finite ones compare.
::testing::AssertionResult lse_matches(const Tensor& lse, const Tensor& ref, double tol) {
  std::vector<double> a = reference_copy(lse).to_vector<double>(), e = ref.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ai = std::isinf(a[i]) && a[i] < 0, ei = std::isinf(e[i]) && e[i] < 0;
    if (ai != ei)
      return ::testing::AssertionFailure()
             << "lse[" << i << "] = " << a[i] << ", expected " << e[i];
    if (ei) a[i] = e[i] = 0.0;
  }
  return test::all_close(from_vector(a, ref.shape(), DType::f64),
                         from_vector(e, ref.shape(), DType::f64), tol, tol);
}

void expect_matches(const Results& gpu, const Results& ref, double tol, double lse_tol) {
  EXPECT_EQ(gpu.out.device(), kGpu);
  EXPECT_TRUE(close(gpu.out, ref.out, tol)) << "out";
  EXPECT_TRUE(lse_matches(gpu.lse, ref.lse, lse_tol)) << "lse";
  EXPECT_TRUE(close(gpu.dq, ref.dq, tol)) << "dq";
  EXPECT_TRUE(close(gpu.dk, ref.dk, tol)) << "dk";
  EXPECT_TRUE(close(gpu.dv, ref.dv, tol)) << "dv";
  if (ref.dbias.defined()) {
    EXPECT_TRUE(close(gpu.dbias, ref.dbias, tol)) << "dbias";
  }
}

void expect_equal(const Results& a, const Results& b) {
  EXPECT_TRUE(test::all_equal(a.out.to(kCpu), b.out.to(kCpu))) << "out";
  EXPECT_TRUE(test::all_equal(a.lse.to(kCpu), b.lse.to(kCpu))) << "lse";
  EXPECT_TRUE(test::all_equal(a.dq.to(kCpu), b.dq.to(kCpu))) << "dq";
  EXPECT_TRUE(test::all_equal(a.dk.to(kCpu), b.dk.to(kCpu))) << "dk";
  EXPECT_TRUE(test::all_equal(a.dv.to(kCpu), b.dv.to(kCpu))) << "dv";
}

// Products in true fp32 for the f32 comparisons, whatever another test left set.
class GpuAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    tf32_ = kernels::allow_tf32();
    kernels::set_allow_tf32(false);
  }
  void TearDown() override { kernels::set_allow_tf32(tf32_); }

 private:
  bool tf32_ = false;
};

// f32 runs the composed path: cuBLASLt in fp32 and fp32 softmax, against f64.
TEST_F(GpuAttention, f32_composed_path_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(name(c, DType::f32));
    Tensor q = test::random_normal({c.B, c.H, c.Tq, c.d}, DType::f32, kGpu);
    Tensor k = test::random_normal({c.B, c.H, c.Tk, c.d}, DType::f32, kGpu);
    Tensor v = test::random_normal({c.B, c.H, c.Tk, c.d}, DType::f32, kGpu);
    Tensor g = test::random_normal({c.B, c.H, c.Tq, c.d}, DType::f32, kGpu);
    const auto o = causal_options(c.causal);
    expect_matches(run(q, k, v, g, o), reference(q, k, v, g, o), 3e-5, 1e-5);
  }
}

TEST_F(GpuAttention, f64_composed_path_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (const Config& c : {kConfigs[1], kConfigs[3]}) {
    SCOPED_TRACE(name(c, DType::f64));
    Tensor q = test::random_normal({c.B, c.H, c.Tq, c.d}, DType::f64, kGpu);
    Tensor k = test::random_normal({c.B, c.H, c.Tk, c.d}, DType::f64, kGpu);
    Tensor v = test::random_normal({c.B, c.H, c.Tk, 24}, DType::f64, kGpu);
    Tensor g = test::random_normal({c.B, c.H, c.Tq, 24}, DType::f64, kGpu);
    const auto o = causal_options(c.causal);
    expect_matches(run(q, k, v, g, o), reference(q, k, v, g, o), 1e-11, 1e-11);
  }
}

// bf16/f16: cuDNN's fused attention where available, against the f64 reference
// of the same rounded inputs. The output and gradients are stored in 16 bits and
// the probabilities are rounded to 16 bits before P v (as flash attention does).
TEST_F(GpuAttention, sixteen_bit_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const Config& c : kConfigs) {
      SCOPED_TRACE(name(c, dt) + (kernels::cudnn_attention_available() ? " (cuDNN)" : ""));
      Tensor q = test::random_normal({c.B, c.H, c.Tq, c.d}, dt, kGpu);
      Tensor k = test::random_normal({c.B, c.H, c.Tk, c.d}, dt, kGpu);
      Tensor v = test::random_normal({c.B, c.H, c.Tk, c.d}, dt, kGpu);
      Tensor g = test::random_normal({c.B, c.H, c.Tq, c.d}, dt, kGpu);
      const auto o = causal_options(c.causal);
      const Results gpu = run(q, k, v, g, o);
      EXPECT_EQ(gpu.lse.dtype(), DType::f32);
      expect_matches(gpu, reference(q, k, v, g, o), 2 * test::normalized_tolerance(dt), 1e-4);
    }
  }
}

// Heads cuDNN does not take (d not a multiple of 8), d = 40 (which it takes),
// and unaligned views (a buffer shifted by one element) all still match.
TEST_F(GpuAttention, sixteen_bit_odd_heads_and_unaligned_views) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16}) {
    for (int64_t d : {20, 40}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      Tensor q = test::random_normal({2, 2, 48, d}, dt, kGpu);
      Tensor k = test::random_normal({2, 2, 48, d}, dt, kGpu);
      Tensor v = test::random_normal({2, 2, 48, d}, dt, kGpu);
      Tensor g = test::random_normal({2, 2, 48, d}, dt, kGpu);
      const auto o = causal_options(true);
      expect_matches(run(q, k, v, g, o), reference(q, k, v, g, o),
                     2 * test::normalized_tolerance(dt), 1e-4);
    }
    SCOPED_TRACE(std::string(dtype_name(dt)) + " unaligned");
    auto shifted = [&](const Shape& s) {
      Tensor buffer = test::random_normal({shape_numel(s) + 1}, dt, kGpu);
      return make_view(buffer, s, contiguous_strides(s), 1);
    };
    Tensor q = shifted({1, 2, 64, 64}), k = shifted({1, 2, 64, 64}), v = shifted({1, 2, 64, 64});
    Tensor g = shifted({1, 2, 64, 64});
    const auto o = causal_options(false);
    expect_matches(run(q, k, v, g, o), reference(q, k, v, g, o), 2 * test::normalized_tolerance(dt),
                   1e-4);
  }
}

// GPT-2's layout: q, k, v are head views of one [B, T, 3, H, d] buffer and the
// gradients land in the three parts of one dqkv buffer, through cuDNN for
// bf16/f16 (16-byte aligned for d % 8 == 0) without copies.
TEST_F(GpuAttention, packed_qkv_views) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t B = 2, T = 128, H = 4;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (int64_t d : {64, 128}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      Tensor qkv = test::random_normal({B, T, 3, H, d}, dt, kGpu);
      auto part = [](const Tensor& x, int64_t i) { return x.select(2, i).transpose(1, 2); };
      Tensor q = part(qkv, 0), k = part(qkv, 1), v = part(qkv, 2);
      Tensor g = test::random_normal({B, T, H, d}, dt, kGpu).transpose(1, 2);
      const auto o = causal_options(true);
      kernels::AttentionResult r = kernels::attention(q, k, v, o);
      Tensor dqkv = empty({B, T, 3, H, d}, dt, kGpu);
      test::poison(dqkv);
      kernels::attention_backward_into(g, q, k, v, r.out, r.lse, o, part(dqkv, 0), part(dqkv, 1),
                                       part(dqkv, 2));
      Results gpu;
      gpu.out = r.out;
      gpu.lse = r.lse;
      gpu.dq = part(dqkv, 0);
      gpu.dk = part(dqkv, 1);
      gpu.dv = part(dqkv, 2);
      const double tol = dt == DType::f32 ? 3e-5 : 2 * test::normalized_tolerance(dt);
      expect_matches(gpu, reference(q, k, v, g, o), tol, dt == DType::f32 ? 1e-5 : 1e-4);
    }
  }
}

// The differentiable packed op on the GPU (bf16, the training configuration)
// against the same op on the CPU in f64.
TEST_F(GpuAttention, packed_causal_attention_autograd) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t B = 2, T = 96, H = 3, d = 64;
  Tensor x = test::random_normal({B, T, 3 * H * d}, DType::bf16, kGpu);
  Tensor w = test::random_normal({B, T, H * d}, DType::bf16, kGpu);
  Tensor qkv = requires_grad_(x.clone());
  Tensor out = packed_causal_attention(qkv, H);
  backward(sum(mul(out, w)));
  Tensor qkv_ref = requires_grad_(reference_copy(x));
  Tensor out_ref = packed_causal_attention(qkv_ref, H);
  backward(sum(mul(out_ref, reference_copy(w))));
  const double tol = 2 * test::normalized_tolerance(DType::bf16);
  EXPECT_TRUE(close(detach(out), detach(out_ref), tol));
  EXPECT_TRUE(close(grad(qkv), grad(qkv_ref), tol));
}

// A cuDNN graph is built on the first call of a shape and reused after; a new
// shape builds another, and the first one still serves its shape.
TEST_F(GpuAttention, graph_cache_hit_and_new_shape) {
  ACCRUE_REQUIRE_CUDA();
  const DType dt = DType::bf16;
  const double tol = 2 * test::normalized_tolerance(dt);
  auto inputs = [&](int64_t T) {
    std::vector<Tensor> x;
    for (int i = 0; i < 4; ++i)
      x.push_back(test::random_normal({2, 4, T, 64}, dt, kGpu));
    return x;
  };
  const auto o = causal_options(true);
  const std::vector<Tensor> a = inputs(128), b = inputs(192);
  const Results ref_a = reference(a[0], a[1], a[2], a[3], o);
  const Results first = run(a[0], a[1], a[2], a[3], o);
  const Results second = run(a[0], a[1], a[2], a[3], o);
  expect_matches(first, ref_a, tol, 1e-4);
  expect_matches(second, ref_a, tol, 1e-4);
  EXPECT_TRUE(test::all_equal(first.out.to(kCpu), second.out.to(kCpu)));
  EXPECT_TRUE(test::all_equal(first.lse.to(kCpu), second.lse.to(kCpu)));
  expect_matches(run(b[0], b[1], b[2], b[3], o), reference(b[0], b[1], b[2], b[3], o), tol, 1e-4);
  expect_matches(run(a[0], a[1], a[2], a[3], o), ref_a, tol, 1e-4);
}

// The fused path never materializes the T x T scores: the forward's peak memory
// stays below one bf16 score matrix, where the composed path needs an fp32 one.
TEST_F(GpuAttention, cudnn_forward_does_not_materialize_scores) {
  ACCRUE_REQUIRE_CUDA();
  if (!kernels::cudnn_attention_available())
    GTEST_SKIP()
        << "no cuDNN attention (built without the frontend, or ACCRUE_ATTENTION_COMPOSED=1)";
  const int64_t B = 2, H = 4, T = 1024, d = 64;
  Tensor q = test::random_normal({B, H, T, d}, DType::bf16, kGpu);
  const auto o = causal_options(true);
  kernels::attention(q, q, q, o);  // builds the graph
  reset_peak_memory(kGpu);
  const int64_t before = memory_stats(kGpu).current_bytes;
  kernels::AttentionResult r = kernels::attention(q, q, q, o);
  const int64_t used = memory_stats(kGpu).peak_bytes - before;
  EXPECT_LT(used, B * H * T * T * 2) << "bytes allocated by one forward";
  EXPECT_GE(used, B * T * H * d * 2);  // at least out itself
}

// The composed path draws the mask of Note [Attention masks] on the device:
// the same elements as the CPU reference drops.
TEST_F(GpuAttention, dropout_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Config& c : {kConfigs[0], kConfigs[4]}) {
      SCOPED_TRACE(name(c, dt) + " dropout");
      Tensor q = test::random_normal({c.B, c.H, c.Tq, c.d}, dt, kGpu);
      Tensor k = test::random_normal({c.B, c.H, c.Tk, c.d}, dt, kGpu);
      Tensor v = test::random_normal({c.B, c.H, c.Tk, c.d}, dt, kGpu);
      Tensor g = test::random_normal({c.B, c.H, c.Tq, c.d}, dt, kGpu);
      kernels::AttentionOptions o = causal_options(c.causal);
      o.dropout(0.2, 987654321, 12345);
      const Results gpu = run(q, k, v, g, o), ref = reference(q, k, v, g, o);
      const double tol = dt == DType::f32 ? 3e-5 : 2 * test::normalized_tolerance(dt);
      expect_matches(gpu, ref, tol, dt == DType::f32 ? 1e-5 : 1e-4);
      // Not the undropped result: the mask really applies.
      const Results plain = reference(q, k, v, g, causal_options(c.causal));
      EXPECT_GT(test::relative_error(ref.out, plain.out), 0.05);
    }
  }
}

// No atomics, fixed-order reductions: the same inputs give the same bits.
TEST_F(GpuAttention, composed_path_is_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  const Config c = kConfigs[3];
  Tensor q = test::random_normal({c.B, c.H, c.Tq, c.d}, DType::f32, kGpu);
  Tensor k = test::random_normal({c.B, c.H, c.Tk, c.d}, DType::f32, kGpu);
  Tensor v = test::random_normal({c.B, c.H, c.Tk, c.d}, DType::f32, kGpu);
  Tensor g = test::random_normal({c.B, c.H, c.Tq, c.d}, DType::f32, kGpu);
  kernels::AttentionOptions o;
  o.dropout(0.1);
  expect_equal(run(q, k, v, g, o), run(q, k, v, g, o));
}

// ---- research-model attention on every path -------------------------------------

// One variant of Note [Attention masks] on q [B, Hq, Tq, d], k/v [B, Hkv, Tk, d],
// and whether cuDNN is expected to take it (bf16/f16, cuDNN available).
struct Variant {
  std::string name;
  int64_t B, Hq, Hkv, Tq, Tk, d;
  std::function<kernels::AttentionOptions(DType)> options;
  bool on_cudnn;
};

Tensor lengths(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n}).to(kGpu);
}

// Document offsets on the CPU: the packed form cuDNN takes (Note [Packed
// documents as padded]); offsets on the device take the composed path.
Tensor host_offsets(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}

std::vector<Variant> variants() {
  using kernels::AttentionOptions;
  using kernels::MaskAlignment;
  auto plain = [](AttentionOptions o) { return [o](DType) { return o; }; };
  std::vector<Variant> v;
  v.push_back({"gqa", 2, 8, 2, 128, 128, 64, plain(AttentionOptions().causal()), true});
  v.push_back({"mqa", 2, 4, 1, 96, 160, 64, plain(AttentionOptions()), true});
  v.push_back({"causal top-left Tq < Tk", 1, 4, 2, 64, 192, 64,
               plain(AttentionOptions().causal(MaskAlignment::top_left)), true});
  v.push_back({"causal bottom-right Tq < Tk", 1, 4, 2, 64, 192, 64,
               plain(AttentionOptions().causal(MaskAlignment::bottom_right)), true});
  // cuDNN refuses bottom-right with Tq > Tk (rows without keys): composed.
  v.push_back({"causal bottom-right Tq > Tk", 1, 4, 2, 192, 64, 64,
               plain(AttentionOptions().causal(MaskAlignment::bottom_right)), false});
  v.push_back({"padded", 3, 4, 2, 128, 128, 64,
               plain(AttentionOptions().causal().seq_lens(lengths({128, 77, 5}))), true});
  v.push_back({"padded kv cache", 2, 4, 1, 16, 160, 64,
               plain(AttentionOptions()
                         .causal(MaskAlignment::bottom_right)
                         .seq_lens(lengths({16, 9}), lengths({160, 100}))),
               true});
  v.push_back(
      {"window", 2, 4, 2, 256, 256, 64, plain(AttentionOptions().causal().window(48)), true});
  // Packed documents go to cuDNN as their padded form (Note [Packed
  // documents as padded]): self-attention (five documents, so the padded
  // batch holds six, one a copy), a KV-cache shape whose second document has
  // keys but no query (their gradients are 0), a window; with the offsets on
  // the device, the composed path (as a CUDA graph computes it).
  v.push_back({"packed documents", 1, 4, 2, 200, 200, 64,
               plain(AttentionOptions().causal().varlen(host_offsets({0, 64, 65, 150, 170, 200}))),
               true});
  v.push_back({"packed documents, offsets on the device", 1, 4, 2, 200, 200, 64,
               plain(AttentionOptions().causal().varlen(lengths({0, 64, 65, 150, 170, 200}))),
               false});
  v.push_back(
      {"packed documents kv cache", 1, 4, 2, 48, 200, 64,
       plain(AttentionOptions()
                 .causal(MaskAlignment::bottom_right)
                 .varlen(host_offsets({0, 16, 16, 41, 48}), host_offsets({0, 60, 90, 170, 200}))),
       true});
  v.push_back(
      {"packed documents window", 1, 8, 2, 256, 256, 64,
       plain(AttentionOptions().causal().window(32).varlen(host_offsets({0, 100, 101, 256}))),
       true});
  // A document with more queries than keys, bottom-right: its first rows see
  // no key, which cuDNN's padding mask does not define as empty: composed.
  v.push_back({"packed documents, rows without keys", 1, 4, 2, 64, 100, 64,
               plain(AttentionOptions()
                         .causal(MaskAlignment::bottom_right)
                         .varlen(host_offsets({0, 40, 64}), host_offsets({0, 20, 100}))),
               false});
  // Boolean masks take the composed path (Note [Attention paths]).
  v.push_back(
      {"bias", 2, 4, 2, 128, 128, 64,
       [](DType dt) {
         return AttentionOptions().causal().bias(test::random_normal({1, 4, 128, 128}, dt, kGpu));
       },
       true});
  v.push_back(
      {"mask", 2, 4, 2, 64, 96, 64,
       [](DType) {
         std::vector<double> u =
             test::random_uniform({2, 1, 64, 96}, 0.0, 1.0, DType::f64).to_vector<double>();
         for (double& x : u)
           x = x > 0.3 ? 1.0 : 0.0;
         for (int64_t j = 0; j < 96; ++j)  // query row 3 of batch 0 sees nothing
           u[3 * 96 + j] = 0.0;
         return AttentionOptions().mask(from_vector(u, {2, 1, 64, 96}, DType::boolean).to(kGpu));
       },
       false});
  return v;
}

// cuDNN off for a scope (kernels::set_cudnn_attention), back on at its end.
struct ComposedOnly {
  ComposedOnly() { kernels::set_cudnn_attention(false); }
  ~ComposedOnly() { kernels::set_cudnn_attention(true); }
};

// Every variant in f32 (composed), f64 (composed) and bf16/f16 twice: as
// dispatch chooses (cuDNN where it takes the variant, which the path query
// proves, else composed) and with cuDNN off (composed), each against the CPU
// reference in f64 of the same inputs.
TEST_F(GpuAttention, research_variants_match_the_cpu_on_every_path) {
  ACCRUE_REQUIRE_CUDA();
  const bool cudnn_built = kernels::cudnn_attention_available();
  for (const Variant& var : variants()) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      const bool sixteen = dt == DType::bf16 || dt == DType::f16;
      for (bool allow_cudnn : {true, false}) {
        if (!allow_cudnn && !sixteen) continue;
        std::unique_ptr<ComposedOnly> off;
        if (!allow_cudnn) off = std::make_unique<ComposedOnly>();
        const bool cudnn = var.on_cudnn && cudnn_built && allow_cudnn && sixteen;
        SCOPED_TRACE(var.name + " " + dtype_name(dt) + (cudnn ? " (cuDNN)" : " (composed)"));
        Tensor q = test::random_normal({var.B, var.Hq, var.Tq, var.d}, dt, kGpu);
        Tensor k = test::random_normal({var.B, var.Hkv, var.Tk, var.d}, dt, kGpu);
        Tensor v = test::random_normal({var.B, var.Hkv, var.Tk, var.d}, dt, kGpu);
        Tensor g = test::random_normal({var.B, var.Hq, var.Tq, var.d}, dt, kGpu);
        const kernels::AttentionOptions o = var.options(dt);
        const Results gpu = run(q, k, v, g, o);
        const kernels::AttentionPath want =
            cudnn ? kernels::AttentionPath::cudnn : kernels::AttentionPath::composed;
        EXPECT_EQ(gpu.forward_path, want) << kernels::attention_path_name(gpu.forward_path) << ": "
                                          << kernels::last_attention_refusal();
        EXPECT_EQ(gpu.backward_path, want) << kernels::attention_path_name(gpu.backward_path)
                                           << ": " << kernels::last_attention_refusal();
        const double tol = dt == DType::f64   ? 1e-11
                           : dt == DType::f32 ? 3e-5
                                              : 2 * test::normalized_tolerance(dt);
        expect_matches(gpu, reference(q, k, v, g, o), tol, sixteen ? 1e-4 : tol);
      }
    }
  }
}

// A bf16 call cuDNN does not take says why, once per reason, and still runs.
TEST_F(GpuAttention, a_cudnn_refusal_is_said_once) {
  ACCRUE_REQUIRE_CUDA();
  if (!kernels::cudnn_attention_available())
    GTEST_SKIP()
        << "no cuDNN attention (built without the frontend, or ACCRUE_ATTENTION_COMPOSED=1)";
  Tensor q = test::random_normal({1, 2, 64, 64}, DType::bf16, kGpu);
  kernels::AttentionOptions o;
  o.mask(ones({1, 1, 64, 64}, DType::boolean, kGpu));
  ::testing::internal::CaptureStderr();
  kernels::attention(q, q, q, o);
  kernels::attention(q, q, q, o);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(kernels::last_attention_path(), kernels::AttentionPath::composed);
  EXPECT_THAT(kernels::last_attention_refusal(), ::testing::HasSubstr("boolean"));
  const size_t first = said.find("cuDNN does not take");
  ASSERT_NE(first, std::string::npos) << said;
  EXPECT_EQ(said.find("cuDNN does not take", first + 1), std::string::npos) << said;
  EXPECT_THAT(said, ::testing::HasSubstr("mask"));
}

// The differentiable op with a learned bias and grouped heads, bf16 on the GPU
// against f64 on the CPU.
TEST_F(GpuAttention, sdpa_autograd_with_gqa_and_a_bias) {
  ACCRUE_REQUIRE_CUDA();
  const DType dt = DType::bf16;
  Tensor q0 = test::random_normal({2, 8, 64, 64}, dt, kGpu);
  Tensor k0 = test::random_normal({2, 2, 64, 64}, dt, kGpu);
  Tensor b0 = test::random_normal({1, 8, 64, 64}, dt, kGpu);
  Tensor w = test::random_normal({2, 8, 64, 64}, dt, kGpu);
  auto run_on = [&](const Tensor& q_in, const Tensor& k_in, const Tensor& b_in,
                    const Tensor& w_in) {
    Tensor q = requires_grad_(q_in), k = requires_grad_(k_in), b = requires_grad_(b_in);
    Tensor out = scaled_dot_product_attention(q, k, k, SdpaOptions().causal().bias(b));
    backward(sum(mul(out, w_in)));
    return std::vector<Tensor>{detach(out), grad(q), grad(k), grad(b)};
  };
  const std::vector<Tensor> gpu = run_on(q0.clone(), k0.clone(), b0.clone(), w);
  const std::vector<Tensor> cpu =
      run_on(reference_copy(q0), reference_copy(k0), reference_copy(b0), reference_copy(w));
  const double tol = 2 * test::normalized_tolerance(dt);
  for (size_t i = 0; i < gpu.size(); ++i)
    EXPECT_TRUE(close(gpu[i], cpu[i], tol)) << "result " << i;
}

// Note [Capturable code]: grouped heads with lengths on the device record
// into a CUDA graph (the lengths are not read back inside it), and a replay
// on new values and new lengths equals the eager calls, on the composed path
// (f32) and on cuDNN (bf16, where available).
TEST_F(GpuAttention, gqa_with_device_lengths_captures_into_a_cuda_graph) {
  ACCRUE_REQUIRE_CUDA();
  const test::GraphPoolScope pool;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = test::random_normal({2, 8, 128, 64}, dt, kGpu);
    const Tensor k = test::random_normal({2, 2, 128, 64}, dt, kGpu);
    const Tensor g = test::random_normal({2, 8, 128, 64}, dt, kGpu);
    const Tensor lens = lengths({128, 70});
    kernels::AttentionOptions o;
    o.causal().seq_lens(lens);
    const auto ops = [&] {
      kernels::AttentionResult r = kernels::attention(q, k, k, o);
      Tensor dq = empty(q.shape(), dt, kGpu), dk = empty(k.shape(), dt, kGpu),
             dv = empty(k.shape(), dt, kGpu);
      kernels::attention_backward_into(g, q, k, k, r.out, r.lse, o, dq, dk, dv);
      return std::vector<Tensor>{r.out, dq, dk, dv};
    };
    const std::vector<Tensor> warm = ops();  // builds cuDNN's graphs eagerly first
    std::vector<Tensor> result;
    for (const Tensor& t : warm)
      result.push_back(empty(t.shape(), dt, kGpu));
    std::string why;
    const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(
        0,
        [&] {
          const std::vector<Tensor> r = ops();
          for (size_t i = 0; i < r.size(); ++i)
            result[i].copy_(r[i]);
        },
        &why);
    ASSERT_TRUE(graph) << why;
    q.copy_(test::random_normal(q.shape(), dt, kGpu));
    lens.copy_(from_vector<int64_t>({50, 128}, {2}).to(kGpu));
    graph->launch();
    const std::vector<Tensor> eager = ops();
    // Bitwise on the composed path; cuDNN's backward may have had to take its
    // atomic (non-deterministic) dq engine.
    for (size_t i = 0; i < eager.size(); ++i)
      EXPECT_TRUE(close(result[i], eager[i], dt == DType::f32 ? 0.0 : 1e-3)) << "result " << i;
    EXPECT_FALSE(test::all_equal(result[0].to(kCpu), warm[0].to(kCpu)));
  }
}

// Inside a CUDA-graph capture the document offsets are not read back, so
// packed documents have no padded form there: bf16 records the composed path
// (and says why), while the eager call with the offsets on the CPU runs on
// cuDNN; the replay matches it.
TEST_F(GpuAttention, packed_documents_in_a_cuda_graph_take_the_composed_path) {
  ACCRUE_REQUIRE_CUDA();
  if (!kernels::cudnn_attention_available())
    GTEST_SKIP()
        << "no cuDNN attention (built without the frontend, or ACCRUE_ATTENTION_COMPOSED=1)";
  const test::GraphPoolScope pool;
  const DType dt = DType::bf16;
  const Tensor q = test::random_normal({1, 4, 128, 64}, dt, kGpu);
  const Tensor k = test::random_normal({1, 2, 128, 64}, dt, kGpu);
  kernels::AttentionOptions o, on_host;
  o.causal().varlen(lengths({0, 50, 128}));
  on_host.causal().varlen(host_offsets({0, 50, 128}));
  kernels::attention(q, k, k, o);  // the composed path's workspaces exist before the capture
  EXPECT_EQ(kernels::last_attention_path(), kernels::AttentionPath::composed);
  const kernels::AttentionResult eager = kernels::attention(q, k, k, on_host);
  EXPECT_EQ(kernels::last_attention_path(), kernels::AttentionPath::cudnn)
      << kernels::last_attention_refusal();
  const Tensor out = empty(eager.out.shape(), dt, kGpu);
  const Tensor lse = empty(eager.lse.shape(), DType::f32, kGpu);
  kernels::AttentionPath captured = kernels::AttentionPath::none;
  std::string refusal, why;
  const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(
      0,
      [&] {
        const kernels::AttentionResult r = kernels::attention(q, k, k, o);
        captured = kernels::last_attention_path();
        refusal = kernels::last_attention_refusal();
        out.copy_(r.out);
        lse.copy_(r.lse);
      },
      &why);
  ASSERT_TRUE(graph) << why;
  EXPECT_EQ(captured, kernels::AttentionPath::composed);
  EXPECT_THAT(refusal, ::testing::HasSubstr("CUDA-graph capture"));
  graph->launch();
  EXPECT_TRUE(close(out, eager.out, 2 * test::normalized_tolerance(dt)));
  EXPECT_TRUE(lse_matches(lse, reference_copy(eager.lse), 1e-4));
}

TEST_F(GpuAttention, mixed_devices_throw) {
  ACCRUE_REQUIRE_CUDA();
  Tensor q = test::random_normal({1, 2, 8, 16}, DType::f32, kGpu);
  Tensor k = test::random_normal({1, 2, 8, 16}, DType::f32, kCpu);
  EXPECT_ERROR(kernels::attention(q, k, q, kernels::AttentionOptions()),
               "scaled_dot_product_attention", "devices of q (cuda:0) and k (cpu) differ");
  kernels::AttentionResult r = kernels::attention(q, q, q, kernels::AttentionOptions());
  EXPECT_ERROR(kernels::attention_backward_into(
                   r.out, q, q, q, r.out, r.lse.to(kCpu), kernels::AttentionOptions(),
                   empty(q.shape(), DType::f32, kGpu), empty(q.shape(), DType::f32, kGpu),
                   empty(q.shape(), DType::f32, kGpu)),
               "scaled_dot_product_attention_backward", "lse is on cpu");
}

}  // namespace
}  // namespace accrue
