// The CPU thread pool (Note [CPU threads]): coverage of the range, exceptions,
// nested calls, the thread count and its environment variable, concurrent callers.
#include <gmock/gmock.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/core/parallel.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using ::testing::HasSubstr;

// Sets the thread count for a scope and restores it (ctest runs with
// ACCRUE_NUM_THREADS=1; these tests need several threads whatever the machine).
class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : previous_(num_threads()) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(previous_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int previous_;
};

// Sets (or unsets, with nullptr) an environment variable for a scope.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvScope() {
    if (old_.has_value()) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(ParallelFor, visits_every_index_once_for_any_range_grain_and_thread_count) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadsScope scope(threads);
    for (int64_t begin : {0, 5}) {
      for (int64_t n : {0, 1, 2, 10, 97, 1000, 4099}) {
        for (int64_t grain : {0, 1, 3, 64, 5000}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " begin " + std::to_string(begin) +
                       " n " + std::to_string(n) + " grain " + std::to_string(grain));
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::atomic<int> calls{0};
          parallel_for(begin, begin + n, grain, [&](int64_t b, int64_t e) {
            EXPECT_LT(b, e);
            EXPECT_GE(b, begin);
            EXPECT_LE(e, begin + n);
            ++calls;
            for (int64_t i = b; i < e; ++i)
              ++hits[static_cast<size_t>(i - begin)];
          });
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << begin + i;
          // At most one chunk per thread, each of at least `grain` indices;
          // a range of at most `grain` indices is one call.
          EXPECT_LE(calls.load(), threads);
          if (n > 0 && n <= std::max<int64_t>(grain, 1)) {
            EXPECT_EQ(calls.load(), 1);
          }
          if (n == 0) {
            EXPECT_EQ(calls.load(), 0);
          }
        }
      }
    }
  }
}

TEST(ParallelFor, splits_a_large_range_across_threads_and_small_ones_stay_inline) {
  ThreadsScope scope(4);
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> calls{0};
  const int64_t runs = parallel_runs();
  parallel_for(0, 4000, 100, [&](int64_t, int64_t) {
    ++calls;
    // Long enough that every chunk is claimed before the first finishes.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(m);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(calls.load(), 4);
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(parallel_runs(), runs + 1);

  int small_calls = 0;
  parallel_for(0, 100, 100, [&](int64_t b, int64_t e) {
    ++small_calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 100);
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_FALSE(in_parallel_region());
  });
  EXPECT_EQ(small_calls, 1);
  EXPECT_EQ(parallel_runs(), runs + 1);
}

TEST(ParallelFor, an_exception_in_a_chunk_reaches_the_caller_after_every_chunk_ran) {
  ThreadsScope scope(4);
  for (int64_t bad : {0, 17, 999}) {
    std::atomic<int64_t> visited{0};
    const std::string where = "index " + std::to_string(bad);
    EXPECT_ERROR(parallel_for(0, 1000, 10,
                              [&](int64_t b, int64_t e) {
                                visited += e - b;
                                if (b <= bad && bad < e) ACCRUE_FAIL("chunk op: index ", bad);
                              }),
                 "chunk op", where.c_str());
    EXPECT_EQ(visited.load(), 1000);
  }
  // Several chunks throw: the lowest chunk's error is the one rethrown.
  EXPECT_ERROR(parallel_for(0, 1000, 10, [&](int64_t b, int64_t) { ACCRUE_FAIL("from ", b); }),
               "from 0");
  // A non-accrue exception passes through unchanged.
  EXPECT_THROW(parallel_for(0, 1000, 10, [](int64_t, int64_t) { throw std::bad_alloc(); }),
               std::bad_alloc);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel_for(0, 1000, 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(ParallelFor, a_nested_call_runs_inline_on_the_thread_of_its_chunk) {
  ThreadsScope scope(4);
  EXPECT_FALSE(in_parallel_region());
  std::atomic<int> outer_calls{0}, inner_calls{0};
  std::vector<std::atomic<int>> hits(400 * 50);
  const int64_t runs = parallel_runs();
  parallel_for(0, 400, 10, [&](int64_t b, int64_t e) {
    ++outer_calls;
    EXPECT_TRUE(in_parallel_region());
    const std::thread::id me = std::this_thread::get_id();
    for (int64_t i = b; i < e; ++i) {
      parallel_for(0, 50, 1, [&](int64_t ib, int64_t ie) {
        ++inner_calls;
        EXPECT_EQ(ib, 0);
        EXPECT_EQ(ie, 50);
        EXPECT_EQ(std::this_thread::get_id(), me);
        for (int64_t j = ib; j < ie; ++j)
          ++hits[static_cast<size_t>(i * 50 + j)];
      });
    }
  });
  EXPECT_FALSE(in_parallel_region());
  EXPECT_EQ(outer_calls.load(), 4);
  EXPECT_EQ(inner_calls.load(), 400);
  for (const auto& h : hits)
    ASSERT_EQ(h.load(), 1);
  EXPECT_EQ(parallel_runs(), runs + 1);  // only the outer call used the pool
}

TEST(ParallelFor, set_num_threads_sets_the_count_and_refuses_bad_values) {
  ThreadsScope scope(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  const int64_t runs = parallel_runs();
  int calls = 0;
  parallel_for(0, 100000, 1, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(e - b, 100000);
  });
  EXPECT_EQ(calls, 1);  // one thread: inline, whatever the grain
  EXPECT_EQ(parallel_runs(), runs);
  set_num_threads(5);
  EXPECT_EQ(num_threads(), 5);
  std::atomic<int> chunks{0};
  parallel_for(0, 100000, 1, [&](int64_t, int64_t) { ++chunks; });
  EXPECT_EQ(chunks.load(), 5);
  EXPECT_ERROR(set_num_threads(0), "set_num_threads", "got 0");
  EXPECT_ERROR(set_num_threads(-2), "set_num_threads", "got -2");
  EXPECT_EQ(num_threads(), 5);
  std::atomic<int> refused{0};
  parallel_for(0, 100, 1, [&](int64_t, int64_t) {
    try {
      set_num_threads(2);
    } catch (const Error& e) {
      if (std::string(e.what()).find("inside a parallel_for chunk") != std::string::npos) ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 5);
  EXPECT_EQ(num_threads(), 5);
}

TEST(ParallelFor, the_default_count_comes_from_ACCRUE_NUM_THREADS_or_the_hardware) {
  {
    EnvScope env("ACCRUE_NUM_THREADS", "3");
    EXPECT_EQ(default_num_threads(), 3);
  }
  {
    EnvScope env("ACCRUE_NUM_THREADS", nullptr);
    const unsigned hw = std::thread::hardware_concurrency();
    EXPECT_EQ(default_num_threads(), hw == 0 ? 1 : static_cast<int>(hw));
  }
  for (const char* bad : {"0", "-1", "two", "4x", "100000"}) {
    EnvScope env("ACCRUE_NUM_THREADS", bad);
    const std::string quoted = std::string("'") + bad + "'";
    EXPECT_ERROR(default_num_threads(), "ACCRUE_NUM_THREADS", quoted.c_str());
  }
}

TEST(ParallelFor, concurrent_callers_each_get_their_whole_range) {
  ThreadsScope scope(3);
  constexpr int kCallers = 4, kRounds = 200;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < kRounds; ++round) {
        std::atomic<int64_t> sum{0};
        parallel_for(0, 3000 + c, 7, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            sum += i;
        });
        sums[static_cast<size_t>(c)] += sum.load();
      }
    });
  }
  for (std::thread& t : callers)
    t.join();
  for (int c = 0; c < kCallers; ++c) {
    const int64_t n = 3000 + c;
    EXPECT_EQ(sums[static_cast<size_t>(c)], kRounds * (n * (n - 1) / 2)) << "caller " << c;
  }
}

TEST(ParallelFor, a_forked_child_gets_a_pool_of_its_own) {
  ThreadsScope scope(4);
  std::atomic<int64_t> sum{0};
  parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) {  // the workers are started
    for (int64_t i = b; i < e; ++i)
      sum += i;
  });
  ASSERT_EQ(sum.load(), 999 * 1000 / 2);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);  // a hang is a failure, not a stuck test
    std::atomic<int64_t> s{0};
    std::mutex m;
    std::set<std::thread::id> ids;
    parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      {
        std::lock_guard<std::mutex> lock(m);
        ids.insert(std::this_thread::get_id());
      }
      for (int64_t i = b; i < e; ++i)
        s += i;
    });
    ::_exit(s.load() == 999 * 1000 / 2 && ids.size() > 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "the child's parallel_for missed indices or ran on one thread";
}

}  // namespace
}  // namespace accrue
