// BucketPlan: how the flat gradient arena is cut into all-reduce buckets.
//
// Note [Buckets]
// ~~~~~~~~~~~~~~
// Under data parallelism the arena is cut into buckets in REVERSE registration
// order: the backward produces the last-registered parameters' gradients
// first, so buckets fill in backward order and the first one can be reduced
// while the rest of the backward runs. The first bucket is small (~1 MB) so
// communication starts early; the second is ~25 MB. Later ones may grow by a
// factor per bucket up to a cap (a schedule: NCCL's bandwidth rises with the
// message, 229 GB/s at 25 MiB against 285 at 128 MiB on two H200s, while the
// first buckets must start early). The default is no growth: every later
// bucket ~25 MB (see bench/RESULTS.md for what the schedules measured). All
// sizes are options.
//
// Invariants, enforced in BucketPlan's constructor:
//   - a parameter is never split: a bucket is a set of whole slots;
//   - because slots are laid out contiguously in registration order, a run of
//     consecutive slots is one contiguous range of the arena, so each bucket is
//     a zero-copy slice [offset, offset + numel) of the flat arena (alignment
//     padding between its slots included: it is zero and stays zero);
//   - the buckets' ranges tile [0, padded_numel) exactly, no gap, no overlap;
//     bucket 0 ends at padded_numel, the last bucket starts at 0;
//   - a bucket never exceeds its size limit unless it holds a single slot
//     that is larger on its own: a too-big parameter gets a bucket of its own.
// Every range starts and ends on a 256-byte boundary, so for f32 every
// bucket's numel is a multiple of 64 (divisible by any world size up to 64
// that is a power of two: ZeRO-1 reduce-scatters buckets without padding).
// ParamStoreOptions().shard_ranks(W) pads slots to W x 256 bytes, which makes every
// bucket divisible by any other world size W (Note [ZeRO-1]).
//
// Note [Layout fingerprint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Ranks must register the same parameters, in the same order, with the same
// shapes and layouts (Note [Parameter layouts]), or their buckets would
// silently reduce unrelated gradients. The fingerprint (FNV-1a over the
// master dtype and every slot's name, shape, strides, offset and numel) is
// compared across ranks during the bootstrap (see
// Note [Exchange protocol]) and any difference is an accrue::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/optim/param_store.h"

namespace accrue::dist {

struct BucketPlanOptions {
  int64_t first_bucket_bytes = int64_t{1} << 20;  // 1 MiB
  int64_t bucket_bytes = int64_t{25} << 20;       // 25 MiB: the second bucket's limit
  // Each later bucket's limit is the one before times `growth`, up to
  // max_bucket_bytes (unset: bucket_bytes, no growth).
  double growth = 1.0;
  int64_t max_bucket_bytes = 0;
};

// Buckets of `mib` MiB after the first (PyTorch DDP's bucket_cap_mb), the
// first at most that size too: what the trainers' --bucket-mb and Python's
// bucket_cap_mb ask for. Throws accrue::Error unless the size is between
// 1 KiB and 1 TiB.
BucketPlanOptions buckets_of_mib(double mib);

struct Bucket {
  int64_t offset = 0;  // in elements of the flat arena
  int64_t numel = 0;   // elements in the range, alignment padding included
  // Registration indices of its slots, in the order the backward finishes
  // them (descending). slots.size() is the readiness countdown's start.
  std::vector<size_t> slots;

  int64_t num_params() const { return static_cast<int64_t>(slots.size()); }
};

class BucketPlan {
 public:
  explicit BucketPlan(const GradArena& arena, const BucketPlanOptions& options = {});
  explicit BucketPlan(const optim::ParamStore& store, const BucketPlanOptions& options = {})
      : BucketPlan(store.grad_arena(), options) {}
  // The same plan from a slot list laid out as a GradArena lays it out (tests,
  // and planning without allocating). element_size: bytes of the master dtype.
  BucketPlan(const std::vector<GradArena::Slot>& slots, int64_t padded_numel, size_t element_size,
             const BucketPlanOptions& options = {});

  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t size() const { return buckets_.size(); }
  const Bucket& operator[](size_t b) const { return buckets_[b]; }
  // The bucket that holds slot `slot` (a registration index).
  size_t bucket_of(size_t slot) const;
  // Bucket b as a 1-D view of a flat arena ([padded_numel], e.g. arena.grads()).
  Tensor view(const Tensor& flat, size_t b) const;
  int64_t padded_numel() const { return padded_numel_; }

  // One line per bucket: "bucket 0: [offset, end) 3 params 1.0 MiB"
  std::string describe() const;

 private:
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  int64_t padded_numel_ = 0;
  size_t element_size_ = 4;
};

// See Note [Layout fingerprint].
uint64_t layout_fingerprint(const GradArena& arena);
inline uint64_t layout_fingerprint(const optim::ParamStore& store) {
  return layout_fingerprint(store.grad_arena());
}
uint64_t layout_fingerprint(const std::vector<GradArena::Slot>& slots, DType master_dtype);

}  // namespace accrue::dist
