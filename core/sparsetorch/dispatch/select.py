"""Choosing a backend: user constraints, then the lowest estimated cost, then a fixed tie-break.

The rule, in order:

1. Collect every backend's offers and declines for the request.
2. Drop offers that break a user constraint, turning each into a decline that says which:
   ``backend=`` (pin a backend), ``method=`` (pin a method), ``max_bytes=`` (memory budget).
   Devices and dtypes a backend did not declare in its ``BackendInfo`` are declined for it
   by the core, with a generated reason.
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

import logging
import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..errors import NoBackendError
from .experience import weigh
from .lru import LRU
from .manager import get_backends
from .records import Decline, Offer, Request, preconditioner_name

__all__ = ["Row", "ExplainTable", "rank", "choose", "clear_decisions"]

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


@dataclass(frozen=True)
class Row:
    """One line of an explain table: an offer (with its rank) or a decline (with its reason)."""

    backend: str
    method: str | None
    seconds: float | None
    bytes: int | None
    chosen: bool
    reason: str
    offer: Offer | None = None


class ExplainTable(Sequence[Row]):
    """The ranked candidates for one request; ``str()`` prints it as a table."""

    def __init__(self, request: Request, rows: list[Row]) -> None:
        self.request = request
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):  # type: ignore[override]
        return self.rows[i]

    @property
    def chosen(self) -> Row | None:
        return next((r for r in self.rows if r.chosen), None)

    @property
    def offers(self) -> list[Row]:
        return [r for r in self.rows if r.offer is not None]

    @property
    def declines(self) -> list[Row]:
        return [r for r in self.rows if r.offer is None]

    def __str__(self) -> str:
        A = self.request.A
        head = (f"{self.request.op}: A {tuple(A.shape)} {A.format.name or A.format if A.format else A.kind}, "
                f"nse={A.nse}, {str(A.dtype).replace('torch.', '')} on {A.device}"
                + (f", properties: {', '.join(sorted(self.request.properties))}" if self.request.properties else ""))
        lines = [head, f"  {'':2}{'backend':<12}{'method':<10}{'est. time':>12}{'peak bytes':>14}  notes / reason"]
        for r in self.rows:
            mark = "->" if r.chosen else "  "
            t = _fmt_seconds(r.seconds) if r.seconds is not None else "-"
            b = _fmt_bytes(r.bytes) if r.bytes is not None else "-"
            lines.append(f"  {mark}{r.backend:<12}{(r.method or '-'):<10}{t:>12}{b:>14}  {r.reason}")
        return "\n".join(lines)

    __repr__ = __str__


def _fmt_seconds(s: float) -> str:
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _fmt_bytes(b: int) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b} B"


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


def _amortized(offer: Offer, repeat: int) -> Offer:
    """The offer priced per call when its pattern serves ``repeat`` calls: the one-time setup
    shared among them."""
    if offer.setup <= 0:
        return offer
    share = offer.setup / repeat
    return replace(offer, seconds=offer.seconds - offer.setup + share, setup=share,
                   notes=(offer.notes + "; " if offer.notes else "")
                   + f"one-time setup {_fmt_seconds(offer.setup)} spread over {repeat} calls")


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


def rank(request: Request) -> ExplainTable:
    """All candidates for ``request``, best first, declines after (constraints applied)."""
    backends = get_backends()
    answers = backends.offers(request)
    want_backend = request.option("backend")
    want_method = request.option("method")
    max_bytes = request.option("max_bytes")
    known = set(backends.names) | {b.name for b in backends.broken}
    if want_backend is not None and want_backend not in known:
        raise NoBackendError(
            f"backend={want_backend!r} is not loaded; loaded backends: {sorted(backends.names)}"
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
    if isinstance(repeat, int) and repeat > 1:
        offers = [_amortized(o, repeat) for o in offers]
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
        key = (request.op, request.operands, request.properties, request.requires_grad, request.measured,
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
        raise NoBackendError(
            f"no backend can do {request.op} for A {tuple(request.A.shape)} ({request.A.dtype}, {request.A.device}) "
            f"with options {dict(_visible(request.options))}. Candidates:\n{reasons or '  (no backend loaded)'}",
            table,
        )
    return chosen.offer, table


def _visible(options: dict[str, Any]):
    return {k: v for k, v in options.items() if v is not None and k not in ("callback",)}.items()
