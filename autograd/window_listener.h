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
};

}  // namespace accrue
