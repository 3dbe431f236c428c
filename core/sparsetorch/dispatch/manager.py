"""Loading backends (lazily, on first dispatch) and a typed facade over the hook relay.

Built-in backends are registered exactly like third-party ones; plugins come from the
``sparsetorch.backends`` entry-point group. Environment variables:

``SPARSETORCH_DISABLE_PLUGINS``  ``1``/``all`` disables every external plugin; otherwise a
                                 comma-separated list of plugin names to skip.
``SPARSETORCH_PLUGINS``          comma-separated allow-list of external plugin names.

Built-ins stay loaded either way (use ``backend=`` to pin one). A plugin that fails to import
or to describe itself is kept as a *broken* entry whose error shows in ``sparsetorch info`` and
in every ``explain`` table.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .records import BackendInfo, Decline, Offer, Request

__all__ = ["Backends", "BrokenBackend", "get_backends", "reset_backends", "ENTRY_POINT_GROUP", "BUILTINS"]

ENTRY_POINT_GROUP = "sparsetorch.backends"
#: Built-in backends: (name, module).
BUILTINS: tuple[tuple[str, str], ...] = (("torch", "sparsetorch.backends.torch_native.plugin"),)


@dataclass(frozen=True)
class BrokenBackend:
    """A plugin that could not be loaded or described, and the error text."""

    name: str
    distribution: str | None
    error: str


def _env_names(var: str) -> set[str] | None:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    return {x.strip() for x in raw.split(",") if x.strip()}


_GENERATIONS = itertools.count(1)


class Backends:
    """The loaded backends and typed calls into them (the core never calls ``pm.hook`` directly)."""

    def __init__(self, *, entry_points: bool = True) -> None:
        #: changes whenever the set of backends may have changed (a new object, register,
        #: unregister): cached dispatch decisions (select.choose) are keyed on it
        self.generation = next(_GENERATIONS)
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._info: dict[str, BackendInfo] = {}
        self._plugins: dict[str, Any] = {}
        self.broken: list[BrokenBackend] = []
        for name, module in BUILTINS:
            self._load(name, None, lambda module=module: importlib.import_module(module), builtin=True)
        if entry_points:
            self._load_entry_points()
        self._pm.check_pending()

    # Loading ----------------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        disable = _env_names("SPARSETORCH_DISABLE_PLUGINS")
        if disable and disable & {"1", "all", "true", "yes"}:
            return
        allow = _env_names("SPARSETORCH_PLUGINS")
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if disable and ep.name in disable:
                continue
            if allow is not None and ep.name not in allow:
                continue
            dist = getattr(ep, "dist", None)
            self._load(ep.name, dist.name if dist is not None else None, ep.load, builtin=False)

    def _load(self, name: str, distribution: str | None, loader, *, builtin: bool) -> None:
        if name in self._plugins:
            self.broken.append(BrokenBackend(name, distribution, f"a backend named {name!r} is already loaded"))
            return
        try:
            plugin = loader()
            self._pm.register(plugin, name=name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the library
            self.broken.append(BrokenBackend(name, distribution, _one_line(exc)))
            return
        self._plugins[name] = plugin
        try:
            info = self._describe(plugin)
        except Exception as exc:  # noqa: BLE001
            self._pm.unregister(plugin)
            del self._plugins[name]
            self.broken.append(BrokenBackend(name, distribution, f"backend_info failed: {_one_line(exc)}"))
            return
        if info.name != name:
            info = BackendInfo(**{**info.__dict__, "name": name})
        if distribution and not info.distribution:
            info = BackendInfo(**{**info.__dict__, "distribution": distribution})
        self._info[name] = info

    def _describe(self, plugin: Any) -> BackendInfo:
        impls = [i for i in self._pm.hook.sparsetorch_backend_info.get_hookimpls() if i.plugin is plugin]
        if not impls:
            raise TypeError("the plugin has no @sparsetorch.hookimpl sparsetorch_backend_info")
        info = impls[0].function()
        if not isinstance(info, BackendInfo):
            raise TypeError(f"sparsetorch_backend_info returned {type(info).__name__}, expected BackendInfo")
        return info

    def register(self, plugin: Any, name: str) -> None:
        """Register a backend object at run time (tests, notebooks, in-tree experiments)."""
        self._load(name, None, lambda: plugin, builtin=False)
        self._pm.check_pending()
        self.generation = next(_GENERATIONS)

    def unregister(self, name: str) -> None:
        plugin = self._plugins.pop(name, None)
        if plugin is not None:
            self._pm.unregister(plugin)
        self._info.pop(name, None)
        self.broken = [b for b in self.broken if b.name != name]
        self.generation = next(_GENERATIONS)

    # Typed facade -----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._info)

    def info(self, name: str | None = None) -> BackendInfo | list[BackendInfo]:
        if name is None:
            return list(self._info.values())
        return self._info[name]

    def offers(self, request: Request) -> list[Offer | Decline]:
        """Every backend's answer to ``request``; a raising backend becomes a decline."""
        out: list[Offer | Decline] = []
        impls = {self._pm.get_name(impl.plugin): impl for impl in self._pm.hook.sparsetorch_offers.get_hookimpls()}
        for name in self._plugins:
            info = self._info[name]
            if request.op not in info.ops:
                out.append(Decline(name, f"does not implement {request.op!r} (it has: {', '.join(info.ops) or 'nothing'})"))
                continue
            if request.device.type not in info.devices and not _allows_transfer(request):
                out.append(Decline(name, f"runs on {', '.join(info.devices)} only; the operands are on {request.device}"))
                continue
            if request.dtype not in info.dtypes:
                have = ", ".join(str(d).replace("torch.", "") for d in info.dtypes)
                out.append(Decline(name, f"does not support dtype {str(request.dtype).replace('torch.', '')} (it has: {have})"))
                continue
            impl = impls.get(name)
            if impl is None:
                out.append(Decline(name, "has no @sparsetorch.hookimpl sparsetorch_offers (plugin bug)"))
                continue
            try:
                answers = impl.function(request=request)
                answers = list(answers or [])
            except Exception as exc:  # noqa: BLE001 - reported as a decline, with the text
                out.append(Decline(name, f"raised {_one_line(exc)}"))
                continue
            if not answers:
                out.append(Decline(name, "returned no offer for this request"))
            for a in answers:
                if isinstance(a, (Offer, Decline)) and a.backend == name:
                    out.append(a)
                elif isinstance(a, (Offer, Decline)):
                    out.append(type(a)(**{**a.__dict__, "backend": name}))
                else:
                    out.append(Decline(name, f"returned {type(a).__name__}, not an Offer or Decline (plugin bug)"))
        for b in self.broken:
            out.append(Decline(b.name, f"failed to load: {b.error}"))
        return out


def _one_line(exc: BaseException) -> str:
    """The whole exception text on one line, with the innermost frame outside pluggy."""
    text = " / ".join(line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip())
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/pluggy/" not in f.filename]
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    return text[:1000] + where


_lock = threading.Lock()
_backends: Backends | None = None


def get_backends() -> Backends:
    """The process-wide backends, loaded on first use."""
    global _backends
    if _backends is None:
        with _lock:
            if _backends is None:
                _backends = Backends()
    return _backends


def reset_backends(*, entry_points: bool = True) -> Backends:
    """Reload backends (after changing the environment variables, or in tests)."""
    global _backends
    with _lock:
        _backends = Backends(entry_points=entry_points)
    from .plan import plan_cache  # noqa: PLC0415 - plan imports select, which imports this module

    plan_cache().clear()
    return _backends


def _allows_transfer(request: Request) -> bool:
    """The user allows host/device copies (``backend_options={"allow_transfer": True}``): a backend
    whose declared devices lack the operands' device is then asked anyway, and offers with the
    copies costed (or declines)."""
    bo = request.option("backend_options") or {}
    return bool(request.option("allow_transfer") or (isinstance(bo, dict) and bo.get("allow_transfer")))
