// The CPU kernels' thread pool: parallel_for over an index range, on a lazily
// started pool of std::threads.
//
// Note [CPU threads]
// ~~~~~~~~~~~~~~~~~~
// The CPU backend runs its loops on num_threads() threads: the
// ACCRUE_NUM_THREADS environment variable (a positive integer), else
// std::thread::hardware_concurrency(); set_num_threads(n) overrides both.
// The pool starts on the first parallel_for that needs it, with n - 1 workers
// (the calling thread runs chunks too).
//
// Results are bitwise independent of the thread count (Note [Determinism]),
// because a kernel splits its work only over independent outputs: every output
// element is computed by one call of fn, by the same code and in the same
// order as with one thread, whichever chunk it falls in. A floating-point sum
// is never split across chunks, unless the order of its partial sums is fixed
// by the shape alone (fixed-size blocks combined in block order), so that one
// thread and N threads add the same numbers in the same order. Which chunk
// boundaries a call uses depends on the thread count; what a kernel computes
// must not.
//
// Small problems stay on the calling thread: parallel_for splits [begin, end)
// into at most num_threads() chunks of at least `grain` indices, and a range
// of at most `grain` indices runs inline, paying nothing but a branch. A
// parallel_for inside a chunk (a kernel called from a pool task, on a worker
// or on the caller) runs inline too, so the pool never waits on itself. The
// first exception a chunk throws (the lowest chunk's, when several do) is
// rethrown to the caller once every chunk has finished.
//
// Several threads may call parallel_for at once (data-parallel ranks in one
// process): their chunks share the workers, and each caller runs its own
// unclaimed chunks, so no call waits for another's (Note [Pool slots]: up to
// eight at once use the workers; a ninth runs its chunks on its own thread).
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

namespace accrue {

// The threads a parallel_for may use, the caller included (at least 1).
int num_threads();

// Sets num_threads() (n >= 1) for every later parallel_for; workers beyond
// n - 1 are stopped. Refused inside a parallel_for chunk.
void set_num_threads(int n);

// True while this thread runs a chunk of a parallel_for (nested calls run inline).
bool in_parallel_region();

// What num_threads() starts as: ACCRUE_NUM_THREADS (an error unless an integer
// from 1 to 1024), else the hardware's thread count. Reads the environment.
int default_num_threads();

// How many parallel_for calls have split their range so far (for tests: a
// kernel that should use the pool did).
int64_t parallel_runs();

namespace detail {

using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);

// How many chunks a parallel_for over n indices uses: 1 (inline) when n <=
// grain, when already inside a chunk or with one thread.
int64_t parallel_chunks(int64_t n, int64_t grain);

// Runs fn over [begin, end) in `chunks` chunks on the pool and the caller.
void parallel_run(int64_t begin, int64_t end, int64_t chunks, ChunkFn fn, void* ctx);

}  // namespace detail

// Calls fn(chunk_begin, chunk_end) over disjoint chunks covering [begin, end),
// each index in exactly one chunk (Note [CPU threads]).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) {
  if (end <= begin) return;
  const int64_t chunks = detail::parallel_chunks(end - begin, grain);
  if (chunks <= 1) {
    fn(begin, end);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  detail::parallel_run(
      begin, end, chunks, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
}

}  // namespace accrue
