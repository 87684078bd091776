#include "accrue/autograd/variable.h"

#include "accrue/core/grad_mode.h"

namespace accrue {

namespace {

bool query_requires_grad(const AutogradMeta* meta) {
  return meta->requires_grad || meta->grad_fn != nullptr;
}

// Core asks autograd whether a tensor requires grad through this hook (see Note [Raw views]).
const bool g_installed = [] {
  install_requires_grad_query(&query_requires_grad);
  return true;
}();

}  // namespace

namespace autograd {

AutogradMeta& meta_of(const Tensor& t) {
  (void)g_installed;
  if (!t.autograd_meta()) t.set_autograd_meta(std::make_shared<AutogradMeta>());
  return *t.autograd_meta();
}

AutogradMeta* find_meta(const Tensor& t) {
  return t.defined() ? t.autograd_meta().get() : nullptr;
}

const Tensor& delivered() {
  static const Tensor sentinel = empty({0});
  return sentinel;
}

bool is_delivered(const Tensor& t) {
  return t.is_same(delivered());
}

GradSink* sink_of(const Tensor& t) {
  AutogradMeta* m = find_meta(t);
  return m ? m->sink : nullptr;
}

}  // namespace autograd

Tensor requires_grad_(const Tensor& t, bool enable) {
  AutogradMeta& m = autograd::meta_of(t);
  ACCRUE_CHECK(!m.grad_fn,
               "requires_grad_: only leaf tensors can be marked; this tensor is the "
               "result of ",
               m.grad_fn->name(), " (use detach() to make a leaf)");
  ACCRUE_CHECK(!enable || is_floating(t.dtype()), "requires_grad_: dtype ", dtype_name(t.dtype()),
               " cannot require gradients (floating dtypes only)");
  m.requires_grad = enable;
  return t;
}

Tensor grad(const Tensor& t) {
  AutogradMeta* m = autograd::find_meta(t);
  return m ? m->grad : Tensor();
}

void set_grad(const Tensor& t, const Tensor& g) {
  if (g.defined()) {
    ACCRUE_CHECK(g.shape() == t.shape(), "set_grad: gradient of shape ", shape_str(g.shape()),
                 " for a tensor of shape ", shape_str(t.shape()));
  }
  autograd::meta_of(t).grad = g;
}

void clear_grad(const Tensor& t) {
  AutogradMeta* m = autograd::find_meta(t);
  if (!m) return;
  // Note [One owner]: dropping the slot view would leave grad() undefined
  // while the arena keeps receiving the gradients.
  ACCRUE_CHECK(m->sink == nullptr, "clear_grad: the tensor of shape ", shape_str(t.shape()),
               " is held by ", m->sink->describe(t),
               ", whose slot is its gradient and is overwritten by the next window's first ",
               "contribution (Note [Overwrite first]): there is nothing to clear");
  m->grad = Tensor();
}

bool is_leaf(const Tensor& t) {
  AutogradMeta* m = autograd::find_meta(t);
  return !m || !m->grad_fn;
}

std::shared_ptr<autograd::Node> grad_fn(const Tensor& t) {
  AutogradMeta* m = autograd::find_meta(t);
  return m ? m->grad_fn : nullptr;
}

Tensor detach(const Tensor& t) {
  // A new handle on the same storage and geometry, without autograd meta.
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd = nullptr;
  return Tensor(std::move(impl));
}

void register_grad_ready_hook(const Tensor& t, GradReadyHook hook) {
  ACCRUE_CHECK(is_leaf(t) && t.requires_grad(),
               "register_grad_ready_hook: the tensor must be a leaf that requires grad");
  autograd::meta_of(t).grad_ready_hooks.push_back(std::move(hook));
}

void set_grad_sink(const Tensor& t, GradSink* sink) {
  autograd::meta_of(t).sink = sink;
}

void set_parameter_owner(const Tensor& t, ParameterOwner* owner) {
  autograd::meta_of(t).owner = owner;
}

void load_parameter(const Tensor& param, const Tensor& value) {
  AutogradMeta* m = autograd::find_meta(param);
  NoGradGuard no_grad;
  if (m && m->owner)
    m->owner->load(param, value);
  else
    param.copy_(value);
}

Tensor parameter_value(const Tensor& param) {
  AutogradMeta* m = autograd::find_meta(param);
  return m && m->owner ? m->owner->value(param) : param;
}

}  // namespace accrue
