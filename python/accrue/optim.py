"""The parameter store, the optimizers and schedules, the accumulation Window
and the accumulation verifier (accrue's optim/, see docs/ACCUMULATION.md).

    store = ParamStore(model.named_parameters(), ParamStoreOptions(moments=opt.moments_needed()))
    window = Window(store, opt, WindowOptions(micro_steps=4, max_grad_norm=1.0))
    for x, y in micro_batches:
        window.backward(accrue.cross_entropy(model(x), y))
        if window.ready():
            window.close()
"""

from ._accrue.optim import (  # noqa: F401  (re-exports)
    AdamOptions,
    AdamWOptions,
    ConstantLR,
    LinearWarmup,
    LossScalerOptions,
    LRSchedule,
    Normalization,
    Optimizer,
    OptimizerKind,
    ParamStore,
    ParamStoreOptions,
    SGDOptions,
    UnusedParameterCheck,
    UnusedParameters,
    VerifyReport,
    WarmupCosine,
    GradientSync,
    GroupReport,
    LayerMonitor,
    LayerReport,
    Window,
    WindowOptions,
    GraphedWindow,
    GraphedWindowCounts,
    WindowReport,
    linear_scaling_rule,
    verify_accumulation,
    verify_tolerance,
)


def SGD(lr: float, **kwargs: float) -> Optimizer:
    """Optimizer(SGDOptions(lr, ...)): torch.optim.SGD's options, without the parameters
    (the ParamStore holds those)."""
    return Optimizer(SGDOptions(lr, **kwargs))


def Adam(lr: float, **kwargs) -> Optimizer:  # type: ignore[no-untyped-def]
    """Optimizer(AdamOptions(lr, ...))."""
    return Optimizer(AdamOptions(lr, **kwargs))


def AdamW(lr: float, **kwargs) -> Optimizer:  # type: ignore[no-untyped-def]
    """Optimizer(AdamWOptions(lr, ...))."""
    return Optimizer(AdamWOptions(lr, **kwargs))
