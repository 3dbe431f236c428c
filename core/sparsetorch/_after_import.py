"""Run a function on a module once it is imported (now, if it was already).

What sparsetorch adjusts in torch's compiler (``torch._dynamo``, ~2 s to import: not loaded by ``import
sparsetorch``) is applied when dynamo's module loads, through a one-shot import hook per module: the
reverse-matmul entry of ``A @ x`` (``tensor/sparse_tensor.py``) and the frame switch of
``SparseWeight.__torch_function__`` (``nn/weight.py``).
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from typing import Any, Callable

__all__ = ["after_import"]

_LOCK = threading.Lock()
#: module name -> the functions still to run on it
_PENDING: dict[str, list[Callable[[Any], None]]] = {}


class _Hook:
    """A meta-path finder that wraps the loader of the modules in :data:`_PENDING` so that their functions run
    right after the module's code; it removes itself once nothing is pending."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        with _LOCK:
            if name not in _PENDING:
                return None
            fns = _PENDING.pop(name)
            if not _PENDING and self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec  # a loader this hook cannot wrap: the callers apply their change again later
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            for fn in fns:
                fn(module)

        loader.exec_module = exec_module
        return spec


_HOOK = _Hook()


def after_import(name: str, fn: Callable[[Any], None]) -> None:
    """``fn(module)`` now if module ``name`` is imported, else right after it is first imported (once)."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    with _LOCK:
        fns = _PENDING.setdefault(name, [])
        if fn not in fns:
            fns.append(fn)
        if _HOOK not in sys.meta_path:
            sys.meta_path.insert(0, _HOOK)
