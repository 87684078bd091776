// WindowListener: how state outside the gradient arena learns where the
// accumulation window is. optim::Window calls it; nn's layers with window
// state (nn::BatchNorm, Note [Window statistics]) implement it. It lives
// below both so that optim never knows nn.
#pragma once

namespace accrue {

class WriteOrder;

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
  // Note [Concurrent micro-batches]: the order of the writes every forward
  // makes into this listener's state (Note [Ordered writes]), which the
  // graphed window activates while micro-steps run side by side; null where
  // the listener cannot keep them in order, which refuses concurrent
  // micro-batches.
  virtual WriteOrder* ordered_writes() { return nullptr; }
};

}  // namespace accrue
