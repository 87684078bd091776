"""Modules: the native ones (Linear, Embedding, LayerNorm, GELU, MLP, GPT2) and
the base class of modules written in Python.

Note [Python modules] below says how modules written in Python work.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from . import _accrue
from ._accrue import Tensor
from ._accrue.nn import (  # noqa: F401  (re-exports)
    GELU,
    GPT2,
    MLP,
    Embedding,
    GPT2Config,
    LayerNorm,
    Linear,
    NativeModule,
    BatchLayout,
    Llama,
    LlamaAttention,
    LlamaConfig,
    LlamaDecoderLayer,
    LlamaKVCache,
    LlamaMLP,
    RMSNorm,
    RopeScaling,
    generate_greedy,
    read_hf_config,
    use_fp8,
    write_hf_config,
)


# Note [Python modules]
# ~~~~~~~~~~~~~~~~~~~~~
# A module written in Python subclasses ``accrue.nn.Module``, a pure Python
# class (not a binding of nn::Module with trampolines): what makes a module is
# its list of named parameters, which is all that a ParamStore, a state dict or
# an optimizer group reads, and a Python class that collects them is simpler
# and harder to break than a C++ object whose children live in Python.
# Attributes register themselves as PyTorch's do: a Module (Python or native)
# becomes a child, a leaf tensor that requires grad (``Parameter(t)``) becomes a
# parameter, and ``register_buffer`` keeps state that is not trained. Names are
# dotted, parameters of a module before its children's, each group in
# assignment order. The native modules count as ``Module`` (isinstance) and
# are held as children like any other. ``forward`` is the subclass's;
# ``module(x)`` calls it. ``to(dtype)`` and ``to(device)`` move parameters
# and buffers in place as nn::Module::to does (Note [Module device and
# dtype]): each tensor keeps its identity, gradients move along, dtype
# conversion touches floating tensors only, and a parameter a ParamStore
# holds must already be where the store put it (checked for the whole tree
# before anything moves).


def Parameter(data: Tensor, requires_grad: bool = True) -> Tensor:
    """A leaf that requires grad over data's memory (torch.nn.Parameter).

    Assigned to an attribute of a Module, it becomes one of its parameters.
    """
    t = _accrue.detach(data)
    t.requires_grad_(requires_grad)
    return t


class Module(metaclass=abc.ABCMeta):
    """The base of modules written in Python (Note [Python modules])."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    # ---- registration
    def _check_init(self, name: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__(): call super().__init__() "
                "first in the subclass's __init__"
            )

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Module):
            self._check_init(name)
            self._forget(name)
            self._modules[name] = value
        elif isinstance(value, Tensor) and value.is_leaf and value.requires_grad:
            self._check_init(name)
            self._forget(name)
            self._parameters[name] = value
        elif isinstance(value, Tensor) and name in self.__dict__.get("_buffers", {}):
            self._buffers[name] = value
        else:
            if name in self.__dict__.get("_parameters", {}) or name in self.__dict__.get(
                "_modules", {}
            ):
                self._forget(name)
            object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._persistent.discard(name)
        self._modules.pop(name, None)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: the registered names.
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        if name in self._parameters or name in self._buffers or name in self._modules:
            self._forget(name)
        else:
            object.__delattr__(self, name)

    def register_parameter(self, name: str, t: Tensor) -> Tensor:
        """Registers `t` (made a leaf that requires grad) as parameter `name`; returns it."""
        self._check_init(name)
        if not t.requires_grad:
            t.requires_grad_()
        if not t.is_leaf:
            raise ValueError(f"register_parameter({name!r}): not a leaf; pass t.detach()")
        self._forget(name)
        self._parameters[name] = t
        return t

    def register_buffer(self, name: str, t: Tensor, persistent: bool = True) -> Tensor:
        """Registers state that is not trained; in the state dict when persistent."""
        self._check_init(name)
        self._forget(name)
        self._buffers[name] = t
        if persistent:
            self._persistent.add(name)
        return t

    def register_module(self, name: str, module: Any) -> Any:
        """Registers a child (as assigning it does); returns it."""
        self._check_init(name)
        self._forget(name)
        self._modules[name] = module
        return module

    add_module = register_module

    # ---- traversal
    def named_children(self) -> Iterator[Tuple[str, Any]]:
        """(name, child) of the direct children."""
        return iter(list(self._modules.items()))

    def children(self) -> Iterator[Any]:
        """The direct children."""
        return iter(list(self._modules.values()))

    def named_parameters(self, prefix: str = "") -> List[Tuple[str, Tensor]]:
        """(dotted name, parameter) pairs: this module's, then each child's."""
        out = [(prefix + n, p) for n, p in self._parameters.items()]
        for name, child in self._modules.items():
            sub = prefix + name + "."
            if not isinstance(child, NativeModule):
                out += child.named_parameters(sub)
            else:
                out += [(sub + n, p) for n, p in child.named_parameters()]
        return out

    def parameters(self) -> List[Tensor]:
        """The parameters, in named_parameters() order."""
        return [p for _, p in self.named_parameters()]

    def parameter_count(self) -> int:
        """The number of parameter elements."""
        return sum(p.numel() for p in self.parameters())

    def named_buffers(self, prefix: str = "") -> List[Tuple[str, Tensor]]:
        """(dotted name, buffer) pairs, persistent or not."""
        out = [(prefix + n, b) for n, b in self._buffers.items()]
        for name, child in self._modules.items():
            sub = prefix + name + "."
            if not isinstance(child, NativeModule):
                out += child.named_buffers(sub)
            else:
                out += [(sub + n, b) for n, b in child.named_buffers()]
        return out

    def _state(self, prefix: str) -> Dict[str, Tuple[Tensor, bool]]:
        # name -> (tensor, is_parameter)
        out: Dict[str, Tuple[Tensor, bool]] = {}
        for n, p in self._parameters.items():
            out[prefix + n] = (p, True)
        for n, b in self._buffers.items():
            if n in self._persistent:
                out[prefix + n] = (b, False)
        for name, child in self._modules.items():
            sub = prefix + name + "."
            if not isinstance(child, NativeModule):
                out.update(child._state(sub))
            else:
                params = {n for n, _ in child.named_parameters()}
                for n, t in child.state_dict().items():
                    out[sub + n] = (_NativeEntry(child, n, t), n in params)  # type: ignore[assignment]
        return out

    def state_dict(self) -> Dict[str, Tensor]:
        """Every parameter and persistent buffer by dotted name, detached views of their
        memory (the master weights once a ParamStore holds the parameters)."""
        out = {}
        for name, (t, is_param) in self._state("").items():
            if isinstance(t, _NativeEntry):
                value = t.value
            else:
                value = _accrue.parameter_value(t) if is_param else t
            out[name] = _accrue.detach(value)  # the same memory, as torch's state_dict
        return out

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True) -> None:
        """Copies each entry into the module's own tensor (cast to its dtype), after checking
        every name and shape first: a missing or (when strict) unexpected name, or a shape
        that differs, raises accrue.Error naming it, and nothing is changed."""
        own = self._state("")
        missing = [n for n in own if n not in state_dict]
        unexpected = [n for n in state_dict if n not in own]
        if missing:
            raise Error(f"load_state_dict: missing {missing}")
        if strict and unexpected:
            raise Error(f"load_state_dict: unexpected {unexpected} (strict=False ignores them)")
        for name, (t, _) in own.items():
            target = t.value if isinstance(t, _NativeEntry) else t
            value = state_dict[name]
            if tuple(value.shape) != tuple(target.shape):
                raise Error(
                    f"load_state_dict: {name!r} has shape {tuple(value.shape)}, the module's "
                    f"{tuple(target.shape)}"
                )
        natives: Dict[int, Tuple[Any, Dict[str, Tensor]]] = {}
        with _no_grad():
            for name, (t, is_param) in own.items():
                value = state_dict[name]
                if isinstance(t, _NativeEntry):
                    natives.setdefault(id(t.module), (t.module, {}))[1][t.name] = value
                elif is_param:
                    _accrue.load_parameter(t, value)
                else:
                    t.copy_(value)
        for module, sub in natives.values():
            module.load_state_dict(sub, strict)

    # ---- device and dtype
    def to(self, target: Any) -> "Module":
        """Moves parameters and buffers, children's too, in place: ``to(accrue.f64)``,
        ``to("cuda")`` (Note [Python modules]); returns self."""
        if isinstance(target, _accrue.dtype):
            def want(t: Tensor) -> Tuple[Any, Any]:
                dt = target if _accrue.is_floating_point(t.dtype) else t.dtype
                return dt, t.device
        else:
            device = _accrue.Device(target) if isinstance(target, str) else target

            def want(t: Tensor) -> Tuple[Any, Any]:
                return t.dtype, device

        for name, p in self.named_parameters():
            if _accrue._is_held(p) and want(p) != (p.dtype, p.device):
                raise Error(
                    f"Module.to: {name!r} is held by a ParamStore, which fixed its dtype and "
                    f"device ({p.dtype.name} on {p.device}): build the store with the target "
                    "device or compute dtype, or call to() before building it. Nothing was moved"
                )
        with _no_grad():
            self._move(target, want)
        return self

    def _move(self, target: Any, want: Any) -> None:
        for t in list(self._parameters.values()) + list(self._buffers.values()):
            dt, dev = want(t)
            if (dt, dev) == (t.dtype, t.device):
                continue
            g = t.grad if t.requires_grad else None
            _accrue._repoint(t, t.to(dev).to(dt))
            if g is not None:
                t.grad = g.to(dev).to(dt)
        for child in self._modules.values():
            if isinstance(child, NativeModule):
                child.to(target)
            else:
                child._move(target, want)

    # ---- mode and calls
    def train(self, mode: bool = True) -> "Module":
        """Training mode (dropout on) for this module and its children; returns self."""
        object.__setattr__(self, "training", mode)
        for child in self._modules.values():
            child.train(mode)
        return self

    def eval(self) -> "Module":
        """train(False); returns self."""
        return self.train(False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The subclass's computation."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for n, p in self._parameters.items():
            lines.append(f"  ({n}): parameter {tuple(p.shape)} {p.dtype.name}")
        for n, c in self._modules.items():
            lines.append(f"  ({n}): " + repr(c).replace("\n", "\n  "))
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


class _NativeEntry:
    """A state-dict entry of a native child: loaded through the child's own load_state_dict."""

    def __init__(self, module: Any, name: str, value: Tensor) -> None:
        self.module, self.name, self.value = module, name, value


class Sequential(Module):
    """Children called in order (torch.nn.Sequential); named "0", "1", ..."""

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            self.register_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x


Module.register(NativeModule)

from . import Error  # noqa: E402
from . import no_grad as _no_grad  # noqa: E402
