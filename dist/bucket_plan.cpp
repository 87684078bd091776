#include "accrue/dist/bucket_plan.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "accrue/core/error.h"

namespace accrue::dist {

BucketPlanOptions buckets_of_mib(double mib) {
  ACCRUE_CHECK(mib >= 1.0 / 1024 && mib <= 1024.0 * 1024, "buckets_of_mib: ", mib,
               " MiB is not a bucket size (1 KiB to 1 TiB)");
  BucketPlanOptions o;
  o.bucket_bytes = static_cast<int64_t>(mib * (1 << 20));
  o.first_bucket_bytes = std::min(o.first_bucket_bytes, o.bucket_bytes);
  return o;
}

BucketPlan::BucketPlan(const GradArena& arena, const BucketPlanOptions& options)
    : BucketPlan(arena.slots(), arena.padded_numel(), element_size(arena.options().dtype()),
                 options) {}

BucketPlan::BucketPlan(const std::vector<GradArena::Slot>& slots, int64_t padded_numel,
                       size_t element_size, const BucketPlanOptions& options)
    : padded_numel_(padded_numel), element_size_(element_size) {
  ACCRUE_CHECK(!slots.empty(), "BucketPlan: no slots");
  ACCRUE_CHECK(element_size > 0, "BucketPlan: element size must be positive");
  ACCRUE_CHECK(options.first_bucket_bytes > 0 && options.bucket_bytes > 0,
               "BucketPlan: bucket sizes must be positive, got first_bucket_bytes=",
               options.first_bucket_bytes, " bucket_bytes=", options.bucket_bytes);
  const int64_t max_bytes =
      options.max_bucket_bytes > 0 ? options.max_bucket_bytes : options.bucket_bytes;
  ACCRUE_CHECK(options.growth >= 1.0 && max_bytes >= options.bucket_bytes,
               "BucketPlan: the schedule must not shrink, got growth=", options.growth,
               " bucket_bytes=", options.bucket_bytes, " max_bucket_bytes=", max_bytes);
  // Note [Buckets]: the plan relies on slots tiling the arena in registration
  // order; check it rather than assume it.
  ACCRUE_CHECK(slots[0].offset == 0, "BucketPlan: slot 0 (", slots[0].name, ") starts at ",
               slots[0].offset, ", not 0");
  const size_t n = slots.size();
  // Slot i's range runs to the next slot's start: its alignment padding rides along.
  auto end_of = [&](size_t i) { return i + 1 < n ? slots[i + 1].offset : padded_numel; };
  for (size_t i = 0; i < n; ++i)
    ACCRUE_CHECK(slots[i].numel >= 0 && slots[i].offset + slots[i].numel <= end_of(i),
                 "BucketPlan: slot ", i, " (", slots[i].name, ") at [", slots[i].offset, ", ",
                 slots[i].offset + slots[i].numel, ") overlaps the next slot or the arena end ",
                 end_of(i));

  const int64_t es = static_cast<int64_t>(element_size);
  Bucket current;
  auto close = [&] {
    if (current.slots.empty()) return;
    buckets_.push_back(std::move(current));
    current = Bucket{};
  };
  // The limit of the bucket being filled: the first one is small, the second
  // bucket_bytes, each later one `growth` times the one before, up to max_bytes.
  std::vector<int64_t> limits = {options.first_bucket_bytes, options.bucket_bytes};
  auto limit = [&] {
    while (limits.size() <= buckets_.size()) {
      const double next = static_cast<double>(limits.back()) * options.growth;
      limits.push_back(next >= static_cast<double>(max_bytes) ? max_bytes
                                                              : static_cast<int64_t>(next));
    }
    return limits[buckets_.size()];
  };
  // Reverse registration order: the order the backward finishes gradients.
  for (size_t i = n; i-- > 0;) {
    const int64_t elems = end_of(i) - slots[i].offset;
    // A parameter is never split: if it does not fit, the bucket closes
    // without it, and a parameter larger than the limit ends up alone.
    if (!current.slots.empty() && (current.numel + elems) * es > limit()) close();
    current.offset = slots[i].offset;  // buckets grow downwards through the arena
    current.numel += elems;
    current.slots.push_back(i);
    if (current.numel * es >= limit()) close();
  }
  close();

  bucket_of_.assign(n, 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t s : buckets_[b].slots)
      bucket_of_[s] = b;
}

size_t BucketPlan::bucket_of(size_t slot) const {
  ACCRUE_CHECK(slot < bucket_of_.size(), "BucketPlan::bucket_of: slot ", slot, " out of range [0, ",
               bucket_of_.size(), ")");
  return bucket_of_[slot];
}

Tensor BucketPlan::view(const Tensor& flat, size_t b) const {
  ACCRUE_CHECK(b < buckets_.size(), "BucketPlan::view: bucket ", b, " out of range [0, ",
               buckets_.size(), ")");
  ACCRUE_CHECK(flat.dim() == 1 && flat.numel() == padded_numel_ && flat.is_contiguous(),
               "BucketPlan::view: expected a flat contiguous arena of ", padded_numel_,
               " elements, got shape ", shape_str(flat.shape()));
  ACCRUE_CHECK(element_size(flat.dtype()) == element_size_,
               "BucketPlan::view: the plan was made for ", element_size_,
               "-byte elements but the arena is ", dtype_name(flat.dtype()));
  return flat.narrow(0, buckets_[b].offset, buckets_[b].numel);
}

std::string BucketPlan::describe() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& k = buckets_[b];
    os << "bucket " << b << ": [" << k.offset << ", " << k.offset + k.numel << ") "
       << k.num_params() << " params "
       << static_cast<double>(k.numel) * static_cast<double>(element_size_) / (1 << 20) << " MiB\n";
  }
  return os.str();
}

namespace {

// FNV-1a, 64 bits, fed integers as 8 little-endian bytes so every host agrees.
struct Fnv1a {
  uint64_t h = 14695981039346656037ull;
  void byte(uint8_t b) {
    h ^= b;
    h *= 1099511628211ull;
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i)
      byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());  // length first: ("ab","c") and ("a","bc") differ
    for (char c : s)
      byte(static_cast<uint8_t>(c));
  }
};

}  // namespace

uint64_t layout_fingerprint(const std::vector<GradArena::Slot>& slots, DType master_dtype) {
  Fnv1a f;
  f.u64(static_cast<uint64_t>(master_dtype));
  f.u64(slots.size());
  for (const GradArena::Slot& s : slots) {
    f.str(s.name);
    f.u64(s.shape.size());
    for (int64_t d : s.shape)
      f.u64(static_cast<uint64_t>(d));
    for (int64_t d : s.strides)  // Note [Parameter layouts]
      f.u64(static_cast<uint64_t>(d));
    f.u64(static_cast<uint64_t>(s.offset));
    f.u64(static_cast<uint64_t>(s.numel));
  }
  return f.h;
}

uint64_t layout_fingerprint(const GradArena& arena) {
  return layout_fingerprint(arena.slots(), arena.options().dtype());
}

}  // namespace accrue::dist
