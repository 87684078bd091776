// The CUDA matrix products (cuBLASLt) against the CPU reference: the same
// public API (kernels::matmul, kernels::gemm) on CPU tensors and on copies of
// them on the GPU, with fresh random inputs. Integer-valued inputs with short
// sums are exact in fp32, so those cases compare bit for bit.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifdef ACCRUE_WITH_CUDA
#include "accrue/kernels/cuda/tuning.h"  // the tuning file exists in CUDA builds only
#endif
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::Tf32Scope;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

Tensor on_cpu(const Tensor& t) {
  return t.to(kCpu);
}

// Builds the operand a test multiplies from the stored tensor, on each side
// after the transfer: Tensor::to copies into contiguous memory, so a transposed
// or narrowed view must be made on the GPU copy to reach the kernel as a view.
using View = std::function<Tensor(const Tensor&)>;
Tensor as_stored(const Tensor& t) {
  return t;
}
Tensor transposed(const Tensor& t) {
  return t.transpose(-2, -1);
}

// matmul(view_a(a), view_b(b)) on the CPU against the same on GPU copies.
::testing::AssertionResult matmul_matches_cpu(const Tensor& a, const Tensor& b, double tolerance,
                                              bool exact, const View& view_a = as_stored,
                                              const View& view_b = as_stored) {
  const Tensor expected = kernels::matmul(view_a(a), view_b(b));
  const Tensor actual = on_cpu(kernels::matmul(view_a(a.to(kGpu)), view_b(b.to(kGpu))));
  if (exact) return test::all_equal(actual, expected);
  const double err = test::relative_error(actual, expected);
  if (err <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err << " > " << tolerance;
}

// The largest integer up to which every integer is exact in dtype: a product of
// small integers whose sums stay below it is exact however cuBLASLt splits K
// (split-K may round partial sums to the output dtype).
double exact_integer_limit(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 9007199254740992.0;
    case DType::f32:
      return 16777216.0;
    case DType::f16:
      return 2048.0;
    default:
      return 256.0;  // bf16
  }
}

TEST(GpuMatmul, gpt2_shapes_match_cpu_in_every_dtype) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({256, 768}, dt);
    const Tensor w = test::random_normal({768, 3072}, dt, kCpu, 0.05);
    EXPECT_TRUE(matmul_matches_cpu(x, w, test::normalized_tolerance(dt), false));
    // The backward shapes: dx = dy @ w^T and dw = x^T @ dy, as transposed views.
    const Tensor dy = test::random_normal({256, 3072}, dt);
    EXPECT_TRUE(
        matmul_matches_cpu(dy, w, test::normalized_tolerance(dt), false, as_stored, transposed));
    EXPECT_TRUE(
        matmul_matches_cpu(x, dy, test::normalized_tolerance(dt), false, transposed, as_stored));
  }
}

TEST(GpuMatmul, odd_sizes_are_exact_on_small_integers) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  const int64_t sizes[][3] = {{1, 1, 1},   {1, 7, 5},     {3, 1, 9},   {13, 17, 1},
                              {33, 65, 7}, {127, 1, 129}, {5, 3, 301}, {97, 131, 67}};
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
    for (DType dt : kFloatTypes) {
      // Entries in [-r, r] with k * r^2 below the dtype's exact-integer limit.
      int r = 4;
      while (r > 1 && static_cast<double>(k) * r * r > exact_integer_limit(dt))
        --r;
      if (static_cast<double>(k) * r * r > exact_integer_limit(dt)) continue;
      const Tensor a = test::random_integers({m, k}, -r, r, dt);
      const Tensor b = test::random_integers({k, n}, -r, r, dt);
      EXPECT_TRUE(matmul_matches_cpu(a, b, 0.0, true)) << dtype_name(dt);
    }
    // And random normals for the rounding paths.
    EXPECT_TRUE(matmul_matches_cpu(test::random_normal({m, k}), test::random_normal({k, n}),
                                   test::normalized_tolerance(DType::f32), false));
  }
}

TEST(GpuMatmul, transposed_views_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  const int64_t m = 45, n = 29, k = 71;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string("a ") + (ta ? "T" : "N") + ", b " + (tb ? "T" : "N"));
      // Stored transposed and used as a view: stride(-2) == 1, CUBLAS_OP_T.
      const Tensor sa = test::random_integers(ta ? Shape{k, m} : Shape{m, k}, -5, 5);
      const Tensor sb = test::random_integers(tb ? Shape{n, k} : Shape{k, n}, -5, 5);
      EXPECT_TRUE(matmul_matches_cpu(sa, sb, 0.0, true, ta ? transposed : as_stored,
                                     tb ? transposed : as_stored));
      // The same through gemm's transpose flags.
      Tensor expected = empty({m, n});
      kernels::gemm(sa, ta, sb, tb, expected, 1.0, 0.0);
      Tensor actual = empty({m, n}, DType::f32, kGpu);
      test::poison(actual);
      kernels::gemm(sa.to(kGpu), ta, sb.to(kGpu), tb, actual, 1.0, 0.0);
      EXPECT_TRUE(test::all_equal(on_cpu(actual), expected));
    }
  }
}

TEST(GpuMatmul, batched_and_broadcast_batches_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  struct Case {
    Shape a, b;
    bool transpose_b;
  };
  const Case cases[] = {
      {{4, 33, 17}, {4, 17, 9}, false},       // plain strided batch
      {{4, 33, 17}, {17, 9}, false},          // shared b: folded into one GEMM
      {{33, 17}, {4, 17, 9}, false},          // shared a: batch stride 0
      {{2, 3, 8, 17}, {3, 17, 5}, false},     // broadcast over a leading dim
      {{2, 1, 8, 17}, {1, 3, 17, 5}, false},  // both broadcast
      {{4, 33, 17}, {4, 9, 17}, true},        // transposed batched b (stored [4, 9, 17])
      {{6, 1, 40}, {40, 7}, false},           // M = 1 per batch
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.a) + " @ " + shape_str(c.b) + (c.transpose_b ? "^T" : ""));
    const View view_b = c.transpose_b ? transposed : as_stored;
    const Tensor a = test::random_integers(c.a, -6, 6);
    const Tensor b = test::random_integers(c.b, -6, 6);
    EXPECT_TRUE(matmul_matches_cpu(a, b, 0.0, true, as_stored, view_b));
    // K <= 40 and entries in [-2, 2]: sums within bf16's exact integers.
    const Tensor a16 = test::random_integers(c.a, -2, 2, DType::bf16);
    const Tensor b16 = test::random_integers(c.b, -2, 2, DType::bf16);
    EXPECT_TRUE(matmul_matches_cpu(a16, b16, 0.0, true, as_stored, view_b));
    EXPECT_TRUE(matmul_matches_cpu(test::random_normal(c.a), test::random_normal(c.b),
                                   test::normalized_tolerance(DType::f32), false, as_stored,
                                   view_b));
  }
}

TEST(GpuMatmul, misaligned_narrowed_views_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  // Narrowing by one column moves the base pointer off every alignment above
  // the element size; cuBLASLt must be told, not assume 256 bytes.
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // K = 63 and entries in [-2, 2]: sums within bf16's exact integers.
    const Tensor a = test::random_integers({37, 70}, -2, 2, dt);
    const Tensor b = test::random_integers({65, 51}, -2, 2, dt);
    EXPECT_TRUE(matmul_matches_cpu(
        a, b, 0.0, true, [](const Tensor& t) { return t.narrow(1, 1, 63); },
        [](const Tensor& t) { return t.narrow(0, 1, 63).narrow(1, 3, 41); }));
    // Misaligned and transposed: a stored [70, 37], used as a narrowed transposed view.
    const Tensor at = test::random_integers({70, 37}, -2, 2, dt);
    EXPECT_TRUE(matmul_matches_cpu(
        at, b, 0.0, true, [](const Tensor& t) { return t.narrow(0, 1, 63).transpose(0, 1); },
        [](const Tensor& t) { return t.narrow(0, 1, 63).narrow(1, 3, 41); }));
  }
}

TEST(GpuMatmul, gemm_writes_with_beta_zero_without_reading_nan) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = test::random_normal({64, 80}, dt);
    const Tensor b = test::random_normal({80, 48}, dt);
    Tensor expected = empty({64, 48}, dt);
    test::poison(expected);
    kernels::gemm(a, false, b, false, expected, 0.75, 0.0);
    Tensor actual = empty({64, 48}, dt, kGpu);
    test::poison(actual);
    kernels::gemm(a.to(kGpu), false, b.to(kGpu), false, actual, 0.75, 0.0);
    const Tensor got = on_cpu(actual);
    for (double v : got.to_vector<double>())
      ASSERT_TRUE(std::isfinite(v)) << "beta = 0 read the NaN-poisoned output";
    EXPECT_LE(test::relative_error(got, expected), test::normalized_tolerance(dt));
  }
}

// Note [Fused weight-gradient accumulation]: bf16/f16 inputs, fp32 compute,
// an fp32 output that is overwritten (beta 0) then accumulated into (beta 1).
TEST(GpuMatmul, gemm_16bit_inputs_accumulate_into_f32) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    // dW [in, out] = x^T @ dy with x [tokens, in], dy [tokens, out].
    const int64_t tokens = 200, in = 96, out = 72;
    const Tensor x = test::random_normal({tokens, in}, dt);
    const Tensor dy = test::random_normal({tokens, out}, dt);
    const Tensor x_gpu = x.to(kGpu), dy_gpu = dy.to(kGpu);
    const Tensor start = test::random_normal({in, out}, DType::f32);
    Tensor expected = start.clone();
    Tensor actual = start.to(kGpu);
    // Overwrite, accumulate, accumulate with a scale: the pattern of a window.
    const double coefficients[][2] = {{1.0, 0.0}, {1.0, 1.0}, {0.5, 1.0}, {2.0, 0.25}};
    for (const auto& c : coefficients) {
      kernels::gemm(x, true, dy, false, expected, c[0], c[1]);
      kernels::gemm(x_gpu, true, dy_gpu, false, actual, c[0], c[1]);
      EXPECT_LE(test::relative_error(on_cpu(actual), expected), 1e-5)
          << "alpha " << c[0] << " beta " << c[1];
    }
    // Small integers: exact, including the accumulation onto existing values.
    const Tensor xi = test::random_integers({tokens, in}, -3, 3, dt);
    const Tensor dyi = test::random_integers({tokens, out}, -3, 3, dt);
    const Tensor base = test::random_integers({in, out}, -100, 100, DType::f32);
    Tensor e = base.clone();
    Tensor g = base.to(kGpu);
    kernels::gemm(xi, true, dyi, false, e, 1.0, 1.0);
    kernels::gemm(xi.to(kGpu), true, dyi.to(kGpu), false, g, 1.0, 1.0);
    EXPECT_TRUE(test::all_equal(on_cpu(g), e));
  }
}

#ifdef ACCRUE_WITH_CUDA
// Note [Tuning file], the file's logic alone (no GPU needed, but a CUDA
// build: the tuning code is CUDA's): a recorded line is read back, whatever
// the key; a new line is chosen once and appended; a choice that declines
// (inside a capture) is returned as nullopt and not recorded; with no file,
// choices live in memory.
TEST(TuningFile, reads_recorded_choices_and_records_new_ones_once) {
  const std::string file =
      (std::filesystem::temp_directory_path() / "accrue_tuning_file_test.txt").string();
  std::remove(file.c_str());
  {
    std::ofstream out(file);
    out << "problem_a,lib1,GPU_X,2\n"
        << "not a line\n";
  }
  int asked = 0;
  auto choose = [&](std::optional<int> answer) {
    return [&asked, answer]() {
      ++asked;
      return answer;
    };
  };
  EXPECT_EQ(kernels::cuda::tuned_choice(file, "problem_a,lib1,GPU_X,", choose(7)), 2);
  EXPECT_EQ(asked, 0) << "the recorded line answers";
  EXPECT_EQ(kernels::cuda::tuned_choice(file, "problem_a,lib2,GPU_X,", choose(1)), 1);
  EXPECT_EQ(kernels::cuda::tuned_choice(file, "problem_a,lib2,GPU_X,", choose(5)), 1);
  EXPECT_EQ(asked, 1) << "chosen once";
  EXPECT_EQ(kernels::cuda::tuned_choice(file, "problem_b,lib1,GPU_X,", choose(std::nullopt)),
            std::nullopt);
  EXPECT_EQ(kernels::cuda::tuned_choice(file, "problem_b,lib1,GPU_X,", choose(3)), 3);
  EXPECT_EQ(asked, 3) << "a declined choice is asked again";
  std::vector<std::string> lines;
  {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);)
      lines.push_back(line);
  }
  EXPECT_EQ(lines, (std::vector<std::string>{"problem_a,lib1,GPU_X,2", "not a line",
                                             "problem_a,lib2,GPU_X,1", "problem_b,lib1,GPU_X,3"}));
  EXPECT_EQ(kernels::cuda::tuned_choice("", "problem_c,", choose(4)), 4);
  EXPECT_EQ(kernels::cuda::tuned_choice("", "problem_c,", choose(6)), 4) << "kept in memory";
  std::remove(file.c_str());
}
#endif  // ACCRUE_WITH_CUDA

// The weight-gradient GEMM x^T dy of integer-valued bf16 [tokens, in] and
// [tokens, out] added twice (beta 1) onto an integer-valued fp32 [in, out]:
// the GPU's sums equal the CPU's exactly after each call, whatever algorithm
// a tuned choice runs.
void expect_tuned_accumulation_exact(int64_t tokens, int64_t in, int64_t out) {
  const Tensor xi = test::random_integers({tokens, in}, -3, 3, DType::bf16);
  const Tensor dyi = test::random_integers({tokens, out}, -3, 3, DType::bf16);
  const Tensor base = test::random_integers({in, out}, -100, 100, DType::f32);
  Tensor e = base.clone();
  Tensor g = base.to(kGpu);
  for (int call = 0; call < 2; ++call) {
    kernels::gemm(xi, true, dyi, false, e, 1.0, 1.0);
    kernels::gemm(xi.to(kGpu), true, dyi.to(kGpu), false, g, 1.0, 1.0);
    EXPECT_TRUE(test::all_equal(on_cpu(g), e)) << "call " << call;
  }
}

// Note [GEMM autotuning]: the first call of a problem times cuBLASLt's
// candidates on a scratch output, so a beta-1 accumulation still adds onto
// the values it had, exactly; the choice is one line of the tuning file, and
// the next call of the problem reads it instead of timing again.
TEST(GpuMatmul, tuned_gemm_accumulates_exactly_and_records_its_choice) {
  ACCRUE_REQUIRE_CUDA();
  const std::string file =
      (std::filesystem::temp_directory_path() / "accrue_gemm_tuning_test.txt").string();
  std::remove(file.c_str());
  kernels::set_gemm_tuning_file(file);
  // Sizes no other test uses, so this problem's plan is made here.
  const int64_t tokens = 328, in = 136, out = 88;
  expect_tuned_accumulation_exact(tokens, in, out);
  kernels::set_gemm_tuning_file("");
  std::ifstream in_file(file);
  std::string line;
  int lines = 0;
  while (std::getline(in_file, line)) {
    ++lines;
    EXPECT_NE(line.find(",cublasLt"), std::string::npos) << line;
    // A cuBLASLt candidate's position (24 asked for), or -1: cublasGemmEx.
    const int choice = std::stoi(line.substr(line.rfind(',') + 1));
    EXPECT_TRUE(choice >= -1 && choice < 24) << line;
  }
  EXPECT_EQ(lines, 1) << "one problem, one recorded choice";
  std::remove(file.c_str());
}

#ifdef ACCRUE_WITH_CUDA
// Note [GEMM autotuning] without a file: with tuning in process on, a new
// problem's first call times the candidates and keeps the choice in memory
// (one more choice known, no file written), and its beta-1 accumulation
// still adds onto the values it had, exactly; off, a new problem is not
// timed.
TEST(GpuMatmul, in_process_tuning_keeps_one_choice_per_problem_in_memory) {
  ACCRUE_REQUIRE_CUDA();
  kernels::set_gemm_tuning_file("");
  const size_t known = kernels::cuda::tuned_choice_count("");
  // Sizes no other test uses, so these problems' plans are made here.
  const int64_t tokens = 376, in = 168, out = 56;
  kernels::set_gemm_tuning_in_process(true);
  EXPECT_TRUE(kernels::gemm_tuning_in_process());
  expect_tuned_accumulation_exact(tokens, in, out);
  EXPECT_EQ(kernels::cuda::tuned_choice_count(""), known + 1) << "one problem, one kept choice";
  kernels::set_gemm_tuning_in_process(false);
  expect_tuned_accumulation_exact(tokens, in, out + 8);
  EXPECT_EQ(kernels::cuda::tuned_choice_count(""), known + 1) << "off: nothing timed";
}
#endif  // ACCRUE_WITH_CUDA

// Note [GEMM SM margin]: GEMMs planned for fewer SMs (the plain GEMM at beta
// 1, the bias epilogue, the GELU epilogue) still compute exact sums on small
// integers, with and without the margin, and switching it back and forth
// reuses each target's plan (the same bits every time).
TEST(GpuMatmul, sm_margin_plans_give_exact_sums_and_switch_back_and_forth) {
  ACCRUE_REQUIRE_CUDA();
  // Sizes no other test uses, so these problems' plans are made here.
  const int64_t tokens = 1048, in = 392, out = 264;
  const Tensor x = test::random_integers({tokens, in}, -3, 3, DType::bf16);
  const Tensor w = test::random_integers({out, in}, -3, 3, DType::bf16);
  const Tensor b = test::random_integers({out}, -8, 8, DType::bf16);
  const Tensor dy = test::random_integers({tokens, out}, -3, 3, DType::bf16);
  const Tensor base = test::random_integers({in, out}, -100, 100, DType::f32);
  Tensor g_ref = base.clone();
  kernels::gemm(x, true, dy, false, g_ref, 1.0, 1.0);
  Tensor pre_ref;
  const Tensor gelu_ref = kernels::linear_gelu(x, w, b, &pre_ref);
  const Tensor x_gpu = x.to(kGpu), w_gpu = w.to(kGpu), b_gpu = b.to(kGpu), dy_gpu = dy.to(kGpu);
  // The epilogue rounds the exact fp32 sum once (the CPU twice): each margin's
  // output must equal the whole device's bit for bit, and the CPU's closely.
  Tensor y_whole, pre_whole;
  for (const int margin : {0, 40, 0, 40, 131}) {
    kernels::set_gemm_sm_margin(0, margin);
    Tensor g = base.to(kGpu);
    kernels::gemm(x_gpu, true, dy_gpu, false, g, 1.0, 1.0);
    EXPECT_TRUE(test::all_equal(on_cpu(g), g_ref)) << "weight-gradient GEMM, margin " << margin;
    const Tensor y = on_cpu(kernels::linear(x_gpu, w_gpu, b_gpu));
    if (!y_whole.defined()) y_whole = y;
    EXPECT_TRUE(test::all_equal(y, y_whole)) << "bias epilogue, margin " << margin;
    EXPECT_TRUE(test::all_close(y, kernels::linear(x, w, b), 1e-2, 1e-2)) << "margin " << margin;
    Tensor pre;
    const Tensor gelu = on_cpu(kernels::linear_gelu(x_gpu, w_gpu, b_gpu, &pre));
    if (!pre_whole.defined()) pre_whole = on_cpu(pre);
    EXPECT_TRUE(test::all_equal(on_cpu(pre), pre_whole))
        << "GELU epilogue's pre, margin " << margin;
    EXPECT_TRUE(test::all_close(gelu, gelu_ref, 2e-2, 2e-2)) << "GELU epilogue, margin " << margin;
  }
  kernels::set_gemm_sm_margin(0, 0);
}

// Note [GEMM autotuning]: a recorded -1 runs cublasGemmEx, which must give
// the same exact sums (integers) and accumulate at beta 1 as cuBLASLt does.
// The problem is made new by the output's alignment (part of the plan key):
// the test records one problem's line, rewrites it for an output 16 bytes off
// 256-byte alignment with the choice -1, and runs that problem.
TEST(GpuMatmul, a_gemm_tuned_to_cublas_gemm_ex_accumulates_exactly) {
  ACCRUE_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path();
  const std::string recorded = (dir / "accrue_gemm_ex_record.txt").string();
  const std::string forced = (dir / "accrue_gemm_ex_forced.txt").string();
  std::remove(recorded.c_str());
  std::remove(forced.c_str());
  // Sizes no other test uses.
  const int64_t tokens = 344, in = 152, out = 72;
  const Tensor xi = test::random_integers({tokens, in}, -3, 3, DType::bf16);
  const Tensor dyi = test::random_integers({tokens, out}, -3, 3, DType::bf16);
  const Tensor base = test::random_integers({in, out}, -100, 100, DType::f32);
  const Tensor x_gpu = xi.to(kGpu), dy_gpu = dyi.to(kGpu);
  kernels::set_gemm_tuning_file(recorded);
  Tensor aligned = base.to(kGpu);
  kernels::gemm(x_gpu, true, dy_gpu, false, aligned, 1.0, 1.0);
  std::string line;
  {
    std::ifstream in_file(recorded);
    ASSERT_TRUE(static_cast<bool>(std::getline(in_file, line))) << "nothing recorded";
  }
  // The output 4 floats into a fresh buffer: 16-byte aligned, a new plan key.
  Tensor buffer = empty({in * out + 64}, DType::f32, kGpu);
  Tensor g = buffer.narrow(0, 4, in * out).reshape({in, out});
  g.copy_(base.to(kGpu));
  const auto address = reinterpret_cast<uintptr_t>(g.data_ptr());
  ASSERT_EQ(address % 16, 0u);
  ASSERT_NE(address % 32, 0u);
  // The line's fields: 24 key values (align_c last), cuBLASLt's version, the GPU, the choice.
  std::vector<std::string> fields;
  std::stringstream split(line);
  for (std::string f; std::getline(split, f, ',');)
    fields.push_back(f);
  ASSERT_EQ(fields.size(), 27u) << line;
  fields[23] = "16";
  fields[26] = "-1";
  {
    std::ofstream out_file(forced);
    for (size_t i = 0; i < fields.size(); ++i)
      out_file << fields[i] << (i + 1 < fields.size() ? "," : "\n");
  }
  kernels::set_gemm_tuning_file(forced);
  Tensor e = base.clone();
  for (int call = 0; call < 2; ++call) {
    kernels::gemm(xi, true, dyi, false, e, 1.0, 1.0);
    kernels::gemm(x_gpu, true, dy_gpu, false, g, 1.0, 1.0);
    EXPECT_TRUE(test::all_equal(on_cpu(g), e)) << "call " << call;
  }
  kernels::set_gemm_tuning_file("");
  int lines = 0;
  std::ifstream check(forced);
  while (std::getline(check, line))
    ++lines;
  EXPECT_EQ(lines, 1) << "the forced choice was read, not timed again";
  std::remove(recorded.c_str());
  std::remove(forced.c_str());
}

TEST(GpuMatmul, gemm_alpha_beta_match_cpu_in_every_dtype) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = test::random_normal({31, 47}, dt);
    const Tensor b = test::random_normal({23, 47}, dt);  // used transposed
    const Tensor start = test::random_normal({31, 23}, dt);
    Tensor expected = start.clone();
    Tensor actual = start.to(kGpu);
    kernels::gemm(a, false, b, true, expected, -1.5, 0.5);
    kernels::gemm(a.to(kGpu), false, b.to(kGpu), true, actual, -1.5, 0.5);
    EXPECT_LE(test::relative_error(on_cpu(actual), expected), test::normalized_tolerance(dt));
  }
}

TEST(GpuMatmul, empty_inner_dimension_scales_the_output) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor a = empty({5, 0}, DType::f32, kGpu);
  const Tensor b = empty({0, 6}, DType::f32, kGpu);
  const Tensor start = test::random_normal({5, 6});
  const Tensor expected = kernels::binary_scalar(kernels::BinaryOp::Mul, start, 0.5);
  Tensor out = start.clone().to(kGpu);
  kernels::gemm(a, false, b, false, out, 1.0, 0.5);
  EXPECT_TRUE(test::all_equal(on_cpu(out), expected));
  test::poison(out);
  kernels::gemm(a, false, b, false, out, 1.0, 0.0);
  EXPECT_TRUE(test::all_equal(on_cpu(out), zeros({5, 6})));
  EXPECT_TRUE(test::all_equal(on_cpu(kernels::matmul(a, b)), zeros({5, 6})));
}

TEST(GpuMatmul, tf32_off_is_fp32_accurate_and_on_is_close) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor a = test::random_normal({256, 768});
  const Tensor b = test::random_normal({768, 1024});
  const Tensor expected = kernels::matmul(a, b);
  const Tensor a_gpu = a.to(kGpu), b_gpu = b.to(kGpu);
  double err_off = 0.0, err_on = 0.0;
  {
    Tf32Scope tf32(false);
    err_off = test::relative_error(on_cpu(kernels::matmul(a_gpu, b_gpu)), expected);
  }
  {
    Tf32Scope tf32(true);
    err_on = test::relative_error(on_cpu(kernels::matmul(a_gpu, b_gpu)), expected);
  }
  EXPECT_LE(err_off, 1e-5);
  // TF32 keeps 10 mantissa bits: about 1e-3 per product, less after the sum.
  EXPECT_LE(err_on, 5e-3);
  // Values that need more than TF32's 10 mantissa bits: exact only in true fp32.
  Tf32Scope tf32(false);
  const Tensor fine =
      kernels::binary_scalar(kernels::BinaryOp::Add, test::random_integers({16, 8}, -8, 8), 4096.0);
  const Tensor ones_k = ones({8, 4});
  EXPECT_TRUE(matmul_matches_cpu(fine, ones_k, 0.0, true));
}

TEST(GpuMatmul, repeated_products_are_bitwise_identical) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = test::random_normal({512, 768}, dt, kGpu);
    const Tensor b = test::random_normal({768, 768}, dt, kGpu);
    const Tensor first = on_cpu(kernels::matmul(a, b));
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(test::all_equal(on_cpu(kernels::matmul(a, b)), first));
  }
}

}  // namespace
}  // namespace accrue
