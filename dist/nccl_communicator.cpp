#include "accrue/dist/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <sstream>

#include "accrue/core/cuda_graph.h"
#include "accrue/core/device_scope.h"
#include "accrue/core/error.h"
#include "accrue/core/status_check.h"
#include "accrue/dist/mpi_bootstrap.h"

namespace accrue::dist {

static_assert(sizeof(ncclUniqueId) == kBlobBytes, "the TCP exchange carries an ncclUniqueId");

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::boolean:
      return ncclUint8;
    case DType::f8e4m3:  // Note [FP8 dtypes]: not reduced, and NCCL's FP8 types are recent
    case DType::f8e5m2:
      break;
  }
  ACCRUE_FAIL("NcclCommunicator: dtype ", static_cast<int>(t), " has no NCCL type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
  }
  ACCRUE_FAIL("NcclCommunicator: unknown reduce op ", static_cast<int>(op));
}

// "all_reduce (sum) of 1048576 f32 (4 MiB)": how errors name a collective.
std::string describe_collective(const char* name, const ReduceOp* op, int64_t numel, DType dtype) {
  std::ostringstream os;
  os << name;
  if (op) os << " (" << reduce_op_name(*op) << ")";
  const double mib = static_cast<double>(numel) * element_size(dtype) / (1 << 20);
  os << " of " << numel << " " << dtype_name(dtype) << " (" << mib << " MiB)";
  return os.str();
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

std::chrono::microseconds to_duration(double seconds) {
  return std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

}  // namespace

Blob NcclCommunicator::make_unique_id() {
  ncclUniqueId uid;
  ACCRUE_NCCL_CHECK(ncclGetUniqueId(&uid));
  Blob blob{};
  std::memcpy(blob.data(), &uid, sizeof uid);
  return blob;
}

NcclCommunicator::NcclCommunicator(const Blob& id, int rank, int world_size, int device,
                                   const NcclOptions& options)
    : rank_(rank), world_size_(world_size), device_(device), options_(options) {
  ACCRUE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "NcclCommunicator: rank ", rank,
               " is not a rank of a world of size ", world_size);
  ACCRUE_CHECK(device >= 0 && device < cuda_device_count(), "NcclCommunicator: rank ", rank,
               " asks for cuda:", device, " but ", cuda_device_count(),
               " CUDA devices are visible ", cuda_unavailable_reason());
  ACCRUE_CHECK(std::isfinite(options.timeout_s) && options.timeout_s > 0 &&
                   std::isfinite(options.bootstrap_timeout_s) && options.bootstrap_timeout_s > 0,
               "NcclCommunicator: timeouts must be finite and > 0, got timeout_s = ",
               options.timeout_s, ", bootstrap_timeout_s = ", options.bootstrap_timeout_s);
  ACCRUE_CHECK(options.watchdog_interval_s > 0 && options.watchdog_interval_s <= options.timeout_s,
               "NcclCommunicator: watchdog_interval_s = ", options.watchdog_interval_s,
               " must lie in (0, timeout_s = ", options.timeout_s, "]");
  ACCRUE_CHECK(!options.max_ctas || (*options.max_ctas >= 1 && *options.max_ctas <= 64),
               "NcclCommunicator: max_ctas = ", options.max_ctas.value_or(0),
               " must lie in [1, 64]");
  cuda::DeviceScope guard(device);
  int least = 0, greatest = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Numerically lower is higher priority: `greatest` is the most urgent.
  stream_ = std::make_unique<Stream>(device, options.high_priority_stream ? greatest : least);
  try {
    cudaEvent_t e;
    ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ready_ = e;

    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; progress and errors are polled
    if (options.cta_policy) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
      using P = NcclOptions::CtaPolicy;
      const P policy = *options.cta_policy;
      config.CTAPolicy = policy == P::efficiency ? NCCL_CTA_POLICY_EFFICIENCY
                         : policy == P::zero     ? NCCL_CTA_POLICY_ZERO
                                                 : NCCL_CTA_POLICY_DEFAULT;
#else
      ACCRUE_FAIL("NcclCommunicator: a CTA policy needs NCCL 2.27 or later, this is ",
                  NCCL_VERSION_CODE);
#endif
    }
    if (options.max_ctas) config.maxCTAs = *options.max_ctas;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, uid, rank, &config);
    std::lock_guard<std::mutex> lock(mu_);
    comm_ = comm;
    std::ostringstream what;
    what << "creating the communicator (world size " << world_size << ")";
    if (r != ncclSuccess && r != ncclInProgress) {
      abort_locked(who() + ": " + what.str() + " failed: NCCL error " + ncclGetErrorString(r) +
                   " (" + ncclGetLastError(comm) + ")");
      throw_if_aborted_locked();
    }
    // Bounded by the bootstrap timeout: a rank that never joins is an error, not a hang.
    wait_for_progress_locked(what.str(), options_.bootstrap_timeout_s);
  } catch (...) {
    release_events();
    throw;
  }
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  try {
    // Note [Copy-engine all-reduce]: the direct form's pushes end before the
    // buffers may go (shutdown's drain bounds the wait).
    join_pending();
    shutdown();
  } catch (const std::exception& e) {
    // A destructor cannot throw; say why the communicator went down hard.
    std::cerr << "accrue: NcclCommunicator " << who() << ": " << e.what() << "\n";
  }
  release_events();
}

void NcclCommunicator::shutdown() {
  cuda::DeviceScope guard(device_);
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_ || !comm_) return;
  // Collectives still in flight must finish before their buffers may go.
  while (poll_locked(Clock::now()) && (!in_flight_.empty() || launching_))
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (aborted_) throw Error(error_);
  const ncclResult_t r = ncclCommFinalize(comm_);
  if (r != ncclSuccess && r != ncclInProgress) {
    abort_locked(who() + ": finalizing the communicator failed: NCCL error " +
                 ncclGetErrorString(r));
    throw Error(error_);
  }
  wait_for_progress_locked("finalizing the communicator", options_.timeout_s);
  ncclCommDestroy(comm_);
  comm_ = nullptr;
}

void NcclCommunicator::release_events() noexcept {
  // Destroying a recorded event that has not completed is allowed: CUDA
  // releases it once it does.
  for (const Work& w : in_flight_)
    cudaEventDestroy(w.done);
  in_flight_.clear();
  for (EventHandle e : spare_events_)
    cudaEventDestroy(e);
  spare_events_.clear();
  if (ready_) cudaEventDestroy(ready_);
  ready_ = nullptr;
}

StreamHandle NcclCommunicator::stream() {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_aborted_locked();
  finish_launch_locked();  // Note [Deferred launch]: what the caller adds lands after it
  return stream_->handle();
}

bool NcclCommunicator::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

std::string NcclCommunicator::who() const {
  std::ostringstream os;
  os << "rank " << rank_ << " of " << world_size_ << " (cuda:" << device_ << ")";
  return os.str();
}

// ---- the watchdog -------------------------------------------------------------------------

// Note [Watchdog]
// ~~~~~~~~~~~~~~~
// A collective whose peer died never completes: its kernel spins on the
// device, and anything the compute stream orders after it (the window close)
// waits forever, as does the host at its next read-back. Two things keep that
// from being a silent hang (Note [No silent hang]):
//   - every enqueued collective is followed by an event; a watchdog thread
//     polls the oldest one (and ncclCommGetAsyncError) every
//     watchdog_interval_s, and when it has been in flight longer than
//     timeout_s, or NCCL reports an error, it calls ncclCommAbort. The abort
//     makes NCCL's kernels quit, which unblocks the streams (and a host stuck
//     in a read-back), and the error is kept;
//   - every later call on the communicator (check(), synchronize(), a
//     collective, the reducer's next micro-step) throws that error, naming
//     this rank and the collective.
// After an abort, the contents of every buffer a collective touched are
// undefined; the communicator cannot be used again.
bool NcclCommunicator::poll_locked(Clock::time_point now) {
  if (aborted_) return false;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) state = r;
  if (state != ncclSuccess && state != ncclInProgress) {
    const std::string in_flight =
        in_flight_.empty() ? "no collective was in flight (the last was " + last_collective_ + ")"
                           : in_flight_.front().what + " was in flight";
    abort_locked(who() + ": NCCL reported " + ncclGetErrorString(state) + " (" +
                 ncclGetLastError(comm_) + ") while " + in_flight +
                 ": a peer died or the network failed; the communicator was aborted");
    return false;
  }
  // Note [Deferred launch]: a launch NCCL has finished is followed from now
  // on; one that outlives the timeout is a hung peer like any other.
  if (launching_ && state == ncclSuccess) follow_launched_locked();
  if (launching_ && now - launching_->enqueued > to_duration(options_.timeout_s)) {
    std::ostringstream os;
    os << who() << ": " << launching_->what << " was not launched within " << options_.timeout_s
       << " s: a peer died, hung or never connected; the communicator was aborted";
    abort_locked(os.str());
    return false;
  }
  while (!in_flight_.empty()) {
    const cudaError_t e = cudaEventQuery(in_flight_.front().done);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      abort_locked(who() + ": CUDA error " + cudaGetErrorString(e) + " while " +
                   in_flight_.front().what + " was in flight; the communicator was aborted");
      return false;
    }
    spare_events_.push_back(in_flight_.front().done);
    in_flight_.pop_front();
  }
  if (!in_flight_.empty() && now - in_flight_.front().enqueued > to_duration(options_.timeout_s)) {
    std::ostringstream os;
    os << who() << ": " << in_flight_.front().what << " did not complete within "
       << options_.timeout_s << " s: a peer died or hung (" << in_flight_.size()
       << " collective(s) in flight); the communicator was aborted";
    abort_locked(os.str());
    return false;
  }
  return true;
}

void NcclCommunicator::abort_locked(const std::string& message) {
  if (aborted_) return;
  aborted_ = true;
  error_ = message;
  if (launching_) {  // never recorded: a spare
    spare_events_.push_back(launching_->done);
    launching_.reset();
  }
  // Note [Copy-engine all-reduce]: no stream stays blocked on the peer's
  // flags. First: ncclCommAbort frees device memory, which may wait for the
  // whole device, so streams still blocked there could hang the abort.
  if (copy_engine_) copy_engine_->release();
  if (comm_) {
    // Its result is of no use: the communicator is gone either way.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclCommunicator::throw_if_aborted_locked() const {
  if (aborted_) throw Error(error_);
}

void NcclCommunicator::wait_for_progress_locked(const std::string& what, double timeout_s) {
  const Clock::time_point deadline = Clock::now() + to_duration(timeout_s);
  for (int spins = 0;; ++spins) {
    throw_if_aborted_locked();
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort_locked(who() + ": " + what + " failed: NCCL error " + ncclGetErrorString(state) + " (" +
                   ncclGetLastError(comm_) +
                   "): a peer died or the network failed; the communicator was aborted");
      throw_if_aborted_locked();
    }
    if (Clock::now() > deadline) {
      std::ostringstream os;
      os << who() << ": " << what << " did not complete within " << timeout_s
         << " s: a peer died, hung or never joined; the communicator was aborted";
      abort_locked(os.str());
      throw_if_aborted_locked();
    }
    // Usually a few microseconds (a lazily connected channel takes longer).
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclCommunicator::watchdog_loop() {
  // Event queries go to the communicator's device from this thread too.
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  const auto interval = to_duration(options_.watchdog_interval_s);
  while (!stop_) {
    stop_cv_.wait_for(lock, interval, [this] { return stop_; });
    if (stop_) break;
    try {
      poll_locked(Clock::now());
    } catch (const std::exception& e) {
      abort_locked(who() + ": the watchdog failed: " + e.what());
    }
  }
}

void NcclCommunicator::check() {
  std::lock_guard<std::mutex> lock(mu_);
  // A thread capturing a CUDA graph (GraphedWindow's micro-steps, whose
  // before_backward checks here) may not query events: the capture would
  // fail, and the query's error would abort the communicator. The watchdog
  // thread keeps polling meanwhile.
  if (!graph_capturing()) poll_locked(Clock::now());
  throw_if_aborted_locked();
}

void NcclCommunicator::synchronize() {
  join_pending();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      poll_locked(Clock::now());
      throw_if_aborted_locked();
      if (in_flight_.empty() && !launching_) return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// ---- collectives --------------------------------------------------------------------------

EventHandle NcclCommunicator::take_event_locked() {
  if (!spare_events_.empty()) {
    EventHandle e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  cudaEvent_t e;
  ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// Note [Deferred launch]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The communicator is non-blocking (Note [No silent hang]: no NCCL call may
// hang the host), and NCCL launches each collective of a non-blocking
// communicator from a thread it starts for it, returning ncclInProgress; no
// other NCCL call may go to the communicator, and nothing after the
// collective on its stream, until that launch has finished. Waiting for it in
// the call cost the host 0.06-0.46 ms a collective on 2 x H200: 1.95 of the
// 2.3 ms the host took to issue the MLP's last backward. So a collective
// returns with its launch pending (launching_), and the wait happens where
// ordering needs it, usually after NCCL has finished: at the next collective,
// in stream() (whoever puts work on the stream, an event the compute stream
// waits for among it, gets it after the collective), synchronize() and the
// destructor. poll_locked (check() and the watchdog) follows a finished
// launch without waiting and aborts one that outlives the timeout, as it does
// a collective that never completes. Measured (bench/RESULTS.md, twenty-first
// session): the calls now take 0.03-0.13 ms and the host issues that backward
// in 2.0 ms; the GPU's windows did not change (the MLP's and GPT-2's), since
// the backward there is slowed by the collectives beside it on the GPU, not by
// the host: the host's time is freed for work that does bound it.
template <class Call>
void NcclCommunicator::enqueue(const std::string& what, Call&& call, bool copy_engine_call) {
  cuda::DeviceScope guard(device_);
  const StreamHandle producer = current_stream(device_);
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_aborted_locked();
  finish_launch_locked();  // Note [Deferred launch]
  // Note [Collective ordering]: after everything the caller's stream has so far.
  ACCRUE_CUDA_CHECK(cudaEventRecord(ready_, producer));
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream_->handle(), ready_, 0));
  Work work{what, take_event_locked(), Clock::now()};
  last_collective_ = what;
  // Its done event then follows the join's wait on the peer: the watchdog's.
  if (copy_engine_ && !copy_engine_call) copy_engine_->join(stream_->handle());
  const ncclResult_t r = call(comm_, stream_->handle());
  if (r != ncclSuccess && r != ncclInProgress) {
    spare_events_.push_back(work.done);
    abort_locked(who() + ": " + what + " could not be enqueued: NCCL error " +
                 ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) +
                 "); the communicator was aborted (the ranks' collectives no longer match)");
    throw_if_aborted_locked();
  }
  launching_ = std::move(work);
  // Note [Deferred launch]: still launching (in progress), it is followed later.
  if (r == ncclSuccess) follow_launched_locked();
  ++issued_;
}

void NcclCommunicator::finish_launch_locked() {
  if (!launching_) return;
  const std::string what = launching_->what;
  const double waited = std::chrono::duration<double>(Clock::now() - launching_->enqueued).count();
  // Throws (having aborted, which returns the event) when it fails or times out.
  wait_for_progress_locked(what, std::max(0.0, options_.timeout_s - waited));
  follow_launched_locked();
}

void NcclCommunicator::follow_launched_locked() {
  Work work = std::move(*launching_);
  launching_.reset();
  const cudaError_t e = cudaEventRecord(work.done, stream_->handle());
  if (e != cudaSuccess) {
    spare_events_.push_back(work.done);
    ACCRUE_CUDA_CHECK(e);
  }
  in_flight_.push_back(std::move(work));
}

void NcclCommunicator::all_reduce(const Tensor& data, ReduceOp op) {
  check_collective_tensor(data, device(), "all_reduce", "data");
  const ncclDataType_t type = nccl_dtype(data.dtype());
  const ncclRedOp_t reduce = nccl_op(op);
  void* p = data.data_ptr();
  const size_t count = static_cast<size_t>(data.numel());
  // Note [Copy-engine all-reduce]: both ranks decide alike (same sizes, same
  // dtype, the arena's alignment), so their calls stay matched.
  if (copy_engine_ && op == ReduceOp::sum && data.dtype() == DType::f32 &&
      static_cast<int64_t>(data.nbytes()) >= copy_engine_min_bytes_ &&
      copy_engine_->takes(p, data.numel())) {
    enqueue(
        describe_collective("all_reduce on the copy engines", &op, data.numel(), data.dtype()),
        [&](ncclComm_t, cudaStream_t s) {
          copy_engine_->enqueue(static_cast<float*>(p), data.numel(), s);
          ++copy_engine_calls_;
          return ncclSuccess;
        },
        /*copy_engine_call=*/true);
    return;
  }
  enqueue(describe_collective("all_reduce", &op, data.numel(), data.dtype()),
          [&](ncclComm_t comm, cudaStream_t s) {
            return ncclAllReduce(p, p, count, type, reduce, comm, s);
          });
}

void NcclCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_collective_tensor(input, device(), "reduce_scatter", "input");
  check_collective_tensor(output, device(), "reduce_scatter", "output");
  ACCRUE_CHECK(input.dtype() == output.dtype(), "reduce_scatter: input is ",
               dtype_name(input.dtype()), " but output is ", dtype_name(output.dtype()));
  ACCRUE_CHECK(input.numel() == output.numel() * world_size_, "reduce_scatter: input has ",
               input.numel(), " elements and output ", output.numel(),
               "; input must have world size (", world_size_, ") x output's");
  const char* in = static_cast<const char*>(input.data_ptr());
  char* out = static_cast<char*>(output.data_ptr());
  // NCCL takes either disjoint buffers or output = chunk rank() of input.
  ACCRUE_CHECK(!overlaps(input, output) || out == in + rank_ * output.nbytes(),
               "reduce_scatter: output overlaps input but is not chunk ", rank_,
               " of it (the in-place form writes this rank's chunk)");
  const ncclDataType_t type = nccl_dtype(input.dtype());
  const ncclRedOp_t reduce = nccl_op(op);
  const size_t count = static_cast<size_t>(output.numel());
  enqueue(describe_collective("reduce_scatter", &op, input.numel(), input.dtype()),
          [&](ncclComm_t comm, cudaStream_t s) {
            return ncclReduceScatter(in, out, count, type, reduce, comm, s);
          });
}

void NcclCommunicator::join_pending() {
  if (!copy_engine_ || !copy_engine_->pending()) return;
  enqueue(
      "all_reduce on the copy engines: the peer's sums awaited",
      [&](ncclComm_t, cudaStream_t s) {
        copy_engine_->join(s);
        return ncclSuccess;
      },
      /*copy_engine_call=*/true);
}

void NcclCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_collective_tensor(input, device(), "all_gather", "input");
  check_collective_tensor(output, device(), "all_gather", "output");
  ACCRUE_CHECK(input.dtype() == output.dtype(), "all_gather: input is ", dtype_name(input.dtype()),
               " but output is ", dtype_name(output.dtype()));
  ACCRUE_CHECK(output.numel() == input.numel() * world_size_, "all_gather: input has ",
               input.numel(), " elements and output ", output.numel(),
               "; output must have world size (", world_size_, ") x input's");
  const char* in = static_cast<const char*>(input.data_ptr());
  char* out = static_cast<char*>(output.data_ptr());
  ACCRUE_CHECK(!overlaps(input, output) || in == out + rank_ * input.nbytes(),
               "all_gather: input overlaps output but is not chunk ", rank_,
               " of it (the in-place form reads this rank's chunk)");
  const ncclDataType_t type = nccl_dtype(input.dtype());
  const size_t count = static_cast<size_t>(input.numel());
  enqueue(describe_collective("all_gather", nullptr, output.numel(), output.dtype()),
          [&](ncclComm_t comm, cudaStream_t s) {
            return ncclAllGather(in, out, count, type, comm, s);
          });
}

void NcclCommunicator::broadcast(const Tensor& data, int root) {
  check_collective_tensor(data, device(), "broadcast", "data");
  ACCRUE_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root,
               " is not a rank of a world of size ", world_size_);
  const ncclDataType_t type = nccl_dtype(data.dtype());
  void* p = data.data_ptr();
  const size_t count = static_cast<size_t>(data.numel());
  std::ostringstream what;
  what << describe_collective("broadcast", nullptr, data.numel(), data.dtype()) << " from rank "
       << root;
  enqueue(what.str(), [&](ncclComm_t comm, cudaStream_t s) {
    return ncclBroadcast(p, p, count, type, root, comm, s);
  });
}

// ---- bootstrap ----------------------------------------------------------------------------

std::unique_ptr<NcclCommunicator> connect_nccl(const RankInfo& info, uint64_t fingerprint,
                                               const NcclOptions& options, int exchange_port) {
  ACCRUE_CHECK(info.local_rank < cuda_device_count(), "connect_nccl: ", describe(info),
               " drives cuda:", info.local_rank, " but ", cuda_device_count(),
               " CUDA devices are visible (one process per GPU: start at most that many per node) ",
               cuda_unavailable_reason());
  // One process per GPU: from here on the local rank's GPU is this process's device.
  set_cuda_device(info.local_rank);
  const Blob own_id = info.rank == 0 ? NcclCommunicator::make_unique_id() : Blob{};
  Blob id;
  if (bootstrap_method(info) == Bootstrap::mpi) {
    // mpirun connected the ranks already: no MASTER_ADDR/MASTER_PORT, no port.
    id = mpi_exchange_blob(info, fingerprint, own_id);
  } else {
    const ExchangeOptions exchange =
        exchange_options(info, fingerprint, exchange_port, options.bootstrap_timeout_s);
    id = info.rank == 0 ? serve_blob(exchange, own_id) : fetch_blob(exchange);
  }
  return std::make_unique<NcclCommunicator>(id, info.rank, info.world_size, info.local_rank,
                                            options);
}

}  // namespace accrue::dist
