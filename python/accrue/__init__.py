"""accrue from Python: tensors, autograd, modules and the accumulation Window.

The engine is the C++ extension ``accrue._accrue``; this package re-exports it
and adds what is simplest in Python: ``no_grad``, ``tensor`` and
``from_numpy``, and the base class of modules written in Python
(``accrue.nn.Module``). See docs/PYTHON.md.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Union

from . import _accrue
from ._accrue import (  # noqa: F401  (re-exports)
    Device,
    Error,
    Generator,
    GradcheckResult,
    Loss,
    OutOfMemoryError,
    Tensor,
    abs,
    add,
    amax,
    arange,
    argmax,
    argsort,
    await_parameters,
    backward,
    cat,
    chunk,
    clamp,
    clone,
    contiguous,
    cos,
    cross_entropy,
    cuda_device_count,
    cuda_is_available,
    cumsum,
    default_generator,
    detach,
    div,
    dtype,
    element_size,
    embedding,
    empty,
    exp,
    expand,
    from_dlpack,
    full,
    gather,
    gelu,
    gradcheck,
    index_add,
    index_select,
    is_floating_point,
    is_grad_enabled,
    fp8_linear,
    layer_norm,
    linear,
    load_parameter,
    log,
    log_softmax,
    manual_seed,
    masked_fill,
    matmul,
    maximum,
    mean,
    minimum,
    mul,
    narrow,
    neg,
    one_hot,
    ones,
    parameter_value,
    permute,
    pow,
    rand,
    randint,
    randn,
    relu,
    repeat_interleave,
    reshape,
    rsqrt,
    scalar_tensor,
    scatter_add,
    select,
    set_grad_enabled,
    sigmoid,
    silu,
    sin,
    softmax,
    sort,
    split,
    sqrt,
    squeeze,
    stack,
    sub,
    sum,
    tanh,
    to_device,
    to_dtype,
    topk,
    transpose,
    tril,
    triu,
    unbind,
    unsqueeze,
    view,
    where,
    zeros,
    MaskAlignment,
    RopeScaling,
    RopeStyle,
    SdpaOptions,
    add_rms_norm,
    classifier_cross_entropy,
    linear_gelu,
    linear_gelu_linear,
    qk_norm,
    residual_layer_norm,
    rms_norm,
    rope,
    scaled_dot_product_attention,
    swiglu,
    swiglu_packed,
    load_npy,
    load_safetensors,
    save_npy,
    save_safetensors,
    dropout,
    packed_causal_attention,
)

# PyTorch's names for the dtypes (accrue's own are f32, f64, ...).
f32 = float32 = dtype.f32
f64 = float64 = dtype.f64
bf16 = bfloat16 = dtype.bf16
f16 = float16 = half = dtype.f16
i32 = int32 = dtype.i32
i64 = int64 = long = dtype.i64
bool_ = dtype.bool
f8e4m3 = float8_e4m3fn = dtype.f8e4m3
f8e5m2 = float8_e5m2 = dtype.f8e5m2

__version__ = "0.1.0"


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """No graph is recorded inside the block (evaluation, manual updates)."""
    previous = is_grad_enabled()
    set_grad_enabled(False)
    try:
        yield
    finally:
        set_grad_enabled(previous)


@contextlib.contextmanager
def enable_grad() -> Iterator[None]:
    """The graph is recorded inside the block, even under no_grad()."""
    previous = is_grad_enabled()
    set_grad_enabled(True)
    try:
        yield
    finally:
        set_grad_enabled(previous)


_NUMPY_DTYPES = {
    "float32": f32,
    "float64": f64,
    "float16": f16,
    "int32": i32,
    "int64": i64,
    "bool": bool_,
}


def from_numpy(array: Any) -> Tensor:
    """A tensor over a numpy array's memory, without a copy (torch.from_numpy).

    Writes through either show in the other; the array stays alive while the
    tensor does. Read-only arrays are copied (accrue has no read-only tensors).
    """
    import numpy as np

    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    if array.dtype.name not in _NUMPY_DTYPES:
        raise TypeError(
            f"from_numpy: numpy dtype {array.dtype} has no accrue dtype; "
            "accrue has float32, float64, float16, int32, int64 and bool"
        )
    return from_dlpack(array)


def tensor(
    data: Any,
    dtype: Optional[dtype] = None,
    device: Union[str, Device] = "cpu",
    requires_grad: bool = False,
) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers, arrays).

    The dtype follows the data as torch.tensor's does: floats give f32, ints
    i64, bools bool, unless `dtype` says otherwise.
    """
    import numpy as np

    if isinstance(data, Tensor):
        out = data.detach().clone()
    else:
        a = np.asarray(data)
        if a.dtype.kind == "f" and a.dtype != np.float16 and dtype is None:
            a = a.astype(np.float32)
        elif a.dtype.kind in "iu" and dtype is None:
            a = a.astype(np.int64)
        if a.dtype.name not in _NUMPY_DTYPES:
            a = a.astype(np.float64)
        out = from_dlpack(np.ascontiguousarray(a)).clone()
    if dtype is not None and out.dtype != dtype:
        out = out.to(dtype)
    out = out.to(Device(device) if isinstance(device, str) else device)
    if requires_grad:
        out.requires_grad_()
    return out


def zeros_like(t: Tensor, dtype: Optional[dtype] = None) -> Tensor:
    """Zeros of t's shape, dtype (unless given) and device."""
    return zeros(t.shape, dtype=dtype or t.dtype, device=t.device)


def ones_like(t: Tensor, dtype: Optional[dtype] = None) -> Tensor:
    """Ones of t's shape, dtype (unless given) and device."""
    return ones(t.shape, dtype=dtype or t.dtype, device=t.device)


from . import nn, optim  # noqa: E402  (they import the names above)
from ._accrue import dist  # noqa: E402,F401  (data parallelism: communicator, Reducer)
from ._accrue import data  # noqa: E402,F401  (token shards and the data loader)
