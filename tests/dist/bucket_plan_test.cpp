// Bucket plans (dist/bucket_plan.h) over GPT-2-sized and small arenas, and
// the layout fingerprint ranks compare before they communicate.
#include <algorithm>
#include <utility>

#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/variable.h"
#include "accrue/dist/bucket_plan.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

// Slots laid out as GradArena lays them out: 256-byte aligned, registration order.
struct Layout {
  std::vector<optim::ParamStore::Slot> slots;
  int64_t padded_numel = 0;
};

Layout layout(const std::vector<std::pair<std::string, Shape>>& params, size_t element_size = 4) {
  const int64_t per = static_cast<int64_t>(256 / element_size);
  Layout l;
  for (const auto& [name, shape] : params) {
    optim::ParamStore::Slot s{name, shape, l.padded_numel, shape_numel(shape),
                              contiguous_strides(shape)};
    l.padded_numel += (s.numel + per - 1) / per * per;
    l.slots.push_back(s);
  }
  return l;
}

// GPT-2 small (124M) in Hugging Face registration order.
Layout gpt2_layout() {
  const int64_t d = 768;
  std::vector<std::pair<std::string, Shape>> p = {{"wte", {50257, d}}, {"wpe", {1024, d}}};
  for (int i = 0; i < 12; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    p.push_back({h + "ln_1.weight", {d}});
    p.push_back({h + "ln_1.bias", {d}});
    p.push_back({h + "attn.c_attn.weight", {d, 3 * d}});
    p.push_back({h + "attn.c_attn.bias", {3 * d}});
    p.push_back({h + "attn.c_proj.weight", {d, d}});
    p.push_back({h + "attn.c_proj.bias", {d}});
    p.push_back({h + "ln_2.weight", {d}});
    p.push_back({h + "ln_2.bias", {d}});
    p.push_back({h + "mlp.c_fc.weight", {d, 4 * d}});
    p.push_back({h + "mlp.c_fc.bias", {4 * d}});
    p.push_back({h + "mlp.c_proj.weight", {4 * d, d}});
    p.push_back({h + "mlp.c_proj.bias", {d}});
  }
  p.push_back({"ln_f.weight", {d}});
  p.push_back({"ln_f.bias", {d}});
  return layout(p);
}

// Bucket b's size limit under `opt`: first, then bucket_bytes, then each the
// one before times growth, capped (BucketPlanOptions).
int64_t limit_of(const BucketPlanOptions& opt, size_t b) {
  if (b == 0) return opt.first_bucket_bytes;
  const int64_t cap = opt.max_bucket_bytes > 0 ? opt.max_bucket_bytes : opt.bucket_bytes;
  int64_t limit = opt.bucket_bytes;
  for (size_t i = 1; i < b; ++i)
    limit = std::min(cap, static_cast<int64_t>(static_cast<double>(limit) * opt.growth));
  return limit;
}

// Every invariant of Note [Buckets], for any plan.
void expect_plan_invariants(const BucketPlan& plan, const Layout& l, size_t es,
                            const BucketPlanOptions& opt) {
  const auto& buckets = plan.buckets();
  ASSERT_FALSE(buckets.empty());
  // Ranges tile [0, padded_numel) exactly, bucket 0 at the top.
  EXPECT_EQ(buckets.front().offset + buckets.front().numel, l.padded_numel);
  EXPECT_EQ(buckets.back().offset, 0);
  for (size_t b = 0; b + 1 < buckets.size(); ++b)
    EXPECT_EQ(buckets[b + 1].offset + buckets[b + 1].numel, buckets[b].offset) << "bucket " << b;
  // Reverse registration order, every slot exactly once, consecutive slots.
  size_t expected_slot = l.slots.size();
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_EQ(buckets[b].num_params(), static_cast<int64_t>(buckets[b].slots.size()));
    for (size_t s : buckets[b].slots) {
      ASSERT_EQ(s, --expected_slot) << "bucket " << b;
      EXPECT_EQ(plan.bucket_of(s), b);
      // Never split: the whole slot lies inside the bucket's range.
      EXPECT_GE(l.slots[s].offset, buckets[b].offset);
      EXPECT_LE(l.slots[s].offset + l.slots[s].numel, buckets[b].offset + buckets[b].numel);
    }
    // The range starts at its lowest slot (zero-copy: no copy needed to gather it).
    EXPECT_EQ(buckets[b].offset, l.slots[buckets[b].slots.back()].offset);
    // 256-byte boundaries.
    EXPECT_EQ(buckets[b].offset * static_cast<int64_t>(es) % 256, 0);
    EXPECT_EQ(buckets[b].numel * static_cast<int64_t>(es) % 256, 0);
  }
  EXPECT_EQ(expected_slot, 0u);
  // Size limits: over the limit only alone; closed only when full or the next slot did not fit.
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t limit = limit_of(opt, b);
    const int64_t bytes = buckets[b].numel * static_cast<int64_t>(es);
    if (bytes > limit) {
      EXPECT_EQ(buckets[b].num_params(), 1) << "bucket " << b;
    }
    if (b + 1 < buckets.size() && bytes < limit) {
      const size_t next = buckets[b + 1].slots.front();
      const int64_t next_end =
          next + 1 < l.slots.size() ? l.slots[next + 1].offset : l.padded_numel;
      EXPECT_GT(bytes + (next_end - l.slots[next].offset) * static_cast<int64_t>(es), limit)
          << "bucket " << b << " closed early";
    }
  }
}

TEST(BucketPlan, gpt2_buckets_in_backward_order) {
  const Layout l = gpt2_layout();
  int64_t total = 0;
  for (const auto& s : l.slots)
    total += s.numel;
  ASSERT_EQ(total, 124439808);  // GPT-2 small
  const BucketPlanOptions opt;  // 1 MiB, then 25 MiB
  const BucketPlan plan(l.slots, l.padded_numel, 4, opt);
  expect_plan_invariants(plan, l, 4, opt);

  // The first bucket is small and holds the last-registered parameters:
  // ln_f.bias, ln_f.weight, h.11.mlp.c_proj.bias (the 9 MiB c_proj.weight does not fit).
  const size_t n = l.slots.size();
  EXPECT_LE(plan[0].numel * 4, opt.first_bucket_bytes);
  EXPECT_EQ(plan[0].slots, (std::vector<size_t>{n - 1, n - 2, n - 3}));
  // wte (50257 x 768 fp32 = 147 MiB) is larger than a bucket: it gets its own, the last one.
  EXPECT_EQ(plan.buckets().back().slots, std::vector<size_t>{0});
  EXPECT_EQ(plan.bucket_of(0), plan.size() - 1);
  for (size_t b = 1; b + 1 < plan.size(); ++b)
    EXPECT_LE(plan[b].numel * 4, opt.bucket_bytes);
  // ~474 MiB in ~25 MiB buckets.
  EXPECT_GE(plan.size(), 15u);
  EXPECT_LE(plan.size(), 30u);
}

TEST(BucketPlan, gpt2_with_other_bucket_sizes) {
  const Layout l = gpt2_layout();
  for (int64_t first : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24})
    for (int64_t rest : {int64_t{1} << 20, int64_t{25} << 20, int64_t{256} << 20}) {
      const BucketPlanOptions opt{first, rest};
      expect_plan_invariants(BucketPlan(l.slots, l.padded_numel, 4, opt), l, 4, opt);
    }
}

// The trainers' --bucket-mb and Python's bucket_cap_mb: the size after the
// first bucket, the first at most that size too; sizes outside 1 KiB..1 TiB refused.
TEST(BucketPlan, buckets_of_mib_sets_the_size_and_caps_the_first) {
  const BucketPlanOptions fifty = buckets_of_mib(50);
  EXPECT_EQ(fifty.bucket_bytes, int64_t{50} << 20);
  EXPECT_EQ(fifty.first_bucket_bytes, BucketPlanOptions{}.first_bucket_bytes);
  const BucketPlanOptions half = buckets_of_mib(0.5);
  EXPECT_EQ(half.bucket_bytes, int64_t{1} << 19);
  EXPECT_EQ(half.first_bucket_bytes, int64_t{1} << 19);
  const Layout l = gpt2_layout();
  for (const double mib : {0.001, 0.5, 4.0, 50.0, 4096.0}) {
    const BucketPlanOptions opt = buckets_of_mib(mib);
    expect_plan_invariants(BucketPlan(l.slots, l.padded_numel, 4, opt), l, 4, opt);
  }
  EXPECT_ERROR(buckets_of_mib(0), "buckets_of_mib: 0 MiB is not a bucket size");
  EXPECT_ERROR(buckets_of_mib(-3), "-3 MiB");
  EXPECT_ERROR(buckets_of_mib(1e9), "not a bucket size (1 KiB to 1 TiB)");
}

// A schedule: 1 MiB, 25 MiB, then doubling up to 256 MiB. GPT-2's layers
// (27 MiB each) go in ever larger buckets; wte (147 MiB) stays alone, last.
TEST(BucketPlan, gpt2_with_a_growing_schedule) {
  const Layout l = gpt2_layout();
  BucketPlanOptions opt;
  opt.growth = 2.0;
  opt.max_bucket_bytes = int64_t{256} << 20;
  const BucketPlan plan(l.slots, l.padded_numel, 4, opt);
  expect_plan_invariants(plan, l, 4, opt);
  const BucketPlan flat(l.slots, l.padded_numel, 4);
  EXPECT_LT(plan.size(), flat.size());
  EXPECT_EQ(limit_of(opt, 2), int64_t{50} << 20);
  EXPECT_EQ(limit_of(opt, 5), int64_t{256} << 20);  // 400 MiB capped
  // Every bucket between the first and wte's is fuller than the one before
  // it, but for the last of them, which holds what is left.
  for (size_t b = 2; b + 2 < plan.size(); ++b)
    EXPECT_GT(plan[b].numel, plan[b - 1].numel) << "bucket " << b;
  EXPECT_EQ(plan.buckets().back().slots, std::vector<size_t>{0});
  EXPECT_THAT(plan.describe(), ::testing::HasSubstr("147.24 MiB"));

  // Growth 1 with a cap is the plain plan; a cap below bucket_bytes or a
  // shrinking factor is refused.
  BucketPlanOptions same;
  same.max_bucket_bytes = same.bucket_bytes;
  EXPECT_EQ(BucketPlan(l.slots, l.padded_numel, 4, same).describe(), flat.describe());
  BucketPlanOptions shrink;
  shrink.growth = 0.5;
  EXPECT_ERROR(BucketPlan(l.slots, l.padded_numel, 4, shrink), "must not shrink", "growth=0.5");
  BucketPlanOptions low_cap;
  low_cap.max_bucket_bytes = 1 << 20;
  EXPECT_ERROR(BucketPlan(l.slots, l.padded_numel, 4, low_cap), "max_bucket_bytes=1048576");
}

TEST(BucketPlan, small_slots_exact_plan) {
  // f32: 64 elements per 256 bytes. Padded sizes: 64, 320, 64, 64, 1024, 128.
  const Layout l =
      layout({{"a", {10}}, {"b", {300}}, {"c", {5}}, {"d", {8, 8}}, {"e", {1000}}, {"f", {2, 50}}});
  const BucketPlanOptions opt{512, 1024};  // first 128 elements, then 256
  const BucketPlan plan(l.slots, l.padded_numel, 4, opt);
  expect_plan_invariants(plan, l, 4, opt);
  // f (128 elems) fills the first bucket; e (1024) alone; d + c (128) then b (320) does
  // not fit: bucket [d, c]; b alone (over the limit); a.
  ASSERT_EQ(plan.size(), 5u);
  EXPECT_EQ(plan[0].slots, std::vector<size_t>{5});
  EXPECT_EQ(plan[1].slots, std::vector<size_t>{4});
  EXPECT_EQ(plan[2].slots, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(plan[3].slots, std::vector<size_t>{1});
  EXPECT_EQ(plan[4].slots, std::vector<size_t>{0});
  EXPECT_EQ(plan[2].offset, 384);
  EXPECT_EQ(plan[2].numel, 128);
  EXPECT_THAT(plan.describe(), ::testing::HasSubstr("bucket 2: [384, 512) 2 params"));

  // Huge limits: one bucket with everything; the first bucket limit applies to it.
  const BucketPlan one(l.slots, l.padded_numel, 4, {1 << 30, 1 << 30});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].offset, 0);
  EXPECT_EQ(one[0].numel, l.padded_numel);
  EXPECT_EQ(one[0].num_params(), 6);

  // f64 (32 elements per 256 bytes) and a single slot.
  const Layout d = layout({{"w", {33}}}, 8);
  const BucketPlan single(d.slots, d.padded_numel, 8, {8, 8});
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].numel, 64);
}

TEST(BucketPlan, views_are_zero_copy_slices_of_a_real_arena) {
  std::vector<Tensor> params;
  for (const Shape& s : std::vector<Shape>{{7, 3}, {100}, {5}, {16, 16}, {3}})
    params.push_back(requires_grad_(test::random_normal(s)));
  optim::ParamStore arena(params, optim::ParamStoreOptions().moments(0));
  const BucketPlanOptions opt{256, 1024};
  const BucketPlan plan(arena, opt);
  Layout l{arena.slots(), arena.padded_numel()};
  expect_plan_invariants(plan, l, 4, opt);
  EXPECT_EQ(plan.padded_numel(), arena.padded_numel());

  int64_t covered = 0;
  for (size_t b = 0; b < plan.size(); ++b) {
    Tensor v = plan.view(arena.grads(), b);
    EXPECT_EQ(v.data_ptr(), static_cast<void*>(arena.grads().data<float>() + plan[b].offset));
    EXPECT_EQ(v.numel(), plan[b].numel);
    covered += v.numel();
  }
  EXPECT_EQ(covered, arena.padded_numel());
  // Writing through a bucket view is writing the parameter's gradient slot.
  const size_t slot = 3;
  Tensor fresh = test::random_normal({16 * 16});
  plan.view(arena.grads(), plan.bucket_of(slot))
      .narrow(0, arena.slots()[slot].offset - plan[plan.bucket_of(slot)].offset, 256)
      .copy_(fresh);
  EXPECT_TRUE(test::all_equal(arena.grad_view(slot).reshape({256}), fresh));

  const std::string size = std::to_string(arena.padded_numel()) + " elements";
  EXPECT_ERROR(plan.view(zeros({arena.padded_numel() + 1}), 0), "BucketPlan::view", size.c_str());
  EXPECT_ERROR(plan.view(zeros({arena.padded_numel()}, DType::f64), 0), "4-byte", "f64");
  EXPECT_ERROR(plan.view(arena.grads(), plan.size()), "bucket", "out of range");
  EXPECT_ERROR(plan.bucket_of(5), "slot 5");
}

TEST(BucketPlan, bad_layouts_and_options) {
  const Layout l = layout({{"a", {10}}, {"b", {20}}});
  EXPECT_ERROR(BucketPlan({}, 0, 4), "no slots");
  EXPECT_ERROR(BucketPlan(l.slots, l.padded_numel, 4, {0, 1024}), "first_bucket_bytes=0");
  EXPECT_ERROR(BucketPlan(l.slots, l.padded_numel, 4, {1024, -1}), "bucket_bytes=-1");
  Layout overlap = l;
  overlap.slots[1].offset = 5;
  EXPECT_ERROR(BucketPlan(overlap.slots, overlap.padded_numel, 4), "slot 0 (a)", "overlaps");
  EXPECT_ERROR(BucketPlan(l.slots, 64, 4), "slot 1 (b)", "arena end 64");
  Layout shifted = l;
  shifted.slots[0].offset = 64;
  EXPECT_ERROR(BucketPlan(shifted.slots, shifted.padded_numel, 4), "slot 0 (a) starts at 64");
}

TEST(LayoutFingerprint, same_layout_same_value_any_difference_changes_it) {
  const Layout a = gpt2_layout();
  const uint64_t fp = layout_fingerprint(a.slots, DType::f32);
  EXPECT_EQ(layout_fingerprint(gpt2_layout().slots, DType::f32), fp);
  EXPECT_NE(layout_fingerprint(a.slots, DType::f64), fp);

  Layout renamed = a;
  renamed.slots[5].name = "h.0.attn.c_attn.weight_";
  EXPECT_NE(layout_fingerprint(renamed.slots, DType::f32), fp);
  Layout reshaped = a;
  reshaped.slots[2].shape = {1, 768};  // same numel, different shape
  EXPECT_NE(layout_fingerprint(reshaped.slots, DType::f32), fp);
  Layout swapped = a;
  std::swap(swapped.slots[3].name, swapped.slots[4].name);
  EXPECT_NE(layout_fingerprint(swapped.slots, DType::f32), fp);
  Layout fewer = a;
  fewer.slots.pop_back();
  EXPECT_NE(layout_fingerprint(fewer.slots, DType::f32), fp);
  // Note [Parameter layouts]: the same shape laid out otherwise (channels-last).
  const Layout rows = layout({{"conv", {8, 3, 3, 3}}});
  Layout last = rows;
  last.slots[0].strides = {27, 1, 9, 3};
  EXPECT_NE(layout_fingerprint(last.slots, DType::f32), layout_fingerprint(rows.slots, DType::f32));

  // From a real arena: it hashes what the arena registered.
  std::vector<Tensor> params{requires_grad_(test::random_normal({4, 3})),
                             requires_grad_(test::random_normal({5}))};
  optim::ParamStore arena({{"w", params[0]}, {"b", params[1]}},
                          optim::ParamStoreOptions().moments(0));
  const Layout same = layout({{"w", {4, 3}}, {"b", {5}}});
  EXPECT_EQ(layout_fingerprint(arena), layout_fingerprint(same.slots, DType::f32));
}

}  // namespace
}  // namespace accrue::dist
