// The dispatch point of kernels/conv.h: validate (every error names the op
// and the shapes), compute the geometry, and run the CPU reference in double
// or, on CUDA, cuDNN where Note [cuDNN convolution] admits the call and the
// composed path otherwise (Note [Composed convolution]).
#include <atomic>
#include <cstdint>
#include <string>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/conv.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels {

namespace {

// A floating tensor on `device` (every op here runs on any device: Note [Composed convolution]).
void check_float_on(const Tensor& t, Device device, const char* op, const char* what) {
  dispatch_util::check_defined(t, op, what);
  dispatch_util::check_floating(t, op, what);
  dispatch_util::check_device(t, device, op, what, "the input");
}

// Which algorithm runs, by device: the CPU the reference, in double
// (kernels/cpu/conv.cpp); CUDA the pointwise GEMMs, cuDNN, kernels of its
// own or the composed path (Note [Composed convolution]).
bool runs_reference(const Tensor& t) {
  return t.device().is_cpu();
}

void check_4d(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.dim() == 4, op, ": ", what, " has shape ", shape_str(t.shape()),
               "; expected 4 dims [N, C, H, W] (NCHW)");
}

// floor((in + 2 pad - dilation (k - 1) - 1) / stride) + 1, checked positive.
int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                 const char* op, const char* axis, const Shape& x_shape) {
  const int64_t span = dilation * (k - 1) + 1;
  ACCRUE_CHECK(in + 2 * pad >= span, op, ": the ", axis, " window spans ", span, " (kernel ", k,
               ", dilation ", dilation, ") but the padded input has ", in + 2 * pad, " (input ",
               shape_str(x_shape), ", padding ", pad, ")");
  return (in + 2 * pad - span) / stride + 1;
}

void check_conv_options(const Conv2dOptions& o, const char* op) {
  ACCRUE_CHECK(o.stride_h >= 1 && o.stride_w >= 1, op, ": stride (", o.stride_h, ", ", o.stride_w,
               ") must be >= 1");
  ACCRUE_CHECK(o.pad_h >= 0 && o.pad_w >= 0, op, ": padding (", o.pad_h, ", ", o.pad_w,
               ") must be >= 0");
  ACCRUE_CHECK(o.dilation_h >= 1 && o.dilation_w >= 1, op, ": dilation (", o.dilation_h, ", ",
               o.dilation_w, ") must be >= 1");
  ACCRUE_CHECK(o.groups >= 1, op, ": groups = ", o.groups, " must be >= 1");
}

}  // namespace

Conv2dGeometry conv_geometry(const Shape& x, const Shape& weight, const Conv2dOptions& o,
                             const char* op) {
  check_conv_options(o, op);
  ACCRUE_CHECK(weight.size() == 4, op, ": weight has shape ", shape_str(weight),
               "; expected 4 dims [O, C / groups, KH, KW]");
  ACCRUE_CHECK(x.size() == 4, op, ": input has shape ", shape_str(x),
               "; expected 4 dims [N, C, H, W] (NCHW)");
  ACCRUE_CHECK(x[1] % o.groups == 0 && weight[0] % o.groups == 0, op, ": groups = ", o.groups,
               " must divide the input's ", x[1], " channels and the weight's ", weight[0],
               " output channels");
  ACCRUE_CHECK(weight[1] * o.groups == x[1], op, ": weight ", shape_str(weight), " with groups ",
               o.groups, " takes ", weight[1] * o.groups, " input channels, the input ",
               shape_str(x), " has ", x[1]);
  ACCRUE_CHECK(weight[2] >= 1 && weight[3] >= 1, op, ": weight ", shape_str(weight),
               " has an empty kernel");
  Conv2dGeometry g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.o = weight[0];
  g.kh = weight[2];
  g.kw = weight[3];
  g.oh = out_size(g.h, g.kh, o.stride_h, o.pad_h, o.dilation_h, op, "height", x);
  g.ow = out_size(g.w, g.kw, o.stride_w, o.pad_w, o.dilation_w, op, "width", x);
  g.options = o;
  return g;
}

Conv2dGeometry pool_geometry(const Shape& x, const Pool2dOptions& p, const char* op) {
  ACCRUE_CHECK(x.size() == 4, op, ": input has shape ", shape_str(x),
               "; expected 4 dims [N, C, H, W] (NCHW)");
  ACCRUE_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1, op, ": kernel (", p.kernel_h, ", ", p.kernel_w,
               ") must be >= 1");
  ACCRUE_CHECK(p.stride_h >= 1 && p.stride_w >= 1, op, ": stride (", p.stride_h, ", ", p.stride_w,
               ") must be >= 1");
  ACCRUE_CHECK(
      p.pad_h >= 0 && p.pad_w >= 0 && 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w, op,
      ": padding (", p.pad_h, ", ", p.pad_w, ") must be between 0 and half the kernel (",
      p.kernel_h, ", ", p.kernel_w, ")");
  Conv2dGeometry g;
  g.n = x[0];
  g.c = g.o = x[1];
  g.h = x[2];
  g.w = x[3];
  g.kh = p.kernel_h;
  g.kw = p.kernel_w;
  g.options.stride_h = p.stride_h;
  g.options.stride_w = p.stride_w;
  g.options.pad_h = p.pad_h;
  g.options.pad_w = p.pad_w;
  g.options.groups = g.c;
  g.oh = out_size(g.h, g.kh, p.stride_h, p.pad_h, 1, op, "height", x);
  g.ow = out_size(g.w, g.kw, p.stride_w, p.pad_w, 1, op, "width", x);
  return g;
}

namespace {

// The output gradient of a convolution: floating, on `device`, of the forward's output shape.
void check_conv_grad(const Tensor& grad, const Shape& expected, Device device, const char* op) {
  check_float_on(grad, device, op, "grad");
  ACCRUE_CHECK(grad.shape() == expected, op, ": grad has shape ", shape_str(grad.shape()),
               "; the forward's output has ", shape_str(expected));
}

// The geometry of a pooling backward: input x_shape [N, C, H, W] (checked
// against grad [N, C, OH, OW]), planes of one channel each.
Conv2dGeometry backward_planes(const Tensor& grad, const Shape& x_shape, const char* op) {
  check_float_on(grad, grad.defined() ? grad.device() : Device::cpu(), op, "grad");
  check_4d(grad, op, "grad");
  ACCRUE_CHECK(x_shape.size() == 4 && x_shape[0] == grad.size(0) && x_shape[1] == grad.size(1) &&
                   x_shape[2] >= 1 && x_shape[3] >= 1,
               op, ": input shape ", shape_str(x_shape), " does not match grad ",
               shape_str(grad.shape()));
  Conv2dGeometry g;
  g.n = x_shape[0];
  g.c = g.o = x_shape[1];
  g.h = x_shape[2];
  g.w = x_shape[3];
  g.oh = grad.size(2);
  g.ow = grad.size(3);
  return g;
}

Tensor f64(const Tensor& t) {
  return t.to(DType::f64).contiguous();
}

bool cudnn_operand_aligned(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Note [cuDNN convolution]: next to a channels-last activation the weight
// goes to cuDNN channels-last too, [O, C / groups, KH, KW] over O, KH, KW,
// C / groups memory (as PyTorch's channels_last model converts its weights).
// Handed the arena's contiguous weight, cuDNN transposes it on every call and
// its weight-gradient engine for the mixed layout took 8.4 ms of a 27 ms
// ResNet-50 step at micro-batch 32 on an H100. A 1 x 1 kernel is both layouts.
bool wants_channels_last_weight(const Shape& weight_shape, const Tensor& activation) {
  return dispatch_util::channels_last(activation) && weight_shape[2] * weight_shape[3] > 1;
}

// A row-major or channels-last tensor as the flat vector of its elements in
// memory order (a view).
Tensor memory_order(const Tensor& t) {
  return t.is_channels_last() ? t.permute({0, 2, 3, 1}).reshape({t.numel()})
                              : t.reshape({t.numel()});
}

}  // namespace

// The fixed order's pieces that the per-shape choice runs too (kernels/conv_backend.h).
namespace fixed_path {

// Note [cuDNN convolution]: which operands go to cuDNN.
bool cudnn_operand(const Tensor& t) {
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  return t.device().is_cuda() && (t.dtype() == DType::bf16 || t.dtype() == DType::f16) &&
         (t.is_contiguous() || dispatch_util::channels_last(t)) && cudnn_operand_aligned(t);
#else
  (void)t;
  return false;
#endif
}

// The weight as the convolution with `activation` wants it: itself when its
// layout is that one (a channels-last model's weights are channels-last, Note
// [Parameter layouts]), else a copy (the weights are small next to the
// activations).
Tensor weight_for(const Tensor& weight, const Tensor& activation) {
  const bool channels_last = wants_channels_last_weight(weight.shape(), activation);
  if (channels_last ? weight.is_channels_last() : weight.is_contiguous()) return weight;
  if (!channels_last) return weight.contiguous();
  Tensor w = dispatch_util::empty_channels_last(weight.shape(), weight.dtype(), weight.device());
  w.copy_(weight);
  return w;
}

// Note [cuDNN convolution]'s weight gradient computed in `dtype` (the slot's
// or the operands'): with beta 0, the slot's dtype and the slot in the wanted
// layout, straight into the slot; otherwise through a temporary of `dtype`,
// copied or added into the slot. False when cuDNN builds neither (nothing
// written).
bool cudnn_weight_gradient_in(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                              const Conv2dGeometry& g, double beta, DType dtype) {
  const bool channels_last = wants_channels_last_weight(grad_weight.shape(), x);
  const bool slot_in_layout =
      channels_last ? grad_weight.is_channels_last() : grad_weight.is_contiguous();
  if (dtype == grad_weight.dtype() && beta == 0.0 && slot_in_layout &&
      cudnn_operand_aligned(grad_weight) && cudnn::conv2d_backward_weight(grad, x, grad_weight, g))
    return true;
  Tensor dw = channels_last
                  ? dispatch_util::empty_channels_last(grad_weight.shape(), dtype, x.device())
                  : empty(grad_weight.shape(), dtype, x.device());
  if (!cudnn::conv2d_backward_weight(grad, x, dw, g)) return false;
  // Laid out as the slot, the temporary holds the same elements in the same
  // memory order: copy or add them as flat vectors, one contiguous pass
  // (over channels-last views an elementwise op would take the strided
  // kernel, and the cast a transposing copy).
  const Tensor slot = slot_in_layout ? memory_order(grad_weight) : grad_weight;
  const Tensor result = slot_in_layout ? memory_order(dw) : dw;
  if (beta == 0.0) {
    slot.copy_(result);  // Note [Overwrite first]: the slot is not read
  } else {
    axpy_(slot, 1.0, result);  // Note [Mixed axpy]: a 16-bit result in the same pass
  }
  return true;
}

// Whether cuDNN may compute this weight gradient (Note [cuDNN convolution]).
bool cudnn_weight_gradient_applies(const Tensor& grad, const Tensor& x, const Tensor& grad_weight) {
  return cudnn_operand(grad) && cudnn_operand(x) && grad.dtype() == x.dtype() &&
         (grad_weight.dtype() == DType::f32 || grad_weight.dtype() == x.dtype());
}

}  // namespace fixed_path

using fixed_path::cudnn_operand;
using fixed_path::use_pointwise_gemm;
using fixed_path::weight_for;

namespace {

// The weight gradient on cuDNN, in the order ConvAlgorithmPolicy asks:
// ConvAlgorithmPolicy::weight_gradient_in_operand_dtype puts a 16-bit output
// first. False when cuDNN takes none of it (nothing written).
bool cudnn_weight_gradient(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                           const Conv2dGeometry& g, double beta) {
  if (!fixed_path::cudnn_weight_gradient_applies(grad, x, grad_weight)) return false;
  const bool operand_dtype_first = conv_algorithm_policy().weight_gradient_in_operand_dtype;
  const DType first = operand_dtype_first ? x.dtype() : grad_weight.dtype();
  const DType second = operand_dtype_first ? grad_weight.dtype() : x.dtype();
  return fixed_path::cudnn_weight_gradient_in(grad, x, grad_weight, g, beta, first) ||
         (second != first &&
          fixed_path::cudnn_weight_gradient_in(grad, x, grad_weight, g, beta, second));
}

}  // namespace

#ifndef ACCRUE_WITH_CUDNN_FRONTEND
// The calls cudnn_operand never admits in a build without the frontend.
namespace cudnn {
bool conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&) {
  return false;
}
bool conv2d_backward_data(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&) {
  return false;
}
bool conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&) {
  return false;
}
}  // namespace cudnn
#endif

namespace {

std::atomic<bool> pointwise_gemm_on{true};
std::atomic<bool> conv_timed{false};
std::atomic<bool> conv_nondeterministic{false};
std::atomic<bool> conv_16_bit_weight_gradient{false};
std::atomic<bool> conv_path_per_shape{false};

}  // namespace

namespace fixed_path {

// Note [Pointwise convolution as a GEMM]: a bf16/f16 CUDA 1 x 1 convolution
// whose activation (the input, or for the data gradient the output gradient)
// is channels-last.
bool use_pointwise_gemm(const Tensor& activation, const Conv2dGeometry& g) {
  return pointwise_gemm_on.load() && activation.device().is_cuda() &&
         dispatch_util::is_16_bit(activation.dtype()) && dispatch_util::channels_last(activation) &&
         pointwise::applies(activation, g);
}

}  // namespace fixed_path

void set_pointwise_conv_gemm(bool on) {
  pointwise_gemm_on.store(on);
}

bool pointwise_conv_gemm() {
  return pointwise_gemm_on.load();
}

void set_conv_algorithm_policy(const ConvAlgorithmPolicy& policy) {
  conv_timed.store(policy.timed);
  conv_nondeterministic.store(policy.allow_nondeterministic);
  conv_16_bit_weight_gradient.store(policy.weight_gradient_in_operand_dtype);
  conv_path_per_shape.store(policy.path_per_shape);
}

ConvAlgorithmPolicy conv_algorithm_policy() {
  ConvAlgorithmPolicy p;
  p.timed = conv_timed.load();
  p.allow_nondeterministic = conv_nondeterministic.load();
  p.weight_gradient_in_operand_dtype = conv_16_bit_weight_gradient.load();
  p.path_per_shape = conv_path_per_shape.load();
  return p;
}

bool cudnn_convolution_available() {
#ifdef ACCRUE_WITH_CUDNN_FRONTEND
  return true;
#else
  return false;
#endif
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dOptions& options) {
  const char* op = "conv2d";
  NoGradGuard no_grad;
  check_float_on(x, x.defined() ? x.device() : Device::cpu(), op, "input");
  check_float_on(weight, x.device(), op, "weight");
  ACCRUE_CHECK(x.dtype() == weight.dtype(), op, ": input is ", dtype_name(x.dtype()),
               ", weight is ", dtype_name(weight.dtype()), "; expected one dtype");
  const Conv2dGeometry g = conv_geometry(x.shape(), weight.shape(), options, op);
  if (conv_algorithm_policy().path_per_shape) {
    if (Tensor out = per_shape::conv2d(x, weight, g); out.defined()) return out;
  }
  if (use_pointwise_gemm(x, g)) return pointwise::conv2d(x, weight, g);
  if (cudnn_operand(x) && cudnn_operand(weight)) {
    Tensor out = dispatch_util::empty_in_layout_of({g.n, g.o, g.oh, g.ow}, x.dtype(), x);
    if (cudnn::conv2d_forward(x, weight_for(weight, x), out, g)) return out;
  }
  if (!runs_reference(x)) return composed::conv2d(x, weight, g);  // Note [Composed convolution]
  Tensor out = empty({g.n, g.o, g.oh, g.ow}, DType::f64);
  cpu::conv2d(f64(x), f64(weight), out, g);
  return out.to(x.dtype());
}

Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Shape& x_shape,
                             const Conv2dOptions& options) {
  const char* op = "conv2d_backward_input";
  NoGradGuard no_grad;
  check_float_on(weight, weight.defined() ? weight.device() : Device::cpu(), op, "weight");
  const Conv2dGeometry g = conv_geometry(x_shape, weight.shape(), options, op);
  check_conv_grad(grad, {g.n, g.o, g.oh, g.ow}, weight.device(), op);
  if (conv_algorithm_policy().path_per_shape) {
    if (Tensor dx = per_shape::conv2d_backward_input(grad, weight, x_shape, g); dx.defined())
      return dx;
  }
  if (grad.dtype() == weight.dtype() && use_pointwise_gemm(grad, g))
    return pointwise::conv2d_backward_input(grad, weight, g);
  if (cudnn_operand(grad) && cudnn_operand(weight) && grad.dtype() == weight.dtype()) {
    Tensor dx = dispatch_util::empty_in_layout_of(x_shape, grad.dtype(), grad);
    if (cudnn::conv2d_backward_data(grad, weight_for(weight, grad), dx, g)) return dx;
  }
  if (!runs_reference(weight)) return composed::conv2d_backward_input(grad, weight, g);
  Tensor dx = empty(x_shape, DType::f64);
  cpu::conv2d_backward_input(f64(grad), f64(weight), dx, g);
  return dx.to(grad.dtype());
}

void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dOptions& options, double beta) {
  const char* op = "conv2d_backward_weight";
  NoGradGuard no_grad;
  check_float_on(x, x.defined() ? x.device() : Device::cpu(), op, "input");
  check_float_on(grad_weight, x.device(), op, "grad_weight");
  ACCRUE_CHECK(beta == 0.0 || beta == 1.0, op, ": beta = ", beta, "; expected 0 or 1");
  const Conv2dGeometry g = conv_geometry(x.shape(), grad_weight.shape(), options, op);
  check_conv_grad(grad, {g.n, g.o, g.oh, g.ow}, x.device(), op);
  if (!runs_reference(x)) {
    // Note [Parameter layouts]: a slot is row-major or channels-last.
    ACCRUE_CHECK(grad_weight.is_contiguous() || grad_weight.is_channels_last(), op,
                 ": grad_weight of shape ", shape_str(grad_weight.shape()), " and strides ",
                 shape_str(grad_weight.strides()), " must be contiguous or channels-last");
    if (conv_algorithm_policy().path_per_shape &&
        per_shape::conv2d_backward_weight(grad, x, grad_weight, g, beta))
      return;
    if (grad.dtype() == x.dtype() && use_pointwise_gemm(x, g)) {
      pointwise::conv2d_backward_weight(grad, x, grad_weight, g, beta);  // 1 x 1: row-major
      return;
    }
    if (cudnn_weight_gradient(grad, x, grad_weight, g, beta)) return;
    // Note [Composed convolution]: its GEMM writes a row-major slot.
    if (grad_weight.is_contiguous()) {
      composed::conv2d_backward_weight(grad, x, grad_weight, g, beta);
      return;
    }
    Tensor dw = empty(grad_weight.shape(), grad_weight.dtype(), x.device());
    composed::conv2d_backward_weight(grad, x, dw, g, 0.0);
    if (beta == 0.0) {
      grad_weight.copy_(dw);  // Note [Overwrite first]: the slot is not read
    } else {
      axpy_(grad_weight, 1.0, dw);
    }
    return;
  }
  Tensor dw = empty(grad_weight.shape(), DType::f64);
  cpu::conv2d_backward_weight(f64(grad), f64(x), dw, g);
  // Note [Overwrite first]: beta 0 never reads the slot (it may hold NaN).
  if (beta != 0.0) axpy_(dw, 1.0, f64(grad_weight));
  grad_weight.copy_(dw);
}

namespace {

// A composed pooling result (contiguous) in the layout of `like`: pooling
// keeps a channels-last model channels-last (Note [Channels-last results]),
// at the price of one copy of its (small) output, so the convolutions after
// it run channels-last in cuDNN.
Tensor in_layout_of(const Tensor& t, const Tensor& like) {
  if (!dispatch_util::channels_last(like) || t.dim() != 4) return t;
  Tensor out = dispatch_util::empty_channels_last(t.shape(), t.dtype(), t.device());
  out.copy_(t);
  return out;
}

}  // namespace

MaxPoolOutput max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const char* op = "max_pool2d";
  NoGradGuard no_grad;
  check_float_on(x, x.defined() ? x.device() : Device::cpu(), op, "input");
  const Conv2dGeometry g = pool_geometry(x.shape(), options, op);
  if (!runs_reference(x)) {  // Note [Max pooling kernels]: in the input's layout
    const Shape shape{g.n, g.c, g.oh, g.ow};
    MaxPoolOutput r{dispatch_util::empty_in_layout_of(shape, x.dtype(), x),
                    dispatch_util::empty_in_layout_of(shape, DType::i64, x)};
    cuda::max_pool2d(x, r.out, r.indices, g);
    return r;
  }
  Tensor out = empty({g.n, g.c, g.oh, g.ow}, DType::f64);
  Tensor indices = empty({g.n, g.c, g.oh, g.ow}, DType::i64);
  cpu::max_pool2d(f64(x), out, indices, g);
  return {out.to(x.dtype()), indices};
}

Tensor max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Shape& x_shape,
                           const Pool2dOptions& options) {
  const char* op = "max_pool2d_backward";
  NoGradGuard no_grad;
  const Conv2dGeometry g = pool_geometry(x_shape, options, op);
  check_conv_grad(grad, {g.n, g.c, g.oh, g.ow}, grad.defined() ? grad.device() : Device::cpu(), op);
  ACCRUE_CHECK(indices.defined() && indices.dtype() == DType::i64 &&
                   indices.shape() == grad.shape() && indices.device() == grad.device(),
               op, ": indices must be i64 on ", grad.device().str(), " with grad's shape ",
               shape_str(grad.shape()));
  if (!runs_reference(grad)) {  // Note [Max pooling kernels]: in the gradient's layout
    check_index_range(indices, g.h * g.w, 0, false, op, "indices");
    Tensor dx = dispatch_util::empty_in_layout_of(x_shape, grad.dtype(), grad);
    cuda::max_pool2d_backward(grad, indices, dx, g);
    return dx;
  }
  const Tensor idx = indices.contiguous();
  for (int64_t v : idx.to_vector<int64_t>())
    ACCRUE_CHECK(v >= 0 && v < g.h * g.w, op, ": index ", v, " is outside the ", g.h, " x ", g.w,
                 " plane");
  Tensor dx = empty(x_shape, DType::f64);
  cpu::max_pool2d_backward(f64(grad), idx, dx, g);
  return dx.to(grad.dtype());
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const char* op = "avg_pool2d";
  NoGradGuard no_grad;
  check_float_on(x, x.defined() ? x.device() : Device::cpu(), op, "input");
  const Conv2dGeometry g = pool_geometry(x.shape(), options, op);
  if (!runs_reference(x))
    return in_layout_of(composed::avg_pool2d(x, g, options.count_include_pad), x);
  Tensor out = empty({g.n, g.c, g.oh, g.ow}, DType::f64);
  cpu::avg_pool2d(f64(x), out, g, options.count_include_pad);
  return out.to(x.dtype());
}

Tensor avg_pool2d_backward(const Tensor& grad, const Shape& x_shape, const Pool2dOptions& options) {
  const char* op = "avg_pool2d_backward";
  NoGradGuard no_grad;
  const Conv2dGeometry g = pool_geometry(x_shape, options, op);
  check_conv_grad(grad, {g.n, g.c, g.oh, g.ow}, grad.defined() ? grad.device() : Device::cpu(), op);
  if (!runs_reference(grad))
    return in_layout_of(composed::avg_pool2d_backward(grad, g, options.count_include_pad), grad);
  Tensor dx = empty(x_shape, DType::f64);
  cpu::avg_pool2d_backward(f64(grad), dx, g, options.count_include_pad);
  return dx.to(grad.dtype());
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  const char* op = "adaptive_avg_pool2d";
  NoGradGuard no_grad;
  check_float_on(x, x.defined() ? x.device() : Device::cpu(), op, "input");
  check_4d(x, op, "input");
  ACCRUE_CHECK(out_h >= 1 && out_w >= 1, op, ": output size (", out_h, ", ", out_w,
               ") must be >= 1");
  Conv2dGeometry g;
  g.n = x.size(0);
  g.c = g.o = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  ACCRUE_CHECK(g.h >= 1 && g.w >= 1, op, ": input ", shape_str(x.shape()), " has an empty plane");
  g.oh = out_h;
  g.ow = out_w;
  if (!runs_reference(x))
    return in_layout_of(composed::adaptive_avg_pool2d(x, g), x);  // Note [Composed convolution]
  Tensor out = empty({g.n, g.c, g.oh, g.ow}, DType::f64);
  cpu::adaptive_avg_pool2d(f64(x), out, g);
  return out.to(x.dtype());
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad, const Shape& x_shape) {
  const char* op = "adaptive_avg_pool2d_backward";
  NoGradGuard no_grad;
  const Conv2dGeometry g = backward_planes(grad, x_shape, op);
  if (!runs_reference(grad)) return composed::adaptive_avg_pool2d_backward(grad, g);
  Tensor dx = empty(x_shape, DType::f64);
  cpu::adaptive_avg_pool2d_backward(f64(grad), dx, g);
  return dx.to(grad.dtype());
}

}  // namespace accrue::kernels
