// Note [Parameter gates] (autograd/parameter_gate.h).
#include "accrue/autograd/parameter_gate.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "accrue/core/error.h"

namespace accrue {

namespace {

std::mutex gates_mutex;
std::vector<ParameterGate*>& gates() {
  static std::vector<ParameterGate*> g;
  return g;
}
// The installed gates with steps pending, and how many (read without the lock).
std::vector<ParameterGate*>& pending_gates() {
  static std::vector<ParameterGate*> g;
  return g;
}
std::atomic<int> pending{0};

void set_pending_locked(ParameterGate* gate, bool on) {
  auto& g = pending_gates();
  const auto at = std::find(g.begin(), g.end(), gate);
  if (on && at == g.end()) g.push_back(gate);
  if (!on && at != g.end()) g.erase(at);
  pending.store(static_cast<int>(g.size()), std::memory_order_relaxed);
}

template <class Params>
void await_all(const Params& params) {
  if (pending.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(gates_mutex);
  for (ParameterGate* gate : pending_gates())
    for (const Tensor& p : params)
      if (p.defined()) gate->await(p);
}

}  // namespace

void install_parameter_gate(ParameterGate* gate) {
  std::lock_guard<std::mutex> lock(gates_mutex);
  gates().push_back(gate);
}

void remove_parameter_gate(ParameterGate* gate) {
  std::lock_guard<std::mutex> lock(gates_mutex);
  auto& g = gates();
  g.erase(std::remove(g.begin(), g.end(), gate), g.end());
  set_pending_locked(gate, false);
}

void set_parameter_gate_pending(ParameterGate* gate, bool on) {
  std::lock_guard<std::mutex> lock(gates_mutex);
  const auto& g = gates();
  ACCRUE_CHECK(!on || std::find(g.begin(), g.end(), gate) != g.end(),
               "set_parameter_gate_pending: the gate is not installed");
  set_pending_locked(gate, on);
}

bool parameter_gates_pending() {
  return pending.load(std::memory_order_relaxed) != 0;
}

void await_parameters(const std::vector<Tensor>& params) {
  await_all(params);
}

void await_parameters(std::initializer_list<Tensor> params) {
  await_all(params);
}

}  // namespace accrue
