// accrue._accrue.optim: the parameter store, the optimizers and their
// schedules, the accumulation Window and the accumulation verifier.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <memory>

#include "accrue/optim/gradient_sync.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/verify.h"
#include "accrue/optim/window.h"
#include "bindings.h"

namespace accrue::python {

namespace {

using namespace optim;

std::vector<NamedParameter> named_from(const std::vector<std::pair<std::string, Tensor>>& pairs) {
  std::vector<NamedParameter> out;
  out.reserve(pairs.size());
  for (const auto& [name, t] : pairs)
    out.push_back({name, t});
  return out;
}

// A schedule written in Python: a subclass of LRSchedule overriding factor().
struct PyLRSchedule : LRSchedule {
  NB_TRAMPOLINE(LRSchedule, 1);
  double factor(int64_t step) const override { NB_OVERRIDE_PURE(factor, step); }
};

// A VerifyRun whose three methods are a Python object's.
class PyVerifyRun final : public VerifyRun {
 public:
  explicit PyVerifyRun(nb::object run) : run_(std::move(run)) {}
  void micro_step(int64_t window, int64_t begin, int64_t end) override {
    run_.attr("micro_step")(window, begin, end);
  }
  void close() override { run_.attr("close")(); }
  std::vector<double> parameters() const override {
    nb::object p = run_.attr("parameters")();
    if (nb::hasattr(p, "tolist")) p = p.attr("tolist")();
    return nb::cast<std::vector<double>>(p);
  }

 private:
  nb::object run_;
};

template <class O>
void adam_options(nb::module_& m, const char* name, const char* doc, double default_wd) {
  nb::class_<O>(m, name, doc)
      .def(
          "__init__",
          [](O* self, double lr, std::pair<double, double> betas, double eps,
             std::optional<double> weight_decay, bool amsgrad) {
            new (self) O(lr);
            self->betas(betas.first, betas.second).eps(eps).amsgrad(amsgrad);
            if (weight_decay) self->weight_decay(*weight_decay);
          },
          nb::arg("lr"), nb::arg("betas") = std::make_pair(0.9, 0.999), nb::arg("eps") = 1e-8,
          nb::arg("weight_decay") = nb::none(), nb::arg("amsgrad") = false,
          default_wd == 0.0 ? "Adam: weight decay 0 by default (L2, added to the gradient)."
                            : "AdamW: weight decay 0.01 by default (decoupled).")
      .def(
          "betas", [](O& o, double b1, double b2) -> O& { return o.betas(b1, b2); },
          nb::arg("beta1"), nb::arg("beta2"), nb::rv_policy::reference_internal,
          "Sets the betas; returns self.")
      .def(
          "eps", [](O& o, double v) -> O& { return o.eps(v); }, nb::arg("eps"),
          nb::rv_policy::reference_internal, "Sets eps; returns self.")
      .def(
          "weight_decay", [](O& o, double v) -> O& { return o.weight_decay(v); },
          nb::arg("weight_decay"), nb::rv_policy::reference_internal,
          "Sets the weight decay; returns self.")
      .def(
          "amsgrad", [](O& o, bool v) -> O& { return o.amsgrad(v); }, nb::arg("amsgrad"),
          nb::rv_policy::reference_internal, "Sets amsgrad; returns self.")
      .def_prop_ro(
          "lr", [](const O& o) { return o.lr(); }, "The learning rate.")
      .def(
          "__repr__",
          [name](const O& o) {
            return std::string(name) + "(lr=" + std::to_string(o.lr()) + ", betas=(" +
                   std::to_string(o.beta1()) + ", " + std::to_string(o.beta2()) +
                   "), eps=" + std::to_string(o.eps()) +
                   ", weight_decay=" + std::to_string(o.weight_decay()) +
                   ", amsgrad=" + (o.amsgrad() ? "True" : "False") + ")";
          },
          "The options.");
}

}  // namespace

void bind_optim(nb::module_& m) {
  // ---- ParamStore
  nb::class_<ParamStoreOptions>(m, "ParamStoreOptions",
                                "Where and in what dtypes a ParamStore keeps parameters.")
      .def(
          "__init__",
          [](ParamStoreOptions* self, std::optional<DeviceArg> device, DType master_dtype,
             std::optional<DType> compute_dtype, int moments, int shard_ranks,
             const std::string& name, bool fp8_codes_in_compute_slots) {
            new (self) ParamStoreOptions();
            self->master_dtype(master_dtype)
                .moments(moments)
                .shard_ranks(shard_ranks)
                .name(name)
                .fp8_codes_in_compute_slots(fp8_codes_in_compute_slots);
            if (device) self->device(*device);
            if (compute_dtype) self->compute_dtype(*compute_dtype);
          },
          nb::kw_only(), nb::arg("device") = nb::none(), nb::arg("master_dtype") = DType::f32,
          nb::arg("compute_dtype") = nb::none(), nb::arg("moments") = 2, nb::arg("shard_ranks") = 1,
          nb::arg("name") = "", nb::arg("fp8_codes_in_compute_slots") = true,
          "device: where the store lives (default: the parameters' device); "
          "master_dtype: master weights, gradients and moments (f32, or f64); compute_dtype: "
          "what the model computes in (the master dtype, or bf16/f16 for a compute copy); "
          "moments: Optimizer.moments_needed(); fp8_codes_in_compute_slots: with a 16-bit "
          "compute copy, keep_fp8_copies keeps the FP8 codes in the weights' compute slots and "
          "points those weights at their master slots (Note [FP8 codes in the compute slots]).")
      .def(
          "device",
          [](ParamStoreOptions& o, DeviceArg d) -> ParamStoreOptions& { return o.device(d); },
          nb::arg("device"), nb::rv_policy::reference_internal, "Sets the device; returns self.")
      .def(
          "master_dtype",
          [](ParamStoreOptions& o, DType d) -> ParamStoreOptions& { return o.master_dtype(d); },
          nb::arg("dtype"), nb::rv_policy::reference_internal,
          "Sets the master dtype; returns self.")
      .def(
          "compute_dtype",
          [](ParamStoreOptions& o, DType d) -> ParamStoreOptions& { return o.compute_dtype(d); },
          nb::arg("dtype"), nb::rv_policy::reference_internal,
          "Sets the compute dtype; returns self.")
      .def(
          "moments", [](ParamStoreOptions& o, int n) -> ParamStoreOptions& { return o.moments(n); },
          nb::arg("n"), nb::rv_policy::reference_internal, "Sets the moment arenas; returns self.")
      .def(
          "shard_ranks",
          [](ParamStoreOptions& o, int n) -> ParamStoreOptions& { return o.shard_ranks(n); },
          nb::arg("n"), nb::rv_policy::reference_internal,
          "Pads slots for ZeRO-1 over n ranks; returns self.")
      .def(
          "name",
          [](ParamStoreOptions& o, std::string n) -> ParamStoreOptions& {
            return o.name(std::move(n));
          },
          nb::arg("name"), nb::rv_policy::reference_internal,
          "Names the store in errors; returns self.");

  nb::class_<ParamStore>(m, "ParamStore",
                         "The optimizer's side of every parameter (Note [Parameter store]): master "
                         "weights, gradients, the compute copy and the moments as flat arenas. "
                         "Each parameter is re-pointed at its slot and its gradients go to the "
                         "gradient arena.")
      .def(
          "__init__",
          [](ParamStore* self, const std::vector<std::pair<std::string, Tensor>>& params,
             const ParamStoreOptions& options) {
            new (self) ParamStore(named_from(params), options);
          },
          nb::arg("named_parameters"), nb::arg("options") = ParamStoreOptions(),
          "From (name, tensor) pairs: module.named_parameters().")
      .def(
          "__init__",
          [](ParamStore* self, const std::vector<Tensor>& params,
             const ParamStoreOptions& options) { new (self) ParamStore(params, options); },
          nb::arg("parameters"), nb::arg("options") = ParamStoreOptions(),
          "From tensors, named param0, param1, ...")
      .def("__len__", &ParamStore::size, "The number of parameters.")
      .def_prop_ro("numel", &ParamStore::numel, "Parameter elements.")
      .def_prop_ro("padded_numel", &ParamStore::padded_numel, "Arena elements, slots padded.")
      .def_prop_ro("params", &ParamStore::params, "The parameters, re-pointed into the store.")
      .def_prop_ro("master", &ParamStore::master, "The flat master arena.")
      .def_prop_ro("grads", &ParamStore::grads, "The flat gradient arena.")
      .def_prop_ro(
          "compute",
          [](const ParamStore& s) -> nb::object {
            return s.compute().defined() ? nb::cast(s.compute()) : nb::none();
          },
          "The flat compute copy, or None when the compute dtype is the master dtype. The slots "
          "of weights with FP8 copies hold their codes (Note [FP8 codes in the compute slots]).")
      .def("moment", &ParamStore::moment, nb::arg("i"), "Moment arena i (Adam: 0 is m, 1 is v).")
      .def("index_of", &ParamStore::index_of, nb::arg("param"), "The slot of a parameter.")
      .def("master_view", &ParamStore::master_view, nb::arg("i"),
           "Slot i of the master, shaped like the parameter.")
      .def("grad_view", &ParamStore::grad_view, nb::arg("i"),
           "Slot i of the gradients, shaped like the parameter.")
      .def("load", nb::overload_cast<const std::string&, const Tensor&>(&ParamStore::load),
           nb::arg("name"), nb::arg("value"),
           "Writes the master slot of the named parameter, then its compute slot: "
           "Note [One load path].")
      .def(
          "keep_fp8_copies",
          [](ParamStore& store, const std::vector<Tensor>& weights, DType dtype, int margin,
             const std::string& recipe) {
            ACCRUE_CHECK(recipe == "tensor" || recipe == "block",
                         "ParamStore.keep_fp8_copies: recipe must be 'tensor' or 'block', got '",
                         recipe, "'");
            store.keep_fp8_copies(weights, dtype, margin,
                                  recipe == "block" ? Fp8Recipe::block : Fp8Recipe::tensor);
          },
          nb::arg("weights"), nb::arg("dtype") = DType::f8e4m3, nb::arg("margin") = 0,
          nb::arg("recipe") = "tensor",
          "Keeps an FP8 copy of each weight (2-D, sizes multiples of 16), per tensor or in "
          "128 x 128 blocks (recipe 'block', for fp8_linear's block recipe), cast now, by every "
          "loader and at each close of a Window built afterwards; fp8_linear reads it (Note "
          "[Window FP8 weights]).")
      .def_prop_ro("has_fp8_copies", &ParamStore::has_fp8_copies,
                   "Whether the store keeps FP8 weight copies.")
      .def(
          "keep_fp8_delayed_scaling",
          [](ParamStore& store, const std::vector<Tensor>& weights, int history, int margin,
             DType grad_dtype) {
            store.keep_fp8_delayed_scaling(
                weights, optim::Fp8DelayedOptions().history(history).margin(margin).dtypes(
                             DType::f8e4m3, grad_dtype));
          },
          nb::arg("weights"), nb::arg("history") = 16, nb::arg("margin") = 0,
          nb::arg("grad_dtype") = DType::f8e5m2,
          "Delayed scaling for the FP8 layers of these weights (per tensor): each casts its "
          "input and output gradient with a scale made from the max amax of the last `history` "
          "windows, taking this amax in the same read; the first window scales as current "
          "scaling. grad_dtype is the layers' (use_fp8's). Once, before building the Window "
          "(Note [FP8 delayed scaling]).")
      .def_prop_ro("has_fp8_delayed_scaling", &ParamStore::has_fp8_delayed_scaling,
                   "Whether the store keeps FP8 delayed scaling.")
      .def(
          "memory", [](const ParamStore& s) { return s.memory().describe(); },
          "Bytes held by role, as a line.");

  // ---- optimizers
  nb::class_<SGDOptions>(
      m, "SGDOptions", "SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD).")
      .def(
          "__init__",
          [](SGDOptions* self, double lr, double momentum, double dampening, bool nesterov,
             double weight_decay) {
            new (self) SGDOptions(lr);
            self->momentum(momentum).dampening(dampening).nesterov(nesterov).weight_decay(
                weight_decay);
          },
          nb::arg("lr"), nb::arg("momentum") = 0.0, nb::arg("dampening") = 0.0,
          nb::arg("nesterov") = false, nb::arg("weight_decay") = 0.0, "torch.optim.SGD's options.")
      .def(
          "momentum", [](SGDOptions& o, double v) -> SGDOptions& { return o.momentum(v); },
          nb::arg("momentum"), nb::rv_policy::reference_internal, "Sets momentum; returns self.")
      .def(
          "weight_decay", [](SGDOptions& o, double v) -> SGDOptions& { return o.weight_decay(v); },
          nb::arg("weight_decay"), nb::rv_policy::reference_internal,
          "Sets weight decay; returns self.")
      .def_prop_ro(
          "lr", [](const SGDOptions& o) { return o.lr(); }, "The learning rate.");
  adam_options<AdamOptions>(m, "AdamOptions", "Adam's options (torch.optim.Adam).", 0.0);
  adam_options<AdamWOptions>(m, "AdamWOptions", "AdamW's options (torch.optim.AdamW).", 0.01);

  nb::class_<LRSchedule, PyLRSchedule>(m, "LRSchedule",
                                       "The learning-rate factor of each optimizer step; subclass "
                                       "it in Python and override factor(step).")
      .def(nb::init<>(), "For subclasses.")
      .def("factor", &LRSchedule::factor, nb::arg("step"),
           "The factor for optimizer step `step` (0-based).");
  nb::class_<ConstantLR, LRSchedule>(m, "ConstantLR", "Factor 1.").def(nb::init<>(), "Factor 1.");
  nb::class_<LinearWarmup, LRSchedule>(m, "LinearWarmup",
                                       "1/warmup up to 1 over `warmup` steps, then 1.")
      .def(nb::init<int64_t>(), nb::arg("warmup"), "Linear warmup over `warmup` steps.");
  nb::class_<WarmupCosine, LRSchedule>(
      m, "WarmupCosine", "Linear warmup, then cosine decay to min_factor at `total` steps.")
      .def(nb::init<int64_t, int64_t, double>(), nb::arg("warmup"), nb::arg("total"),
           nb::arg("min_factor") = 0.0, "Warmup, then cosine to min_factor.");
  m.def("linear_scaling_rule", &linear_scaling_rule, nb::arg("base_lr"), nb::arg("base_batch"),
        nb::arg("batch"), "The linear-scaling rule: lr grows with the global batch.");

  nb::enum_<OptimizerKind>(m, "OptimizerKind", "SGD, Adam or AdamW.")
      .value("SGD", OptimizerKind::SGD, "SGD.")
      .value("Adam", OptimizerKind::Adam, "Adam.")
      .value("AdamW", OptimizerKind::AdamW, "AdamW.");
  nb::class_<Optimizer>(m, "Optimizer",
                        "An optimizer as the configuration of the window's fused close: options, "
                        "parameter groups, a schedule. The Window steps it.")
      .def(nb::init<const SGDOptions&>(), nb::arg("options"), "SGD.")
      .def(nb::init<const AdamOptions&>(), nb::arg("options"), "Adam.")
      .def(nb::init<const AdamWOptions&>(), nb::arg("options"), "AdamW.")
      .def(
          "add_param_group",
          [](Optimizer& o, const std::vector<Tensor>& params, std::optional<double> lr,
             std::optional<double> weight_decay) -> Optimizer& {
            GroupOptions g;
            if (lr) g.lr(*lr);
            if (weight_decay) g.weight_decay(*weight_decay);
            return o.add_param_group(params, g);
          },
          nb::arg("params"), nb::kw_only(), nb::arg("lr") = nb::none(),
          nb::arg("weight_decay") = nb::none(), nb::rv_policy::reference,
          "A group whose lr / weight decay override the optimizer's (before the Window is "
          "built); returns self.")
      .def("slot_groups", &Optimizer::slot_groups, nb::arg("store"),
           "The parameter group of each of the store's slots: 0 the default, k the k-th "
           "add_param_group.")
      .def(
          "set_schedule",
          [](Optimizer& o, std::shared_ptr<LRSchedule> s) -> Optimizer& {
            return o.set_schedule(std::move(s));
          },
          nb::arg("schedule"), nb::rv_policy::reference,
          "The LR schedule, evaluated at each window's close; returns self.")
      .def_prop_ro("kind", &Optimizer::kind, "SGD, Adam or AdamW.")
      .def("moments_needed", &Optimizer::moments_needed,
           "Moment arenas the store must hold (ParamStoreOptions.moments).");

  // ---- Window
  nb::class_<LossScalerOptions>(m, "LossScalerOptions",
                                "Loss scaling: none, fixed or dynamic (torch.amp.GradScaler).")
      .def_static("none", &LossScalerOptions::none, "No scaling.")
      .def_static("fixed", &LossScalerOptions::fixed, nb::arg("scale"), "A fixed scale.")
      .def_static("dynamic", &LossScalerOptions::dynamic,
                  "Starts at 65536, x2 after 2000 clean windows, x0.5 on overflow.")
      .def(
          "init_scale",
          [](LossScalerOptions& o, double v) -> LossScalerOptions& { return o.init_scale(v); },
          nb::arg("scale"), nb::rv_policy::reference_internal,
          "Sets the first scale; returns self.")
      .def(
          "growth_factor",
          [](LossScalerOptions& o, double v) -> LossScalerOptions& { return o.growth_factor(v); },
          nb::arg("factor"), nb::rv_policy::reference_internal, "Returns self.")
      .def(
          "backoff_factor",
          [](LossScalerOptions& o, double v) -> LossScalerOptions& { return o.backoff_factor(v); },
          nb::arg("factor"), nb::rv_policy::reference_internal, "Returns self.")
      .def(
          "growth_interval",
          [](LossScalerOptions& o, int64_t v) -> LossScalerOptions& {
            return o.growth_interval(v);
          },
          nb::arg("windows"), nb::rv_policy::reference_internal, "Returns self.")
      .def(
          "min_scale",
          [](LossScalerOptions& o, double v) -> LossScalerOptions& { return o.min_scale(v); },
          nb::arg("scale"), nb::rv_policy::reference_internal, "Returns self.")
      .def(
          "max_scale",
          [](LossScalerOptions& o, double v) -> LossScalerOptions& { return o.max_scale(v); },
          nb::arg("scale"), nb::rv_policy::reference_internal, "Returns self.")
      .def(
          "calibrate",
          [](LossScalerOptions& o, bool on, double margin) -> LossScalerOptions& {
            return o.calibrate(on, margin);
          },
          nb::arg("on") = true, nb::arg("margin") = 8.0, nb::rv_policy::reference_internal,
          "Picks the first scale from the first window's gradients; returns self.");

  nb::enum_<kernels::Normalization>(m, "Normalization",
                                    "How a window's gradient is normalized (Note [Normalization]).")
      .value("ItemCount", kernels::Normalization::ItemCount,
             "Divide the window's sum by its item count N (exact).")
      .value("MeanOfMicroBatchMeans", kernels::Normalization::MeanOfMicroBatchMeans,
             "Legacy: each micro-batch's mean, divided by K (inexact with padding).");
  nb::enum_<UnusedParameters>(m, "UnusedParameters",
                              "Parameters no gradient reached (Note [Unused parameters]).")
      .value("step_with_zero", UnusedParameters::step_with_zero,
             "Step with a zero gradient (the default).")
      .value("skip", UnusedParameters::skip, "Leave them unchanged (torch's set_to_none=True).");
  nb::enum_<UnusedParameterCheck>(m, "UnusedParameterCheck",
                                  "What the Window says about unused parameters.")
      .value("warn", UnusedParameterCheck::warn, "One line, the first time.")
      .value("error", UnusedParameterCheck::error, "accrue.Error naming them.")
      .value("ignore", UnusedParameterCheck::ignore, "Nothing.");

  nb::class_<WindowOptions>(m, "WindowOptions", "The accumulation window's options.")
      .def(
          "__init__",
          [](WindowOptions* self, int64_t micro_steps, double max_grad_norm,
             std::optional<LossScalerOptions> scaler, kernels::Normalization normalization,
             UnusedParameters unused, UnusedParameterCheck check, bool norm_under_backward,
             bool close_under_forward, int64_t close_layer_elements, int64_t close_max_blocks,
             bool close_steps_on_first_read) {
            new (self) WindowOptions();
            self->micro_steps(micro_steps)
                .max_grad_norm(max_grad_norm)
                .normalization(normalization)
                .unused_parameters(unused)
                .unused_parameter_check(check)
                .norm_under_backward(norm_under_backward)
                .close_under_forward(close_under_forward, close_layer_elements, close_max_blocks)
                .close_steps_on_first_read(close_steps_on_first_read);
            if (scaler) self->scaler(*scaler);
          },
          nb::kw_only(), nb::arg("micro_steps") = 1, nb::arg("max_grad_norm") = 0.0,
          nb::arg("scaler") = nb::none(),
          nb::arg("normalization") = kernels::Normalization::ItemCount,
          nb::arg("unused_parameters") = UnusedParameters::step_with_zero,
          nb::arg("unused_parameter_check") = UnusedParameterCheck::warn,
          nb::arg("norm_under_backward") = false, nb::arg("close_under_forward") = false,
          nb::arg("close_layer_elements") = int64_t{1} << 20, nb::arg("close_max_blocks") = 0,
          nb::arg("close_steps_on_first_read") = false,
          "micro_steps: K; max_grad_norm: global-norm clipping (<= 0: off); scaler: "
          "LossScalerOptions (none by default); close_under_forward: the optimizer step layer "
          "by layer beside the next forward, which awaits each layer (accrue.await_parameters; "
          "Note [Close under the forward]).")
      .def(
          "micro_steps",
          [](WindowOptions& o, int64_t k) -> WindowOptions& { return o.micro_steps(k); },
          nb::arg("k"), nb::rv_policy::reference_internal, "Sets K; returns self.")
      .def(
          "max_grad_norm",
          [](WindowOptions& o, double v) -> WindowOptions& { return o.max_grad_norm(v); },
          nb::arg("max_norm"), nb::rv_policy::reference_internal, "Sets clipping; returns self.")
      .def(
          "scaler",
          [](WindowOptions& o, const LossScalerOptions& s) -> WindowOptions& {
            return o.scaler(s);
          },
          nb::arg("scaler"), nb::rv_policy::reference_internal, "Sets loss scaling; returns self.")
      .def(
          "unused_parameter_log",
          [](WindowOptions& o, std::function<void(const std::string&)> log) -> WindowOptions& {
            return o.unused_parameter_log(std::move(log));
          },
          nb::arg("log"), nb::rv_policy::reference_internal,
          "Where warn's line goes (a callable taking a str); returns self.");

  nb::class_<WindowReport>(m, "WindowReport", "What the host learns about the last closed window.")
      .def_ro("window", &WindowReport::window, "Windows closed so far.")
      .def_ro("loss", &WindowReport::loss,
              "The window's summed loss / N, over every rank under data parallelism.")
      .def_ro("local_loss", &WindowReport::local_loss,
              "This rank's summed loss / this rank's items (one process: equals loss).")
      .def_ro("items", &WindowReport::items, "N, the window's items.")
      .def_ro("grad_norm", &WindowReport::grad_norm, "Unscaled, normalized, before clipping.")
      .def_ro("clip_coef", &WindowReport::clip_coef, "The clipping coefficient applied.")
      .def_ro("loss_scale", &WindowReport::loss_scale, "The scale for the next window.")
      .def_ro("skipped", &WindowReport::skipped, "True when the window was skipped (non-finite).")
      .def_ro("skipped_windows", &WindowReport::skipped_windows, "Windows skipped so far.")
      .def_ro("optimizer_steps", &WindowReport::optimizer_steps, "Optimizer steps so far.")
      .def(
          "__repr__",
          [](const WindowReport& r) {
            return "WindowReport(window=" + std::to_string(r.window) +
                   ", loss=" + std::to_string(r.loss) + ", items=" + std::to_string(r.items) +
                   ", grad_norm=" + std::to_string(r.grad_norm) +
                   ", skipped=" + (r.skipped ? "True" : "False") + ")";
          },
          "The main figures.");

  nb::class_<GradientSync>(m, "GradientSync",
                           "How a Window talks to data parallelism (optim/gradient_sync.h); "
                           "accrue.dist.Reducer is one.");

  nb::class_<Window>(m, "Window",
                     "K micro-batches, one optimizer step (Note [Window close]): backward() per "
                     "micro-batch, close() when ready(); report() is the only host read.")
      .def(nb::init<ParamStore&, Optimizer&, const WindowOptions&, GradientSync*>(),
           nb::arg("store"), nb::arg("optimizer"), nb::arg("options") = WindowOptions(),
           nb::arg("sync").none() = nb::none(), nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(),
           nb::keep_alive<1, 5>(),
           "A window over the store's arenas, stepping `optimizer`; under data parallelism "
           "`sync` (an accrue.dist.Reducer) sums the gradients and N over the ranks at the close.")
      .def("backward", &Window::backward, nb::arg("loss"),
           "One micro-step: backward of loss.sum seeded with the loss scale, N += loss.count.")
      .def(
          "backward",
          [](Window& w, const Tensor& sum, const Tensor& count) {
            w.backward(Loss{sum, count});
          },
          nb::arg("sum"), nb::arg("count"), "backward(Loss(sum, count)).")
      .def("ready", &Window::ready, "True after K micro-steps.")
      .def("close", &Window::close, "Norm, clip, scale and the fused optimizer step, no host sync.")
      .def_prop_ro("micro_step", &Window::micro_step, "Micro-steps done in this window.")
      .def_prop_ro("micro_steps", &Window::micro_steps, "K.")
      .def_prop_ro("windows_closed", &Window::windows_closed, "Windows closed so far.")
      .def("restart", &Window::restart, "Drops the current window's micro-steps.")
      .def("check", &Window::check, "Raises the first deferred index error (one host sync).")
      .def("report", &Window::report, "check(), then the last closed window's figures.")
      .def("state_dict", &Window::state_dict, "Everything a bit-exact resume needs.")
      .def("load_state_dict", &Window::load_state_dict, nb::arg("state_dict"),
           "Resumes from state_dict().")
      .def("describe_close", &Window::describe_close, "The close's stages in order.");

  // ---- verifier
  nb::class_<VerifyReport>(m, "VerifyReport",
                           "K micro-batches against one batch, window by window.")
      .def_ro("parameter_error", &VerifyReport::parameter_error,
              "Per window, max |a - b| / max |b|.")
      .def_ro("tolerance", &VerifyReport::tolerance, "The tolerance.")
      .def_ro("micro_steps", &VerifyReport::micro_steps, "K.")
      .def_ro("passed", &VerifyReport::passed, "True when every window is within the tolerance.")
      .def("table", &VerifyReport::table, "One line per window, then PASS or FAIL.")
      .def(
          "__bool__", [](const VerifyReport& r) { return r.passed; }, "passed.");
  m.def(
      "verify_accumulation",
      [](nb::callable factory, int64_t windows, int64_t micro_steps, int64_t batch,
         std::optional<double> tolerance) {
        VerifyOptions o;
        o.windows = windows;
        o.micro_steps = micro_steps;
        o.batch = batch;
        if (tolerance) o.tolerance = *tolerance;
        return verify_accumulation(
            [&](int64_t k) -> std::unique_ptr<VerifyRun> {
              return std::make_unique<PyVerifyRun>(factory(k));
            },
            o);
      },
      nb::arg("factory"), nb::kw_only(), nb::arg("windows") = 5, nb::arg("micro_steps") = 4,
      nb::arg("batch") = 16, nb::arg("tolerance") = nb::none(),
      "Builds the setup twice with factory(k) (an object with micro_step(window, begin, end), "
      "close() and parameters() -> flat floats), K micro-steps and 1, feeds both the same "
      "batches and compares the parameters after every window (Note [Accumulation verifier]).");
  m.def("verify_tolerance", &VerifyOptions::tolerance_for, nb::arg("dtype"),
        "The verifier's tolerance for a dtype: 1e-10 f64, 1e-5 f32, 2e-2 bf16/f16.");
}

}  // namespace accrue::python
