"""Every binding has a docstring and the stubs ship."""

import inspect
import pathlib

import accrue
from accrue import _accrue


def documented(obj):
    doc = getattr(obj, "__doc__", None) or ""
    # nanobind puts each overload's signature first ("name(...) -> ..."); prose follows.
    name = getattr(obj, "__name__", None)
    lines = [l for l in doc.splitlines() if l.strip()]
    return any(not (name and l.startswith(name + "(")) for l in lines)


def bindings():
    for mod in (_accrue, _accrue.nn, _accrue.optim, _accrue.data):
        for name, obj in vars(mod).items():
            if name.startswith("_") or inspect.ismodule(obj):
                continue
            yield f"{mod.__name__}.{name}", obj
            if isinstance(obj, type) and obj.__module__.startswith("accrue._accrue"):
                for attr, member in vars(obj).items():
                    if attr.startswith("__") and attr not in ("__init__", "__getitem__", "__setitem__",
                                                                "__dlpack__", "__dlpack_device__"):
                        continue
                    if attr.startswith("_") and not attr.startswith("__"):
                        continue
                    yield f"{mod.__name__}.{name}.{attr}", member


def test_every_binding_has_a_docstring():
    missing = [n for n, obj in bindings() if callable(obj) or isinstance(obj, property)
               if not isinstance(obj, (int, float, str)) and not documented(obj)]
    assert not missing, missing


def test_stubs_and_marker_ship():
    root = pathlib.Path(accrue.__file__).parent
    assert (root / "py.typed").exists()
    for stub in ("__init__.pyi", "nn.pyi", "optim.pyi"):
        assert (root / "_accrue" / stub).stat().st_size > 1000, stub
