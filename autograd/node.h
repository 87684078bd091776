// The autograd graph: nodes (one per recorded op), edges to the nodes that
// produced the op's inputs, and the leaf accumulator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::autograd {

class Node;

// Where a gradient flows: input `input_nr` of node `fn`. An empty edge (fn ==
// nullptr) means the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// One recorded operation. Every node has exactly one output (multi-result
// ops such as cross-entropy return non-differentiable companions), so apply()
// takes the gradient of that output and returns one gradient per input edge
// (undefined where an input needs none).
class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual const char* name() const = 0;
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // Note [Fan-out sums in the backward] (autograd/engine.cpp): the input whose
  // gathered gradient this node adds into its own, or -1 (most nodes).
  virtual int gathering_input() const { return -1; }
  // apply() given the gradient gathered so far for input gathering_input(): the
  // gradient returned for that input must include `gathered`.
  virtual std::vector<Tensor> apply_gathered(const Tensor& grad_output, const Tensor& gathered);
  // Frees the tensors saved for backward (after a backward without retain_graph).
  virtual void release_saved() {}

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  // Creation order: the engine runs later nodes first among the ready ones.
  uint64_t sequence_nr() const { return sequence_nr_; }

 private:
  std::vector<Edge> next_edges_;
  uint64_t sequence_nr_;
};

// The gradient function of a recorded op: captures what it saved and maps the
// output gradient to one gradient per input.
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
// A gradient function that also takes the gradient gathered so far for one of
// its inputs (undefined when there is none yet) and returns that input's
// gradient with it added (Note [Fan-out sums in the backward]).
using GatheringBackwardFn =
    std::function<std::vector<Tensor>(const Tensor& grad_output, const Tensor& gathered)>;

// A node whose backward is a closure. Releasing it destroys the closure and
// with it every saved tensor; applying it afterwards throws.
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn backward);
  FunctionNode(const char* name, int gathering_input, GatheringBackwardFn backward)
      : name_(name), gathering_input_(gathering_input), backward_(std::move(backward)) {}
  const char* name() const override { return name_; }
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  int gathering_input() const override { return gathering_input_; }
  std::vector<Tensor> apply_gathered(const Tensor& grad_output, const Tensor& gathered) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  const char* name_;
  int gathering_input_ = -1;
  GatheringBackwardFn backward_;
};

// The sink of a leaf that requires grad: hands the summed gradient of this
// backward to accumulate_leaf_grad (see Note [Leaf gradient]).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {}
  const char* name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

// The edge through which a gradient for `t` should flow: its grad_fn, its
// leaf accumulator, or an empty edge when it needs no gradient.
Edge gradient_edge(const Tensor& t);

// Records one op: if grad mode is on and any input requires grad, makes a
// FunctionNode with `backward` whose edges lead to the inputs, and attaches it
// to `output` as its grad_fn. Returns output either way.
Tensor record(const char* name, Tensor output, const std::vector<Tensor>& inputs,
              BackwardFn backward);
// record() for a backward that adds the gradient gathered for input
// `gathering_input` into its own (Note [Fan-out sums in the backward]).
Tensor record_gathering(const char* name, Tensor output, const std::vector<Tensor>& inputs,
                        int gathering_input, GatheringBackwardFn backward);

// True when grad mode is on and at least one of the inputs requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

}  // namespace accrue::autograd
