// The parameter gate: how a forward waits for parameters that the last
// window's close is still stepping (Note [Close under the forward] in
// optim/layer_steps.h). nn's models call await_parameters before each layer;
// optim's LayerSteps is the gate. It lives below both so that nn never knows
// optim.
//
// Note [Parameter gates]
// ~~~~~~~~~~~~~~~~~~~~~~
// A gate is installed by the one who steps parameters out of the close's
// order (a Window with close_under_forward) and removed when it goes; it is
// marked pending from the close that starts its steps to the join that ends
// them (micro-step 0's backward). While none is pending, await_parameters
// returns at once (one relaxed atomic load), so models call it
// unconditionally, and micro-steps 1 to K - 1 build no list of parameters
// for it. With one pending, the
// calling thread's current stream is made to wait (an event, no host
// synchronization) until every parameter given, and every parameter
// registered before it in its store, holds the stepped value. A parameter no
// gate knows is left alone. A model that reads a parameter before awaiting
// it reads the old value: the Window refuses a window whose forward awaited
// nothing, and the CPU test mode (steps on first await) makes a missed
// await change the bits, which the equivalence tests see.
#pragma once

#include <initializer_list>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue {

class ParameterGate {
 public:
  virtual ~ParameterGate() = default;
  // Waits until `param` (and what comes before it) is stepped, if the gate
  // holds it; returns without effect otherwise.
  virtual void await(const Tensor& param) = 0;
};

// Note [Parameter gates]: at most a few gates at once (one per live Window
// that asked for them); install and remove from the thread that runs the
// windows.
void install_parameter_gate(ParameterGate* gate);
void remove_parameter_gate(ParameterGate* gate);

// Note [Parameter gates]: an installed gate says when it has steps pending.
void set_parameter_gate_pending(ParameterGate* gate, bool pending);
// True while any installed gate has steps pending (one relaxed atomic load):
// callers that gather a module's parameters first skip that when it is false.
bool parameter_gates_pending();

void await_parameters(const std::vector<Tensor>& params);
void await_parameters(std::initializer_list<Tensor> params);

}  // namespace accrue
