// Activation checkpointing: see Note [Activation checkpointing] in autograd/checkpoint.h.
#include "accrue/autograd/checkpoint.h"

#include <memory>
#include <utility>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"

namespace accrue {

namespace {

using autograd::Edge;
using autograd::Node;

// Grad mode on for a scope: the recompute runs inside the engine, which turned it off.
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// The generator at the forward's state for a scope, then back where it was:
// the recompute draws the forward's dropout masks, and the stream goes on
// afterwards as if the recompute had never drawn.
class RewindGuard {
 public:
  RewindGuard(Generator& gen, uint64_t seed, uint64_t offset)
      : gen_(gen), seed_(gen.seed()), offset_(gen.offset()) {
    gen.set_state(seed, offset);
  }
  ~RewindGuard() { gen_.set_state(seed_, offset_); }
  RewindGuard(const RewindGuard&) = delete;
  RewindGuard& operator=(const RewindGuard&) = delete;

 private:
  Generator& gen_;
  uint64_t seed_, offset_;
};

// Note [Checkpoint outputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Every node has one output, so a checkpoint with n outputs records n + 1
// nodes: CheckpointBackward, whose edges lead to the inputs, and one
// CheckpointOutput per output, the output's grad_fn, with a single edge into
// CheckpointBackward. An output's node stores the gradient it receives in
// the state they share; the first of them to run also passes its gradient
// along the edge, only because the engine applies a node that some gradient
// reached, and the others pass nothing (still releasing the dependency). So
// CheckpointBackward runs once, after every output the backward reached,
// ignores its own incoming tensor and recomputes once for all of them; an
// output that nothing used has no gradient and is left out of the objective.
struct OutputGrads {
  std::vector<Tensor> grads;  // one per output; undefined until reached
  bool signalled = false;     // whether CheckpointBackward was sent its gradient
  void reset() {
    grads.assign(grads.size(), Tensor());
    signalled = false;
  }
};

class CheckpointOutput final : public Node {
 public:
  CheckpointOutput(size_t index, std::shared_ptr<OutputGrads> state)
      : index_(index), state_(std::move(state)) {}
  const char* name() const override { return "CheckpointOutput"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    state_->grads[index_] = grad_output;
    if (state_->signalled) return {Tensor()};
    state_->signalled = true;
    return {grad_output};
  }

 private:
  size_t index_;
  std::shared_ptr<OutputGrads> state_;
};

// One backward from several roots, each seeded with its gradient (roots
// without one are skipped): a join node whose edges lead to the roots and
// whose backward hands out the seeds. Needs grad mode on (to record the join).
void backward_from(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds) {
  std::vector<Tensor> reached, reached_seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!seeds[i].defined() || !roots[i].requires_grad()) continue;
    reached.push_back(roots[i]);
    reached_seeds.push_back(seeds[i]);
  }
  if (reached.empty()) return;
  if (reached.size() == 1) {
    backward(reached[0], reached_seeds[0]);
    return;
  }
  // The join's own output is a CPU scalar: backward seeds it with 1 and the
  // join ignores that seed.
  Tensor join = autograd::record(
      "CheckpointJoin", empty({}), reached,
      [seeds = std::move(reached_seeds)](const Tensor&) -> std::vector<Tensor> { return seeds; });
  backward(join);
}

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(CheckpointMultiFn fn, std::vector<Tensor> inputs, std::vector<bool> needs_grad,
                     Generator& gen, uint64_t seed, uint64_t offset,
                     std::shared_ptr<OutputGrads> outputs)
      : fn_(std::move(fn)),
        inputs_(std::move(inputs)),
        needs_grad_(std::move(needs_grad)),
        gen_(gen),
        seed_(seed),
        offset_(offset),
        outputs_(std::move(outputs)) {}
  const char* name() const override { return "CheckpointBackward"; }

  // grad_output is only CheckpointOutput's signal (Note [Checkpoint outputs]).
  std::vector<Tensor> apply(const Tensor&) override {
    ACCRUE_CHECK(fn_ != nullptr,
                 "backward through CheckpointBackward a second time: its saved inputs were freed "
                 "by the first backward. Pass retain_graph=true to the first backward to keep "
                 "them.");
    // Fresh leaves: the nested backward stops at them and leaves their gradients in .grad.
    std::vector<Tensor> leaves;
    leaves.reserve(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor leaf = inputs_[i].defined() ? detach(inputs_[i]) : Tensor();
      if (needs_grad_[i]) requires_grad_(leaf);
      leaves.push_back(std::move(leaf));
    }
    {
      EnableGradGuard grad_on;
      std::vector<Tensor> outs;
      {
        RewindGuard rewind(gen_, seed_, offset_);
        outs = fn_(leaves);
      }
      ACCRUE_CHECK(outs.size() == outputs_->grads.size(), "checkpoint: the recompute returned ",
                   outs.size(), " tensors, the forward ", outputs_->grads.size(),
                   " (fn must be deterministic in its structure)");
      backward_from(outs, outputs_->grads);
    }
    outputs_->reset();  // ready for another backward when the graph is retained
    std::vector<Tensor> grads;
    grads.reserve(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i)
      grads.push_back(needs_grad_[i] ? grad(leaves[i]) : Tensor());
    return grads;
  }

  void release_saved() override {
    fn_ = nullptr;
    inputs_.clear();
  }

 private:
  CheckpointMultiFn fn_;
  std::vector<Tensor> inputs_;  // detached (Note [Saved tensors are detached])
  std::vector<bool> needs_grad_;
  Generator& gen_;
  uint64_t seed_, offset_;  // the generator's state when the forward began
  std::shared_ptr<OutputGrads> outputs_;
};

}  // namespace

std::vector<Tensor> checkpoint_multi(const CheckpointMultiFn& fn, const std::vector<Tensor>& inputs,
                                     Generator* generator) {
  ACCRUE_CHECK(fn != nullptr, "checkpoint: fn is empty");
  if (!GradMode::is_enabled()) return fn(inputs);
  Generator& gen = generator ? *generator : default_generator();
  const uint64_t seed = gen.seed(), offset = gen.offset();

  std::vector<Tensor> detached;
  std::vector<bool> needs_grad;
  std::vector<Edge> edges;
  for (const Tensor& t : inputs) {
    detached.push_back(t.defined() ? detach(t) : Tensor());
    needs_grad.push_back(t.defined() && t.requires_grad());
    edges.push_back(t.defined() ? autograd::gradient_edge(t) : Edge{});
  }
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(detached);
  }
  ACCRUE_CHECK(!outs.empty(), "checkpoint: fn returned no tensors");
  for (size_t k = 0; k < outs.size(); ++k)
    ACCRUE_CHECK(outs[k].defined(), "checkpoint: output ", k, " of fn is undefined");

  auto state = std::make_shared<OutputGrads>();
  state->grads.resize(outs.size());
  auto node = std::make_shared<CheckpointBackward>(fn, std::move(detached), std::move(needs_grad),
                                                   gen, seed, offset, state);
  node->set_next_edges(std::move(edges));
  std::vector<Tensor> results;
  for (size_t k = 0; k < outs.size(); ++k) {
    // A fresh handle: fn may have returned an input or a parameter itself.
    Tensor out = detach(outs[k]);
    if (is_floating(out.dtype())) {
      auto output_node = std::make_shared<CheckpointOutput>(k, state);
      output_node->set_next_edges({Edge{node, 0}});
      auto meta = std::make_shared<AutogradMeta>();
      meta->grad_fn = std::move(output_node);
      out.set_autograd_meta(std::move(meta));
    }
    results.push_back(std::move(out));
  }
  return results;
}

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, Generator* generator) {
  ACCRUE_CHECK(fn != nullptr, "checkpoint: fn is empty");
  // fn is copied: the node keeps it until backward.
  return checkpoint_multi(
      [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }, inputs,
      generator)[0];
}

}  // namespace accrue
