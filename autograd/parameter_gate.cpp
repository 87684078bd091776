// Note [Parameter gates] (autograd/parameter_gate.h).
#include "accrue/autograd/parameter_gate.h"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace accrue {

namespace {

std::mutex gates_mutex;
std::vector<ParameterGate*>& gates() {
  static std::vector<ParameterGate*> g;
  return g;
}
std::atomic<int> installed{0};

template <class Params>
void await_all(const Params& params) {
  if (installed.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(gates_mutex);
  for (ParameterGate* gate : gates())
    for (const Tensor& p : params)
      if (p.defined()) gate->await(p);
}

}  // namespace

void install_parameter_gate(ParameterGate* gate) {
  std::lock_guard<std::mutex> lock(gates_mutex);
  gates().push_back(gate);
  installed.store(static_cast<int>(gates().size()), std::memory_order_relaxed);
}

void remove_parameter_gate(ParameterGate* gate) {
  std::lock_guard<std::mutex> lock(gates_mutex);
  auto& g = gates();
  g.erase(std::remove(g.begin(), g.end(), gate), g.end());
  installed.store(static_cast<int>(g.size()), std::memory_order_relaxed);
}

bool parameter_gates_installed() {
  return installed.load(std::memory_order_relaxed) != 0;
}

void await_parameters(const std::vector<Tensor>& params) {
  await_all(params);
}

void await_parameters(std::initializer_list<Tensor> params) {
  await_all(params);
}

}  // namespace accrue
