// Note [Ordered writes] (core/write_order.h).
#include "accrue/core/write_order.h"

#include "accrue/core/error.h"

namespace accrue {

WriteOrder::WriteOrder(size_t keys, Ops ops) : ops_(std::move(ops)), keys_(keys) {}

WriteOrder::~WriteOrder() = default;

void WriteOrder::activate() {
  for (Key& k : keys_)
    k = Key{};
  seen_.clear();
  active_ = true;
}

void WriteOrder::deactivate() {
  active_ = false;
}

void WriteOrder::check(size_t key, const char* op) const {
  ACCRUE_CHECK(key < keys_.size(), "WriteOrder::", op, ": key ", key, " of ", keys_.size());
}

void WriteOrder::before_write(size_t key, StreamHandle stream) {
  if (!active_) return;
  check(key, "before_write");
  Key& k = keys_[key];
  if (k.writer == stream) return;  // this stream's turn already
  if (k.recorded) wait_for(key, stream);
  ACCRUE_CHECK(k.writer == nullptr || k.recorded, "WriteOrder::before_write: key ", key,
               " is written by a stream whose turn has not finished (Note [Ordered writes])");
  k.writer = stream;
  k.recorded = false;
}

void WriteOrder::finished(size_t key, StreamHandle stream) {
  if (!active_) return;
  check(key, "finished");
  Key& k = keys_[key];
  // A turn that wrote nothing through before_write still ends here: a later
  // stream's writes must follow whatever this stream did before.
  if (k.writer != stream && k.recorded) wait_for(key, stream);
  run(Op::record, key, stream);
  k.writer = stream;
  k.recorded = true;
  k.number = records_;
}

void WriteOrder::wait_for(size_t key, StreamHandle stream) {
  const Key& k = keys_[key];
  int64_t& seen = seen_[{stream, k.writer}];
  if (seen >= k.number) {  // an earlier wait on a later record of the writer covers it
    ++implied_;
    return;
  }
  run(Op::wait, key, stream);
  seen = k.number;
}

void WriteOrder::run(Op op, size_t key, StreamHandle stream) {
  (op == Op::wait ? waits_ : records_) += 1;
  if (ops_) {
    ops_(op, key, stream);
    return;
  }
  if (events_.empty()) events_.resize(keys_.size());
  std::unique_ptr<Event>& e = events_[key];
  if (!e) e = std::make_unique<Event>();
  if (op == Op::wait) {
    e->block(stream);
  } else {
    e->record(stream);
  }
}

}  // namespace accrue
