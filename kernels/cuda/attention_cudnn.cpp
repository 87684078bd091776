// Scaled dot-product attention on cuDNN's fused flash attention, through the
// cuDNN frontend's graph API. Compiled only with ACCRUE_WITH_CUDNN_FRONTEND;
// kernels/attention.cpp sends here what Note [Attention paths] admits:
// bf16/f16, no dropout, no boolean mask, no packed documents, dv == d a
// multiple of 8 up to 128, every operand 16-byte aligned in its base and
// strides.
//
// Note [cuDNN attention graphs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One cudnnHandle per (device, stream), created on first use and bound to
// that stream, so that work on concurrent streams never shares a handle. One
// graph per key: direction, device, dtype, B, Hq, Hkv, Tq, Tk, d, dv, the
// masks (causal, alignment, window, sequence lengths), whether there is a
// bias and its gradient, the scale's bits and the strides of every operand,
// which are the tensors' real strides (the heads of a packed [B, T, 3, H, d]
// qkv buffer and the [B, Tq, H, dv] output go in as views, never copied). A
// graph is built once (validate, operation graph, heuristic A plans, support
// check, plan build) and cached for the process; later calls bind pointers
// and execute. A key cuDNN refuses is cached too, with cuDNN's message, so
// that it is neither rebuilt nor retried: the call returns false and
// kernels/attention.cpp takes the composed path (Note [Attention paths]).
// The workspace comes from accrue's allocator on the current stream and is
// freed, stream-ordered, after the launch. Nothing synchronizes the host.
// The state is never destroyed: freeing handles from static destructors
// races the driver's teardown (as Note [cuBLASLt state] says for cuBLASLt).
//
// The forward writes Stats = max + ln(sum(exp(s - max))) per query row, f32
// [B, H, Tq, 1] packed: accrue's lse, see Note [Attention paths]. Grouped
// heads are cuDNN's own (k and v with Hkv heads, dk and dv likewise). The
// causal mask is cuDNN's diagonal band with right bound 0 and the diagonal
// alignment of the call; a window is its left bound, sliding_window_length,
// whose rule (col > row - window, shifted by Lk - Lq bottom-right) is Note
// [Attention masks]'s. Sequence lengths are its padding mask (int32 [B, 1, 1,
// 1] copies of accrue's i64 ones); cuDNN leaves padding rows as they were,
// so they are then zeroed (and their lse set to -inf, their dq, dk, dv rows
// to 0) by a small kernel (cuda::attention_zero_padding). The bias goes in
// with its own shape and strides, dbias out contiguous.
//
// Backward asks for cuDNN's deterministic algorithm (accrue's results are
// bitwise reproducible, no float atomics); where this cuDNN cannot build it
// for a shape, the default (atomic dQ accumulation) graph is built instead.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <bit>
#include <cstdint>
#include <exception>
#include <initializer_list>
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
#include "accrue/kernels/attention_backend.h"

namespace accrue::kernels::cudnn {

namespace fe = ::cudnn_frontend;

namespace {

using Graph = fe::graph::Graph;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;
using VariantPack = std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*>;

constexpr const char* kForward = "scaled_dot_product_attention";
constexpr const char* kBackward = "scaled_dot_product_attention_backward";

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqQ, kSeqKV, kBias, kDBias };

std::string describe(const AttentionParams& p, DType dtype) {
  return detail::str_cat(
      "B=", p.B, " Hq=", p.H, " Hkv=", p.Hkv, " Tq=", p.Tq, " Tk=", p.Tk, " d=", p.d, " dv=", p.dv,
      " ", dtype_name(dtype),
      p.causal ? (p.bottom_right ? " causal(bottom_right)" : " causal(top_left)") : "",
      p.window > 0 ? " window" : "", p.padded() ? " seq_lens" : "",
      p.bias.defined() ? " bias" : "");
}

void check_fe(fe::error_t status, const char* op, const char* step, const AttentionParams& p,
              DType dtype) {
  if (status.is_good()) return;
  ACCRUE_FAIL(op, ": cuDNN frontend ", step, " failed for ", describe(p, dtype), ": ",
              status.get_message());
}

using ::accrue::cuda::DeviceScope;

// See Note [cuDNN attention graphs].
class CudnnState {
 public:
  static CudnnState& instance() {
    static CudnnState* state = new CudnnState();  // never destroyed, on purpose
    return *state;
  }

  std::mutex& mutex() { return mutex_; }

  // The caller holds mutex().
  cudnnHandle_t handle(int device, cudaStream_t stream) {
    auto it = handles_.find({device, stream});
    if (it != handles_.end()) return it->second;
    cudnnHandle_t h = nullptr;
    ACCRUE_CUDNN_CHECK(cudnnCreate(&h));
    ACCRUE_CUDNN_CHECK(cudnnSetStream(h, stream));
    handles_.emplace(std::make_pair(device, stream), h);
    return h;
  }

  // A key's outcome: a built graph, or cuDNN's refusal.
  struct Entry {
    std::shared_ptr<Graph> graph;
    std::string refusal;
  };
  // The caller holds mutex(). Returns null when the key was never tried.
  const Entry* find(const std::vector<int64_t>& key) const {
    auto it = graphs_.find(key);
    return it == graphs_.end() ? nullptr : &it->second;
  }
  const Entry& insert(std::vector<int64_t> key, Entry entry) {
    return graphs_.emplace(std::move(key), std::move(entry)).first->second;
  }

  bool device_supported(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = supported_.find(device);
    if (it != supported_.end()) return it->second;
    int major = 0;
    ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    // Ampere or newer, and cuDNN 9.5.1 or newer: older ones assume that dO has
    // the strides of O (accrue passes any), and the frontend refuses fp16/bf16
    // SDPA on 9.10.0/9.10.1 for known bugs.
    const size_t version = cudnnGetVersion();
    const bool ok = major >= 8 && version >= 90501 && version != 91000 && version != 91001;
    supported_.emplace(device, ok);
    return ok;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, cudaStream_t>, cudnnHandle_t> handles_;
  std::map<std::vector<int64_t>, Entry> graphs_;
  std::map<int, bool> supported_;
};

fe::DataType_t io_type(DType t) {
  return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

std::shared_ptr<Graph> new_graph(DType dtype) {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(io_type(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// t's real strides, except that a zero stride of a size-1 dim (its stride is
// never used) becomes the extent of the dims inside it, which cuDNN accepts.
std::vector<int64_t> strides_of(const Tensor& t) {
  std::vector<int64_t> s = t.strides();
  for (size_t d = 0; d < s.size(); ++d) {
    if (t.size(static_cast<int64_t>(d)) != 1 || s[d] != 0) continue;
    s[d] = 1;
    for (size_t inner = d + 1; inner < s.size(); ++inner)
      s[d] *= t.size(static_cast<int64_t>(inner));
  }
  return s;
}

// A graph tensor with t's real shape and strides.
TensorAttr input(Graph& g, const char* name, int64_t uid, const Tensor& t) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(t.shape()).set_stride(
          strides_of(t)));
}

void describe_output(const TensorAttr& attr, int64_t uid, const Tensor& t) {
  attr->set_output(true).set_uid(uid).set_dim(t.shape()).set_stride(strides_of(t));
}

// lse as cuDNN's Stats: f32 [B, H, Tq, 1], packed.
std::vector<int64_t> stats_dim(const AttentionParams& p) {
  return {p.B, p.H, p.Tq, 1};
}
std::vector<int64_t> stats_stride(const AttentionParams& p) {
  return {p.H * p.Tq, p.Tq, 1, 1};
}

// Sequence lengths as cuDNN takes them: int32 [B, 1, 1, 1].
TensorAttr seq_len_input(Graph& g, const char* name, int64_t uid, const AttentionParams& p) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({p.B, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// The masks and the bias of Note [cuDNN attention graphs].
template <class Attributes>
void set_masks(Graph& g, Attributes& a, const AttentionParams& p) {
  const auto alignment =
      p.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT;
  if (p.causal || p.window > 0) a.set_diagonal_alignment(alignment);
  if (p.causal) a.set_diagonal_band_right_bound(0);
  if (p.window > 0) a.set_diagonal_band_left_bound(static_cast<int>(p.window));
  if (p.padded()) {
    a.set_padding_mask(true)
        .set_seq_len_q(seq_len_input(g, "seq_len_q", kSeqQ, p))
        .set_seq_len_kv(seq_len_input(g, "seq_len_kv", kSeqKV, p));
  }
  if (p.bias.defined()) {
    TensorAttr bias = g.tensor(fe::graph::Tensor_attributes()
                                   .set_name("Bias")
                                   .set_uid(kBias)
                                   .set_dim(p.bias_source.shape())
                                   .set_stride(strides_of(p.bias_source)));
    a.set_bias(bias);
  }
}

// Validates, lowers and plans a graph. Returns "" when it is built, else
// cuDNN's reason, naming the failing step.
std::string build(Graph& g, cudnnHandle_t handle, const char* op, const AttentionParams& p,
                  DType dtype) {
  try {
    check_fe(g.validate(), op, "graph validation", p, dtype);
    check_fe(g.build_operation_graph(handle), op, "operation graph", p, dtype);
    check_fe(g.create_execution_plans({fe::HeurMode_t::A}), op, "execution plans", p, dtype);
    check_fe(g.check_support(handle), op, "support check", p, dtype);
    check_fe(g.build_plans(handle), op, "plan build", p, dtype);
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {  // the frontend's own exceptions
    return detail::str_cat(op, ": cuDNN frontend failed for ", describe(p, dtype), ": ", e.what());
  }
  return "";
}

// The key of Note [cuDNN attention graphs]: everything a graph depends on.
std::vector<int64_t> graph_key(int64_t direction, int device, DType dtype, const AttentionParams& p,
                               std::initializer_list<const Tensor*> operands) {
  std::vector<int64_t> key{direction,
                           device,
                           static_cast<int64_t>(dtype),
                           p.B,
                           p.H,
                           p.Hkv,
                           p.Tq,
                           p.Tk,
                           p.d,
                           p.dv,
                           p.causal ? 1 : 0,
                           p.bottom_right ? 1 : 0,
                           p.window,
                           p.padded() ? 1 : 0,
                           std::bit_cast<int64_t>(p.scale)};
  if (p.bias.defined()) {
    key.insert(key.end(), p.bias_source.shape().begin(), p.bias_source.shape().end());
    const std::vector<int64_t> s = strides_of(p.bias_source);
    key.insert(key.end(), s.begin(), s.end());
  }
  for (const Tensor* t : operands)
    key.insert(key.end(), t->strides().begin(), t->strides().end());
  return key;
}

// The forward's graph, or cuDNN's refusal.
CudnnState::Entry forward_graph(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const AttentionParams& p, cudnnHandle_t handle) {
  auto g = new_graph(q.dtype());
  auto options = fe::graph::SDPA_attributes()
                     .set_name("accrue_sdpa")
                     .set_generate_stats(true)
                     .set_attn_scale(static_cast<float>(p.scale));
  set_masks(*g, options, p);
  auto [o, stats] =
      g->sdpa(input(*g, "Q", kQ, q), input(*g, "K", kK, k), input(*g, "V", kV, v), options);
  describe_output(o, kO, out);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dim(p))
      .set_stride(stats_stride(p));
  std::string why = build(*g, handle, kForward, p, q.dtype());
  if (!why.empty()) return {nullptr, why};
  return {g, ""};
}

CudnnState::Entry backward_graph(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv, const Tensor& dbias,
                                 const AttentionParams& p, bool deterministic,
                                 cudnnHandle_t handle) {
  auto g = new_graph(q.dtype());
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("Stats")
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_dim(stats_dim(p))
                             .set_stride(stats_stride(p)));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("accrue_sdpa_backward")
                     .set_attn_scale(static_cast<float>(p.scale))
                     .set_deterministic_algorithm(deterministic);
  set_masks(*g, options, p);
  if (dbias.defined()) {
    TensorAttr db = g->tensor(fe::graph::Tensor_attributes()
                                  .set_name("dBias")
                                  .set_uid(kDBias)
                                  .set_dim(dbias.shape())
                                  .set_stride(strides_of(dbias)));
    db->set_output(true);
    options.set_dbias(db);
  }
  auto [gq, gk, gv] =
      g->sdpa_backward(input(*g, "Q", kQ, q), input(*g, "K", kK, k), input(*g, "V", kV, v),
                       input(*g, "O", kO, out), input(*g, "dO", kDO, grad_out), stats, options);
  describe_output(gq, kDQ, dq);
  describe_output(gk, kDK, dk);
  describe_output(gv, kDV, dv);
  std::string why = build(*g, handle, kBackward, p, q.dtype());
  if (!why.empty()) return {nullptr, why};
  return {g, ""};
}

// The int32 lengths, the bias and dbias of a call, bound into its variant pack
// (the lengths' copies live until after the launch, stream-ordered).
struct MaskOperands {
  Tensor seq_len_q, seq_len_kv;
  void bind(VariantPack& pack, const AttentionParams& p, const Tensor& dbias) {
    if (p.padded()) {
      seq_len_q = p.seq_len_q.to(DType::i32);
      seq_len_kv = p.seq_len_kv.to(DType::i32);
      pack[kSeqQ] = seq_len_q.data_ptr();
      pack[kSeqKV] = seq_len_kv.data_ptr();
    }
    if (p.bias.defined()) pack[kBias] = p.bias_source.data_ptr();
    if (dbias.defined()) pack[kDBias] = dbias.data_ptr();
  }
};

// Runs a built graph on the current stream with a workspace from accrue's allocator.
void execute(const Graph& g, cudnnHandle_t handle, VariantPack& pack, Device device, const char* op,
             const AttentionParams& p, DType dtype) {
  int64_t bytes = 0;
  check_fe(g.get_workspace_size(bytes), op, "workspace query", p, dtype);
  Tensor workspace;
  void* ptr = nullptr;
  if (bytes > 0) {
    workspace = empty({(bytes + 7) / 8}, DType::i64, device);
    if (prewrite_library_outputs()) workspace.fill_(0.0);  // Note [Library outputs under initcheck]
    ptr = workspace.data_ptr();
  }
  check_fe(g.execute(handle, pack, ptr), op, "execute", p, dtype);
  // workspace is released here, after the launch, on the same stream.
}

}  // namespace

bool device_supported(int device) {
  return CudnnState::instance().device_supported(device);
}

void prepare_attention_stream(int device, StreamHandle stream) {
  CudnnState& state = CudnnState::instance();
  std::lock_guard<std::mutex> lock(state.mutex());
  const DeviceScope scope(device);
  state.handle(device, stream);
}

bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       const Tensor& out, const Tensor& lse, std::string* why) {
  const int dev = q.device().index;
  DeviceScope scope(dev);
  CudnnState& state = CudnnState::instance();
  std::lock_guard<std::mutex> lock(state.mutex());
  cudnnHandle_t handle = state.handle(dev, current_stream(dev));
  std::vector<int64_t> key = graph_key(0, dev, q.dtype(), p, {&q, &k, &v, &out});
  const CudnnState::Entry* entry = state.find(key);
  if (!entry) entry = &state.insert(std::move(key), forward_graph(q, k, v, out, p, handle));
  if (!entry->graph) {
    *why = entry->refusal;
    return false;
  }
  if (prewrite_library_outputs()) {  // Note [Library outputs under initcheck]
    out.fill_(0.0);
    lse.fill_(0.0);
  }
  VariantPack pack{{kQ, q.data_ptr()},
                   {kK, k.data_ptr()},
                   {kV, v.data_ptr()},
                   {kO, out.data_ptr()},
                   {kStats, lse.data_ptr()}};
  MaskOperands masks;
  masks.bind(pack, p, Tensor());
  execute(*entry->graph, handle, pack, q.device(), kForward, p, q.dtype());
  if (p.padded()) cuda::attention_zero_padding(out, p.seq_len_q, lse);
  return true;
}

bool attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionParams& p,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias,
                        std::string* why) {
  const int dev = q.device().index;
  DeviceScope scope(dev);
  CudnnState& state = CudnnState::instance();
  std::lock_guard<std::mutex> lock(state.mutex());
  cudnnHandle_t handle = state.handle(dev, current_stream(dev));
  std::vector<int64_t> key =
      graph_key(1, dev, q.dtype(), p, {&q, &k, &v, &out, &grad_out, &dq, &dk, &dv});
  key.push_back(dbias.defined() ? 1 : 0);
  const CudnnState::Entry* entry = state.find(key);
  if (!entry) {
    CudnnState::Entry built = backward_graph(grad_out, q, k, v, out, dq, dk, dv, dbias, p,
                                             /*deterministic=*/true, handle);
    // Not every cuDNN has a deterministic engine for every shape: Note [cuDNN attention graphs].
    if (!built.graph)
      built = backward_graph(grad_out, q, k, v, out, dq, dk, dv, dbias, p,
                             /*deterministic=*/false, handle);
    entry = &state.insert(std::move(key), std::move(built));
  }
  if (!entry->graph) {
    *why = entry->refusal;
    return false;
  }
  if (prewrite_library_outputs()) {  // Note [Library outputs under initcheck]
    dq.fill_(0.0);
    dk.fill_(0.0);
    dv.fill_(0.0);
    if (dbias.defined()) dbias.fill_(0.0);
  }
  VariantPack pack{{kQ, q.data_ptr()},   {kK, k.data_ptr()},         {kV, v.data_ptr()},
                   {kO, out.data_ptr()}, {kDO, grad_out.data_ptr()}, {kStats, lse.data_ptr()},
                   {kDQ, dq.data_ptr()}, {kDK, dk.data_ptr()},       {kDV, dv.data_ptr()}};
  MaskOperands masks;
  masks.bind(pack, p, dbias);
  execute(*entry->graph, handle, pack, q.device(), kBackward, p, q.dtype());
  if (p.padded()) {
    cuda::attention_zero_padding(dq, p.seq_len_q, Tensor());
    cuda::attention_zero_padding(dk, p.seq_len_kv, Tensor());
    cuda::attention_zero_padding(dv, p.seq_len_kv, Tensor());
  }
  return true;
}

}  // namespace accrue::kernels::cudnn
