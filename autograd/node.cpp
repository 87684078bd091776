#include "accrue/autograd/node.h"

#include <atomic>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"

namespace accrue::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node() : sequence_nr_(g_next_sequence_nr.fetch_add(1)) {}

std::vector<Tensor> Node::apply_gathered(const Tensor&, const Tensor&) {
  ACCRUE_FAIL("backward: ", name(), " was given a gathered gradient but gathers none");
}

FunctionNode::FunctionNode(const char* name, BackwardFn backward) : name_(name) {
  if (backward)
    backward_ = [fn = std::move(backward)](const Tensor& g, const Tensor&) { return fn(g); };
}

std::vector<Tensor> FunctionNode::apply(const Tensor& grad_output) {
  return apply_gathered(grad_output, Tensor());
}

std::vector<Tensor> FunctionNode::apply_gathered(const Tensor& grad_output,
                                                 const Tensor& gathered) {
  ACCRUE_CHECK(backward_ != nullptr, "backward through ", name_,
               " a second time: its saved tensors were freed by the first backward. Pass "
               "retain_graph=true to the first backward to keep them.");
  ACCRUE_CHECK(!gathered.defined() || gathering_input_ >= 0, "backward: ", name_,
               " was given a gathered gradient but gathers none");
  NoGradGuard no_grad;  // backward formulas are not themselves recorded
  return backward_(grad_output, gathered);
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  accumulate_leaf_grad(leaf_, grad_output);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* meta = find_meta(t);
  if (!meta) return {};
  if (meta->grad_fn) return {meta->grad_fn, meta->output_nr};
  if (!meta->requires_grad) return {};
  std::shared_ptr<AccumulateGrad> acc = meta->accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta->accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {

// Attaches `node` to `output` as its grad_fn, with edges to `inputs`.
Tensor attach(std::shared_ptr<FunctionNode> node, Tensor output,
              const std::vector<Tensor>& inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs)
    edges.push_back(t.defined() ? gradient_edge(t) : Edge{});
  node->set_next_edges(std::move(edges));
  // A result that came back as an existing handle (a no-op view, a same-dtype
  // cast) gets a fresh one, so recording never rewrites an input's meta.
  if (output.autograd_meta()) output = Tensor(std::make_shared<TensorImpl>(*output.impl()));
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  output.set_autograd_meta(std::move(meta));
  return output;
}

}  // namespace

Tensor record(const char* name, Tensor output, const std::vector<Tensor>& inputs,
              BackwardFn backward) {
  if (!any_requires_grad(inputs)) return output;
  return attach(std::make_shared<FunctionNode>(name, std::move(backward)), std::move(output),
                inputs);
}

Tensor record_gathering(const char* name, Tensor output, const std::vector<Tensor>& inputs,
                        int gathering_input, GatheringBackwardFn backward) {
  ACCRUE_CHECK(gathering_input >= 0 && gathering_input < static_cast<int>(inputs.size()),
               "record_gathering: ", name, " gathers input ", gathering_input, " of ",
               inputs.size());
  if (!any_requires_grad(inputs)) return output;
  return attach(std::make_shared<FunctionNode>(name, gathering_input, std::move(backward)),
                std::move(output), inputs);
}

}  // namespace accrue::autograd
