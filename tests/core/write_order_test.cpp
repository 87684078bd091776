// Note [Ordered writes]: which waits and records a WriteOrder issues, on
// stand-in streams (the ops are written down instead of run on CUDA).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "accrue/core/write_order.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

StreamHandle stream(uintptr_t id) {
  return reinterpret_cast<StreamHandle>(id);
}

struct Recorded {
  std::vector<std::string> ops;
  WriteOrder::Ops sink() {
    return [this](WriteOrder::Op op, size_t key, StreamHandle s) {
      ops.push_back(std::string(op == WriteOrder::Op::wait ? "wait " : "record ") +
                    std::to_string(key) + " on " + std::to_string(reinterpret_cast<uintptr_t>(s)));
    };
  }
};

TEST(WriteOrder, inactive_it_issues_nothing) {
  Recorded r;
  WriteOrder order(2, r.sink());
  order.before_write(0, stream(1));
  order.finished(0, stream(1));
  order.before_write(0, stream(2));
  EXPECT_TRUE(r.ops.empty());
  EXPECT_FALSE(order.active());
}

// Micro-step 0 on stream 1, micro-step 1 on stream 2, micro-step 2 on stream
// 1 again: each stream's first write of a key waits for the other's record.
TEST(WriteOrder, each_turn_waits_for_the_last_turn_of_another_stream) {
  Recorded r;
  WriteOrder order(2, r.sink());
  const WriteOrderScope on(order);
  order.before_write(0, stream(1));  // the first turn waits for nothing
  order.before_write(0, stream(1));
  order.finished(0, stream(1));
  order.before_write(1, stream(1));
  order.finished(1, stream(1));
  order.before_write(0, stream(2));
  order.before_write(0, stream(2));  // its own turn: ordered by the stream
  order.finished(0, stream(2));
  order.before_write(0, stream(1));
  const std::vector<std::string> want = {"record 0 on 1", "record 1 on 1", "wait 0 on 2",
                                         "record 0 on 2", "wait 0 on 1"};
  EXPECT_EQ(r.ops, want);
  EXPECT_EQ(order.waits(), 2);
  EXPECT_EQ(order.records(), 3);
}

// A wait for the writer's later record covers its earlier ones: a tied
// weight's slot, finished last by one backward and written first by the
// next, leaves one wait; slots taken in the order they were finished each
// need theirs.
TEST(WriteOrder, a_wait_implied_by_an_earlier_one_is_left_out) {
  Recorded r;
  WriteOrder order(3, r.sink());
  const WriteOrderScope on(order);
  for (size_t key : {0, 1, 2}) {
    order.before_write(key, stream(1));
    order.finished(key, stream(1));
  }
  order.before_write(2, stream(2));  // the last finished: covers keys 0 and 1
  order.before_write(0, stream(2));
  order.before_write(1, stream(2));
  EXPECT_EQ(order.waits(), 1);
  EXPECT_EQ(order.implied_waits(), 2);
  for (size_t key : {0, 1, 2})
    order.finished(key, stream(2));
  order.before_write(0, stream(1));  // in finishing order: every wait is needed
  order.before_write(1, stream(1));
  order.before_write(2, stream(1));
  const std::vector<std::string> want = {
      "record 0 on 1", "record 1 on 1", "record 2 on 1", "wait 2 on 2", "record 0 on 2",
      "record 1 on 2", "record 2 on 2", "wait 0 on 1",   "wait 1 on 1", "wait 2 on 1"};
  EXPECT_EQ(r.ops, want);
  EXPECT_EQ(order.implied_waits(), 2);
}

// A turn that ends without a write of its own still follows the last one,
// so its record covers it.
TEST(WriteOrder, a_finish_without_a_write_follows_the_last_turn) {
  Recorded r;
  WriteOrder order(1, r.sink());
  const WriteOrderScope on(order);
  order.before_write(0, stream(1));
  order.finished(0, stream(1));
  order.finished(0, stream(2));
  const std::vector<std::string> want = {"record 0 on 1", "wait 0 on 2", "record 0 on 2"};
  EXPECT_EQ(r.ops, want);
}

TEST(WriteOrder, activating_again_forgets_the_writers) {
  Recorded r;
  WriteOrder order(1, r.sink());
  order.activate();
  order.before_write(0, stream(1));
  order.finished(0, stream(1));
  order.deactivate();
  order.activate();
  order.before_write(0, stream(2));  // a new group: nothing to wait for
  order.deactivate();
  const std::vector<std::string> want = {"record 0 on 1"};
  EXPECT_EQ(r.ops, want);
}

TEST(WriteOrder, bad_use_is_an_error) {
  Recorded r;
  WriteOrder order(2, r.sink());
  const WriteOrderScope on(order);
  EXPECT_ERROR(order.before_write(2, stream(1)), "WriteOrder::before_write", "key 2 of 2");
  EXPECT_ERROR(order.finished(5, stream(1)), "WriteOrder::finished", "key 5 of 2");
  order.before_write(0, stream(1));
  // Stream 2 may not write while stream 1's turn is open: nothing orders them.
  EXPECT_ERROR(order.before_write(0, stream(2)), "WriteOrder::before_write",
               "turn has not finished");
}

}  // namespace
}  // namespace accrue
