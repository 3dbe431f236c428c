"""Run a function on a module once it is imported (now, if it was already).

What sparsetorch adjusts in torch's compiler (``torch._dynamo``, ~2 s to import: not loaded by ``import
sparsetorch``) is applied when dynamo's module loads, through an import hook: the reverse-matmul entry of
``A @ x`` (``tensor/sparse_tensor.py``) and the frame switch of ``SparseWeight.__torch_function__``
(``nn/weight.py``).

The hook (first on ``sys.meta_path``, left there: removing a finder while the import system walks the list
would skip the next one) answers only for the modules waited for, with the spec the finders after it give,
and runs the functions right after the module's code. Where it cannot wrap the loader (no ``exec_module``), or
the module was mid-import when :func:`after_import` was called, the functions run at the next import of
anything once the module has finished loading.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

__all__ = ["after_import"]

_LOCK = threading.RLock()
#: module name -> the functions to run when it is imported (not imported yet)
_PENDING: dict[str, list[Callable[[Any], None]]] = {}
#: module name -> the functions to run once it has finished loading (imported, or being imported, without them)
_WAITING: dict[str, list[Callable[[Any], None]]] = {}


def _loaded(name: str) -> Any:
    """The module ``name`` if it is in ``sys.modules`` and its code has run to the end, else None."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def _apply(fns: list[Callable[[Any], None]], module: Any) -> None:
    """Run ``fns`` on ``module``; one that fails is skipped (these are adjustments: the import they follow must not
    fail for them), with a warning that names it."""
    for fn in fns:
        try:
            fn(module)
        except Exception as exc:  # noqa: BLE001 - reported, not raised into another package's import
            import warnings

            warnings.warn(f"sparsetorch: {getattr(fn, '__qualname__', fn)} on {module.__name__} failed ({exc!r}); "
                          f"its adjustment is not applied", RuntimeWarning, stacklevel=2)


def _flush() -> None:
    """Run the waiting functions of the modules that have finished loading since."""
    with _LOCK:
        ready = [(name, _WAITING.pop(name)) for name in list(_WAITING) if _loaded(name) is not None]
    for name, fns in ready:
        _apply(fns, sys.modules[name])


class _Hook:
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if _WAITING:
            _flush()
        with _LOCK:
            fns = _PENDING.pop(name, None)
        if fns is None:
            return None
        meta = list(sys.meta_path)
        spec = None
        for finder in meta[meta.index(self) + 1:] if self in meta else meta:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            with _LOCK:
                _WAITING.setdefault(name, []).extend(fns)
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _apply(fns, module)

        loader.exec_module = exec_module
        return spec


_HOOK = _Hook()


def after_import(name: str, fn: Callable[[Any], None]) -> None:
    """``fn(module)`` now if module ``name`` is imported, else right after it is first imported (once)."""
    with _LOCK:
        module = _loaded(name)
        if module is None:
            waiting = _WAITING if name in sys.modules else _PENDING  # mid-import: after it, at the next import
            fns = waiting.setdefault(name, [])
            if fn not in fns:
                fns.append(fn)
            if _HOOK not in sys.meta_path:
                sys.meta_path.insert(0, _HOOK)
            return
    _apply([fn], module)
