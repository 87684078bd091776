// The CPU thread pool (Note [CPU threads]).
#include "accrue/core/parallel.h"

#include <pthread.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
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
// that finds no new job, and a caller waiting for its job's last chunk,
// first spin for up to kSpin on an atomic (with the CPU's pause hint), then
// sleep (a worker) or yield (a caller). A pool between calls costs at most
// kSpin of each worker's time; the results do not change (Note [CPU threads]:
// who runs a chunk never changes what it computes).
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

// One parallel_for call, on its caller's stack. Chunks are claimed with one
// atomic increment each (Note [Pool slots]).
struct Job {
  Job(ChunkFn f, void* c, int64_t b, int64_t count, int64_t k)
      : fn(f), ctx(c), begin(b), n(count), chunks(k) {}

  ChunkFn fn;
  void* ctx;
  int64_t begin, n, chunks;
  std::atomic<int64_t> next{0};  // the next unclaimed chunk (>= chunks: none left)
  std::atomic<int64_t> done{0};  // chunks finished
  std::mutex m;                  // guards error and error_chunk
  std::exception_ptr error;
  int64_t error_chunk = std::numeric_limits<int64_t>::max();

  // Chunk c is [c * base + min(c, rem), ...): sizes differ by at most one.
  void run(int64_t c) {
    const int64_t base = n / chunks, rem = n % chunks;
    const int64_t b = begin + c * base + std::min(c, rem);
    const int64_t e = b + base + (c < rem ? 1 : 0);
    const bool outer = t_in_chunk;
    t_in_chunk = true;
    try {
      fn(ctx, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(m);
      if (c < error_chunk) {
        error = std::current_exception();
        error_chunk = c;
      }
    }
    t_in_chunk = outer;
    done.fetch_add(1, std::memory_order_release);
  }

  // Runs chunks until none is left unclaimed; how many this thread ran.
  int64_t run_unclaimed() {
    int64_t ran = 0;
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1), ++ran)
      run(c);
    return ran;
  }
};

// Note [Pool slots]
// ~~~~~~~~~~~~~~~~~
// A caller publishes its job in a free slot of a fixed array, bumps the
// pool's generation, and runs chunks itself; workers that see a new
// generation scan the slots and run chunks of every job they find. Claiming
// a chunk is one atomic increment. The first pool took the pool's mutex for
// every claim and a job's mutex for every finished chunk: 16 threads contend
// for them on every call, the suspect (not measured directly) for the tiny
// Llama's f64 window running only 4.0-4.4x faster on 16 threads than on one
// where its chunking allows 9.0x (bench/RESULTS.md).
// The job lives on its caller's stack, so the caller must not return while a
// worker may still touch it. A worker announces itself in the slot's
// `active` count before it reads the slot's job; the caller empties the slot
// and then waits for `active` to reach zero (and for every chunk to finish).
// Both sides are sequentially consistent, so either the worker sees the
// empty slot or the caller sees the worker (the store-load pairing of
// Dekker's protocol): no worker holds a job whose caller has returned.
// A slot stays taken until its caller has seen the last worker leave, so a
// caller never waits on workers of a job published after its own. Several
// threads may call parallel_for at once, each in its own slot; with every
// slot taken, a caller runs its chunks itself. Either way each chunk runs
// exactly once and the results do not change.
constexpr int kSlots = 8;

struct alignas(64) Slot {
  std::atomic<bool> taken{false};  // a caller's, from publishing until its workers are gone
  std::atomic<Job*> job{nullptr};
  std::atomic<int> active{0};  // workers that may hold job
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
    Slot* slot = publish(job);
    job.run_unclaimed();
    if (slot != nullptr) {
      slot->job.store(nullptr);  // Note [Pool slots]: then wait for the workers
      const auto finished = [&] {
        return job.done.load(std::memory_order_acquire) == job.chunks && slot->active.load() == 0;
      };
      if (!spin_until(finished)) {
        while (!finished())
          std::this_thread::yield();
      }
      slot->taken.store(false);  // only now: another caller's workers would count as ours
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  // Puts the job in a free slot and wakes the workers; nullptr when every
  // slot is taken (the caller then runs every chunk).
  Slot* publish(Job& job) {
    for (Slot& slot : slots_) {
      if (!slot.taken.load(std::memory_order_relaxed) && !slot.taken.exchange(true)) {
        slot.job.store(&job);
        generation_.fetch_add(1);
        if (sleepers_.load() > 0) {
          std::lock_guard<std::mutex> lock(m_);
          cv_.notify_all();
        }
        return &slot;
      }
    }
    return nullptr;
  }

  bool woken(uint64_t seen) const { return stop_.load() || generation_.load() != seen; }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      // Note [Pool spinning]: the next job usually comes within microseconds.
      if (!spin_until([&] { return woken(seen); })) {
        std::unique_lock<std::mutex> lock(m_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] { return woken(seen); });
        sleepers_.fetch_sub(1);
      }
      if (stop_.load()) return;
      seen = generation_.load();
      // Every published job, until a scan finds nothing to run.
      for (bool ran = true; ran;) {
        ran = false;
        for (Slot& slot : slots_) {
          if (slot.job.load(std::memory_order_relaxed) == nullptr) continue;
          slot.active.fetch_add(1);  // Note [Pool slots]: before reading the job
          if (Job* job = slot.job.load(); job != nullptr && job->run_unclaimed() > 0) ran = true;
          slot.active.fetch_sub(1);
        }
      }
    }
  }

  // Under config_m_. A worker finishes the chunks it holds; chunks nobody
  // claimed are run by their callers.
  void stop_workers() {
    stop_.store(true);
    {
      std::lock_guard<std::mutex> lock(m_);
      cv_.notify_all();
    }
    for (std::thread& t : workers_)
      t.join();
    workers_.clear();
    started_.store(0, std::memory_order_release);
    stop_.store(false);
  }

  std::mutex config_m_;  // serializes starting and stopping workers
  std::vector<std::thread> workers_;
  std::atomic<int> started_{0};  // workers_.size(), read without config_m_
  Slot slots_[kSlots];
  std::atomic<uint64_t> generation_{0};  // bumped by every published job
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};  // workers waiting on cv_
  std::mutex m_;                  // for cv_ only
  std::condition_variable cv_;
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
