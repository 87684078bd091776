// NcclCommunicator: the Communicator of a multi-GPU world, one process per GPU.
//
//   RankInfo info = discover_rank();                      // dist/launch_env.h
//   auto comm = connect_nccl(info, layout_fingerprint(arena));
//   comm->all_reduce(arena.grads());                       // enqueued, not waited for
//   comm->synchronize();                                   // or order by events
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0) and runs its
// collectives on its own high-priority stream, so that a bucket's all-reduce
// overlaps the backward kernels on the compute stream (Note [Collective
// ordering] in dist/process_group.h). Every collective is additionally
// ordered after the calling thread's current stream (an event recorded there
// and waited for on the communicator's stream), so "produce on the current
// stream, then call the collective" is always safe.
//
// Defined only in builds with NCCL (ACCRUE_WITH_NCCL is then defined for the
// library and its consumers); elsewhere use StubCommunicator.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "accrue/dist/copy_engine_all_reduce.h"
#include "accrue/dist/launch_env.h"
#include "accrue/dist/process_group.h"
#include "accrue/dist/tcp_exchange.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace accrue::dist {

struct NcclOptions {
  // Note [No silent hang]: how long a collective (counted from when it was
  // enqueued) or the communicator's creation may take before the watchdog
  // aborts the communicator and the next call on it throws accrue::Error.
  double timeout_s = 60.0;
  // The bootstrap's limit: the TCP exchange of the unique id (waiting for
  // every rank to start) and the communicator's creation.
  double bootstrap_timeout_s = 120.0;
  // How often the watchdog thread looks at the collectives in flight.
  double watchdog_interval_s = 0.1;
  // Run collectives on a stream of the device's highest priority, so that
  // their kernels are scheduled ahead of the backward's when both are ready.
  bool high_priority_stream = true;
  // ncclConfig_t::CTAPolicy (NCCL 2.27 and later): how many CTAs NCCL's
  // kernels may take from the SMs the backward's GEMMs run on. Unset leaves
  // NCCL's default (NCCL_CTA_POLICY_DEFAULT).
  enum class CtaPolicy { nccl_default, efficiency, zero };
  std::optional<CtaPolicy> cta_policy;
  // ncclConfig_t::maxCTAs: at most this many CTAs per NCCL kernel, in [1,
  // 64]; unset leaves NCCL's choice. With ReducerOptions::gemm_sm_margin the
  // GEMMs leave that many SMs free (Note [GEMM SM margin]).
  std::optional<int> max_ctas;
};

class NcclCommunicator final : public Communicator {
 public:
  // A fresh NCCL unique id (rank 0 makes it, every rank needs it).
  static Blob make_unique_id();

  // Joins the world `id` names as `rank` of `world_size`, driving CUDA device
  // `device`. Collective over the world: every rank must call it. Throws
  // accrue::Error naming this rank when the world does not assemble within
  // options.bootstrap_timeout_s.
  NcclCommunicator(const Blob& id, int rank, int world_size, int device,
                   const NcclOptions& options = {});
  // Waits (bounded by the timeout) for the collectives in flight, then
  // releases the communicator; aborts it instead if they do not finish.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return Device::cuda(device_); }
  // Note [Deferred launch]: first finishes a launch NCCL is still making.
  StreamHandle stream() override;

  void all_reduce(const Tensor& data, ReduceOp op = ReduceOp::sum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::sum) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  void broadcast(const Tensor& data, int root = 0) override;
  // Two ranks of one host with peer access: Note [Copy-engine all-reduce].
  bool use_copy_engine_all_reduce(int64_t max_bytes, int64_t min_bytes, std::string* why) override;
  bool share_with_copy_engines(const Tensor& flat, bool whole_buckets, std::string* why) override;
  void join_pending() override;
  void synchronize() override;
  void check() override;

  const NcclOptions& options() const { return options_; }
  // All-reduces the copy engines carried (Note [Copy-engine all-reduce]).
  int64_t copy_engine_all_reduces() const { return copy_engine_calls_.load(); }
  // Collectives enqueued so far, of every kind.
  int64_t collectives_issued() const { return issued_.load(); }
  // True once the watchdog (or a failed call) has aborted the communicator:
  // every later call throws the error that caused it.
  bool aborted() const;

 private:
  // One enqueued collective the watchdog follows until its event completes.
  struct Work {
    std::string what;  // "all_reduce (sum) of 1048576 f32"
    EventHandle done = nullptr;
    std::chrono::steady_clock::time_point enqueued;
  };
  using Clock = std::chrono::steady_clock;

  // Enqueues one NCCL call (`call` receives the comm and the stream) after
  // the current stream's work and follows it until it completes. Unless it
  // is a copy-engine call, what copy-engine calls left pending is joined
  // first (Note [Copy-engine all-reduce]).
  template <class Call>
  void enqueue(const std::string& what, Call&& call, bool copy_engine_call = false);
  // Exchanges one byte string per rank over NCCL, in rank order.
  std::vector<std::string> gather_strings(const std::string& mine);
  // With mu_ held: retires completed work, turns an NCCL error or an expired
  // deadline into abort_locked(). Returns false once aborted.
  bool poll_locked(Clock::time_point now);
  // With mu_ held: aborts the communicator and keeps `message` as the error
  // every later call throws.
  void abort_locked(const std::string& message);
  // With mu_ held: throws the kept error when aborted.
  void throw_if_aborted_locked() const;
  // With mu_ held: waits, at most timeout_s, until NCCL's state leaves
  // ncclInProgress after a non-blocking call; aborts and throws on failure.
  void wait_for_progress_locked(const std::string& what, double timeout_s);
  // Note [Deferred launch], with mu_ held: waits (within the collective's
  // timeout) until NCCL has launched the pending collective, then follows it
  // like any other; nothing when none is pending.
  void finish_launch_locked();
  // ... the second half: its done event on the stream, into in_flight_.
  void follow_launched_locked();
  // "rank 1 of 2 (cuda:1)"
  std::string who() const;
  EventHandle take_event_locked();
  void watchdog_loop();
  // The destructor's work: drain (bounded), finalize and destroy, or abort.
  void shutdown();
  void release_events() noexcept;

  int rank_, world_size_, device_;
  NcclOptions options_;
  std::unique_ptr<Stream> stream_;
  EventHandle ready_ = nullptr;  // recorded on the current stream before each collective

  mutable std::mutex mu_;  // guards everything below and every NCCL call
  ncclComm* comm_ = nullptr;
  std::deque<Work> in_flight_;
  // Note [Deferred launch]: the collective NCCL is still launching, if any;
  // its done event is recorded once the launch has finished.
  std::optional<Work> launching_;
  std::vector<EventHandle> spare_events_;
  bool aborted_ = false;
  std::string error_;
  std::string last_collective_ = "no collective yet";

  std::atomic<int64_t> issued_{0};
  // Note [Copy-engine all-reduce]: set by use_copy_engine_all_reduce; its
  // calls run under mu_ like NCCL's, followed by the watchdog the same way.
  std::unique_ptr<CopyEngineAllReduce> copy_engine_;
  int64_t copy_engine_min_bytes_ = 0;
  std::atomic<int64_t> copy_engine_calls_{0};
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watchdog_;
};

// The NCCL bootstrap: rank 0 makes the unique id and hands it to every rank,
// then every rank joins the communicator on cuda:info.local_rank.
// bootstrap_method(info) (dist/mpi_bootstrap.h) says how the id travels:
//   - Bootstrap::mpi (accrue built with MPI, started by mpirun): over MPI
//     (Note [MPI bootstrap]); MASTER_ADDR/MASTER_PORT are not needed and
//     `exchange_port` is unused;
//   - Bootstrap::tcp (torchrun, srun, or no MPI in the build): over the TCP
//     exchange (Note [Exchange protocol]) on `exchange_port` (0: MASTER_PORT + 1).
// `fingerprint` is this rank's layout_fingerprint (dist/bucket_plan.h): ranks
// whose layouts (or world sizes) differ get accrue::Error instead of a
// communicator, on every rank.
std::unique_ptr<NcclCommunicator> connect_nccl(const RankInfo& info, uint64_t fingerprint,
                                               const NcclOptions& options = {},
                                               int exchange_port = 0);

}  // namespace accrue::dist
