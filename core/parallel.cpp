// The CPU thread pool (Note [CPU threads]).
#include "accrue/core/parallel.h"

#include <pthread.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "accrue/core/error.h"

namespace accrue {

namespace {

using detail::ChunkFn;

thread_local bool t_in_chunk = false;

constexpr int kMaxThreads = 1024;

int read_default_threads() {
  if (const char* env = std::getenv("ACCRUE_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    ACCRUE_CHECK(*end == '\0' && v >= 1 && v <= kMaxThreads,
                 "ACCRUE_NUM_THREADS: expected an integer from 1 to ", kMaxThreads, ", got '", env,
                 "'");
    return static_cast<int>(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, kMaxThreads));
}

// 0 until first read: the environment is read on the first num_threads().
std::atomic<int> g_threads{0};
std::atomic<int64_t> g_runs{0};

// Note [Pool spinning]
// ~~~~~~~~~~~~~~~~~~~~
// A model's step is thousands of short parallel_for calls with a little serial
// work between them. A worker asleep on a condition variable takes a futex
// wake-up before it runs its chunk, and the caller waits for it, or runs the
// chunk itself: on 2 cores a job of two 50-us chunks took as long as on one
// thread (bench/RESULTS.md, "workers spin before they sleep"). So a worker
// that finds the queue empty, and a caller waiting for its job's last chunk,
// first spin for up to kSpin on an atomic (with the CPU's pause hint), then
// sleep as before. A pool between
// calls costs at most kSpin of each worker's time; the results do not change
// (Note [CPU threads]: who runs a chunk never changes what it computes).
constexpr std::chrono::microseconds kSpin{100};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until ready() or kSpin has passed; whether ready() became true.
template <class Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (ready()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return false;
    cpu_relax();
  }
}

// One parallel_for call. It lives on its caller's stack; it is in the pool's
// queue only while it has unclaimed chunks, and chunks are claimed under the
// pool's mutex, so a worker never sees a job whose caller may have returned.
struct Job {
  Job(ChunkFn f, void* c, int64_t b, int64_t count, int64_t k)
      : fn(f), ctx(c), begin(b), n(count), chunks(k) {}

  ChunkFn fn;
  void* ctx;
  int64_t begin, n, chunks;
  int64_t next = 0;  // the next unclaimed chunk (under the pool's mutex)
  std::mutex m;      // guards error and error_chunk; done changes under it
  std::condition_variable cv;
  std::atomic<int64_t> done{0};  // read without m by a spinning caller
  std::exception_ptr error;
  int64_t error_chunk = std::numeric_limits<int64_t>::max();

  // Chunk c is [c * base + min(c, rem), ...): sizes differ by at most one.
  void run(int64_t c) {
    const int64_t base = n / chunks, rem = n % chunks;
    const int64_t b = begin + c * base + std::min(c, rem);
    const int64_t e = b + base + (c < rem ? 1 : 0);
    const bool outer = t_in_chunk;
    t_in_chunk = true;
    std::exception_ptr err;
    try {
      fn(ctx, b, e);
    } catch (...) {
      err = std::current_exception();
    }
    t_in_chunk = outer;
    std::lock_guard<std::mutex> lock(m);
    if (err && c < error_chunk) {
      error = err;
      error_chunk = c;
    }
    // Notify under the lock: the caller cannot return (and destroy the job)
    // before this thread lets go of m.
    if (++done == chunks) cv.notify_all();
  }
};

class Pool {
 public:
  // Workers for `threads` threads in all (the caller is one of them).
  void ensure(int threads) {
    if (started_.load(std::memory_order_acquire) == threads - 1) return;
    std::lock_guard<std::mutex> config(config_m_);
    const size_t want = static_cast<size_t>(threads - 1);
    if (workers_.size() == want) return;
    stop_workers();
    for (size_t i = 0; i < want; ++i)
      workers_.emplace_back([this] { work(); });
    started_.store(static_cast<int>(want), std::memory_order_release);
  }

  void resize_to(int threads) {
    std::lock_guard<std::mutex> config(config_m_);
    if (workers_.size() > static_cast<size_t>(threads - 1)) stop_workers();
  }

  void lock_for_fork() {
    config_m_.lock();
    m_.lock();
  }
  void unlock_after_fork() {
    m_.unlock();
    config_m_.unlock();
  }

  void run(Job& job) {
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(&job);
      queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
    }
    cv_.notify_all();
    // The caller runs its own chunks until none is left unclaimed: a call
    // never waits on workers that are busy elsewhere or gone.
    for (;;) {
      int64_t c;
      {
        std::lock_guard<std::mutex> lock(m_);
        if (job.next == job.chunks) break;
        c = claim(job);
      }
      job.run(c);
    }
    // Note [Pool spinning]. Then the lock: the last chunk's thread may still
    // hold it to notify, and the job must outlive that.
    spin_until([&] { return job.done.load(std::memory_order_acquire) == job.chunks; });
    std::unique_lock<std::mutex> lock(job.m);
    job.cv.wait(lock, [&] { return job.done.load(std::memory_order_acquire) == job.chunks; });
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  // Under m_: claims the job's next chunk, dequeuing the job at its last.
  int64_t claim(Job& job) {
    const int64_t c = job.next++;
    if (job.next == job.chunks) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), &job));
      queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
    }
    return c;
  }

  void work() {
    for (;;) {
      Job* job;
      int64_t c;
      // Note [Pool spinning]: the next job usually comes within microseconds.
      spin_until([&] { return queued_.load(std::memory_order_acquire) > 0; });
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = queue_.front();
        c = claim(*job);
      }
      job->run(c);
    }
  }

  // Under config_m_. A worker finishes the chunk it holds; chunks nobody
  // claimed are run by their callers.
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_)
      t.join();
    workers_.clear();
    started_.store(0, std::memory_order_release);
    std::lock_guard<std::mutex> lock(m_);
    stop_ = false;
  }

  std::mutex config_m_;  // serializes starting and stopping workers
  std::vector<std::thread> workers_;
  std::atomic<int> started_{0};  // workers_.size(), read without config_m_
  std::mutex m_;                 // guards queue_, stop_ and every queued job's next
  std::condition_variable cv_;
  std::deque<Job*> queue_;
  std::atomic<int64_t> queued_{0};  // queue_.size(), for spinning workers
  bool stop_ = false;
};

// Never destroyed: a kernel running from a static destructor, or a worker
// still waiting at exit, must not meet a destroyed pool.
Pool* g_pool = nullptr;

// A fork() copies the pool but none of its workers, and possibly a mutex a
// worker held: the child starts a fresh pool (the old one is left as it is),
// and the fork waits until no thread holds the pool's mutexes.
Pool& pool() {
  static const bool installed = [] {
    g_pool = new Pool();
    pthread_atfork([] { g_pool->lock_for_fork(); }, [] { g_pool->unlock_after_fork(); },
                   [] { g_pool = new Pool(); });
    return true;
  }();
  (void)installed;
  return *g_pool;
}

}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    int expected = 0;
    n = read_default_threads();
    if (!g_threads.compare_exchange_strong(expected, n)) n = expected;
  }
  return n;
}

void set_num_threads(int n) {
  ACCRUE_CHECK(n >= 1 && n <= kMaxThreads, "set_num_threads: expected 1 to ", kMaxThreads,
               " threads, got ", n);
  ACCRUE_CHECK(!t_in_chunk, "set_num_threads(", n, "): called inside a parallel_for chunk");
  g_threads.store(n);
  pool().resize_to(n);
}

bool in_parallel_region() {
  return t_in_chunk;
}

int default_num_threads() {
  return read_default_threads();
}

int64_t parallel_runs() {
  return g_runs.load(std::memory_order_relaxed);
}

namespace detail {

int64_t parallel_chunks(int64_t n, int64_t grain) {
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain || t_in_chunk) return 1;
  const int64_t threads = num_threads();
  if (threads == 1) return 1;
  return std::min(threads, (n + grain - 1) / grain);
}

void parallel_run(int64_t begin, int64_t end, int64_t chunks, ChunkFn fn, void* ctx) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  Pool& p = pool();
  p.ensure(num_threads());
  Job job(fn, ctx, begin, end - begin, chunks);
  p.run(job);
}

}  // namespace detail

}  // namespace accrue
