#include "accrue/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "accrue/autograd/gradient_observer.h"
#include "accrue/autograd/variable.h"
#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/ops.h"

namespace accrue {

namespace autograd {

// Note [Leaf gradient]
// ~~~~~~~~~~~~~~~~~~~~
// Every gradient a backward produces for a leaf lands here, exactly once per
// leaf per backward (the engine sums fan-out contributions first). With a
// GradSink (the gradient arena) the sink decides between writing and adding;
// otherwise the first backward stores the gradient and later ones add to it,
// until clear_grad(). The leaf's grad-ready hooks fire right after, when the
// gradient of this backward is final.
void accumulate_leaf_grad(const Tensor& leaf, const Tensor& grad) {
  AutogradMeta& meta = meta_of(leaf);
  // An undefined grad: everything was delivered straight into the sink's slot.
  if (grad.defined()) {
    ACCRUE_CHECK(grad.shape() == leaf.shape(), "backward: gradient of shape ",
                 shape_str(grad.shape()), " for a leaf of shape ", shape_str(leaf.shape()));
    if (meta.sink) {
      meta.sink->accumulate(leaf, grad);
    } else if (!meta.grad.defined()) {
      // Own the gradient: the incoming tensor may alias a graph buffer or the seed.
      meta.grad = grad.dtype() == leaf.dtype() ? grad.clone() : grad.to(leaf.dtype());
    } else {
      kernels::axpy_(meta.grad, 1.0, grad);  // converted to .grad's dtype: Note [Mixed axpy]
    }
  }
  if (meta.sink) meta.sink->finished(leaf);  // Note [Ordered writes]
  // Note [Weight gradients on a branch]: a hook may read the gradient the branch writes.
  WeightGradBranch* branch = WeightGradBranch::current();
  if (branch != nullptr && !meta.grad_ready_hooks.empty()) branch->join();
  for (const GradReadyHook& hook : meta.grad_ready_hooks)
    hook(leaf);
}

// Note [Fan-out sums in the backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor used by several ops receives the sum of their gradients: the
// engine gathers them in the buffer of the node that made the tensor, adding
// each new one with an elementwise kernel. A transformer's residual stream is
// such a tensor twice a layer (the sum feeds the next LayerNorm and the next
// residual add), and the add costs a launch and three passes over the
// gradient. A node whose backward can add a tensor into the gradient it
// writes for one of its inputs in the same pass (LayerNorm's and RMSNorm's,
// rounded once; record_gathering in autograd/node.h names the input) is
// handed the gradient gathered so far for that input, when there is one, and
// returns the sum: the engine then replaces the buffer instead of adding to
// it. Which gradients are gathered before the node runs depends on the
// graph's order alone (the engine's order is fixed: newest ready node first),
// so the sums are the same bits on every run. The node must never write into
// `gathered`: a gradient may sit in several buffers (an add passes its
// gradient to both inputs). Measured on an H200 against the engine's add
// (bench/RESULTS.md, twenty-third session): GPT-2 124M +0.6% at micro-batch 4
// and +0.8% at 1 (within the spread at 32), llama-125m +0.7%.

}  // namespace autograd

namespace {

using autograd::Node;

// The gradient gathered so far for `node`'s gathering input, or an undefined
// tensor (Note [Fan-out sums in the backward]).
Tensor gathered_gradient(const Node& node, const std::unordered_map<Node*, Tensor>& buffers) {
  const int i = node.gathering_input();
  if (i < 0 || i >= static_cast<int>(node.next_edges().size())) return Tensor();
  const autograd::Edge& e = node.next_edges()[static_cast<size_t>(i)];
  if (!e.valid()) return Tensor();
  const auto it = buffers.find(e.fn.get());
  return it == buffers.end() ? Tensor() : it->second;
}

struct ByNewestFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

}  // namespace

void backward(const Tensor& root, const Tensor& seed, bool retain_graph) {
  ACCRUE_CHECK(root.defined(), "backward: the root tensor is undefined");
  ACCRUE_CHECK(root.requires_grad(), "backward: the root of shape ", shape_str(root.shape()),
               " does not require grad (no leaf it depends on has requires_grad)");
  Tensor g = seed;
  if (!g.defined()) {
    ACCRUE_CHECK(root.numel() == 1, "backward: a seed is required for a root of shape ",
                 shape_str(root.shape()), " (only single-element roots default to 1)");
    g = ones(root.shape(), root.dtype(), root.device());
  }
  ACCRUE_CHECK(g.shape() == root.shape(), "backward: seed of shape ", shape_str(g.shape()),
               " for a root of shape ", shape_str(root.shape()));
  ACCRUE_CHECK(g.device() == root.device(), "backward: seed on ", g.device().str(),
               " for a root on ", root.device().str());
  NoGradGuard no_grad;

  const autograd::Edge start = autograd::gradient_edge(root);
  // Count, for every node reachable from the root, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  {
    std::vector<Node*> stack{start.fn.get()};
    alive[start.fn.get()] = start.fn;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const autograd::Edge& e : n->next_edges()) {
        if (!e.valid()) continue;
        if (dependencies[e.fn.get()]++ == 0) {
          alive[e.fn.get()] = e.fn;
          stack.push_back(e.fn.get());
        }
      }
    }
  }

  // Gradient buffers: the sum of everything that flowed into a node so far.
  std::unordered_map<Node*, Tensor> buffers;
  std::unordered_set<Node*> delivered;  // leaves that got gradient through a sink's claim
  buffers[start.fn.get()] = g;
  std::priority_queue<Node*, std::vector<Node*>, ByNewestFirst> ready;
  ready.push(start.fn.get());
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Tensor grad_in = std::move(buffers[n]);
    buffers.erase(n);
    // A node that received no gradient still releases its inputs' dependencies;
    // a leaf whose gradient was only delivered directly still lands (hooks).
    std::vector<Tensor> grads;
    Tensor gathered;  // Note [Fan-out sums in the backward]
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(n)) {
      if (grad_in.defined() || delivered.count(n))
        autograd::accumulate_leaf_grad(acc->leaf(), grad_in);
    } else if (grad_in.defined()) {
      const NvtxRange range(n->name());  // Note [NVTX ranges]: one range per op's backward
      if (autograd::GradientObserver* o = autograd::current_gradient_observer())
        o->observe(grad_in);  // Note [Gradient observer]
      gathered = gathered_gradient(*n, buffers);
      grads = gathered.defined() ? n->apply_gathered(grad_in, gathered) : n->apply(grad_in);
    }
    if (!retain_graph) n->release_saved();
    const auto& edges = n->next_edges();
    ACCRUE_CHECK(grads.empty() || grads.size() == edges.size(), "backward: ", n->name(),
                 " returned ", grads.size(), " gradients for ", edges.size(), " inputs");
    // The gathering input's gradient includes the buffer's: it replaces it, before
    // any other edge of n to the same node adds to it (Note [Fan-out sums in the backward]).
    int replaced = -1;
    if (gathered.defined()) {
      const int gi = n->gathering_input();
      ACCRUE_CHECK(static_cast<size_t>(gi) < grads.size() &&
                       grads[static_cast<size_t>(gi)].defined() &&
                       !autograd::is_delivered(grads[static_cast<size_t>(gi)]),
                   "backward: ", n->name(), " was given the gradient gathered for input ", gi,
                   " but returned none for it");
      buffers[edges[static_cast<size_t>(gi)].fn.get()] = grads[static_cast<size_t>(gi)];
      replaced = gi;
    }
    for (size_t i = 0; i < edges.size(); ++i) {
      const autograd::Edge& e = edges[i];
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      if (i < grads.size() && autograd::is_delivered(grads[i])) {
        delivered.insert(next);
      } else if (i < grads.size() && grads[i].defined()) {
        Tensor& buf = buffers[next];
        if (static_cast<int>(i) == replaced) {
          // already in the buffer (above)
        } else if (!buf.defined()) {
          buf = grads[i];
        } else {
          // Fan-out: a tensor used by several ops receives the sum of their gradients.
          buf = kernels::binary(kernels::BinaryOp::Add, buf, grads[i]);
        }
      }
      if (--dependencies[next] == 0) ready.push(next);
    }
  }
  // Note [Weight gradients on a branch]: what follows the backward reads the slots here.
  if (autograd::WeightGradBranch* branch = autograd::WeightGradBranch::current()) branch->join();
}

}  // namespace accrue
