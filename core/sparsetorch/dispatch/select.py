"""Loading the backends and choosing among them: the dispatcher.

## Loading

Loading backends (lazily, on first dispatch) and a typed facade over the hook relay.

Built-in backends are registered exactly like third-party ones; plugins come from the
``sparsetorch.backends`` entry-point group. Environment variables:

``SPARSETORCH_DISABLE_PLUGINS``  ``1``/``all``/``true``/``yes``/``on`` (any case) disables every
                                 external plugin; otherwise a comma-separated list of plugin names
                                 to skip.
``SPARSETORCH_PLUGINS``          comma-separated allow-list of external plugin names.

Built-ins stay loaded either way (use ``backend=`` to pin one). A plugin that fails to import
or to describe itself is kept as a *broken* entry whose error shows in ``sparsetorch info`` and
in every ``explain`` table.

## Choosing

Choosing a backend: user constraints, then the lowest estimated cost, then a fixed tie-break.

The rule, in order:

1. Collect every backend's offers and declines for the request.
2. Drop offers that break a user constraint, turning each into a decline that says which:
   ``backend=`` (pin a backend), ``method=`` (pin a method), ``max_bytes=`` (memory budget).
   Ops, devices and dtypes a backend did not declare in its ``BackendInfo`` are declined for it
   by the core, with a generated reason; so is an offer of a method it did not declare for the op.
3. Rank the remaining offers by estimated seconds, lowest first.
4. Ties: offers within 1 % of the cheapest remaining estimate form a group, ordered by lower
   peak bytes, then higher backend ``priority``, then backend name, then method name.
   The result never depends on plugin load order.

``explain(op, *operands, **options)`` returns this ranking as an :class:`ExplainTable`.
``SPARSETORCH_TRACE=1`` logs each decision to the ``sparsetorch.dispatch`` logger (stderr).

Decisions are remembered: :func:`choose` keys a request by its metadata (op, operands' kind,
shape, dtype, device, format, nse, properties, options; never data), the loaded backends'
``generation`` and the calibration setting, and answers a repeated request without asking the
backends again (asking them costs ~0.1 ms per call with four plugins loaded, measured; a
training loop asks the same question every step). Registering or removing a backend starts
afresh; ``SPARSETORCH_DISPATCH_CACHE=0`` turns this off; :func:`clear_decisions` empties it.
:func:`explain` always asks the backends.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any, Callable

import pluggy

from ..errors import InputError, NoBackendError
from ..tensor import construct as _construct
from . import hookspecs
from .experience import weigh
from .lru import LRU
from .records import METHODS, BackendInfo, Decline, ExplainTable, Offer, Request, Row, _fmt_seconds, _fmt_bytes, preconditioner_name

__all__ = ["Backends", "BrokenBackend", "get_backends", "reset_backends", "ENTRY_POINT_GROUP", "BUILTINS",
           "Row", "ExplainTable", "rank", "choose", "clear_decisions"]

ENTRY_POINT_GROUP = "sparsetorch.backends"
#: Built-in backends: (name, module).
BUILTINS: tuple[tuple[str, str], ...] = (("torch", "sparsetorch.backends.torch_native.plugin"),)


@dataclass(frozen=True)
class BrokenBackend:
    """A plugin that could not be loaded or described, and the error text."""

    name: str
    distribution: str | None
    error: str


#: ``SPARSETORCH_DISABLE_PLUGINS`` values (compared lower-cased) that disable every external plugin
DISABLE_ALL = ("1", "all", "true", "yes", "on")


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
        self._conversions: dict[str, Callable] | None = None
        self._conversion_owners: dict[str, str] = {}
        self.broken: list[BrokenBackend] = []
        #: the loading filters as they were read (``SPARSETORCH_DISABLE_PLUGINS``,
        #: ``SPARSETORCH_PLUGINS``; None: entry points not loaded at all), for :meth:`not_loaded`
        self._filters: tuple[str, str] | None = None
        for name, module in BUILTINS:
            self._load(name, None, lambda module=module: importlib.import_module(module), builtin=True)
        if entry_points:
            self._load_entry_points()

    # Loading ----------------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        self._filters = (os.environ.get("SPARSETORCH_DISABLE_PLUGINS", "").strip(),
                         os.environ.get("SPARSETORCH_PLUGINS", "").strip())
        disable = _env_names("SPARSETORCH_DISABLE_PLUGINS")
        if _disables_all(disable):
            return
        allow = _env_names("SPARSETORCH_PLUGINS")
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if _filtered(ep.name, disable, allow):
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
        unknown = self._unknown_hooks(plugin)
        if unknown is not None:
            # pluggy's check_pending, for this plugin alone: run over the whole manager it raised
            # from every dispatch (and `sparsetorch info`) for one plugin's misspelled hook
            self._pm.unregister(plugin)
            self.broken.append(BrokenBackend(name, distribution, unknown))
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

    def not_loaded(self, name: str) -> str | None:
        """Why the installed plugin ``name`` is not loaded, when the loading filters left it out
        (``SPARSETORCH_DISABLE_PLUGINS``, ``SPARSETORCH_PLUGINS`` as read when these backends were
        loaded, or ``reset_backends(entry_points=False)``); None when no such plugin is installed
        or no filter applies. Reads the installed entry points (an error path)."""
        try:
            eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        except Exception:  # noqa: BLE001 - an explanation only
            return None
        if not eps:
            return None
        dist = getattr(eps[0], "dist", None)
        what = f"installed ({dist.name} {dist.version})" if dist is not None else "installed"
        again = "then call sparsetorch.backend.reset_backends() (or start a new process)"
        if self._filters is None:
            return f"is {what} but these backends were loaded without entry points (reset_backends(entry_points=False)); {again}"
        raw_disable, raw_allow = self._filters
        disable = {x.strip() for x in raw_disable.split(",") if x.strip()} or None
        allow = {x.strip() for x in raw_allow.split(",") if x.strip()} or None
        if _disables_all(disable):
            return (f"is {what} but disabled by SPARSETORCH_DISABLE_PLUGINS={raw_disable!r} (every external plugin); "
                    f"unset it, {again}")
        if disable and name in disable:
            return (f"is {what} but disabled by SPARSETORCH_DISABLE_PLUGINS={raw_disable!r}; remove {name!r} from it, "
                    f"{again}")
        if allow is not None and name not in allow:
            return (f"is {what} but filtered out by SPARSETORCH_PLUGINS={raw_allow!r} (the allow-list of external "
                    f"plugins); add {name!r} to it or unset it, {again}")
        return None

    def filters_text(self) -> str:
        """The loading filters as read, for messages: ``SPARSETORCH_DISABLE_PLUGINS='scipy', SPARSETORCH_PLUGINS unset``."""
        if self._filters is None:
            return "entry points not loaded"
        return ", ".join(f"{var}={raw!r}" if raw else f"{var} unset"
                         for var, raw in zip(("SPARSETORCH_DISABLE_PLUGINS", "SPARSETORCH_PLUGINS"), self._filters))

    def _unknown_hooks(self, plugin: Any) -> str | None:
        """pluggy's ``PluginValidationError`` text for a hook of ``plugin`` that no hookspec
        declares (a misspelled ``@hookimpl def sparsetorch_offer``), with the nearest hook name;
        None when every hook is known (or marked ``optionalhook``)."""
        import difflib  # noqa: PLC0415 - the error path only

        for caller in self._pm.get_hookcallers(plugin) or ():
            if caller.has_spec() or all(i.optionalhook for i in caller.get_hookimpls() if i.plugin is plugin):
                continue
            specs = sorted(n for n, c in vars(self._pm.hook).items()
                           if isinstance(c, pluggy.HookCaller) and c.has_spec())
            close = difflib.get_close_matches(caller.name, specs, n=1)
            exc = pluggy.PluginValidationError(plugin, f"unknown hook {caller.name!r} in plugin {plugin!r}")
            return (f"{type(exc).__name__}: {exc}" + (f" (did you mean {close[0]!r}?)" if close else "")
                    + f"; hooks: {', '.join(specs)}")
        return None

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
        self._conversions = None
        self.generation = next(_GENERATIONS)

    def unregister(self, name: str) -> None:
        plugin = self._plugins.pop(name, None)
        if plugin is not None:
            self._pm.unregister(plugin)
        self._info.pop(name, None)
        self.broken = [b for b in self.broken if b.name != name]
        self._conversions = None
        self.generation = next(_GENERATIONS)

    # Typed facade -----------------------------------------------------------------------------
    def conversion_kernel(self, name: str) -> Callable | None:
        """The compiled conversion step ``name`` (hookspecs.CONVERSION_KERNELS) of the backend of
        highest priority that offers it (then backend name order), or None. The table is built once
        per set of backends; a backend whose hook raises offers no kernel (the core's own code runs
        instead)."""
        return self._conversion_table().get(name)

    def _conversion_table(self) -> dict[str, Callable]:
        """``{step: kernel}`` of the backends loaded now, built once per set of backends."""
        table = self._conversions
        if table is None:
            found: dict[str, tuple[tuple[int, str], Callable]] = {}
            for impl in self._pm.hook.sparsetorch_conversion_kernels.get_hookimpls():
                owner = self._pm.get_name(impl.plugin)
                info = self._info.get(owner)
                if info is None:
                    continue
                try:
                    got = dict(impl.function() or {})
                except Exception:  # noqa: BLE001 - a broken hook offers nothing
                    continue
                rank = (-info.priority, owner)
                for key, fn in got.items():
                    if key in hookspecs.CONVERSION_KERNELS and callable(fn) and (key not in found or rank < found[key][0]):
                        found[key] = (rank, fn)
            self._conversion_owners = {k: rank[1] for k, (rank, _) in found.items()}  # before the table other threads test
            table = self._conversions = {k: fn for k, (_, fn) in found.items()}
        return table

    def conversion_kernel_owners(self) -> dict[str, str]:
        """``{step name: backend}`` for the compiled conversion steps in use (``sparsetorch info``)."""
        self._conversion_table()
        return dict(self._conversion_owners)

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
                if not isinstance(a, (Offer, Decline)):
                    out.append(Decline(name, f"returned {type(a).__name__}, not an Offer or Decline (plugin bug)"))
                    continue
                if a.backend != name:
                    a = type(a)(**{**a.__dict__, "backend": name})
                why = _undeclared_method(a, info, request.op) if isinstance(a, Offer) else None
                out.append(a if why is None else Decline(name, why, a.method))
        for b in self.broken:
            out.append(Decline(b.name, f"failed to load: {b.error}"))
        return out


def _disables_all(disable: set[str] | None) -> bool:
    """Whether ``SPARSETORCH_DISABLE_PLUGINS`` (its names) disables every external plugin."""
    return disable is not None and any(x.lower() in DISABLE_ALL for x in disable)


def _filtered(name: str, disable: set[str] | None, allow: set[str] | None) -> bool:
    """Whether the loading filters leave the external plugin ``name`` out."""
    return _disables_all(disable) or (disable is not None and name in disable) or (allow is not None and name not in allow)


def _undeclared_method(offer: Offer, info: BackendInfo, op: str) -> str | None:
    """Why ``offer`` is dropped when its method is not one of the core's ``METHODS`` or not one its
    backend declared for ``op`` in ``BackendInfo.ops`` (the method decides which checks, tolerances,
    gradients and fallbacks the core applies; ``method=``, ``explain`` and ``sparsetorch info`` read
    the declaration), else None."""
    declared = info.methods(op)
    if offer.method in declared:
        return None
    have = f"its declared {op} methods: {', '.join(declared) or 'none'}"
    if offer.method not in METHODS:
        return (f"plugin {info.name!r} offered method {offer.method!r}, which is not a sparsetorch method "
                f"({have}; known: {', '.join(METHODS)}); offer dropped (plugin bug)")
    return (f"plugin {info.name!r} offered method {offer.method!r} for {op}, which its BackendInfo does not declare "
            f"({have}); offer dropped (plugin bug: declare it in BackendInfo.ops or do not offer it)")


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


def _conversion_kernel(name: str) -> Callable | None:
    """The tensor layer's lookup of compiled conversion steps (``construct.set_conversion_kernel_lookup``)."""
    return get_backends().conversion_kernel(name)


_construct.set_conversion_kernel_lookup(_conversion_kernel)


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


# --- choosing ------------------------------------------------------------------------------------
log = logging.getLogger("sparsetorch.dispatch")


def _trace_enabled() -> bool:
    return os.environ.get("SPARSETORCH_TRACE", "").strip().lower() in ("1", "true", "yes", "on")


def _ensure_trace_handler() -> None:
    if not any(getattr(h, "_sparsetorch", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[sparsetorch] %(message)s"))
        h._sparsetorch = True  # type: ignore[attr-defined]
        log.addHandler(h)
        log.setLevel(logging.INFO)


def _ordered(offers: list[Offer], priorities: dict[str, int]) -> list[Offer]:
    """Cheapest first; offers within 1 % of the cheapest remaining one form a tie group, ordered
    by peak bytes, then higher priority, then backend name, then method name."""
    rest = sorted(offers, key=lambda o: (o.seconds, o.backend, o.method))
    out: list[Offer] = []
    while rest:
        lead = rest[0].seconds
        group = [o for o in rest if o.seconds <= lead * 1.01 + 1e-15]
        rest = [o for o in rest if o.seconds > lead * 1.01 + 1e-15]
        out += sorted(group, key=lambda o: (o.bytes, -priorities.get(o.backend, 0), o.backend, o.method))
    return out


def _amortized(offer: Offer, repeat: int, same: int = 1) -> Offer:
    """The offer priced per call when its pattern serves ``repeat`` calls and its present values
    ``same`` calls: the one-time setup shared among the former, the factorization among the latter."""
    notes = []
    seconds, setup, factor = offer.seconds, offer.setup, offer.factor
    if setup > 0 and repeat > 1:
        seconds, setup = seconds - setup + setup / repeat, setup / repeat
        notes.append(f"one-time setup {_fmt_seconds(offer.setup)} spread over {repeat} calls")
    if factor > 0 and same > 1:
        seconds, factor = seconds - factor + factor / same, factor / same
        notes.append(f"factorization {_fmt_seconds(offer.factor)} spread over {same} calls on the same values")
    if not notes:
        return offer
    return replace(offer, seconds=max(seconds, 0.0), setup=min(setup, max(seconds, 0.0)),
                   factor=min(factor, max(seconds - setup, 0.0)),
                   notes=(offer.notes + "; " if offer.notes else "") + "; ".join(notes))


def _honour_preconditioner(request: Request, offers: list[Offer]) -> tuple[list[Offer], list[Decline]]:
    """With ``preconditioner=`` given, only offers that use it: a direct method would ignore it,
    and an iterative offer with another preconditioner is not what was asked (one rule in the
    core, whatever each backend does with the name)."""
    pre = request.option("preconditioner")
    if pre is None:
        return offers, []
    asked = preconditioner_name(pre)
    keep: list[Offer] = []
    out: list[Decline] = []
    for o in offers:
        have = preconditioner_name(o.preconditioner) or "none"
        if o.direct:
            out.append(Decline(o.backend, f"a preconditioner was requested ({asked!r}), but {o.method} is a direct "
                                          f"method; drop preconditioner= to use it", o.method))
        elif have != asked:
            out.append(Decline(o.backend, f"its {o.method} offer uses preconditioner {have!r}, not the {asked!r} "
                                          f"asked for", o.method))
        else:
            keep.append(o)
    return keep, out


#: ``backend_options`` keys the core reads itself, whatever the backend: ``allow_transfer`` (a CPU
#: backend may be offered device operands, copied) and ``dimension`` (the matrix's geometric
#: dimension, which the iterative cost models read; docs/dispatch.md)
CORE_BACKEND_OPTIONS = ("allow_transfer", "dimension")


def unknown_method(op: str, method: Any) -> str | None:
    """A sentence naming ``method`` when no loaded backend declares it for ``op`` (a typo, or a method
    of another op: ``solve(method='lsqr')``), with the methods that exist; None otherwise."""
    if not isinstance(method, str):
        return None
    try:
        infos = get_backends().info()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - an explanation only
        return None
    known = sorted({m for i in infos for m in i.ops.get(op, ())})
    if not known or method in known:
        return None
    import difflib

    close = difflib.get_close_matches(method, known, n=1)
    other = sorted(o for i in infos for o, ms in i.ops.items() if method in ms and o != op)
    hint = (f" (it is a method of {other[0]}: use sparsetorch.{other[0]})" if other
            else f" (did you mean {close[0]!r}?)" if close else "")
    return f"method {method!r} is not a {op} method of any loaded backend{hint}; {op} methods: {', '.join(known)}."


def check_backend_options(backends: "Backends", backend_options: Any, want_backend: str | None) -> None:
    """An ``InputError`` for a ``backend_options`` key that no backend in reach reads (a misspelled
    key would otherwise be ignored without a word): the pinned backend's keys, or every loaded
    backend's, plus the core's. Backends that do not declare their keys (``BackendInfo.options``
    None: third-party plugins) make every key possible, and nothing is checked."""
    if not backend_options:
        return
    infos = [i for i in backends.info() if want_backend is None or i.name == want_backend]  # type: ignore[union-attr]
    if not infos or any(i.options is None for i in infos):
        return
    known = set(CORE_BACKEND_OPTIONS).union(*(i.options or () for i in infos))
    unknown = sorted(str(k) for k in backend_options if k not in known)
    if not unknown:
        return
    import difflib

    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    where = f"backend {want_backend!r}" if want_backend is not None else \
        f"any loaded backend ({', '.join(sorted(i.name for i in infos))})"
    readers = {i.name: sorted(i.options or ()) for i in infos}
    listing = "; ".join(f"{name}: {', '.join(keys) or '(none)'}" for name, keys in sorted(readers.items()))
    raise InputError(f"backend_options {', '.join(hints)} {'is' if len(unknown) == 1 else 'are'} not read by "
                     f"{where} nor by the core, so {'it' if len(unknown) == 1 else 'they'} would have no effect. "
                     f"Keys read: core: {', '.join(CORE_BACKEND_OPTIONS)}; {listing}. A key of a backend that "
                     f"is not installed here has no effect either: install its plugin or drop the key")


def rank(request: Request) -> ExplainTable:
    """All candidates for ``request``, best first, declines after (constraints applied)."""
    backends = get_backends()
    want_backend = request.option("backend")
    check_backend_options(backends, request.option("backend_options"), want_backend)
    answers = backends.offers(request)
    want_method = request.option("method")
    max_bytes = request.option("max_bytes")
    known = set(backends.names) | {b.name for b in backends.broken}
    if want_backend is not None and want_backend not in known:
        why = backends.not_loaded(want_backend) if isinstance(want_backend, str) else None
        if why is not None:
            raise NoBackendError(f"backend={want_backend!r} is not loaded: it {why}; loaded backends: "
                                 f"{sorted(backends.names)} ({backends.filters_text()})")
        raise NoBackendError(
            f"backend={want_backend!r} is not loaded{backend_hint(want_backend, known)}; loaded backends: "
            f"{sorted(backends.names)}"
            + (f"; broken: {[b.name for b in backends.broken]}" if backends.broken else "")
            + ". Install its plugin (pip install sparsetorch-<name>) or check SPARSETORCH_PLUGINS"
        )
    offers: list[Offer] = []
    declines: list[Decline] = []
    for a in answers:
        if isinstance(a, Decline):
            declines.append(a)
        elif want_backend is not None and a.backend != want_backend:
            declines.append(Decline(a.backend, f"not the requested backend={want_backend!r}", a.method))
        elif want_method is not None and a.method != want_method:
            declines.append(Decline(a.backend, f"not the requested method={want_method!r}", a.method))
        elif max_bytes is not None and a.bytes > max_bytes:
            declines.append(Decline(a.backend, f"needs {_fmt_bytes(a.bytes)} > max_bytes={_fmt_bytes(max_bytes)}", a.method))
        else:
            offers.append(a)
    if request.op == "solve":
        offers, kept = _honour_preconditioner(request, offers)
        declines += kept
        offers, weighed = weigh(request, offers)
        declines += weighed
    repeat = request.option("repeat")
    repeat = repeat if isinstance(repeat, int) and repeat > 1 else 1
    same = request.same_values
    if repeat > 1 or same > 1:
        offers = [_amortized(o, repeat, same) for o in offers]
    prio = {i.name: i.priority for i in backends.info()}  # type: ignore[union-attr]
    offers = _ordered(offers, prio)
    rows = [Row(o.backend, o.method, o.seconds, o.bytes, k == 0, o.notes, o) for k, o in enumerate(offers)]
    rows += [Row(d.backend, d.method, None, None, False, d.reason) for d in declines]
    table = ExplainTable(request, rows)
    if _trace_enabled():
        _ensure_trace_handler()
        c = table.chosen
        if c is None:
            log.info("%s: no backend can do it\n%s", request.op, table)
        else:
            log.info("%s -> %s/%s (est. %s)\n%s", request.op, c.backend, c.method, _fmt_seconds(c.seconds or 0.0), table)
    return table


_DECISIONS: "LRU[Any, tuple[Offer, ExplainTable]]" = LRU("dispatch decisions", 256)


def clear_decisions() -> None:
    """Forget the remembered dispatch decisions (the next call of each request asks the backends)."""
    _DECISIONS.clear()


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an option value: metadata only (tensors by shape/dtype/device,
    callables and other objects by identity)."""
    import torch  # noqa: PLC0415

    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    try:
        hash(value)
    except TypeError:
        return ("object", type(value).__name__, id(value))
    return ("id", id(value)) if callable(value) else value


def _decision_key(request: Request) -> Any:
    if os.environ.get("SPARSETORCH_DISPATCH_CACHE", "1").lower() in ("0", "false", "no", "off") or _trace_enabled():
        return None
    try:
        key = (request.op, request.operands, request.properties, request.requires_grad, request.measured, request.same_values,
               tuple(sorted((k, _freeze(v)) for k, v in request.options.items() if k != "callback")),
               get_backends().generation, os.environ.get("SPARSETORCH_CALIBRATION"))
        hash(key)
    except TypeError:
        return None
    return key


def choose(request: Request) -> tuple[Offer, ExplainTable]:
    """The best offer for ``request``, or :class:`NoBackendError` listing every decline."""
    key = _decision_key(request)
    if key is not None:
        hit = _DECISIONS.get(key)
        if hit is not None:
            return hit
    offer, table = _choose(request)
    if key is not None:
        _DECISIONS.put(key, (offer, table))
    return offer, table


def _choose(request: Request) -> tuple[Offer, ExplainTable]:
    table = rank(request)
    chosen = table.chosen
    if chosen is None or chosen.offer is None:
        reasons = "\n".join(f"  - {r.backend}{'/' + r.method if r.method else ''}: {r.reason}" for r in table.declines)
        lead = unknown_method(request.op, request.option("method"))
        raise NoBackendError(
            f"{lead + ' ' if lead else ''}no backend can do {request.op} for A {tuple(request.A.shape)} ({request.A.dtype}, "
            f"{request.A.device}) with options {dict(_visible(request.options))}. Candidates:\n"
            f"{reasons or '  (no backend loaded)'}",
            table,
        )
    return chosen.offer, table


def _visible(options: dict[str, Any]):
    return {k: v for k, v in options.items() if v is not None and k not in ("callback",)}.items()


#: other libraries' backend names (torch-sla's) for ours
_ALIASES = {"pytorch": "torch", "native": "torch", "eigen3": "eigen", "cusparse": "cupy"}


def backend_hint(name: str, known) -> str:
    """`` (did you mean 'torch'?)`` for a backend name that is another library's spelling or a near miss of
    a loaded one, else ``""``."""
    import difflib  # noqa: PLC0415 - the error path only

    guess = _ALIASES.get(str(name).lower())
    if guess is None or guess not in known:
        close = difflib.get_close_matches(str(name).lower(), sorted(known), n=1, cutoff=0.6)
        guess = close[0] if close else None
    return f" (did you mean {guess!r}?)" if guess else ""
