// The CUDA window close against the CPU reference (kernels/window_close.h):
// the same public calls on CPU tensors and on GPU copies of them, with fresh
// random inputs. The norm partials must match an f64 sum to 1e-6 relative and
// count non-finite elements exactly; the scalar step must write the same state;
// the fused optimizer must match the reference to about an ulp per step (the
// GPU may fuse a multiply-add) over several windows, on sizes with an odd tail
// and several groups, aligned or not. Determinism: two runs give the same bits.
// A skipped window leaves every buffer bitwise unchanged on the GPU too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "accrue/kernels/window_close.h"
#include "tests/kernels/optimizer_kinds.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using namespace kernels;  // NOLINT: the window-close names read better unqualified here

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor gpu(const Tensor& t) {
  return t.defined() ? t.to(kGpu) : Tensor();
}
Tensor cpu(const Tensor& t) {
  return t.defined() ? t.to(kCpu) : Tensor();
}

double field(const Tensor& state, WindowField f) {
  return state.to_vector<double>()[f];
}
void set_field(const Tensor& state, WindowField f, double value) {
  state.narrow(0, f, 1).fill_(value);
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = cpu(a).contiguous(), y = cpu(b).contiguous();
  if (x.dtype() != y.dtype() || x.shape() != y.shape())
    return ::testing::AssertionFailure() << "dtype or shape differs";
  if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// Within rtol of each element or rtol of the largest element: a rounding
// difference in a sum like b1 m + (1 - b1) g is an ulp of its largest term,
// which can be far more than an ulp of a result that cancelled.
::testing::AssertionResult close_at_scale(const Tensor& actual, const Tensor& expected,
                                          double rtol) {
  double scale = 0;
  for (double x : expected.to_vector<double>())
    scale = std::max(scale, std::fabs(x));
  return test::all_close(actual, expected, rtol, rtol * scale);
}

// (sum of squares, non-finite count) folded over the rows in order.
std::pair<double, double> fold(const Tensor& partials) {
  const std::vector<double> p = partials.to_vector<double>();
  double sumsq = 0, nonfinite = 0;
  for (size_t r = 0; r < p.size() / 2; ++r) {
    sumsq += p[2 * r];
    nonfinite += p[2 * r + 1];
  }
  return {sumsq, nonfinite};
}

Tensor norm_partials(const Tensor& grads) {
  const Tensor partials = empty({norm_partials_rows(grads), 2}, DType::f64, grads.device());
  test::poison(partials);
  grad_norm_partials(grads, partials);
  return partials;
}

// ---- norm partials -------------------------------------------------------------------------

const int64_t kSizes[] = {1, 3, 4, 4097, 1 << 20, 3000007};

TEST(GpuWindowClose, norm_partials_match_the_f64_reference_and_are_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64}) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      const Tensor g = test::random_normal({n}, dt, kCpu, 5.0);
      const Tensor g_gpu = gpu(g);
      const Tensor p1 = norm_partials(g_gpu), p2 = norm_partials(g_gpu);
      EXPECT_TRUE(bitwise_equal(p1, p2));
      const auto [expected, expected_bad] = fold(norm_partials(g));
      const auto [actual, bad] = fold(p1);
      EXPECT_NEAR(actual, expected, 1e-6 * expected);
      EXPECT_EQ(bad, 0.0);
      EXPECT_EQ(expected_bad, 0.0);
    }
  }
}

TEST(GpuWindowClose, norm_partials_count_non_finite_elements_exactly) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 3000007;
  std::vector<double> v = test::random_normal({n}, DType::f64).to_vector<double>();
  v[0] = kInf;
  v[12345] = -kInf;
  v[2000000] = kNaN;
  v[n - 1] = kNaN;  // in the tail after the last whole pack
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor g = gpu(from_vector(v, {n}, dt));
    EXPECT_EQ(fold(norm_partials(g)).second, 4.0) << dtype_name(dt);
  }
}

TEST(GpuWindowClose, misaligned_arena_gives_the_same_partials_bitwise) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 1000003;
  const Tensor base = gpu(test::random_normal({n + 1}));
  const Tensor misaligned = base.narrow(0, 1, n);  // 4 bytes past a 16-byte boundary
  const Tensor aligned = misaligned.clone();
  EXPECT_TRUE(bitwise_equal(norm_partials(misaligned), norm_partials(aligned)));
}

// ---- the scalar step -----------------------------------------------------------------------

TEST(GpuWindowClose, scalar_step_writes_the_state_the_cpu_writes) {
  ACCRUE_REQUIRE_CUDA();
  CloseConfig dynamic;
  test::set_dynamic_scaler(dynamic.scaler);
  dynamic.scaler.growth_interval = 2;
  dynamic.max_norm = 3.0;
  CloseConfig legacy = dynamic;
  legacy.normalization = Normalization::MeanOfMicroBatchMeans;
  legacy.micro_steps = 3;
  legacy.scaler.scaled = true;
  const std::vector<std::vector<double>> windows = {
      {1e8, 0, 2e8, 0}, {4e6, 0, 1e6, 0}, {1e9, 0, 5.0, 1.0}, {kInf, 0, 1, 0}, {3e7, 0, 1e5, 0}};
  for (const CloseConfig& config : {dynamic, legacy}) {
    const Tensor state = make_window_state(4096, kCpu);
    const Tensor state_gpu = make_window_state(4096, kGpu);
    for (const std::vector<double>& rows : windows) {
      const Tensor partials = from_vector(rows, {static_cast<int64_t>(rows.size() / 2), 2});
      set_field(state, kItems, 123);
      set_field(state_gpu, kItems, 123);
      window_scalar_step(partials, state, config);
      window_scalar_step(gpu(partials), state_gpu, config);
      EXPECT_TRUE(test::all_close(state_gpu, state, 1e-15, 0.0));
    }
    EXPECT_EQ(field(state_gpu, kSkippedWindows), 2.0);
    EXPECT_EQ(field(state_gpu, kStep), 3.0);
  }
}

// ---- the fused optimizer step --------------------------------------------------------------

struct Buffers {
  OptimizerBuffers cpu, gpu;
};

// Every buffer random; chunk groups in an uneven pattern over `groups` groups.
// The GPU buffers are copies of the CPU ones; `offset` > 0 makes every GPU
// buffer a view that starts `offset` elements into its allocation (misaligned).
Buffers make_buffers(int64_t n, DType dt, int groups, DType copy, int64_t offset = 0) {
  Buffers b;
  OptimizerBuffers& c = b.cpu;
  c.params = test::random_normal({n}, dt);
  c.grads = test::random_normal({n}, dt);
  c.exp_avg = test::random_normal({n}, dt, kCpu, 0.1);
  c.exp_avg_sq = test::random_uniform({n}, 0.001, 0.1, dt);
  c.max_exp_avg_sq = test::random_uniform({n}, 0.001, 0.1, dt);
  c.compute = empty({n}, copy);
  test::poison(c.compute);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int32_t> g(chunks);
  for (int64_t i = 0; i < chunks; ++i)
    g[i] = static_cast<int32_t>((i * 5 / 3 + i / 7) % groups);
  c.chunk_groups = from_vector(g, {chunks}, DType::i32);

  auto to_gpu = [&](const Tensor& t) {
    if (offset == 0) return gpu(t);
    const Tensor room = empty({t.numel() + offset}, t.dtype(), kGpu);
    const Tensor view = room.narrow(0, offset, t.numel());
    view.copy_(t);
    return view;
  };
  OptimizerBuffers& d = b.gpu;
  d.params = to_gpu(c.params);
  d.grads = to_gpu(c.grads);
  d.exp_avg = to_gpu(c.exp_avg);
  d.exp_avg_sq = to_gpu(c.exp_avg_sq);
  d.max_exp_avg_sq = to_gpu(c.max_exp_avg_sq);
  d.compute = to_gpu(c.compute);
  d.chunk_groups = gpu(c.chunk_groups);
  return b;
}

OptimizerConfig config_of(test::Kind kind, int groups) {
  OptimizerConfig c;
  test::set_kind(c, kind);
  c.beta1 = 0.85;
  c.beta2 = 0.98;
  c.eps = 1e-7;
  for (int k = 0; k < groups; ++k)
    c.groups.push_back({1e-2 / (k + 1), k % 2 == 0 ? 0.05 : 0.0});
  return c;
}

struct Variant {
  std::string name;
  OptimizerConfig config;
};

std::vector<Variant> variants(int groups) {
  OptimizerConfig sgd = config_of(test::Kind::SGD, groups);
  OptimizerConfig momentum = sgd, nesterov = sgd;
  momentum.momentum = 0.9;
  momentum.dampening = 0.2;
  nesterov.momentum = 0.8;
  nesterov.nesterov = true;
  OptimizerConfig adam = config_of(test::Kind::Adam, groups), adam_ams = adam;
  adam_ams.amsgrad = true;
  OptimizerConfig adamw = config_of(test::Kind::AdamW, groups), adamw_ams = adamw;
  adamw_ams.amsgrad = true;
  return {{"sgd", sgd},
          {"sgd_momentum", momentum},
          {"sgd_nesterov", nesterov},
          {"adam", adam},
          {"adam_amsgrad", adam_ams},
          {"adamw", adamw},
          {"adamw_amsgrad", adamw_ams}};
}

// Closes `windows` windows on both devices with the same raw gradients (scale
// 512, N = 64, clipping on), comparing the state and every buffer after each.
void expect_gpu_matches_cpu(const OptimizerConfig& opt, Buffers& b, int windows, double rtol,
                            double atol) {
  const int64_t n = b.cpu.params.numel();
  const DType dt = b.cpu.params.dtype();
  CloseConfig close;
  test::set_dynamic_scaler(close.scaler);
  close.max_norm = 0.5 * std::sqrt(static_cast<double>(n));  // clips the larger windows
  const Tensor state = make_window_state(512, kCpu), state_gpu = make_window_state(512, kGpu);
  for (int w = 0; w < windows; ++w) {
    SCOPED_TRACE("window " + std::to_string(w));
    const Tensor raw = test::random_normal({n}, dt, kCpu, 512.0 * 64 * (w % 2 ? 0.3 : 1.0));
    b.cpu.grads.copy_(raw);
    b.gpu.grads.copy_(raw);
    for (const Tensor& s : {state, state_gpu})
      set_field(s, kItems, 64);
    window_scalar_step(norm_partials(b.cpu.grads), state, close);
    window_scalar_step(norm_partials(b.gpu.grads), state_gpu, close);
    ASSERT_TRUE(test::all_close(state_gpu, state, 1e-12, 0.0));
    fused_optimizer_step(opt, b.cpu, state);
    fused_optimizer_step(opt, b.gpu, state_gpu);
    EXPECT_TRUE(test::all_close(b.gpu.params, b.cpu.params, rtol, atol)) << "params";
    if (opt.adam || opt.momentum != 0) {
      EXPECT_TRUE(close_at_scale(b.gpu.exp_avg, b.cpu.exp_avg, rtol)) << "exp_avg";
    }
    if (opt.adam) {
      EXPECT_TRUE(test::all_close(b.gpu.exp_avg_sq, b.cpu.exp_avg_sq, rtol, atol * atol))
          << "exp_avg_sq";
      EXPECT_TRUE(test::all_close(b.gpu.max_exp_avg_sq, b.cpu.max_exp_avg_sq, rtol, atol * atol))
          << "max_exp_avg_sq";
    }
    EXPECT_TRUE(test::all_equal(b.gpu.compute, b.gpu.params.to(b.gpu.compute.dtype())))
        << "compute copy";
  }
}

TEST(GpuWindowClose, fused_step_matches_the_cpu_over_windows_large_f32_bf16_copy) {
  ACCRUE_REQUIRE_CUDA();
  for (const Variant& v : variants(3)) {
    SCOPED_TRACE(v.name);
    Buffers b = make_buffers(3000007, DType::f32, 3, DType::bf16);
    expect_gpu_matches_cpu(v.config, b, 4, 1e-6, 1e-7);
  }
}

TEST(GpuWindowClose, fused_step_matches_the_cpu_f64_and_f16_copy) {
  ACCRUE_REQUIRE_CUDA();
  for (const Variant& v : variants(8)) {
    SCOPED_TRACE(v.name);
    Buffers b = make_buffers(100003, DType::f64, 8, DType::f16);
    expect_gpu_matches_cpu(v.config, b, 3, 1e-13, 1e-15);
  }
}

TEST(GpuWindowClose, fused_step_on_misaligned_buffers_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (const Variant& v : variants(2)) {
    SCOPED_TRACE(v.name);
    Buffers b = make_buffers(70001, DType::f32, 2, DType::bf16, /*offset=*/1);
    expect_gpu_matches_cpu(v.config, b, 3, 1e-6, 1e-7);
  }
}

// Note [ZeRO-1]: ranges of one arena stepped on the GPU against the whole
// arena's chunk table (first_element = the range's offset; offsets that are
// not a multiple of a pack take the scalar path) match the CPU's ranges.
TEST(GpuWindowClose, fused_step_of_ranges_with_first_element_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (const Variant& v : variants(3)) {
    SCOPED_TRACE(v.name);
    const Buffers whole = make_buffers(200003, DType::f32, 3, DType::bf16);
    for (auto [offset, numel] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 65536}, {65536, 70001}, {135537, 64466}}) {
      SCOPED_TRACE("range at " + std::to_string(offset));
      Buffers b;
      b.cpu = whole.cpu;
      b.gpu = whole.gpu;
      for (OptimizerBuffers* side : {&b.cpu, &b.gpu}) {
        for (Tensor* t : {&side->params, &side->grads, &side->exp_avg, &side->exp_avg_sq,
                          &side->max_exp_avg_sq, &side->compute})
          *t = t->narrow(0, offset, numel);
        side->first_element = offset;
      }
      expect_gpu_matches_cpu(v.config, b, 2, 1e-6, 1e-7);
    }
  }
}

TEST(GpuWindowClose, fused_step_is_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  const OptimizerConfig opt = variants(3)[6].config;  // AdamW with amsgrad
  Buffers b = make_buffers(1 << 20, DType::f32, 3, DType::bf16);
  const OptimizerBuffers& d = b.gpu;
  OptimizerBuffers twin = d;
  twin.params = d.params.clone();
  twin.exp_avg = d.exp_avg.clone();
  twin.exp_avg_sq = d.exp_avg_sq.clone();
  twin.max_exp_avg_sq = d.max_exp_avg_sq.clone();
  twin.compute = d.compute.clone();
  const Tensor state = make_window_state(1, kGpu);
  set_field(state, kItems, 10);
  window_scalar_step(norm_partials(d.grads), state, CloseConfig{});
  fused_optimizer_step(opt, d, state);
  fused_optimizer_step(opt, twin, state);
  EXPECT_TRUE(bitwise_equal(d.params, twin.params));
  EXPECT_TRUE(bitwise_equal(d.exp_avg, twin.exp_avg));
  EXPECT_TRUE(bitwise_equal(d.exp_avg_sq, twin.exp_avg_sq));
  EXPECT_TRUE(bitwise_equal(d.max_exp_avg_sq, twin.max_exp_avg_sq));
  EXPECT_TRUE(bitwise_equal(d.compute, twin.compute));
}

TEST(GpuWindowClose, skipped_window_leaves_every_buffer_bitwise_unchanged) {
  ACCRUE_REQUIRE_CUDA();
  for (const Variant& v : variants(2)) {
    SCOPED_TRACE(v.name);
    const int64_t n = 300001;
    Buffers b = make_buffers(n, DType::f32, 2, DType::bf16);
    const OptimizerBuffers& d = b.gpu;
    const Tensor state = make_window_state(2048, kGpu);
    set_field(state, kItems, 7);
    set_field(state, kStep, 3);
    std::vector<double> raw = test::random_normal({n}).to_vector<double>();
    raw[n / 3] = kNaN;
    d.grads.copy_(from_vector(raw, {n}, DType::f32));
    const Tensor p = d.params.clone(), m = d.exp_avg.clone(), s = d.exp_avg_sq.clone(),
                 vmax = d.max_exp_avg_sq.clone(), copy = d.compute.clone();
    CloseConfig close;
    test::set_dynamic_scaler(close.scaler);
    window_scalar_step(norm_partials(d.grads), state, close);
    fused_optimizer_step(v.config, d, state);
    EXPECT_EQ(field(state, kFoundInf), 1.0);
    EXPECT_EQ(field(state, kStep), 3.0);
    EXPECT_EQ(field(state, kScale), 1024.0);
    EXPECT_TRUE(bitwise_equal(d.params, p));
    EXPECT_TRUE(bitwise_equal(d.exp_avg, m));
    EXPECT_TRUE(bitwise_equal(d.exp_avg_sq, s));
    EXPECT_TRUE(bitwise_equal(d.max_exp_avg_sq, vmax));
    EXPECT_TRUE(bitwise_equal(d.compute, copy)) << "the compute copy is not written either";
  }
}

// Note [Scale calibration]: the CUDA kernel writes the CPU's scale and
// tracker, exactly (powers of two), for amax values from tiny to non-finite,
// with and without a skipped window.
TEST(GpuWindowClose, calibrated_scale_matches_the_cpu_exactly) {
  ACCRUE_REQUIRE_CUDA();
  kernels::ScalerConfig scaler;
  scaler.scaled = scaler.dynamic = true;
  scaler.max_scale = 1 << 20;
  Generator gen(17);
  std::vector<double> amaxes = {0.0, 1e-30, 1e-3, 0.83, 1.0, 65504.0, 1e9, INFINITY, NAN};
  for (double v : rand({20}, DType::f64, Device::cpu(), &gen).to_vector<double>())
    amaxes.push_back(std::exp(30.0 * v - 15.0));  // fresh values over 13 decades
  for (double found_inf : {0.0, 1.0}) {
    for (double amax : amaxes) {
      for (double margin : {1.0, 8.0, 100.0}) {
        Tensor cpu_state = kernels::make_window_state(2.0, Device::cpu());
        cpu_state.narrow(0, kernels::kFoundInf, 1).fill_(found_inf);
        cpu_state.narrow(0, kernels::kGrowthTracker, 1).fill_(7.0);
        Tensor gpu_state = cpu_state.to(kGpu);
        const Tensor a = from_vector<double>({amax}, {1});
        kernels::calibrate_loss_scale(a, cpu_state, scaler, 2.0, margin);
        kernels::calibrate_loss_scale(a.to(kGpu), gpu_state, scaler, 2.0, margin);
        EXPECT_EQ(gpu_state.to(Device::cpu()).to_vector<double>(), cpu_state.to_vector<double>())
            << "amax " << amax << " margin " << margin << " found_inf " << found_inf;
      }
    }
  }
}

TEST(GpuWindowClose, buffers_on_different_devices_are_rejected) {
  ACCRUE_REQUIRE_CUDA();
  Buffers b = make_buffers(100, DType::f32, 1, DType::bf16);
  OptimizerBuffers mixed = b.gpu;
  mixed.exp_avg = b.cpu.exp_avg;
  EXPECT_THROW(
      fused_optimizer_step(config_of(test::Kind::Adam, 1), mixed, make_window_state(1, kGpu)),
      Error);
  EXPECT_THROW(
      fused_optimizer_step(config_of(test::Kind::Adam, 1), b.gpu, make_window_state(1, kCpu)),
      Error);
  EXPECT_THROW(grad_norm_partials(b.gpu.grads, empty({1, 2}, DType::f64)), Error);
}

// ---- Note [Unused parameters] ------------------------------------------------------------

// The tables of UnusedParameters::skip over `chunks` chunks: slot s holds
// chunks [37 s, 37 s + 37); per-slot step counts start at s % 5.
struct SlotTablesOf {
  Tensor chunk_slots, used, steps;
  int64_t slots = 0;
};
SlotTablesOf make_slot_tables(int64_t n, Device device) {
  SlotTablesOf t;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int32_t> table(chunks);
  for (int64_t c = 0; c < chunks; ++c)
    table[c] = static_cast<int32_t>(c / 37);
  t.slots = table.back() + 1;
  std::vector<double> rows(3 * t.slots, 0.0);
  for (int64_t s = 0; s < t.slots; ++s)
    rows[3 * s] = static_cast<double>(s % 5);
  t.chunk_slots = from_vector(table, {chunks}, DType::i32, device);
  t.used = zeros({t.slots}, DType::f64, device);
  t.steps = from_vector(rows, {t.slots, 3}, DType::f64, device);
  return t;
}

void attach(OptimizerBuffers& b, const SlotTablesOf& t) {
  b.chunk_slots = t.chunk_slots;
  b.slot_used = t.used;
  b.slot_steps = t.steps;
}

// Under skip the CUDA pass equals the CPU reference on fresh random inputs
// (f32 within 1e-6), over several windows with a changing used pattern (more
// than 1024 slots: several flag launches), and leaves every unused slot's
// weights, compute copy, moments and step count bitwise unchanged.
TEST(GpuWindowClose, skip_unused_slots_matches_the_cpu_and_leaves_them_bitwise_unchanged) {
  ACCRUE_REQUIRE_CUDA();
  for (const Variant& v : variants(3)) {
    SCOPED_TRACE(v.name);
    const int64_t n = 3000007;
    Buffers b = make_buffers(n, DType::f32, 3, DType::bf16);
    const SlotTablesOf cpu_tables = make_slot_tables(n, kCpu),
                       gpu_tables = make_slot_tables(n, kGpu);
    ASSERT_GT(cpu_tables.slots, 1024);
    attach(b.cpu, cpu_tables);
    attach(b.gpu, gpu_tables);
    const Tensor state = make_window_state(1, kCpu), state_gpu = make_window_state(1, kGpu);
    for (int w = 0; w < 3; ++w) {
      SCOPED_TRACE("window " + std::to_string(w));
      std::vector<bool> written(static_cast<size_t>(cpu_tables.slots));
      for (int64_t s = 0; s < cpu_tables.slots; ++s)
        written[s] = s != 0 && (s * 7 + w) % 3 != 0;
      const Tensor raw = test::random_normal({n}, DType::f32, kCpu, 64.0);
      b.cpu.grads.copy_(raw);
      b.gpu.grads.copy_(raw);
      const Tensor p0 = cpu(b.gpu.params), m0 = cpu(b.gpu.exp_avg), v0 = cpu(b.gpu.exp_avg_sq),
                   x0 = cpu(b.gpu.max_exp_avg_sq), c0 = cpu(b.gpu.compute),
                   t0 = cpu(gpu_tables.steps);
      for (const Tensor& s : {state, state_gpu})
        set_field(s, kItems, 64);
      store_slot_flags(written, cpu_tables.used);
      store_slot_flags(written, gpu_tables.used);
      ASSERT_TRUE(test::all_equal(cpu(gpu_tables.used), cpu_tables.used));
      window_scalar_step(norm_partials(b.cpu.grads), state, CloseConfig{});
      window_scalar_step(norm_partials(b.gpu.grads), state_gpu, CloseConfig{});
      advance_slot_steps(v.config, cpu_tables.used, cpu_tables.steps, state);
      advance_slot_steps(v.config, gpu_tables.used, gpu_tables.steps, state_gpu);
      EXPECT_TRUE(test::all_close(gpu_tables.steps, cpu_tables.steps, 1e-15, 0.0));
      fused_optimizer_step(v.config, b.cpu, state);
      fused_optimizer_step(v.config, b.gpu, state_gpu);
      EXPECT_TRUE(test::all_close(b.gpu.params, b.cpu.params, 1e-6, 1e-7)) << "params";
      if (v.config.adam || v.config.momentum != 0) {
        EXPECT_TRUE(close_at_scale(b.gpu.exp_avg, b.cpu.exp_avg, 1e-6)) << "exp_avg";
      }
      if (v.config.adam) {
        EXPECT_TRUE(test::all_close(b.gpu.exp_avg_sq, b.cpu.exp_avg_sq, 1e-6, 1e-14));
        EXPECT_TRUE(test::all_close(b.gpu.max_exp_avg_sq, b.cpu.max_exp_avg_sq, 1e-6, 1e-14));
      }
      // Bitwise: every element of an unused slot, in every buffer, and its count.
      const std::vector<float> p = cpu(b.gpu.params).to_vector<float>(), pb = p0.to_vector<float>(),
                               m = cpu(b.gpu.exp_avg).to_vector<float>(),
                               mb = m0.to_vector<float>(),
                               vv = cpu(b.gpu.exp_avg_sq).to_vector<float>(),
                               vb = v0.to_vector<float>(),
                               x = cpu(b.gpu.max_exp_avg_sq).to_vector<float>(),
                               xb = x0.to_vector<float>();
      const std::vector<double> c = cpu(b.gpu.compute).to_vector<double>(),
                                cb = c0.to_vector<double>(),
                                t = cpu(gpu_tables.steps).to_vector<double>(),
                                tb = t0.to_vector<double>();
      int64_t unused_elements = 0, changed = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = (i / kChunk) / 37;
        if (written[s]) continue;
        ++unused_elements;
        changed += std::memcmp(&p[i], &pb[i], sizeof(float)) != 0;
        changed += std::memcmp(&m[i], &mb[i], sizeof(float)) != 0;
        changed += std::memcmp(&vv[i], &vb[i], sizeof(float)) != 0;
        changed += std::memcmp(&x[i], &xb[i], sizeof(float)) != 0;
        changed += std::memcmp(&c[i], &cb[i], sizeof(double)) != 0;
      }
      EXPECT_GT(unused_elements, 0);
      EXPECT_EQ(changed, 0) << "values of unused slots changed";
      for (int64_t s = 0; s < gpu_tables.slots; ++s) {
        const double expected = written[s] ? tb[3 * s] + 1 : tb[3 * s];
        ASSERT_EQ(t[3 * s], expected) << "slot " << s << "'s step count";
      }
    }
  }
}

// A copy of every buffer the pass writes, sharing the read-only tables.
OptimizerBuffers writable_copy(const OptimizerBuffers& b) {
  OptimizerBuffers c = b;
  for (Tensor* t : {&c.params, &c.exp_avg, &c.exp_avg_sq, &c.max_exp_avg_sq, &c.compute})
    if (t->defined()) *t = t->clone();
  return c;
}

// Note [Step sums] on CUDA: each chunk's row within 1e-12 of the CPU
// reference's (the same sums added in another order), bitwise the same on a
// second run, and the update bitwise the one without the sums; f32 and f64,
// every optimizer, under skip with unused slots (their rows (g^2, 0, p^2)).
TEST(GpuWindowClose, step_sums_match_the_cpu_and_leave_the_update_bitwise_unchanged) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Variant& v : variants(3)) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + v.name);
      const int64_t n = 37 * kChunk * 600, chunks = n / kChunk;  // whole chunks
      Buffers b = make_buffers(n, dt, 3, DType::bf16);
      const SlotTablesOf cpu_tables = make_slot_tables(n, kCpu),
                         gpu_tables = make_slot_tables(n, kGpu);
      attach(b.cpu, cpu_tables);
      attach(b.gpu, gpu_tables);
      std::vector<bool> written(static_cast<size_t>(cpu_tables.slots));
      for (int64_t s = 0; s < cpu_tables.slots; ++s)
        written[s] = s % 4 != 1;
      store_slot_flags(written, cpu_tables.used);
      store_slot_flags(written, gpu_tables.used);
      const Tensor state = make_window_state(1, kCpu);
      set_field(state, kItems, 64);
      window_scalar_step(norm_partials(b.cpu.grads), state, CloseConfig{});
      const Tensor state_gpu = gpu(state);
      advance_slot_steps(v.config, cpu_tables.used, cpu_tables.steps, state);
      advance_slot_steps(v.config, gpu_tables.used, gpu_tables.steps, state_gpu);

      OptimizerBuffers plain = writable_copy(b.gpu), with = writable_copy(b.gpu),
                       again = writable_copy(b.gpu);
      for (OptimizerBuffers* x : {&with, &again}) {
        x->step_sums = empty({chunks, 3}, DType::f64, kGpu);
        test::poison(x->step_sums);
      }
      b.cpu.step_sums = empty({chunks, 3}, DType::f64);
      test::poison(b.cpu.step_sums);
      fused_optimizer_step(v.config, plain, state_gpu);
      fused_optimizer_step(v.config, with, state_gpu);
      fused_optimizer_step(v.config, again, state_gpu);
      fused_optimizer_step(v.config, b.cpu, state);
      EXPECT_TRUE(bitwise_equal(with.params, plain.params)) << "params";
      EXPECT_TRUE(bitwise_equal(with.exp_avg, plain.exp_avg)) << "exp_avg";
      EXPECT_TRUE(bitwise_equal(with.exp_avg_sq, plain.exp_avg_sq)) << "exp_avg_sq";
      EXPECT_TRUE(bitwise_equal(with.max_exp_avg_sq, plain.max_exp_avg_sq)) << "max_exp_avg_sq";
      EXPECT_TRUE(bitwise_equal(with.compute, plain.compute)) << "compute";
      EXPECT_TRUE(bitwise_equal(with.step_sums, again.step_sums)) << "a second run differs";
      // The update column: f32 updates round differently on the two devices
      // (fused multiply-adds), so it is compared at the f32 rounding of the
      // weights; the gradient and weight columns read the same inputs.
      const std::vector<double> g = cpu(with.step_sums).to_vector<double>(),
                                c = b.cpu.step_sums.to_vector<double>();
      const double update_tol = dt == DType::f32 ? 2e-3 : 1e-9;
      for (int64_t k = 0; k < chunks; ++k) {
        ASSERT_NEAR(g[3 * k], c[3 * k], 1e-12 * c[3 * k]) << "chunk " << k << " |g|^2";
        ASSERT_NEAR(g[3 * k + 1], c[3 * k + 1], update_tol * c[3 * k + 1] + 1e-300)
            << "chunk " << k << " |update|^2";
        ASSERT_NEAR(g[3 * k + 2], c[3 * k + 2], 1e-12 * c[3 * k + 2]) << "chunk " << k << " |p|^2";
        if (!written[(k / 37)]) {
          ASSERT_EQ(g[3 * k + 1], 0.0) << "chunk " << k << " is unused";
        }
      }
    }
  }
}

// step_sums_per_slot on CUDA against the CPU: slots of many chunks (more
// than a block's threads), one and none; after a skipped window, the sums
// of the arena itself, a NaN gradient making its slot's |g|^2 infinite.
TEST(GpuWindowClose, step_sums_per_slot_matches_the_cpu_and_reads_a_skipped_windows_arena) {
  ACCRUE_REQUIRE_CUDA();
  // Slot 3 spans several of the fold's tiles of 2048 chunks, and slot 0 ends inside one.
  const int64_t chunks = 12000, n = chunks * kChunk;
  const Tensor rows = test::random_uniform({chunks, 3}, 0.0, 1.0, DType::f64);
  const Tensor ranges =
      from_vector<int64_t>({0, 2000, 2000, 2000, 2000, 2001, 2001, 12000}, {4, 2}, DType::i64);
  std::vector<double> raw = test::random_normal({n}, DType::f64).to_vector<double>();
  raw[9000 * kChunk + 5] = kNaN;
  const Tensor grads = from_vector(raw, {n}, DType::f32), params = test::random_normal({n});
  for (double found_inf : {0.0, 1.0}) {
    SCOPED_TRACE(found_inf);
    const Tensor state = make_window_state(1, kCpu);
    set_field(state, kFoundInf, found_inf);
    const Tensor out = empty({4, 3}, DType::f64), out_gpu = empty({4, 3}, DType::f64, kGpu),
                 again = empty({4, 3}, DType::f64, kGpu);
    step_sums_per_slot(rows, ranges, grads, params, state, out);
    step_sums_per_slot(gpu(rows), gpu(ranges), gpu(grads), gpu(params), gpu(state), out_gpu);
    step_sums_per_slot(gpu(rows), gpu(ranges), gpu(grads), gpu(params), gpu(state), again);
    EXPECT_TRUE(bitwise_equal(out_gpu, again)) << "a second run differs";
    const std::vector<double> c = out.to_vector<double>(), g = cpu(out_gpu).to_vector<double>();
    for (size_t i = 0; i < c.size(); ++i) {
      if (std::isinf(c[i])) {
        EXPECT_EQ(g[i], c[i]) << i;
      } else {
        EXPECT_NEAR(g[i], c[i], 1e-12 * c[i]) << i;
      }
    }
    EXPECT_EQ(c[3 * 3], found_inf != 0.0 ? kInf : c[3 * 3]);  // slot 3 holds the NaN
  }
}

}  // namespace
}  // namespace accrue
