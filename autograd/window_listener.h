// WindowListener: how state outside the gradient arena learns where the
// accumulation window is. optim::Window calls it; nn's layers with window
// state (nn::BatchNorm, Note [Window statistics]) implement it. It lives
// below both so that optim never knows nn.
#pragma once

namespace accrue {

class WindowListener {
 public:
  virtual ~WindowListener() = default;
  // The window closed (its update, or its skip, is enqueued). Device work
  // only: no host synchronization.
  virtual void on_window_close() = 0;
  // The window's micro-steps so far were dropped (optim::Window::restart).
  virtual void on_window_restart() = 0;
  // Note [Graphed window]: why replaying the micro-steps and the close from
  // CUDA graphs would leave this listener wrong (its host state follows the
  // forwards, which a replay does not run), or null when it would not. A
  // replayed close still calls on_window_close, eagerly, after the graph.
  // Unknown listeners are assumed to keep host state.
  virtual const char* why_not_capturable() const {
    return "a WindowListener that does not say it follows replays";
  }
  // Note [Concurrent micro-batches]: whether the listener takes part in a
  // group of micro-steps in flight on several streams. Between
  // on_group_begin and on_group_end its forwards keep what they would write
  // into the listener's shared state; on_group_end (on the current stream,
  // after the group's streams joined it) writes it in the forwards' order,
  // so the bits are those of the sequential loop; on_group_abandon drops it
  // (a capture that failed ran nothing). False refuses concurrent
  // micro-batches.
  virtual bool defers_group_writes() const { return false; }
  virtual void on_group_begin() {}
  virtual void on_group_end() {}
  virtual void on_group_abandon() {}
};

}  // namespace accrue
