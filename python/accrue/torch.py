"""accrue's accumulation window for any PyTorch model (docs/PYTHON.md, "accrue.torch").

    window = accrue.torch.AccumulationWindow(model, "adamw", lr=3e-4, micro_steps=4,
                                             max_grad_norm=1.0)
    for x, y in micro_batches:
        loss_sum = F.cross_entropy(model(x), y, reduction="sum", ignore_index=-100)
        window.backward(loss_sum, (y != -100).sum())
        if window.ready():
            window.close()            # norm, clip, AdamW on accrue's arenas; no host sync
            print(window.report())    # the one host read

Note [Torch bridge] below says how the model's parameters and gradients live in
accrue's arenas.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

import accrue
from accrue import optim

from ._accrue import bridge as _bridge

__all__ = ["AccumulationWindow"]

# Note [Torch bridge]
# ~~~~~~~~~~~~~~~~~~~
# The model's trainable parameters move into one accrue ParamStore: its
# master arena (f32, or f64 for f64 models) and gradient arena are flat
# buffers with a slot per parameter. Each torch parameter keeps its Python
# object but its ``.data`` becomes a torch view (DLPack, no copy) of its slot:
# the master slot for f32/f64 parameters, the compute slot of a bf16/f16 copy
# for 16-bit ones, which the fused close writes from the f32 master. So the
# close's update is what the model computes with next, without a copy back.
# (The other direction, the store over the torch parameters' own memory, is
# not possible: the fused close needs one flat arena with padded, aligned
# slots, so the store copies the values in once, at construction.)
#
# Gradients, f32/f64: each ``param.grad`` is preset to a torch view of its
# gradient slot. PyTorch's AccumulateGrad adds into a defined ``.grad`` in
# place (``grad += new``, outside create_graph), so every micro-step's backward
# accumulates into accrue's arena directly; the window zeroes the arena at its
# first micro-step (PyTorch's zero_grad(set_to_none=False)). Gradients,
# bf16/f16: the gradient PyTorch computes is 16-bit, so it cannot be a view of
# the f32 slot; a post-accumulate-grad hook adds it (cast to f32) into the
# slot and frees ``param.grad``, so the sum over micro-steps is in f32.
#
# The window records which parameters received a gradient and tells the
# store (bridge.set_written_flags): the close's Note [Overwrite first] zeroes
# only the slots nobody wrote, and Note [Unused parameters] sees which were
# unused, as with accrue's backward. f32/f64: AccumulateGrad's in-place add
# bumps the ``.grad``'s version counter, so the window compares the counters
# before and after each backward, on the calling thread. A hook would do the
# same at a price: on CUDA the backward runs on autograd's device thread, and
# every Python hook there takes the GIL. bf16/f16: the hook that adds the
# gradient records it. With a process group the hooks also feed the reducer
# (Note [Torch bridge data parallelism]).
#
# Normalization (Note [Normalization]): ``backward(loss_sum, count)`` hands
# accrue's Window a one-element leaf holding the loss sum's value and the
# count; the Window adds the count to N and the value to the window's loss
# sum on the device, and seeds that leaf's backward with the loss scale. The
# leaf's gradient is then the seed, which PyTorch's backward of ``loss_sum``
# uses (without a scaler, the seed is 1 and ``loss_sum.backward()`` runs as
# is). The close divides by the window's N once: the big batch's mean.
#
# CUDA: the same code runs for CUDA parameters (the store on the
# parameters' device, accrue's work on torch's current stream, Note [Torch
# bridge streams] in python/src/bridge.cpp); the GPU
# machine runs test_bridge.py's CUDA tests (the big batch in f32 and bf16,
# the dynamic scaler, resume) and test_dist.py's two ranks.

_MASTER = {
    torch.float64: (accrue.f64, None),
    torch.float32: (accrue.f32, None),
    torch.bfloat16: (accrue.f32, accrue.bf16),
    torch.float16: (accrue.f32, accrue.f16),
}


def _groups(param_groups: Any, params: List[torch.Tensor], names: List[str], leaves: List[Any],
            no_decay_1d: bool) -> List[Tuple[Dict[str, float], List[Any]]]:
    """torch.optim-style parameter groups as (lr / weight_decay overrides, store leaves)."""
    if param_groups is None:
        return []
    if no_decay_1d:
        raise ValueError("AccumulationWindow: give no_decay_1d or param_groups, not both")
    index = {id(p): i for i, p in enumerate(params)}
    seen: Dict[int, int] = {}
    out = []
    for g, group in enumerate(param_groups):
        if not isinstance(group, dict) or "params" not in group:
            raise ValueError(f"AccumulationWindow: param_groups[{g}] must be a dict with 'params'")
        extra = sorted(set(group) - {"params", "lr", "weight_decay"})
        if extra:
            raise ValueError(
                f"AccumulationWindow: param_groups[{g}] has {extra}; accrue's groups take "
                "'params', 'lr' and 'weight_decay' (the rest are the window's)"
            )
        chosen = []
        for p in group["params"]:
            i = index.get(id(p))
            if i is None:
                raise ValueError(
                    f"AccumulationWindow: param_groups[{g}] holds a tensor of shape "
                    f"{tuple(p.shape)} that is not a trainable parameter of the model"
                )
            if i in seen:
                raise ValueError(
                    f"AccumulationWindow: {names[i]!r} is in param_groups[{seen[i]}] and [{g}]"
                )
            seen[i] = g
            chosen.append(leaves[i])
        overrides = {k: float(group[k]) for k in ("lr", "weight_decay") if k in group}
        if chosen:
            out.append((overrides, chosen))
    return out


def _on_torch_stream(device: torch.device) -> Any:
    """Note [Torch bridge streams]: accrue's work on torch's current stream while open."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _bridge.StreamScope(index, torch.cuda.current_stream(device).cuda_stream)


class _Schedule(optim.LRSchedule):
    """A Python callable step -> factor as an accrue LRSchedule."""

    def __init__(self, fn: Callable[[int], float]) -> None:
        super().__init__()
        self._fn = fn

    def factor(self, step: int) -> float:
        return float(self._fn(step))


def _scaler_options(scaler: Any) -> Optional[optim.LossScalerOptions]:
    if scaler is None or scaler == "none":
        return None
    if scaler == "dynamic":
        return optim.LossScalerOptions.dynamic()
    if isinstance(scaler, (int, float)) and not isinstance(scaler, bool):
        return optim.LossScalerOptions.fixed(float(scaler))
    if isinstance(scaler, optim.LossScalerOptions):
        return scaler
    raise ValueError(
        f"AccumulationWindow: scaler must be None, 'dynamic', a number (a fixed scale) or "
        f"accrue.optim.LossScalerOptions, got {scaler!r}"
    )


# Note [Torch bridge data parallelism]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Under a torch.distributed process group, the window's Reducer runs on an
# NCCL communicator of accrue's own: rank 0 of the group makes the NCCL
# unique id and the group broadcasts it (broadcast_object_list), then every
# rank joins. PyTorch's autograd, not accrue's, fills the arena, so the
# reducer's own grad-ready hooks never fire; in the last micro-step the
# bridge's post-accumulate-grad hooks call Reducer.grad_ready instead (on the
# autograd thread, in a StreamScope of the stream the backward runs on, Note
# [Torch bridge streams]), and each bucket is all-reduced as soon as its
# gradients are final, under the rest of the backward, in plan order; the
# buckets left go at the close, with N summed over the ranks (Note
# [Normalization]) and the report's loss the world's mean. Rank 0's weights
# are broadcast into the store at construction, so ranks that initialized
# differently start equal, and the torch parameters (views of the store)
# follow.


def _world_of(process_group: Any, device: torch.device, zero1: bool) -> Tuple[int, int]:
    """(world size, rank) of the group, after the refusals; (1, 0) without one."""
    if process_group is None:
        if zero1:
            raise ValueError("AccumulationWindow: zero1 shards over a process group; give one")
        return 1, 0
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError(
            "AccumulationWindow: process_group given but torch.distributed is not initialized"
        )
    if device.type != "cuda":
        raise ValueError(
            f"AccumulationWindow: data parallelism runs on NCCL: the parameters are on {device}"
        )
    if not accrue._accrue.dist.nccl_available:
        raise ValueError("AccumulationWindow: this build of accrue has no NCCL")
    return dist.get_world_size(process_group), dist.get_rank(process_group)


def _connect(process_group: Any, world: int, rank: int, device: torch.device,
             store: optim.ParamStore, zero1: bool, bucket_cap_mb: Optional[float],
             grad_transport: str) -> Tuple[Any, Any]:
    """Note [Torch bridge data parallelism]: the communicator and the reducer."""
    import torch.distributed as dist

    uid = [accrue._accrue.dist.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=dist.get_global_rank(process_group, 0),
                               group=process_group)
    index = device.index if device.index is not None else torch.cuda.current_device()
    comm = accrue._accrue.dist.NcclCommunicator(uid[0], rank, world, index)
    reducer = accrue._accrue.dist.Reducer(store, comm, zero1=zero1, bucket_mb=bucket_cap_mb,
                                          transport=grad_transport)
    reducer.broadcast_parameters(0)
    return comm, reducer


class AccumulationWindow:
    """K micro-batches of a torch.nn.Module, one fused accrue close (Note [Torch bridge]).

    optimizer: "adamw" (default), "adam" or "sgd" (``momentum``, ``dampening`` and
    ``nesterov`` as torch.optim.SGD's).
    weight_decay applies to every parameter unless ``no_decay_1d`` is set,
    then parameters of fewer than 2 dimensions (biases, norms) get 0.
    param_groups: torch.optim's groups, a list of dicts with "params" (the
    model's parameters) and optionally "lr" and "weight_decay"; a parameter in
    no group takes the window's lr and weight_decay (not with no_decay_1d).
    max_grad_norm: global-norm clipping (None: off). scaler: None, "dynamic",
    a fixed scale, or accrue.optim.LossScalerOptions. lr_schedule: an
    accrue.optim.LRSchedule or a callable step -> factor of lr.

    process_group: a torch.distributed process group (e.g.
    ``torch.distributed.group.WORLD``) for data parallelism: each rank runs
    its own micro-batches, and the close sums the gradients and N over the
    ranks on an NCCL communicator of accrue's own, whose id travels through
    the group (Note [Torch bridge data parallelism]); rank 0's weights are
    broadcast at construction. zero1 shards the optimizer state over the
    ranks (Note [ZeRO-1]). bucket_cap_mb: the gradient buckets' size in MiB
    (DDP's bucket_cap_mb; default 25). grad_transport: "exact" (default), or
    "bf16" / "f16", half the bytes on the wire at a rounding cost, so the step
    is no longer the large batch's exactly (Note [Gradient transport]; DDP's
    compress hooks). Without a group, bucket_cap_mb and grad_transport do
    nothing. CUDA parameters only.

    Refused (ValueError): no trainable parameter, parameters on several
    devices, dtypes other than one of f64/f32/bf16/f16, a process group with
    parameters off CUDA or a build without NCCL, zero1 without a group, a
    bucket_cap_mb outside [0.001, 4096], another grad_transport. Refused later
    (RuntimeError): the model's trainable parameters, their ``.data`` or
    their ``.grad`` replaced after the window was built, close() before K
    micro-steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: str = "adamw",
        *,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: Optional[float] = None,
        no_decay_1d: bool = False,
        param_groups: Optional[List[Dict[str, Any]]] = None,
        amsgrad: bool = False,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        micro_steps: int = 1,
        max_grad_norm: Optional[float] = None,
        scaler: Any = None,
        lr_schedule: Union[None, optim.LRSchedule, Callable[[int], float]] = None,
        unused_parameters: optim.UnusedParameters = optim.UnusedParameters.step_with_zero,
        unused_parameter_check: optim.UnusedParameterCheck = optim.UnusedParameterCheck.warn,
        process_group: Any = None,
        zero1: bool = False,
        bucket_cap_mb: Optional[float] = None,
        grad_transport: str = "exact",
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"AccumulationWindow: expected a torch.nn.Module, got {type(model).__name__}"
            )
        if bucket_cap_mb is not None and not 0.001 <= bucket_cap_mb <= 4096:
            raise ValueError(
                f"AccumulationWindow: bucket_cap_mb must be in [0.001, 4096], got {bucket_cap_mb}"
            )
        if grad_transport not in ("exact", "bf16", "f16"):
            raise ValueError(
                "AccumulationWindow: grad_transport must be 'exact', 'bf16' or 'f16', "
                f"got {grad_transport!r}"
            )
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("AccumulationWindow: the model has no parameter that requires grad")
        devices = sorted({str(p.device) for _, p in named})
        if len(devices) > 1:
            first = named[0][1].device
            others = [f"{n} on {p.device}" for n, p in named if p.device != first]
            where = f"{named[0][0]} on {first}, " + ", ".join(others[:8])
            raise ValueError(
                f"AccumulationWindow: parameters on several devices ({', '.join(devices)}: "
                f"{where}); one window holds one device's parameters"
            )
        dtypes = sorted({str(p.dtype) for _, p in named})
        if len(dtypes) > 1:
            raise ValueError(
                f"AccumulationWindow: parameters of several dtypes ({', '.join(dtypes)}); "
                "one window holds one dtype (model.to(dtype) first)"
            )
        dtype = named[0][1].dtype
        if dtype not in _MASTER:
            raise ValueError(
                f"AccumulationWindow: parameter dtype {dtype} is not supported "
                "(float64, float32, bfloat16, float16)"
            )
        device = named[0][1].device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(
                f"AccumulationWindow: parameters on {device}; accrue holds cpu and cuda ones"
            )
        master, compute = _MASTER[dtype]
        self._model = model
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._sixteen = compute is not None
        self._device = device

        kind = optimizer.lower()
        if kind == "adamw":
            options = optim.AdamWOptions(
                lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad
            )
        elif kind == "adam":
            options = optim.AdamOptions(
                lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad
            )
        elif kind == "sgd":
            options = optim.SGDOptions(lr, momentum=momentum, dampening=dampening,
                                       nesterov=nesterov, weight_decay=weight_decay or 0.0)
        else:
            raise ValueError(
                f"AccumulationWindow: optimizer must be 'adamw', 'adam' or 'sgd', got {optimizer!r}"
            )
        self._optimizer = optim.Optimizer(options)

        # Note [Torch bridge streams]: accrue's work here on torch's stream.
        with _on_torch_stream(device):
            # The store copies the values in; the accrue leaves are re-pointed at
            # their slots, and the torch parameters are then re-pointed too.
            leaves = []
            for p in self._params:
                a = accrue.from_dlpack(p.detach())
                a.requires_grad_()
                leaves.append(a)
            world, rank = _world_of(process_group, device, zero1)
            store_options = optim.ParamStoreOptions(
                device=str(device),
                master_dtype=master,
                compute_dtype=compute,
                moments=self._optimizer.moments_needed(),
                shard_ranks=world if zero1 else 1,
                name="accrue.torch",
            )
            self._store = optim.ParamStore(list(zip(self._names, leaves)), store_options)
            if no_decay_1d:
                flat = [t for t, p in zip(self._store.params, self._params) if p.dim() < 2]
                if flat:
                    self._optimizer.add_param_group(flat, weight_decay=0.0)
            for group, leaves_of_group in _groups(param_groups, self._params, self._names,
                                                  self._store.params, no_decay_1d):
                self._optimizer.add_param_group(leaves_of_group, **group)
            if lr_schedule is not None:
                if not isinstance(lr_schedule, optim.LRSchedule):
                    lr_schedule = _Schedule(lr_schedule)
                self._schedule = lr_schedule  # kept alive: the optimizer holds it by shared_ptr
                self._optimizer.set_schedule(lr_schedule)
            scaler_options = _scaler_options(scaler)
            window_options = optim.WindowOptions(
                micro_steps=micro_steps,
                max_grad_norm=0.0 if max_grad_norm is None else float(max_grad_norm),
                scaler=scaler_options,
                unused_parameters=unused_parameters,
                unused_parameter_check=unused_parameter_check,
            )
            self._scaled = scaler_options is not None
            self._communicator = self._reducer = None
            if process_group is not None:
                self._communicator, self._reducer = _connect(
                    process_group, world, rank, device, self._store, zero1, bucket_cap_mb,
                    grad_transport
                )
            self._window = optim.Window(self._store, self._optimizer, window_options, self._reducer)

            self._last_micro_step = False  # the bridge's hooks feed the reducer
            self._counts: Dict[float, torch.Tensor] = {}  # _count_tensor's
            self._capturing = False  # inside capture(): Note [Window captured whole]
            self._graphs: Dict[int, Tuple[Any, List[bool]]] = {}  # capture(): id -> (graph, flags)
            self._data: List[torch.Tensor] = []
            self._data_ptrs: List[int] = []  # _check_model's
            self._grads: List[torch.Tensor] = []
            self._used = [False] * len(self._params)
            self._handles = []
            for i, (p, leaf) in enumerate(zip(self._params, self._store.params)):
                data = torch.from_dlpack(leaf.detach())
                grad = torch.from_dlpack(self._store.grad_view(i).detach())
                p.data = data
                self._data.append(data)
                self._data_ptrs.append(data.data_ptr())
                self._grads.append(grad)
                if not self._sixteen:
                    p.grad = grad
                if self._sixteen or self._reducer is not None:  # Note [Torch bridge]
                    self._handles.append(p.register_post_accumulate_grad_hook(self._hook(i)))
            self._grad_arena = torch.from_dlpack(self._store.grads.detach())

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        # A weak reference: the parameters hold their hooks, and must not keep
        # a dropped window (its Window and store) alive.
        ref = weakref.ref(self)

        def hook(p: torch.Tensor) -> None:
            self = ref()
            if self is None:
                return
            self._used[i] = True
            if self._sixteen:
                self._grads[i].add_(p.grad.to(self._grads[i].dtype))
                p.grad = None
            if self._last_micro_step:
                # Note [Torch bridge data parallelism]: the bucket goes now, after
                # this gradient's kernels on the stream the backward runs on.
                with _on_torch_stream(self._device):
                    self._reducer.grad_ready(i)

        return hook

    # ---- checks

    def _check_model(self, op: str, whole: bool = True) -> None:
        """The model's trainable parameters are still the window's, each in its slot, and each
        .grad its slot of the gradient arena (a .grad dropped by zero_grad is put back). A
        backward after the window's first micro-step (whole=False) skips the walk over the
        module tree and the dtype and shape checks: 0.03 ms of host time for GPT-2's 148
        parameters against 0.24 ms (one CPU core); the close does them all before it steps."""
        if whole:
            named = [(n, p) for n, p in self._model.named_parameters() if p.requires_grad]
            if [n for n, _ in named] != self._names or any(
                p is not q for (_, p), q in zip(named, self._params)
            ):
                raise RuntimeError(
                    f"AccumulationWindow.{op}: the model's trainable parameters changed after "
                    f"the window was built ({len(self._names)} then, {len(named)} now); build a "
                    "new window"
                )
        for name, p, data, at in zip(self._names, self._params, self._data, self._data_ptrs):
            if p.data_ptr() != at or (whole and (p.dtype != data.dtype or p.shape != data.shape)):
                raise RuntimeError(
                    f"AccumulationWindow.{op}: parameter {name!r} no longer lives in the "
                    "window's store (its .data was replaced, or the model was moved); "
                    "build a new window"
                )
        if self._sixteen:
            return
        for name, p, grad in zip(self._names, self._params, self._grads):
            g = p.grad
            if g is None:
                p.grad = grad  # zero_grad(set_to_none=True) dropped the view
            elif g is not grad and g.data_ptr() != grad.data_ptr():
                raise RuntimeError(
                    f"AccumulationWindow.{op}: parameter {name!r} has a .grad that is not its "
                    "slot of the window's gradient arena (it was replaced); set it to None"
                )

    # ---- the window

    def backward(self, loss_sum: torch.Tensor, count: Union[int, float, torch.Tensor]) -> None:
        """One micro-step: the backward of ``loss_sum`` (a sum over the micro-batch's items,
        seeded with the loss scale), and ``count`` items added to the window's N.

        If the backward raises, the window restarts: its micro-steps so far are dropped."""
        if not isinstance(loss_sum, torch.Tensor) or loss_sum.numel() != 1:
            raise TypeError(
                "AccumulationWindow.backward: loss_sum must be a one-element torch tensor (the "
                "sum over the micro-batch)"
            )
        if not loss_sum.requires_grad:
            raise RuntimeError(
                "AccumulationWindow.backward: loss_sum does not require grad (computed under "
                "torch.no_grad(), or from no trainable parameter); nothing was counted"
            )
        if loss_sum.device != self._device:
            raise ValueError(
                f"AccumulationWindow.backward: loss on {loss_sum.device}, parameters on "
                f"{self._device}"
            )
        self._check_model("backward", whole=self._window.micro_step == 0)
        master = self._grad_arena.dtype
        if isinstance(count, torch.Tensor):
            n = count.detach().to(device=self._device, dtype=torch.float64).reshape(())
        else:
            n = self._count_tensor(float(count))
        first = self._window.micro_step == 0
        if first:
            self._grad_arena.zero_()
            self._used = [False] * len(self._params)
        with _on_torch_stream(self._device), self._capture_scope():
            probe = accrue.from_dlpack(loss_sum.detach().to(master).reshape(()).clone())
            probe.requires_grad_()
            self._window.backward(probe, accrue.from_dlpack(n.clone()))
            # Note [Torch bridge streams]: accrue's temporaries die inside the scope.
            seed = torch.from_dlpack(probe.grad.detach()).clone() if self._scaled else None
            del probe
        # The Window armed the reducer for its last micro-step: the hooks feed it.
        self._last_micro_step = self._reducer is not None and self._window.ready()
        # Note [Torch bridge]: which f32/f64 gradients this backward adds to.
        versions = None if self._sixteen else [p.grad._version for p in self._params]
        try:
            if seed is not None:
                loss_sum.backward(seed.to(loss_sum.dtype).reshape(loss_sum.shape))
            else:
                loss_sum.backward()
        except BaseException:
            # The Window counted a micro-step whose gradients never landed
            # (whole or in part): the window starts again from micro-step 0.
            with _on_torch_stream(self._device):
                self._window.restart()
            raise
        finally:
            self._last_micro_step = False
        if versions is not None:
            self._used = [
                used or (p.grad is not None and p.grad._version != v)
                for used, p, v in zip(self._used, self._params, versions)
            ]
        written = _bridge.written_flags(self._store)
        _bridge.set_written_flags(self._store, [a or b for a, b in zip(written, self._used)])

    def _count_tensor(self, count: float) -> torch.Tensor:
        """A device tensor holding a number count, made once per value: torch copies a host
        number to the GPU and then waits for the stream, which would stall every micro-step
        on the work queued before it (a window's micro-batches usually share one count)."""
        n = self._counts.get(count)
        if n is None:
            if self._capturing:
                raise RuntimeError(
                    f"AccumulationWindow.backward: a count of {count:g} while a CUDA graph "
                    "records; its copy to the device cannot be captured: pass the count as a "
                    "device tensor, or run an eager window with the same counts first"
                )
            if len(self._counts) >= 64:  # varied counts (varlen batches): keep the newest
                self._counts.pop(next(iter(self._counts)))
            n = torch.tensor(count, dtype=torch.float64, device=self._device)
            self._counts[count] = n
        return n

    def ready(self) -> bool:
        """True after K micro-steps."""
        return self._window.ready()

    def close(self) -> None:
        """accrue's fused close (Note [Window close]): unscale, non-finite check, norm, clip,
        the optimizer step, on the arenas the torch parameters live in; no host sync."""
        if not self._window.ready():
            raise RuntimeError(
                f"AccumulationWindow.close: {self._window.micro_step} of "
                f"{self._window.micro_steps} micro-steps done; call backward() "
                f"{self._window.micro_steps - self._window.micro_step} more time(s) first"
            )
        self._check_model("close")
        with _on_torch_stream(self._device), self._capture_scope():
            self._window.close()

    # ---- CUDA graphs

    def _capture_scope(self) -> Any:
        """Note [Window captured whole]: accrue decides as under its own captures while
        capture() records (and the streams are Note [Torch bridge streams]'s)."""
        return _bridge.CaptureScope() if self._capturing else contextlib.nullcontext()

    @contextlib.contextmanager
    def capture(self, graph: Any, **graph_kwargs: Any) -> Any:
        """Records one whole window into a ``torch.cuda.CUDAGraph``: the block runs the K
        ``backward()`` calls (forwards included) and ``close()`` on static inputs, inside
        ``torch.cuda.graph(graph, **graph_kwargs)``; ``replay(graph)`` then runs a window.

            for _ in range(2):  # eager windows first: workspaces, plans, the counts' tensors
                ...
            graph = torch.cuda.CUDAGraph()
            with window.capture(graph):
                for k in range(K):
                    window.backward(loss_sum(model, xs[k], ys[k]), counts[k])
                window.close()
            for batch in windows:
                ...copy the batch into xs, ys, counts...
                window.replay(graph)

        A replay updates the weights bitwise as the eager window does: the step counts,
        the loss scale and N live on the device, and replay() stores each window's learning
        rates there first (Note [Window captured whole] in optim/window.h, which also says
        what is refused: a process group, a noise scale or norm under the backward, a
        calibrating scaler). The same parameters must receive gradients in every replay (the
        close's zeroing of the unused ones is recorded). ``capture_error_mode`` defaults to
        "thread_local", as accrue's own captures."""
        if self._device.type != "cuda":
            raise RuntimeError(
                f"AccumulationWindow.capture: the parameters are on {self._device}; CUDA "
                "graphs are CUDA's"
            )
        if self._capturing:
            raise RuntimeError("AccumulationWindow.capture: already capturing")
        self._check_model("capture")
        before = _bridge.begin_whole_capture(self._window)
        used = list(self._used)
        graph_kwargs.setdefault("capture_error_mode", "thread_local")
        self._capturing = True
        try:
            with torch.cuda.graph(graph, **graph_kwargs):
                yield
        except BaseException:
            self._capturing = False
            with contextlib.suppress(Exception):  # the block's error is the one to see
                _bridge.end_whole_capture(self._window, before)
            self._used = used
            raise
        self._capturing = False
        self._used = used
        written = _bridge.end_whole_capture(self._window, before)
        self._graphs[id(graph)] = (graph, written)

    def replay(self, graph: Any) -> None:
        """One window from a graph that capture() recorded: its learning rates stored on the
        device, the graph replayed on torch's current stream, the host's counts advanced."""
        entry = self._graphs.get(id(graph))
        if entry is None or entry[0] is not graph:
            raise RuntimeError(
                "AccumulationWindow.replay: this graph was not recorded by this window's "
                "capture()"
            )
        written = entry[1]
        self._check_model("replay")
        with _on_torch_stream(self._device):
            _bridge.before_whole_replay(self._window, written)
            graph.replay()
            _bridge.after_whole_replay(self._window, written)
        self._used = list(written)

    def report(self) -> optim.WindowReport:
        """The last closed window's loss (sum / N), N, grad_norm, clip_coef, loss_scale,
        skipped, ...: one host read."""
        with _on_torch_stream(self._device):  # after the close, in torch's stream order
            return self._window.report()

    @property
    def micro_step(self) -> int:
        """Micro-steps done in this window."""
        return self._window.micro_step

    @property
    def micro_steps(self) -> int:
        """K."""
        return self._window.micro_steps

    @property
    def windows_closed(self) -> int:
        """Windows closed so far."""
        return self._window.windows_closed

    @property
    def store(self) -> optim.ParamStore:
        """The accrue ParamStore the parameters live in."""
        return self._store

    @property
    def reducer(self) -> Any:
        """The accrue.dist.Reducer of data parallelism (None without a process group)."""
        return self._reducer

    @property
    def window(self) -> optim.Window:
        """The accrue Window."""
        return self._window

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """Everything a bitwise resume needs (Window.state_dict: master weights, moments,
        scale, step and window counts; mid-window also the gradients so far), as torch
        tensors (copies), for torch.save."""
        with _on_torch_stream(self._device):  # Note [Torch bridge streams]
            state = self._window.state_dict()
            return {k: torch.from_dlpack(v.detach()).clone() for k, v in state.items()}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Resumes from state_dict(): the torch parameters see the loaded values in place."""
        self._check_model("load_state_dict")
        with _on_torch_stream(self._device):  # Note [Torch bridge streams]
            self._window.load_state_dict(
                {k: accrue.from_dlpack(v.detach().contiguous().clone()) for k, v in state.items()}
            )
        self._used = list(_bridge.written_flags(self._store))

    def remove(self) -> None:
        """Removes the hooks (the parameters stay in the store's memory)."""
        for h in self._handles:
            h.remove()
        self._handles = []
