#include "accrue/autograd/gradient_observer.h"

namespace accrue::autograd {

namespace {
thread_local GradientObserver* g_observer = nullptr;
}  // namespace

GradientObserver* current_gradient_observer() {
  return g_observer;
}

GradientObserverScope::GradientObserverScope(GradientObserver* observer) : previous_(g_observer) {
  g_observer = observer;
}

GradientObserverScope::~GradientObserverScope() {
  g_observer = previous_;
}

}  // namespace accrue::autograd
