#include "accrue/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/random.h"

namespace accrue {

namespace {

double projected(const Tensor& y, const std::vector<double>& v) {
  const std::vector<double> values = y.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < values.size(); ++i)
    s += values[i] * v[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  for (const Tensor& t : inputs) {
    ACCRUE_CHECK(!t.defined() || !t.requires_grad() ||
                     (t.dtype() == DType::f64 && t.device().is_cpu() && t.is_contiguous()),
                 "gradcheck: checked inputs must be contiguous f64 CPU tensors, got ",
                 dtype_name(t.dtype()), " on ", t.device().str());
  }
  // Note [One owner]: an arena-held input's gradient never reaches grad().
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined() || !t.requires_grad()) continue;
    const GradSink* sink = autograd::sink_of(t);
    ACCRUE_CHECK(
        sink == nullptr, "gradcheck: input ", k, " of shape ", shape_str(t.shape()), " is held by ",
        sink->describe(t),
        ": its gradient lands in that arena's slot (written or added by the window's ",
        "flags, Note [Overwrite first]), not in the grad() that gradcheck reads. ",
        "Gradcheck a fresh leaf with its values instead, requires_grad_(detach(p).clone()), ",
        "or the model before an arena or ParamStore holds it");
  }
  // Analytic: one backward of <v, f(x)>.
  Tensor y = f(inputs);
  ACCRUE_CHECK(y.defined() && y.requires_grad(),
               "gradcheck: the function's output does not depend on any input that requires grad");
  Generator gen(options.seed);
  Tensor v = randn(y.shape(), y.dtype(), y.device(), &gen);
  const std::vector<double> vv = v.to_vector<double>();
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) clear_grad(t);
  backward(y, v);

  GradcheckResult result;
  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor g = grad(x);
    const std::vector<double> analytic =
        g.defined() ? g.to_vector<double>() : std::vector<double>(x.numel(), 0.0);
    double* data = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double original = data[i];
      data[i] = original + options.eps;
      const double plus = projected(f(inputs), vv);
      data[i] = original - options.eps;
      const double minus = projected(f(inputs), vv);
      data[i] = original;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double diff = std::fabs(numeric - analytic[i]);
      if (!(diff <= options.atol + options.rtol * std::fabs(numeric))) {
        std::ostringstream os;
        os.precision(12);
        os << "gradcheck: input " << k << " of shape " << shape_str(x.shape()) << ", element " << i
           << ": analytic " << analytic[i] << " vs numeric " << numeric;
        return {false, os.str()};
      }
    }
  }
  return result;
}

}  // namespace accrue
