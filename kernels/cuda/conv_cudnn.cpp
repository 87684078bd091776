// 2-D convolution on cuDNN, through the cuDNN frontend's graph API: forward
// (conv_fprop), data gradient (conv_dgrad) and weight gradient (conv_wgrad).
// Compiled only with ACCRUE_WITH_CUDNN_FRONTEND; kernels/conv.cpp sends here
// what Note [cuDNN convolution] admits.
//
// Note [cuDNN convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Which calls come here: bf16 or f16 CUDA tensors whose every operand is
// packed NCHW or packed NHWC (channels-last: strides C=1, W=C, H=W C,
// N=H W C) with a 16-byte aligned base. f32 and f64 stay on the composed path
// (Note [Composed convolution]), whose GEMMs keep TF32 off, so the f32 suite
// still compares with the CPU reference at 1e-5.
//  - Tensors go in with their real strides; an output takes its input's
//    layout (an NHWC input gives an NHWC output). Elementwise results and
//    the fused BatchNorm keep a channels-last layout (Note [Channels-last
//    results], Note [Fused batch norm kernels]), so a channels-last ResNet
//    stays channels-last from its input to its pooling. Next to a
//    channels-last activation the weight goes in channels-last too, as does
//    the weight gradient's output: as is where the model's weights are
//    channels-last (nn::Module::to_channels_last, Note [Parameter layouts]),
//    else a copy (kernels/conv.cpp's weight_for).
//  - One graph per key: direction, device, dtype, the geometry and every
//    operand's strides (and the weight gradient's output dtype). It is built
//    once (validate, operation graph, heuristics A then fallback, the
//    non-deterministic engines removed, support check, plan build) and cached
//    for the process; later calls bind pointers and execute. By default the
//    plan chosen is the first that builds: no timing, so the same plan on
//    every run. kernels::set_conv_algorithm_policy (kernels/conv.h) can ask
//    for every candidate to be built and timed on the key's first call (the
//    frontend's autotune: the host waits, up to 100 runs per plan), the
//    fastest kept for the process; a different run may then keep another
//    engine. It can also admit the engines cuDNN marks non-deterministic.
//    The policy is part of the key.
//  - A key cuDNN cannot build is remembered as unsupported and said once on
//    stderr. Its calls go to the composed path, except a weight gradient
//    into an f32 slot, which first tries a graph with the operands' dtype
//    and a temporary.
//  - The weight gradient: beta 0 writes the result straight into the slot,
//    f32 or the input's dtype, where cuDNN builds a graph with that output
//    type and the slot's layout is the one wanted; a slot of the other layout
//    and beta 1 (Note [Fused weight-gradient accumulation]) go through a
//    temporary of the slot's dtype, copied or added into the slot, because
//    the graph API's conv_wgrad has no alpha/beta blend. The temporary is the
//    weight's size, small beside the activations. Only a slow engine writes
//    an fp32 weight gradient from bf16 operands (on an H100 in ResNet-50,
//    0.26 ms per call, about 5x PyTorch's bf16 ones: bench/RESULTS.md), so
//    ConvAlgorithmPolicy::weight_gradient_in_operand_dtype asks for the
//    operands' dtype first (a temporary, then added into the f32 slot).
//  - Handles are per (device, stream) and bound to that stream; workspaces
//    come from accrue's allocator on that stream. Nothing synchronizes the
//    host, except a timed plan choice on a key's first call. The state is
//    never destroyed, as in Note [cuDNN attention graphs].
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/device_scope.h"
#include "accrue/core/status_check.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::cudnn {

namespace fe = ::cudnn_frontend;

namespace {

using Graph = fe::graph::Graph;
using VariantPack = std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*>;

enum Direction : int64_t { kForward = 0, kData = 1, kWeight = 2 };
enum Uid : int64_t { kIn = 1, kWeightUid, kOut };

const char* op_name(Direction d) {
  switch (d) {
    case kForward:
      return "conv2d";
    case kData:
      return "conv2d_backward_input";
    case kWeight:
      return "conv2d_backward_weight";
  }
  return "conv2d";
}

std::string describe(const Conv2dGeometry& g, DType dtype) {
  const Conv2dOptions& o = g.options;
  return detail::str_cat("input [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "], weight [", g.o, ", ",
                         g.c / o.groups, ", ", g.kh, ", ", g.kw, "], stride (", o.stride_h, ", ",
                         o.stride_w, "), padding (", o.pad_h, ", ", o.pad_w, "), dilation (",
                         o.dilation_h, ", ", o.dilation_w, "), groups ", o.groups, ", ",
                         dtype_name(dtype));
}

void check_fe(fe::error_t status, Direction d, const char* step, const Conv2dGeometry& g,
              DType dtype) {
  if (status.is_good()) return;
  // The frontend's message lists every engine it tried, one per line: the
  // first line says why, and the refusal is reported once (Note [cuDNN convolution]).
  const std::string message = status.get_message();
  ACCRUE_FAIL(op_name(d), ": cuDNN frontend ", step, " failed for ", describe(g, dtype), ": ",
              message.substr(0, message.find('\n')));
}

// See Note [cuDNN convolution]: handles, built graphs and the keys that failed to build.
class ConvState {
 public:
  static ConvState& instance() {
    static ConvState* state = new ConvState();  // never destroyed, on purpose
    return *state;
  }
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, cudnnHandle_t> handles;
  std::map<std::vector<int64_t>, std::shared_ptr<Graph>> graphs;  // null: cuDNN refused the key

  // The caller holds mutex.
  cudnnHandle_t handle(int device, cudaStream_t stream) {
    auto it = handles.find({device, stream});
    if (it != handles.end()) return it->second;
    cudnnHandle_t h = nullptr;
    ACCRUE_CUDNN_CHECK(cudnnCreate(&h));
    ACCRUE_CUDNN_CHECK(cudnnSetStream(h, stream));
    handles.emplace(std::make_pair(device, stream), h);
    return h;
  }
};

fe::DataType_t fe_type(DType t) {
  switch (t) {
    case DType::bf16:
      return fe::DataType_t::BFLOAT16;
    case DType::f16:
      return fe::DataType_t::HALF;
    default:
      return fe::DataType_t::FLOAT;
  }
}

std::shared_ptr<fe::graph::Tensor_attributes> operand(Graph& g, const char* name, int64_t uid,
                                                      const Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(t.shape())
                      .set_stride(t.strides())
                      .set_data_type(fe_type(t.dtype())));
}

void describe_output(const std::shared_ptr<fe::graph::Tensor_attributes>& attr, const Tensor& t) {
  attr->set_output(true)
      .set_uid(kOut)
      .set_dim(t.shape())
      .set_stride(t.strides())
      .set_data_type(fe_type(t.dtype()));
}

// The graph of one call: a = x (forward, weight) or dy (data); b = the weight
// (forward, data) or x (weight); out = y, dx or dw.
std::shared_ptr<Graph> build_graph(Direction d, const Tensor& a, const Tensor& b, const Tensor& out,
                                   const Conv2dGeometry& geometry, cudnnHandle_t handle) {
  const Conv2dOptions& o = geometry.options;
  const std::vector<int64_t> padding{o.pad_h, o.pad_w}, stride{o.stride_h, o.stride_w},
      dilation{o.dilation_h, o.dilation_w};
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe_type(a.dtype()))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  std::shared_ptr<fe::graph::Tensor_attributes> result;
  if (d == kForward) {
    result = g->conv_fprop(operand(*g, "X", kIn, a), operand(*g, "W", kWeightUid, b),
                           fe::graph::Conv_fprop_attributes()
                               .set_name("accrue_conv_fprop")
                               .set_padding(padding)
                               .set_stride(stride)
                               .set_dilation(dilation));
  } else if (d == kData) {
    result = g->conv_dgrad(operand(*g, "DY", kIn, a), operand(*g, "W", kWeightUid, b),
                           fe::graph::Conv_dgrad_attributes()
                               .set_name("accrue_conv_dgrad")
                               .set_padding(padding)
                               .set_stride(stride)
                               .set_dilation(dilation));
  } else {
    result = g->conv_wgrad(operand(*g, "DY", kIn, a), operand(*g, "X", kWeightUid, b),
                           fe::graph::Conv_wgrad_attributes()
                               .set_name("accrue_conv_wgrad")
                               .set_padding(padding)
                               .set_stride(stride)
                               .set_dilation(dilation));
  }
  describe_output(result, out);
  const DType dtype = a.dtype();
  try {
    check_fe(g->validate(), d, "graph validation", geometry, dtype);
    check_fe(g->build_operation_graph(handle), d, "operation graph", geometry, dtype);
    check_fe(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), d,
             "execution plans", geometry, dtype);
    const ConvAlgorithmPolicy policy = conv_algorithm_policy();
    if (!policy.allow_nondeterministic)
      g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    check_fe(g->check_support(handle), d, "support check", geometry, dtype);
    check_fe(g->build_plans(handle, policy.timed ? fe::BuildPlanPolicy_t::ALL
                                                 : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
             d, "plan build", geometry, dtype);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the frontend's own exceptions
    ACCRUE_FAIL(op_name(d), ": cuDNN frontend failed for ", describe(geometry, dtype), ": ",
                e.what());
  }
  return g;
}

std::vector<int64_t> graph_key(Direction d, int device, const Tensor& a, const Tensor& b,
                               const Tensor& out, const Conv2dGeometry& g) {
  const Conv2dOptions& o = g.options;
  const ConvAlgorithmPolicy policy = conv_algorithm_policy();
  std::vector<int64_t> key{d,
                           device,
                           static_cast<int64_t>(a.dtype()),
                           static_cast<int64_t>(out.dtype()),
                           o.stride_h,
                           o.stride_w,
                           o.pad_h,
                           o.pad_w,
                           o.dilation_h,
                           o.dilation_w,
                           o.groups,
                           policy.timed,
                           policy.allow_nondeterministic};
  for (const Tensor* t : {&a, &b, &out}) {
    key.insert(key.end(), t->shape().begin(), t->shape().end());
    key.insert(key.end(), t->strides().begin(), t->strides().end());
  }
  return key;
}

// The cached graph of the call, built on first use (*built says so); null when
// cuDNN cannot build it. The caller holds the state's mutex.
std::shared_ptr<Graph> graph_for(ConvState& state, Direction d, const Tensor& a, const Tensor& b,
                                 const Tensor& out, const Conv2dGeometry& g, cudnnHandle_t handle,
                                 bool* built) {
  std::vector<int64_t> key = graph_key(d, a.device().index, a, b, out, g);
  auto it = state.graphs.find(key);
  *built = it == state.graphs.end();
  if (!*built) return it->second;
  std::shared_ptr<Graph> graph;
  try {
    graph = build_graph(d, a, b, out, g, handle);
  } catch (const Error& e) {
    // Note [cuDNN convolution]: said once; conv.cpp then tries a temporary in the
    // operands' dtype (the weight gradient) or the composed path.
    std::fprintf(stderr, "accrue: %s; this call takes another path\n", e.what());
    graph = nullptr;
  }
  state.graphs.emplace(std::move(key), graph);
  return graph;
}

// Runs `graph` with a workspace from accrue's allocator on the current stream.
void execute(const Graph& graph, cudnnHandle_t handle, VariantPack& pack, Device device,
             Direction d, const Conv2dGeometry& g, DType dtype) {
  int64_t bytes = 0;
  check_fe(graph.get_workspace_size(bytes), d, "workspace query", g, dtype);
  Tensor workspace;
  void* ptr = nullptr;
  if (bytes > 0) {
    workspace = empty({(bytes + 7) / 8}, DType::i64, device);
    if (prewrite_library_outputs()) workspace.fill_(0.0);  // Note [Library outputs under initcheck]
    ptr = workspace.data_ptr();
  }
  check_fe(graph.execute(handle, pack, ptr), d, "execute", g, dtype);
  // workspace is released here, after the launch, on the same stream.
}

// The timed choice of ConvAlgorithmPolicy: every built plan run on the call's
// operands (outputs are overwritten by the call that follows), the fastest
// moved first.
void time_plans(Graph& graph, cudnnHandle_t handle, VariantPack& pack, Device device, Direction d,
                const Conv2dGeometry& g, DType dtype) {
  const int64_t bytes = graph.get_autotune_workspace_size();
  Tensor workspace;
  if (bytes > 0) workspace = empty({(bytes + 7) / 8}, DType::i64, device);
  check_fe(graph.autotune(handle, pack, bytes > 0 ? workspace.data_ptr() : nullptr), d,
           "timed plan choice", g, dtype);
}

// Runs one convolution call; false when cuDNN cannot build it (nothing written).
bool run(Direction d, const Tensor& a, const Tensor& b, const Tensor& out,
         const Conv2dGeometry& g) {
  const int dev = a.device().index;
  ::accrue::cuda::DeviceScope scope(dev);
  ConvState& state = ConvState::instance();
  std::lock_guard<std::mutex> lock(state.mutex);
  cudnnHandle_t handle = state.handle(dev, current_stream(dev));
  bool built = false;
  std::shared_ptr<Graph> graph = graph_for(state, d, a, b, out, g, handle, &built);
  if (!graph) return false;
  if (prewrite_library_outputs()) out.fill_(0.0);  // Note [Library outputs under initcheck]
  VariantPack pack{{kIn, a.data_ptr()}, {kWeightUid, b.data_ptr()}, {kOut, out.data_ptr()}};
  if (built && conv_algorithm_policy().timed)
    time_plans(*graph, handle, pack, a.device(), d, g, a.dtype());
  execute(*graph, handle, pack, a.device(), d, g, a.dtype());
  return true;
}

}  // namespace

void prepare_conv_stream(int device, StreamHandle stream) {
  ConvState& state = ConvState::instance();
  std::lock_guard<std::mutex> lock(state.mutex);
  const ::accrue::cuda::DeviceScope scope(device);
  state.handle(device, stream);
}

bool conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& out,
                    const Conv2dGeometry& g) {
  return run(kForward, x, weight, out, g);
}

bool conv2d_backward_data(const Tensor& grad, const Tensor& weight, const Tensor& dx,
                          const Conv2dGeometry& g) {
  return run(kData, grad, weight, dx, g);
}

bool conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& dw,
                            const Conv2dGeometry& g) {
  return run(kWeight, grad, x, dw, g);
}

}  // namespace accrue::kernels::cudnn
