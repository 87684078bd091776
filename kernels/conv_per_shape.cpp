// The per-shape choice of a 16-bit convolution's path: kernels/conv.cpp asks
// here first while ConvAlgorithmPolicy::path_per_shape is on
// (kernels/conv_backend.h, namespace per_shape).
#include <functional>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::per_shape {

// Note [Per-shape convolution paths]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Which path computes a 16-bit convolution fastest depends on the shape. A
// 1 x 1 convolution of a channels-last activation runs as a GEMM on views
// (Note [Pointwise convolution as a GEMM]) or on cuDNN, in all three
// directions. A weight gradient into an fp32 slot has two cuDNN paths more:
// cuDNN's engines that write fp32 are slow on large activations (0.26 ms a
// call on ResNet-50's on an H100, bench/RESULTS.md), and a 16-bit output added
// into the slot costs the add pass and a rounding of the micro-step's
// gradient to 16 bits. Which wins is a matter of the layer, not of the model:
// ResNet-50 bf16 on an H200 (bench/RESULTS.md, 2026-11-28 evening) ran 3,804
// images/s at 256 x 1 with fp32 outputs, 5,145 with 16-bit ones and 5,177
// with the path chosen per shape, which took the 1 x 1 GEMM for every 1 x 1
// weight gradient and the 16-bit output for 70 of the other 77 (over the four
// micro-batches' shapes).
// ConvAlgorithmPolicy::path_per_shape times the paths that apply on a
// shape's first call (a weight gradient into a scratch slot, never the
// call's: beta 1 must not see them) and keeps the fastest: in the tuning file
// when one is set (Note [Tuning file]), so that a rerun reads the choice back
// and computes the same bits, else for the process. Each path computes the
// bits it computes under the fixed settings, so a recorded choice reproduces
// one of them exactly. Inside a CUDA graph capture, with nothing recorded yet,
// the fixed order runs (warm up before capturing).

using fixed_path::cudnn_operand;
using fixed_path::use_pointwise_gemm;
using fixed_path::weight_for;

namespace {

// A tuning line's key: the direction, the geometry, each operand's dtype and
// strides, then `extra` (the paths offered, beta).
std::string path_key(const char* op, const Conv2dGeometry& g,
                     std::initializer_list<const Tensor*> operands, const std::string& extra) {
  const Conv2dOptions& o = g.options;
  std::ostringstream s;
  s << op << ",";
  for (int64_t v : {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, o.stride_h, o.stride_w, o.pad_h, o.pad_w,
                    o.dilation_h, o.dilation_w, o.groups})
    s << v << ",";
  for (const Tensor* t : operands) {
    s << dtype_name(t->dtype()) << ",";
    for (int64_t stride : t->strides())
      s << stride << ",";
  }
  s << extra << ",";
  return s.str();
}

// Note [Per-shape convolution paths]: the index of the path to run among
// `count`, timed through run(i) (false: the path declined) and recorded; -1
// when the fixed order is to run (inside a capture, nothing recorded).
int chosen_path(const std::string& key, const Tensor& on, int count,
                const std::function<bool(int)>& run) {
  const int choice = cuda::choose_conv_path(key, on.device().index, count, run);
  return choice >= 0 && choice < count ? choice : -1;
}

// The forward of a 1 x 1 convolution that both the GEMM on views and cuDNN
// take: path 0 the GEMM, 1 cuDNN. Null when cuDNN declined path 1.
Tensor forward_path(int path, const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  if (path == 0) return pointwise::conv2d(x, weight, g);
  Tensor out = dispatch_util::empty_in_layout_of({g.n, g.o, g.oh, g.ow}, x.dtype(), x);
  return cudnn::conv2d_forward(x, weight_for(weight, x), out, g) ? out : Tensor();
}

// As forward_path, for the data gradient.
Tensor data_gradient_path(int path, const Tensor& grad, const Tensor& weight, const Shape& x_shape,
                          const Conv2dGeometry& g) {
  if (path == 0) return pointwise::conv2d_backward_input(grad, weight, g);
  Tensor dx = dispatch_util::empty_in_layout_of(x_shape, grad.dtype(), grad);
  return cudnn::conv2d_backward_data(grad, weight_for(weight, grad), dx, g) ? dx : Tensor();
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  if (!(use_pointwise_gemm(x, g) && cudnn_operand(x) && cudnn_operand(weight))) return {};
  const int path = chosen_path(path_key("conv2d", g, {&x, &weight}, "paths01"), x, 2,
                               [&](int i) { return forward_path(i, x, weight, g).defined(); });
  return path < 0 ? Tensor() : forward_path(path, x, weight, g);
}

Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Shape& x_shape,
                             const Conv2dGeometry& g) {
  if (!(grad.dtype() == weight.dtype() && use_pointwise_gemm(grad, g) && cudnn_operand(grad) &&
        cudnn_operand(weight)))
    return {};
  const int path =
      chosen_path(path_key("conv2d_backward_input", g, {&grad, &weight}, "paths01"), grad, 2,
                  [&](int i) { return data_gradient_path(i, grad, weight, x_shape, g).defined(); });
  return path < 0 ? Tensor() : data_gradient_path(path, grad, weight, x_shape, g);
}

namespace {

// The weight gradient's paths, in the order a choice counts them.
enum class WeightGradientPath : int {
  pointwise_gemm = 0,
  cudnn_slot_dtype = 1,
  cudnn_operand_dtype = 2
};

std::vector<WeightGradientPath> weight_gradient_paths(const Tensor& grad, const Tensor& x,
                                                      const Tensor& grad_weight,
                                                      const Conv2dGeometry& g) {
  std::vector<WeightGradientPath> paths;
  if (grad.dtype() == x.dtype() && use_pointwise_gemm(x, g))
    paths.push_back(WeightGradientPath::pointwise_gemm);
  if (fixed_path::cudnn_weight_gradient_applies(grad, x, grad_weight)) {
    paths.push_back(WeightGradientPath::cudnn_slot_dtype);
    if (grad_weight.dtype() != x.dtype()) paths.push_back(WeightGradientPath::cudnn_operand_dtype);
  }
  return paths;
}

// False when the path declined (cuDNN built no graph; nothing written).
bool run_weight_gradient_path(WeightGradientPath path, const Tensor& grad, const Tensor& x,
                              const Tensor& slot, const Conv2dGeometry& g, double beta) {
  switch (path) {
    case WeightGradientPath::pointwise_gemm:
      pointwise::conv2d_backward_weight(grad, x, slot, g, beta);
      return true;
    case WeightGradientPath::cudnn_slot_dtype:
      return fixed_path::cudnn_weight_gradient_in(grad, x, slot, g, beta, slot.dtype());
    case WeightGradientPath::cudnn_operand_dtype:
      return fixed_path::cudnn_weight_gradient_in(grad, x, slot, g, beta, x.dtype());
  }
  return false;
}

}  // namespace

bool conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dGeometry& g, double beta) {
  const std::vector<WeightGradientPath> paths = weight_gradient_paths(grad, x, grad_weight, g);
  if (paths.size() < 2) return false;
  std::ostringstream extra;
  extra << "beta" << beta << ",paths";
  for (WeightGradientPath path : paths)
    extra << static_cast<int>(path);
  std::optional<Tensor> scratch;  // the timed runs' slot, made on the first of them
  const int choice = chosen_path(
      path_key("conv2d_backward_weight", g, {&grad, &x, &grad_weight}, extra.str()), x,
      static_cast<int>(paths.size()), [&](int i) {
        if (!scratch) {
          scratch = grad_weight.is_channels_last()
                        ? dispatch_util::empty_channels_last(grad_weight.shape(),
                                                             grad_weight.dtype(), x.device())
                        : empty(grad_weight.shape(), grad_weight.dtype(), x.device());
          scratch->fill_(0.0);  // beta 1 reads it
        }
        return run_weight_gradient_path(paths[static_cast<size_t>(i)], grad, x, *scratch, g, beta);
      });
  return choice >= 0 && run_weight_gradient_path(paths[static_cast<size_t>(choice)], grad, x,
                                                 grad_weight, g, beta);
}

}  // namespace accrue::kernels::per_shape
