// WriteOrder: keeps the writes of several streams into shared buffers in the
// order the host issued them, for micro-batches in flight on their own streams.
//
// Note [Ordered writes]
// ~~~~~~~~~~~~~~~~~~~~~
// Within a window the weights do not change, so micro-batch k + 1's forward
// does not depend on micro-batch k's backward; only the writes into shared
// buffers do (each gradient slot, the window's loss sum and item count), and
// their order decides the bits of an fp32 sum. With micro-batches issued one
// after another on the host, each on its own stream, a WriteOrder keeps
// those writes in host order:
//  - before_write(key) on stream s: when another stream last finished
//    writing the key, s waits for that stream's event of the key (once per
//    turn: later writes on s are ordered by s itself);
//  - finished(key) on stream s: records the key's event on s, after every
//    write of s's turn has been issued.
// Micro-batch k + 1 then adds into slot i only after micro-batch k's last
// write into it, so the sums are bitwise those of the sequential loop, while
// everything else of the two micro-batches (their forwards, the backward of
// other layers) may run side by side. One event per key is enough: the host
// issues micro-batch k whole before k + 1, so a wait always names the latest
// record (a wait takes the event as it stands when issued). Under CUDA graph
// capture the events become the graph's edges.
// A wait that an earlier wait of the same stream implies is left out: a
// record on a stream follows everything issued there before it, so after
// waiting for the writer's record number q, the waiter needs none of that
// writer's records up to q. With a tied weight (GPT-2's embedding, written
// first and last by a backward) the next backward's first wait covers all
// the others, and the graph keeps one cross-stream edge instead of one a slot.
// Inactive (the default) every call returns at once: one stream orders
// itself. activate() starts with no owner, so the first turn never waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "accrue/core/cuda_runtime.h"

namespace accrue {

class WriteOrder {
 public:
  enum class Op { wait, record };
  // Carries out an op on `stream` for `key`; empty: CUDA events, one per key.
  // (The CPU tests of the ordering pass one that writes the ops down.)
  using Ops = std::function<void(Op op, size_t key, StreamHandle stream)>;

  explicit WriteOrder(size_t keys, Ops ops = nullptr);
  ~WriteOrder();
  WriteOrder(const WriteOrder&) = delete;
  WriteOrder& operator=(const WriteOrder&) = delete;

  void activate();
  void deactivate();
  bool active() const { return active_; }
  // The stream a write on `device` goes to while the order is active (the
  // current stream), else null: what before_write and finished take.
  StreamHandle stream(int device) const { return active_ ? current_stream(device) : nullptr; }
  size_t keys() const { return keys_.size(); }

  void before_write(size_t key, StreamHandle stream);
  void finished(size_t key, StreamHandle stream);

  // Waits and records issued since the order was built, and the waits left
  // out as implied by an earlier one (for tests and reports).
  int64_t waits() const { return waits_; }
  int64_t records() const { return records_; }
  int64_t implied_waits() const { return implied_; }

 private:
  struct Key {
    StreamHandle writer = nullptr;  // the stream whose turn it is, or whose turn ended last
    bool recorded = false;          // the writer's turn ended with a record
    int64_t number = 0;             // that record's place among all records
  };
  void check(size_t key, const char* op) const;
  // Makes `stream` wait for the key's last record unless an earlier wait implies it.
  void wait_for(size_t key, StreamHandle stream);
  void run(Op op, size_t key, StreamHandle stream);

  Ops ops_;
  bool active_ = false;
  std::vector<Key> keys_;
  std::vector<std::unique_ptr<Event>> events_;  // made on first use, with the CUDA ops
  // (waiter, writer) -> the writer's latest record number the waiter has waited for.
  std::map<std::pair<StreamHandle, StreamHandle>, int64_t> seen_;
  int64_t waits_ = 0, records_ = 0, implied_ = 0;
};

// Activates an order for a scope.
class WriteOrderScope {
 public:
  explicit WriteOrderScope(WriteOrder& order) : order_(order) { order_.activate(); }
  ~WriteOrderScope() { order_.deactivate(); }
  WriteOrderScope(const WriteOrderScope&) = delete;
  WriteOrderScope& operator=(const WriteOrderScope&) = delete;

 private:
  WriteOrder& order_;
};

}  // namespace accrue
