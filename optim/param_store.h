// ParamStore: the optimizer's side of every trainable parameter, laid out over
// the gradient arena's slots.
//
//   optim::ParamStore store(model.named_parameters(), optim::ParamStoreOptions()
//                                                         .device(Device::cuda(0))
//                                                         .compute_dtype(DType::bf16)
//                                                         .moments(opt.moments_needed()));
//   optim::Window window(store, opt, optim::WindowOptions().micro_steps(8));
//
// Note [Parameter store]
// ~~~~~~~~~~~~~~~~~~~~~~
// Master weights, the optional bf16/f16 compute copy and the optimizer
// moments are flat arenas with the gradient arena's slots (Note [Grad arena]),
// so the close is one pass over aligned ranges. After construction each
// parameter's data IS its master slot, or, with a 16-bit compute dtype, its
// slot of the compute copy, which the GEMMs read and the optimizer writes
// (a weight with FP8 copies goes back to its master slot: Note [FP8 codes in
// the compute slots] in optim/fp8_weights.h). Under ZeRO-1 the moments, and
// with a compute copy the master too, shrink to this rank's owned ranges
// packed in order (Note [ZeRO-1] in dist/reducer.h).
// The store owns the GradArena (autograd's half: gradients, sink, written
// flags) and forwards its layout, so one object is what a trainer builds and
// hands to the Window and the Reducer.
//
// Note [One load path]
// ~~~~~~~~~~~~~~~~~~~~
// Every write of a parameter's value from outside the optimizer (a Hugging
// Face file, Module::load_state_dict, a trainer's checkpoint) goes through
// load(): the master slot first, then the compute slot refreshed from it with
// the same cast the construction made, so the copies never disagree and
// loading after the store exists trains exactly as loading before it. nn
// reaches it without knowing optim: the store is each parameter's
// ParameterOwner (autograd/variable.h), and accrue::load_parameter routes
// there. Optimizer moments are not touched. With a sharded master (ZeRO-1)
// each rank writes its owned part and the whole compute copy.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/core/tensor.h"
#include "accrue/optim/fp8_scaling.h"
#include "accrue/optim/fp8_weights.h"

namespace accrue::optim {

// Named setters, as optim::WindowOptions; every one has a default.
class ParamStoreOptions {
 public:
  // Where masters, moments and gradients live. Unset: the parameters' own
  // device (they must share one), so a store never moves a model silently.
  ParamStoreOptions& device(Device d) {
    device_ = d;
    return *this;
  }
  // The dtype of master weights, gradients and moments: f32 (the default), or
  // f64 for the CPU reference.
  ParamStoreOptions& master_dtype(DType d) {
    master_dtype_ = d;
    return *this;
  }
  // The dtype parameters compute in: the master dtype (the default), or
  // bf16/f16 for a compute copy.
  ParamStoreOptions& compute_dtype(DType d) {
    compute_dtype_ = d;
    return *this;
  }
  // How many moment arenas to allocate (0 to 3: SGD momentum, Adam m and v,
  // amsgrad's max; Optimizer::moments_needed()). Default 2.
  ParamStoreOptions& moments(int n) {
    moments_ = n;
    return *this;
  }
  // Slots are padded to a multiple of shard_ranks x 256 bytes, so that ZeRO-1
  // over this many ranks cuts every bucket into equal chunks (Note [ZeRO-1]).
  // 1 (the default) suffices for a world size that divides 256 bytes' worth
  // of elements (a power of two up to 64 for f32, 32 for f64); other world
  // sizes set it to W.
  ParamStoreOptions& shard_ranks(int n) {
    shard_ranks_ = n;
    return *this;
  }
  // Note [FP8 codes in the compute slots] (optim/fp8_weights.h): with a bf16
  // or f16 compute copy, keep_fp8_copies puts a weight's FP8 codes in its
  // compute slot and points the parameter at its master slot (default true);
  // false keeps them apart, 2 more bytes a weight element.
  ParamStoreOptions& fp8_codes_in_compute_slots(bool on) {
    fp8_codes_in_compute_slots_ = on;
    return *this;
  }
  // What errors call the store (Note [One owner]); empty: unnamed.
  ParamStoreOptions& name(std::string n) {
    name_ = std::move(n);
    return *this;
  }
  // The gradients in an allocation another process can map
  // (GradArenaOptions::shareable): a dist::Reducer with
  // copy_engine_all_reduce then sums straight from the peer's arena (Note
  // [Copy-engine all-reduce]). Default false.
  ParamStoreOptions& shareable_gradients(bool on) {
    shareable_gradients_ = on;
    return *this;
  }
  Device device() const { return device_.value_or(Device::cpu()); }
  bool has_device() const { return device_.has_value(); }
  DType master_dtype() const { return master_dtype_; }
  DType compute_dtype() const { return compute_dtype_.value_or(master_dtype_); }
  int moments() const { return moments_; }
  int shard_ranks() const { return shard_ranks_; }
  bool fp8_codes_in_compute_slots() const { return fp8_codes_in_compute_slots_; }
  const std::string& name() const { return name_; }
  bool shareable_gradients() const { return shareable_gradients_; }

 private:
  std::optional<Device> device_;
  DType master_dtype_ = DType::f32;
  std::optional<DType> compute_dtype_;
  int moments_ = 2;
  int shard_ranks_ = 1;
  bool fp8_codes_in_compute_slots_ = true;
  std::string name_;
  bool shareable_gradients_ = false;
};

// Bytes a store holds on its device, by role (the report of Note [ZeRO-1]).
struct StoreMemory {
  int64_t master = 0, grads = 0, compute = 0, moments = 0;
  int64_t fp8 = 0;  // Note [Window FP8 weights]: the FP8 copies, and delayed scaling's rows
  bool master_sharded = false, moments_sharded = false;
  bool fp8_in_compute = false;  // Note [FP8 codes in the compute slots]
  int64_t total() const { return master + grads + compute + moments + fp8; }
  // "master 237.5 MiB (sharded), grads 475.0 MiB, compute 237.5 MiB, moments 475.0 MiB
  // (sharded), total 1.39 GiB"
  std::string describe() const;
};

class ParamStore final : public ParameterOwner {
 public:
  using Slot = GradArena::Slot;

  // Moves `params` (leaves that require grad, any float dtype and device;
  // nn::Module::named_parameters()) into the store: their values are copied
  // into the master arena, each tensor is re-pointed at its slot (and
  // converted to the compute dtype), and its gradients are routed to the
  // gradient arena. A parameter another store or arena holds is refused
  // (Note [One owner]).
  ParamStore(const std::vector<NamedParameter>& params, const ParamStoreOptions& options = {});
  // The same for tensors without names: they are called "param0", "param1", ...
  ParamStore(const std::vector<Tensor>& params, const ParamStoreOptions& options = {});
  ~ParamStore() override;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const ParamStoreOptions& options() const { return options_; }
  // Autograd's half: gradients, the sink, the written flags.
  GradArena& grad_arena() { return grads_; }
  const GradArena& grad_arena() const { return grads_; }

  // The layout, shared with the gradient arena.
  const std::vector<Slot>& slots() const { return grads_.slots(); }
  size_t size() const { return grads_.size(); }
  int64_t numel() const { return grads_.numel(); }
  int64_t padded_numel() const { return grads_.padded_numel(); }
  int index_of(const Tensor& param) const { return grads_.index_of(param); }
  // The parameters as registered (re-pointed into the store).
  const std::vector<Tensor>& params() const { return grads_.params(); }

  // The flat arenas: master and gradients [padded_numel] (the master packed
  // when sharded), the moments [moment_numel()], the compute copy
  // [padded_numel] or undefined when the compute dtype is the master dtype
  // (its slots of FP8-cast weights may hold their codes: Note [FP8 codes in
  // the compute slots]).
  // Note [Close under the forward]: master(), compute() and moment() join
  // the last close's pending layer steps first (they are the steps' output).
  const Tensor& master() const {
    join("ParamStore::master");
    return master_;
  }
  const Tensor& grads() const { return grads_.grads(); }
  const Tensor& compute() const {
    join("ParamStore::compute");
    return compute_;
  }
  const Tensor& moment(int i) const;
  int64_t moment_numel() const { return moment_numel_; }
  // The flat tensor the forward reads: the compute copy, else the master.
  const Tensor& forward_weights() const { return compute_.defined() ? compute_ : master_; }

  // Views of one slot, shaped and laid out like the parameter.
  Tensor master_view(size_t i) const;
  Tensor grad_view(size_t i) const { return grads_.grad_view(i); }

  // Note [One load path]: writes the master slot of the parameter named
  // `name`, then its compute slot. Throws for a name the store does not hold
  // or a shape that differs.
  void load(const std::string& name, const Tensor& value);
  // ParameterOwner: the same, by the parameter's handle; value() is its master slot
  // (the parameter itself when the master is sharded).
  void load(const Tensor& param, const Tensor& value) override;
  Tensor value(const Tensor& param) const override;
  // A whole master arena at once (a window checkpoint): `master` is laid out
  // like master() (packed over `owned` when the store is sharded, or packed
  // by the caller over `owned` when `owned` is not empty), then the compute
  // copy follows from it.
  void load_master(const Tensor& master, const std::vector<ArenaRange>& owned = {});
  // The compute copy cast again from the whole master, after something wrote
  // the master in place (rank 0's weights broadcast into it).
  void refresh_compute();

  // Note [ZeRO-1] (dist/reducer.h): this rank keeps optimizer moments only for
  // its shard, `numel` elements (its owned ranges packed in order). Replaces
  // every moment arena with a zeroed one of that size; before the first step.
  void shard_moments(int64_t numel);
  bool moments_sharded() const { return moment_numel_ != padded_numel(); }
  // Note [ZeRO-1]: with a compute copy (which the forward reads, so the
  // master is only the optimizer's), this rank keeps master weights only for
  // its owned ranges, packed in order as the moments are. Needs the compute
  // copy; afterwards master() is that packed shard and master_view() throws.
  void shard_master(const std::vector<ArenaRange>& owned);
  bool master_sharded() const { return master_sharded_; }
  StoreMemory memory() const;

  // Note [Window FP8 weights] (optim/fp8_weights.h): keeps an FP8 copy of
  // each of `weights` (parameters of this store, 2-D, sizes multiples of
  // 16), per tensor or in 128 x 128 blocks (`recipe`, that of the layers
  // reading them), cast now, recast whenever a loader writes them and at
  // every close of a Window built afterwards; fp8_linear reads it. Call
  // before building the Window (its close must hold the recast stage).
  // With a 16-bit compute copy the codes go in the weights' compute slots
  // and the parameters point at their master slots (Note [FP8 codes in the
  // compute slots]; ParamStoreOptions::fp8_codes_in_compute_slots).
  void keep_fp8_copies(const std::vector<Tensor>& weights, DType dtype = DType::f8e4m3,
                       int margin = 0, Fp8Recipe recipe = Fp8Recipe::tensor);
  bool has_fp8_copies() const { return fp8_ && !fp8_->empty(); }
  // Recasts every FP8 copy from the forward's weights (the close's stage).
  void refresh_fp8_copies();
  // Recasts slot i's copy, if it has one (Note [Close under the forward]).
  void refresh_fp8_slot(size_t i) {
    if (fp8_) fp8_->refresh_slot(i);
  }
  const Fp8Weight* fp8_copy(const Tensor& param) const override;

  // Note [FP8 delayed scaling] (optim/fp8_scaling.h): keeps the delayed-scaling
  // rows of the FP8 layers whose weights are `weights` (parameters of this
  // store), which fp8_linear then casts x and dy with. Once, and before
  // building the Window (its close must hold the update).
  void keep_fp8_delayed_scaling(const std::vector<Tensor>& weights,
                                const Fp8DelayedOptions& options = {});
  bool has_fp8_delayed_scaling() const { return fp8_scaling_ != nullptr; }
  // The rows' owner (the Window's close updates it, its checkpoint saves it), or nullptr.
  Fp8DelayedScaling* fp8_delayed_scaling() const { return fp8_scaling_.get(); }
  const Fp8DelayedRows* fp8_scaling(const Tensor& param) const override;

  // Note [Close under the forward] (optim/layer_steps.h): called, with the
  // method's name, before master, compute, moment, value, master_view, load,
  // load_master and refresh_compute read or write the arenas; LayerSteps
  // joins its pending steps there. Null: none.
  // A second hook while one is set is refused (two such Windows on one store).
  void set_join_hook(std::function<void(const char*)> hook);

  // Forwarded to the gradient arena (Note [Overwrite first]).
  void begin_window() { grads_.begin_window(); }
  bool written(size_t i) const { return grads_.written(i); }
  const std::vector<bool>& written_flags() const { return grads_.written_flags(); }
  void set_written_flags(const std::vector<bool>& flags) { grads_.set_written_flags(flags); }
  int zero_unwritten() { return grads_.zero_unwritten(); }

 private:
  size_t slot_of(const Tensor& param, const char* op) const;
  // The construction's second half: the master filled, the parameters re-pointed.
  void adopt(const std::vector<Tensor>& params);
  // Points parameter i at its slot of `arena` (the master or the compute copy).
  void point_at(size_t i, const Tensor& arena);
  // Whether keep_fp8_copies puts slot i's codes in its compute slot.
  bool codes_fit_compute_slot(size_t i) const;
  // Note [FP8 codes in the compute slots]: before the master is sharded.
  void move_fp8_codes_out_of_compute();
  void load_slot(size_t i, const Tensor& value, const char* op);

  ParamStoreOptions options_;
  GradArena grads_;
  int64_t moment_numel_ = 0;
  bool master_sharded_ = false;
  std::vector<ArenaRange> owned_;  // the packed master's ranges, when sharded
  Tensor master_, compute_;
  std::vector<Tensor> moments_;
  std::unique_ptr<Fp8WeightCopies> fp8_;            // Note [Window FP8 weights]; null until asked
  std::unique_ptr<Fp8DelayedScaling> fp8_scaling_;  // Note [FP8 delayed scaling]; null until asked
  std::function<void(const char*)> join_;           // set_join_hook
  void join(const char* where) const {
    if (join_) join_(where);
  }
};

}  // namespace accrue::optim
