// NcclCommunicator's copy-engine all-reduce, set up (Note [Copy-engine
// all-reduce]): connecting the two ranks' engines and sharing the gradient
// arenas, both over byte strings gathered through NCCL. The collectives
// that run on the engines stay in nccl_communicator.cpp.
#include <cstring>

#include "accrue/core/device_scope.h"
#include "accrue/core/error.h"
#include "accrue/dist/nccl_communicator.h"

namespace accrue::dist {

std::vector<std::string> NcclCommunicator::gather_strings(const std::string& mine) {
  // In blocks of a fixed size.
  constexpr int64_t kWords = 64;
  ACCRUE_CHECK(mine.size() < (kWords - 1) * 8, "copy-engine set-up: ", mine.size(),
               " bytes to exchange");
  std::vector<int64_t> words(kWords, 0);
  words[0] = static_cast<int64_t>(mine.size());
  std::memcpy(words.data() + 1, mine.data(), mine.size());
  const Tensor in = from_vector(words, {kWords}, DType::i64, device());
  const Tensor out = zeros({kWords * world_size_}, DType::i64, device());
  all_gather(in, out);
  synchronize();
  const std::vector<int64_t> all = out.to_vector<int64_t>();
  std::vector<std::string> strings;
  for (int r = 0; r < world_size_; ++r) {
    const int64_t* w = all.data() + r * kWords;
    ACCRUE_CHECK(w[0] >= 0 && w[0] < (kWords - 1) * 8, "copy-engine set-up: rank ", r,
                 " sent a length of ", w[0]);
    strings.emplace_back(reinterpret_cast<const char*>(w + 1), static_cast<size_t>(w[0]));
  }
  return strings;
}

bool NcclCommunicator::share_with_copy_engines(const Tensor& flat, bool whole_buckets,
                                               std::string* why) {
  check_collective_tensor(flat, device(), "share_with_copy_engines", "flat");
  ACCRUE_CHECK(flat.dtype() == DType::f32, "share_with_copy_engines: the copy engines sum f32; ",
               "flat is ", dtype_name(flat.dtype()));
  if (!copy_engine_) {
    if (why != nullptr) *why = "the copy engines are not in use (use_copy_engine_all_reduce first)";
    return false;
  }
  cuda::DeviceScope guard(device_);
  return copy_engine_->share(
      static_cast<float*>(flat.data_ptr()), flat.numel(),
      [this](const std::string& mine) { return gather_strings(mine); }, why,
      whole_buckets ? CopyEngineAllReduce::Direct::whole : CopyEngineAllReduce::Direct::halves);
}

bool NcclCommunicator::use_copy_engine_all_reduce(int64_t max_bytes, int64_t min_bytes,
                                                  std::string* why) {
  auto refuse = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  ACCRUE_CHECK(max_bytes >= 0 && min_bytes >= 0, "use_copy_engine_all_reduce: max_bytes ",
               max_bytes, ", min_bytes ", min_bytes);
  // Every rank takes the same branch: they share the world size, the calls
  // and their arguments.
  if (copy_engine_ && max_bytes > 0 && max_bytes <= copy_engine_->capacity_bytes()) {
    copy_engine_min_bytes_ = min_bytes;
    return true;
  }
  if (copy_engine_) {  // off, or too small: the calls so far end before its buffers go
    synchronize();
    std::lock_guard<std::mutex> lock(mu_);
    copy_engine_.reset();
  }
  if (max_bytes == 0) return refuse("turned off");
  if (world_size_ != 2)
    return refuse("the copy engines sum between two GPUs; the world has " +
                  std::to_string(world_size_));
  auto gather = [this](const std::string& mine) { return gather_strings(mine); };
  std::string reason;
  std::unique_ptr<CopyEngineAllReduce> engine =
      CopyEngineAllReduce::connect(rank_, device_, max_bytes, gather, &reason);
  if (!engine) return refuse(reason);
  std::lock_guard<std::mutex> lock(mu_);
  copy_engine_ = std::move(engine);
  copy_engine_min_bytes_ = min_bytes;
  return true;
}

}  // namespace accrue::dist
