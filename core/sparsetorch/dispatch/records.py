"""The typed records that cross the plugin boundary.

A backend describes itself once with :class:`BackendInfo`; for each concrete :class:`Request`
it answers with :class:`Offer` (it can, at this estimated cost, with this plan factory) or
:class:`Decline` (it cannot, and why). The dispatcher validates every record it receives, so a
misbehaving plugin is reported by name instead of breaking a call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..format import TensorFormat

from ..errors import InputError

__all__ = ["BackendInfo", "OperandInfo", "Request", "Offer", "Decline", "OPS", "METHODS", "DIRECT_METHODS", "Measured", "preconditioner_name",
           "make_request"]

#: Operations a backend may implement.
OPS = ("matmul", "solve", "eigsh", "eigs", "logdet", "lstsq", "solve_list")

#: One vocabulary of method names across backends.
METHODS = (
    "spmm", "lu", "cholesky", "ldlt", "qr", "dense", "cg", "bicgstab", "gmres", "lgmres", "minres",
    "tfqmr", "gcrotmk", "cgs", "lsqr", "lsmr", "amg", "arpack", "lobpcg", "lanczos",
)


#: Methods that factor the matrix (their answer does not depend on a tolerance).
DIRECT_METHODS = frozenset({"lu", "cholesky", "ldlt", "qr", "dense"})


@dataclass(frozen=True)
class BackendInfo:
    """What a backend is and can do, declared once (the cheap, static stage of capability)."""

    name: str
    version: str
    description: str
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    ops: Mapping[str, tuple[str, ...]]
    formats: tuple[TensorFormat, ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    distribution: str | None = None
    #: the ``backend_options`` keys this backend reads; None: not declared (the core then cannot
    #: tell a caller's misspelled key from one this backend reads, and checks none)
    options: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.options is not None:
            if isinstance(self.options, str) or not all(isinstance(k, str) for k in self.options):
                raise ValueError(f"backend {self.name!r}: options must be a tuple of backend_options key names, "
                                 f"got {self.options!r}")
            object.__setattr__(self, "options", tuple(self.options))
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"backend name must be alphanumeric (with - or _), got {self.name!r}")
        for op, methods in self.ops.items():
            if op not in OPS:
                raise ValueError(f"backend {self.name!r} declares unknown op {op!r}; known: {OPS}")
            bad = [m for m in methods if m not in METHODS]
            if bad:
                raise ValueError(f"backend {self.name!r} declares unknown methods {bad} for {op!r}; known: {METHODS}")

    def methods(self, op: str) -> tuple[str, ...]:
        return tuple(self.ops.get(op, ()))


@dataclass(frozen=True)
class OperandInfo:
    """Metadata of one operand (what a backend may inspect without touching data)."""

    kind: str  # "sparse" | "dense" | "sparse_list"
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    format: TensorFormat | None = None
    nse: int | None = None
    batch_shape: tuple[int, ...] = ()
    requires_grad: bool = False
    #: the growth dimension of a square sparse operand's graph, measured by the core where it
    #: prices factorizations (``ops/_graph.py``: about d for a d-dimensional mesh, more for an
    #: expander); None when not measured or mesh-like. Read it through :func:`fill_dimension`.
    graph_dimension: float | None = None
    #: how a square sparse operand's graph falls apart into independent pieces (a block-diagonal
    #: matrix): groups ``(size, entries per row, count)``, measured with ``graph_dimension``
    #: (``ops/_graph.py: graph_components``); None when it is one piece (or not measured). The
    #: shared fill tables (:func:`lu_fill_flops`) price such a matrix piece by piece.
    components: tuple[tuple[int, float, int], ...] | None = None

    @property
    def n(self) -> int:
        return self.shape[-1]


@dataclass(frozen=True)
class Request:
    """One concrete request: the op, its operands' metadata, known properties and options.

    ``properties`` holds tags such as ``"symmetric"``, ``"hermitian"``, ``"spd"``,
    ``"nonsymmetric"`` (known from the user or detected cheaply). ``options`` are the user's
    keyword options (``method``, ``preconditioner``, ``rtol``, ``atol``, ``maxiter``, ...).
    """

    op: str
    operands: tuple[OperandInfo, ...]
    properties: frozenset[str] = frozenset()
    options: Mapping[str, Any] = field(default_factory=dict)
    requires_grad: bool = False
    #: what earlier calls on the same pattern measured, per (backend, method, preconditioner)
    #: (filled by the core; backends may read it, the core applies it to their offers)
    measured: tuple[tuple[tuple[str, str, str | None], "Measured"], ...] = ()
    #: calls expected on A's present values (filled by the core from the calls seen in a row on the
    #: same values, a power of two): offers' ``factor`` is spread over them
    same_values: int = 1

    @property
    def A(self) -> OperandInfo:
        return self.operands[0]

    @property
    def device(self) -> torch.device:
        return self.operands[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.operands[0].dtype

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    @property
    def rhs_columns(self) -> int:
        """Right-hand sides (or dense columns) per matrix, batch included."""
        if len(self.operands) < 2:
            return 1
        b = self.operands[1]
        nb = len(self.A.batch_shape)
        cols = b.shape[nb + 1:] if len(b.shape) > nb + 1 else ()
        return max(1, math.prod(cols)) * max(1, math.prod(self.A.batch_shape))


def make_request(op: str, operands: tuple[OperandInfo, ...], properties: frozenset[str], options: Mapping[str, Any],
                 measured: tuple[Any, ...] = ()) -> Request:
    """A request; ``options`` is the op's option record (``dispatch/options.py``), kept as it is
    (frozen), or a plain dict, copied."""
    requires_grad = any(o.requires_grad for o in operands)
    opts = dict(options) if isinstance(options, dict) else options
    return Request(op, operands, properties, opts, requires_grad, measured)


@dataclass(frozen=True)
class Measured:
    """What a method did on a pattern: the iterations an iterative one took to reach ``rtol`` (or
    ran before it stopped, ``converged=False``: then ``reason`` says why); for a direct one,
    ``seconds``, the least wall time of its whole attempt (plan, factorization, solve and check)
    over ``samples`` attempts, kept when each exceeded the backend's estimate several times over."""

    iterations: int
    rtol: float
    converged: bool
    reason: str = ""
    seconds: float | None = None
    #: how many attempts measured ``seconds`` (the least of them is kept); one is not trusted
    #: alone: a loaded machine stalls a call now and then
    samples: int = 0


@dataclass(frozen=True)
class Offer:
    """A backend can do the request with ``method`` at an estimated cost.

    ``seconds`` and ``bytes`` (peak extra memory) come from the backend's cost model;
    ``build(A, request)`` creates the plan. ``notes`` says what the cost includes (e.g. a
    format conversion) so ``explain`` can show it. ``setup`` is the part of ``seconds`` paid
    once per pattern (a symbolic analysis, a format conversion): when the pattern is expected
    to serve several calls (the ``repeat`` option, or the calls seen so far on it), dispatch
    spreads it over them. ``iterations`` is the estimated iteration count of an iterative method
    (None for a direct one): with it the core can weigh the estimate by what it knows of the
    matrix class and by the iterations measured on the same pattern, and bound an attempt by
    the cost of the direct method it delays (docs/dispatch.md, "Fallback").
    """

    backend: str
    method: str
    seconds: float
    bytes: int
    build: Callable[..., Any] = field(compare=False, repr=False)
    notes: str = ""
    preconditioner: str | None = None
    setup: float = 0.0
    iterations: int | None = None
    factor: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"offer from {self.backend!r} has invalid seconds={self.seconds!r}")
        if not (isinstance(self.setup, (int, float)) and math.isfinite(self.setup)
                and 0 <= self.setup <= self.seconds * (1 + 1e-9)):
            raise ValueError(f"offer from {self.backend!r} has invalid setup={self.setup!r}: the one-time part of "
                             f"seconds={self.seconds!r} must lie in [0, seconds]")
        if not (isinstance(self.factor, (int, float)) and math.isfinite(self.factor)
                and 0 <= self.factor and self.setup + self.factor <= self.seconds * (1 + 1e-9)):
            raise ValueError(f"offer from {self.backend!r} has invalid factor={self.factor!r}: the once-per-values part "
                             f"of seconds={self.seconds!r} must be >= 0 and, with setup={self.setup!r}, at most seconds")
        if not (isinstance(self.bytes, int) and self.bytes >= 0):
            raise ValueError(f"offer from {self.backend!r} has invalid bytes={self.bytes!r}")
        if not callable(self.build):
            raise ValueError(f"offer from {self.backend!r} has no callable plan factory")
        if self.iterations is not None and not (isinstance(self.iterations, int) and self.iterations >= 1):
            raise ValueError(f"offer from {self.backend!r} has invalid iterations={self.iterations!r} (a positive int "
                             f"or None for a direct method)")

    @property
    def direct(self) -> bool:
        """Whether the method is direct (a factorization: no iteration count, no tolerance)."""
        return self.method in DIRECT_METHODS


@dataclass(frozen=True)
class Decline:
    """A backend cannot do the request (or one method of it), and says why."""

    backend: str
    reason: str
    method: str | None = None


def preconditioner_name(pre: Any) -> str | None:
    """The canonical name of a ``preconditioner=`` argument, the one rule for every backend:
    None (the backend's default) stays None; a callable applying ``M^-1`` is ``"user"``; a
    string is lower-cased, with ``"identity"`` (and an empty string) meaning ``"none"`` (no
    preconditioner, asked for). Anything else is an input error."""
    if pre is None:
        return None
    if isinstance(pre, str):
        name = pre.strip().lower()
        return "none" if name in ("", "identity", "none") else name
    if callable(pre):
        return "user"
    raise InputError(f"preconditioner must be a name (e.g. 'jacobi'), None, or a callable applying M^-1; got "
                     f"{type(pre).__name__} {pre!r}")


# --- the ranking of one request (what explain prints) -------------------------------------------
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

    def __getitem__(self, i: Any) -> Any:
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
