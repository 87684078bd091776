// A world of W ranks as W threads of one process, and the communicator whose
// collectives run on the host between them (exact f64 sums, in rank order):
// data parallelism tested without a GPU (tests/dist/zero1_test.cpp,
// tests/dist/sync_batch_norm_test.cpp), or without NCCL on one GPU
// (tests/dist/gpu_fp8_dist_test.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "accrue/dist/process_group.h"

namespace accrue::dist::host {

// The rendezvous of W threads: each deposits its data, all wait for all,
// each reads every rank's, all wait again so the slots can be reused.
class HostWorld {
 public:
  explicit HostWorld(int world) : world_(world), slots_(world) {}
  int size() const { return world_; }

  std::vector<std::vector<double>> exchange(int rank, std::vector<double> mine) {
    std::unique_lock<std::mutex> lock(mu_);
    slots_[rank] = std::move(mine);
    arrive(lock);
    std::vector<std::vector<double>> all = slots_;
    arrive(lock);
    return all;
  }

 private:
  // A reusable barrier; a rank that never comes is an error, not a hang.
  void arrive(std::unique_lock<std::mutex>& lock) {
    const int64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    ACCRUE_CHECK(cv_.wait_for(lock, std::chrono::seconds(20), [&] { return generation_ != gen; }),
                 "HostWorld: a rank did not reach the collective within 20 s");
  }

  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<std::vector<double>> slots_;
};

// On a CUDA device (the ranks' threads sharing one GPU) a collective reads
// the data back to the host on the thread's current stream, which waits for
// the work queued before it, and copies the result in on that stream.
class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(HostWorld& world, int rank, Device device = Device::cpu())
      : world_(world), rank_(rank), device_(device) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_.size(); }
  Device device() const override { return device_; }
  StreamHandle stream() override { return nullptr; }

  void all_reduce(const Tensor& data, ReduceOp op) override {
    ++counts["all_reduce"];
    const auto all = world_.exchange(rank_, data.to_vector<double>());
    std::vector<double> out = all[0];
    for (size_t r = 1; r < all.size(); ++r)
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = op == ReduceOp::sum ? out[i] + all[r][i] : std::max(out[i], all[r][i]);
    write(data, out);
  }
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) override {
    ++counts["reduce_scatter"];
    ACCRUE_CHECK(input.numel() == output.numel() * world_size(), "HostCommunicator: sizes");
    const auto all = world_.exchange(rank_, input.to_vector<double>());
    const size_t n = static_cast<size_t>(output.numel()), at = n * rank_;
    std::vector<double> out(all[0].begin() + at, all[0].begin() + at + n);
    for (size_t r = 1; r < all.size(); ++r)
      for (size_t i = 0; i < n; ++i)
        out[i] = op == ReduceOp::sum ? out[i] + all[r][at + i] : std::max(out[i], all[r][at + i]);
    write(output, out);
  }
  void all_gather(const Tensor& input, const Tensor& output) override {
    ++counts["all_gather"];
    ACCRUE_CHECK(output.numel() == input.numel() * world_size(), "HostCommunicator: sizes");
    const auto all = world_.exchange(rank_, input.to_vector<double>());
    std::vector<double> out;
    for (const auto& part : all)
      out.insert(out.end(), part.begin(), part.end());
    write(output, out);
  }
  void broadcast(const Tensor& data, int root) override {
    ++counts["broadcast"];
    write(data, world_.exchange(rank_, data.to_vector<double>())[root]);
  }
  void synchronize() override {}
  void check() override {}

  std::map<std::string, int64_t> counts;

 private:
  static void write(const Tensor& t, const std::vector<double>& v) {
    t.copy_(from_vector(v, t.shape(), DType::f64).to(t.dtype()));
  }

  HostWorld& world_;
  int rank_;
  Device device_;
};

// Runs fn(rank) for every rank of a world on its own thread and joins them;
// the first rank's exception (in rank order) is rethrown after all joined.
inline void on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads)
    t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace accrue::dist::host
