// Whether operations record the autograd graph on this thread.
//
// It lives in core (as in c10) because core's raw view methods consult it to
// refuse silently dropping a gradient (see Note [Raw views]).
#pragma once

namespace accrue {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: no graph is recorded inside the scope (evaluation, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace accrue
