"""Typed option records: what a call asked for, validated once in the core, defaults in one place.

One record per op family: :class:`SolveOptions` (solve, Solver, solve_list; its per-call part
:class:`CallOptions`), :class:`MatmulOptions`, :class:`SpectralOptions` (eigsh, eigs),
:class:`LstsqOptions`, :class:`LogdetOptions` (slogdet, logdet, det). The public functions keep
their keyword arguments (nobody has to build a record); the op turns them into a frozen record,
which is what plugins receive as ``request.options`` and, for the per-call part of a solve, as
the ``options`` argument of ``plan.solve``. A record is also a read-only
``Mapping`` of its field names, so ``request.option("rtol")`` and ``options.get("maxiter")`` keep
working; new code reads attributes (``options.rtol``).

Defaults that several backends share live here (:data:`DEFAULT_RESTART`,
:data:`DEFAULT_CHECK_EVERY`): a field left ``None`` means "the standard default", and
:meth:`SolveOptions.restart_or_default` / :meth:`CallOptions.check_every_or_default` give it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Mapping

from ..errors import InputError
from .records import preconditioner_name

__all__ = ["SolveOptions", "CallOptions", "MatmulOptions", "SpectralOptions", "LstsqOptions", "LogdetOptions",
           "defaults", "DEFAULT_RESTART", "DEFAULT_CHECK_EVERY", "CALL_FIELDS"]

#: restarted Krylov methods (GMRES, LGMRES): iterations per cycle unless ``restart=`` says
DEFAULT_RESTART = 30
#: iterative methods on a GPU: iterations between convergence checks (each check syncs the host)
DEFAULT_CHECK_EVERY = 8
#: the options that change from call to call on one plan (passed to ``plan.solve``)
CALL_FIELDS = ("rtol", "atol", "maxiter", "check_every", "callback")


def _positive_int(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InputError(f"{name} must be a positive int or None, got {value!r}")


def _tolerances(rtol: Any, atol: Any) -> None:
    if not (rtol is None or (isinstance(rtol, (int, float)) and not isinstance(rtol, bool) and rtol >= 0)) or not (
            isinstance(atol, (int, float)) and not isinstance(atol, bool) and atol >= 0):
        raise InputError(f"rtol and atol must be non-negative numbers (rtol=None: the accuracy contract's default for "
                         f"the dtype), got rtol={rtol!r}, atol={atol!r}")
    if rtol == 0 and atol == 0:
        raise InputError("rtol and atol are both 0: an iterative method could never stop; give one of them")


def _floats(record: Any) -> None:
    """rtol and atol as floats (after validation)."""
    if record.rtol is not None:
        object.__setattr__(record, "rtol", float(record.rtol))
    object.__setattr__(record, "atol", float(record.atol))


class _Record(Mapping[str, Any]):
    """A frozen dataclass that reads as a Mapping of its fields.

    The fields are the instance's ``__dict__`` (no other attribute is ever set on an instance),
    so reading an option costs what a dict lookup costs: dispatch reads them on every call."""

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dict__)

    def __len__(self) -> int:
        return len(self.__dict__)

    def items(self) -> Any:
        return self.__dict__.items()

    def keys(self) -> Any:
        return self.__dict__.keys()

    def values(self) -> Any:
        return self.__dict__.values()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"

    @classmethod
    def _names(cls) -> frozenset[str] | tuple[str, ...]:
        # the field names, computed once per class (a Mapping lookup per option read, on every call)
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
            cls._field_names = names  # type: ignore[attr-defined]
            cls._field_set = frozenset(names)  # type: ignore[attr-defined]
        return names

    def __contains__(self, key: object) -> bool:
        return key in self.__dict__

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def trusted_replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` the core has validated itself (a resolved tolerance, a filled-in
        ``repeat``): no checks again, on the per-call path."""
        unknown = set(changes) - set(self._names())
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.__dict__.update(changes)
        return out


def defaults(cls: type) -> dict[str, Any]:
    """The keyword defaults of a record class (``None`` for a field made by a factory)."""
    return {f.name: (None if f.default is dataclasses.MISSING else f.default) for f in fields(cls)}


def _name(record: Any, *names: str) -> None:
    for name in names:
        v = getattr(record, name)
        if v is not None and not isinstance(v, str):
            raise InputError(f"{name} must be a name (str) or None, got {type(v).__name__} {v!r}")


def _backend_options(record: Any) -> None:
    bo = record.backend_options
    if bo is None:
        bo = {}
    if not isinstance(bo, Mapping):
        raise InputError(f"backend_options must be a dict of options for the backends, got {type(bo).__name__}")
    object.__setattr__(record, "backend_options", dict(bo))  # a copy: the caller's dict is not kept



@dataclass(frozen=True, eq=False)
class CallOptions(_Record):
    """The per-call part of a solve: what ``plan.solve(B, adjoint=, options=)`` receives.

    ``rtol`` is already resolved to a number (the contract's default for the dtype when the
    caller gave none); ``atol`` absolute; ``maxiter`` None for the method's own bound;
    ``check_every`` None for :data:`DEFAULT_CHECK_EVERY`; ``callback(iteration, residual)``;
    ``stagnation``: the method may stop early when its residual stops improving (no 1 % gain in
    max(1000, n) iterations), set by the core where a direct method waits behind a method dispatch
    chose and the caller gave no ``maxiter`` (a plugin that cannot tell ignores it)."""

    rtol: float | None = None
    atol: float = 0.0
    maxiter: int | None = None
    check_every: int | None = None
    callback: Callable[[int, float], Any] | None = None
    stagnation: bool = False

    def __post_init__(self) -> None:
        _tolerances(self.rtol, self.atol)
        _floats(self)
        _positive_int("maxiter", self.maxiter)
        _positive_int("check_every", self.check_every)
        if self.callback is not None and not callable(self.callback):
            raise InputError(f"callback must be callable(iteration, residual) or None, got {self.callback!r}")

    def check_every_or_default(self) -> int:
        return self.check_every or DEFAULT_CHECK_EVERY

    @classmethod
    def trusted(cls, rtol: float | None, atol: float, maxiter: int | None, check_every: int | None,
                callback: Callable[[int, float], Any] | None) -> "CallOptions":
        """A record from values the core validated already (a ``SolveOptions``' fields): no
        checks again, on the per-call path of every solve."""
        self = object.__new__(cls)
        # the instance dict filled at once (what object.__setattr__ per field does, at half the cost)
        self.__dict__.update(rtol=rtol, atol=atol, maxiter=maxiter, check_every=check_every, callback=callback,
                             stagnation=False)
        return self


@dataclass(frozen=True, eq=False)
class SolveOptions(_Record):
    """Every option of ``solve`` / ``Solver`` after validation (``request.options`` of op "solve").

    ``preconditioner`` is canonical (:func:`~sparsetorch.dispatch.records.preconditioner_name`:
    lower case, ``"identity"`` is ``"none"``) unless it is a callable, kept as given.
    ``backend_options`` is a copy of the caller's dict (plugins read it, never write it)."""

    backend: str | None = None
    method: str | None = None
    preconditioner: Any = None
    rtol: float | None = None
    atol: float = 0.0
    maxiter: int | None = None
    restart: int | None = None
    block_size: int | None = None
    dense_max: int | None = None
    max_bytes: int | None = None
    callback: Callable[[int, float], Any] | None = None
    check_every: int | None = None
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    repeat: int | None = None

    def __post_init__(self) -> None:
        _tolerances(self.rtol, self.atol)
        _floats(self)
        d = self.__dict__
        for name in ("maxiter", "restart", "block_size", "dense_max", "check_every"):
            if d[name] is not None:  # the common case (None) without a call: this runs on every solve
                _positive_int(name, d[name])
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int)
                                           or self.max_bytes < 0):
            raise InputError(f"max_bytes must be a non-negative int or None, got {self.max_bytes!r}")
        if self.repeat is not None and (isinstance(self.repeat, bool) or not isinstance(self.repeat, int)
                                        or self.repeat < 1):
            raise InputError(f"repeat must be a positive int (how many solves this pattern will serve) or None, "
                             f"got {self.repeat!r}")
        _name(self, "backend", "method")
        if self.callback is not None and not callable(self.callback):
            raise InputError(f"callback must be callable(iteration, residual) or None, got {self.callback!r}")
        if self.preconditioner is not None and not callable(self.preconditioner):
            object.__setattr__(self, "preconditioner", preconditioner_name(self.preconditioner))
        _backend_options(self)

    def restart_or_default(self) -> int:
        return self.restart or DEFAULT_RESTART

    def call(self, rtol: float | None = None) -> CallOptions:
        """The per-call part (``rtol`` resolved by the caller when given)."""
        return CallOptions(self.rtol if rtol is None else rtol, self.atol, self.maxiter, self.check_every,
                           self.callback)


@dataclass(frozen=True, eq=False)
class MatmulOptions(_Record):
    """The options of ``matmul`` / ``Matmul`` (``request.options`` of op "matmul")."""

    backend: str | None = None
    #: calls the pattern is expected to serve: filled in by the core from the calls seen on it,
    #: so one-time setups (a conversion) are priced per call (not a keyword of the op)
    repeat: int | None = None

    def __post_init__(self) -> None:
        _name(self, "backend")


@dataclass(frozen=True, eq=False)
class LogdetOptions(_Record):
    """The options of ``slogdet`` / ``logdet`` / ``det`` that choose a plan (``request.options`` of
    op "logdet"); the gradient's options (``grad_method``, ``probes``) stay with the op."""

    backend: str | None = None
    method: str | None = None
    #: calls the pattern is expected to serve: filled in by the core from the calls seen on it,
    #: so one-time setups (a conversion) are priced per call (not a keyword of the op)
    repeat: int | None = None

    def __post_init__(self) -> None:
        _name(self, "backend", "method")


@dataclass(frozen=True, eq=False)
class SpectralOptions(_Record):
    """The options of ``eigsh`` and ``eigs`` (``request.options`` of ops "eigsh" and "eigs").

    ``which`` is the op's spelling (checked by the op against its list: eigsh "LA", "SA", "LM",
    "SM"; eigs adds "LR", "SR", "LI", "SI"); ``tol`` 0 means the accuracy contract's default for
    the dtype; ``sigma`` a shift (real for eigsh, complex allowed for eigs) or None;
    ``generalized``: a mass matrix ``M`` was given (eigsh)."""

    backend: str | None = None
    method: str | None = None
    k: int = 6
    which: str = "LM"
    sigma: Any = None
    tol: float = 0.0
    maxiter: int | None = None
    dense_max: int | None = None
    generalized: bool = False
    #: calls the pattern is expected to serve: filled in by the core from the calls seen on it,
    #: so one-time setups (a conversion) are priced per call (not a keyword of the op)
    repeat: int | None = None

    def __post_init__(self) -> None:
        _name(self, "backend", "method", "which")
        _positive_int("k", self.k)
        _positive_int("maxiter", self.maxiter)
        if self.dense_max is not None and (isinstance(self.dense_max, bool) or not isinstance(self.dense_max, int)
                                           or self.dense_max < 0):
            raise InputError(f"dense_max must be a non-negative int or None (0: the method's default), "
                             f"got {self.dense_max!r}")
        if not (isinstance(self.tol, (int, float)) and not isinstance(self.tol, bool) and self.tol >= 0):
            raise InputError(f"tol must be a non-negative number (0: the accuracy contract's default), got {self.tol!r}")
        object.__setattr__(self, "tol", float(self.tol))
        object.__setattr__(self, "generalized", bool(self.generalized))


@dataclass(frozen=True, eq=False)
class LstsqOptions(_Record):
    """The options of ``lstsq`` / ``Lstsq`` (``request.options`` of op "lstsq").

    LSQR/LSMR's tolerances: a least-squares solution stops when ``||A^H r|| <= atol ||A|| ||r||``,
    a compatible system when ``||r|| <= btol ||b|| + atol ||A|| ||x||``; ``conlim`` bounds the
    estimated condition number. ``atol=None``/``btol=None`` follow the accuracy contract
    (:meth:`resolved` sets them to the dtype's default_rtol: 1e-10 in float64, 1e-5 in float32)."""

    backend: str | None = None
    method: str | None = None
    damp: float = 0.0
    atol: float | None = None
    btol: float | None = None
    conlim: float = 1e8
    maxiter: int | None = None
    max_bytes: int | None = None
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    #: calls the pattern is expected to serve: filled in by the core from the calls seen on it,
    #: so one-time setups (a conversion) are priced per call (not a keyword of the op)
    repeat: int | None = None

    def __post_init__(self) -> None:
        _name(self, "backend", "method")
        for name in ("damp", "atol", "btol"):
            v = getattr(self, name)
            if v is None and name != "damp":
                continue
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and math.isfinite(v)):
                raise InputError(f"lstsq: {name} must be a finite number >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.atol == 0 and self.btol == 0:
            raise InputError("lstsq: atol and btol are both 0: the iteration could never stop; give one of them "
                             "(e.g. 1e-10)")
        if not (isinstance(self.conlim, (int, float)) and self.conlim > 0):
            raise InputError(f"lstsq: conlim must be a positive number (0 is not allowed; use 1e16 for no limit), "
                             f"got {self.conlim!r}")
        object.__setattr__(self, "conlim", float(self.conlim))
        if self.maxiter is not None and (not isinstance(self.maxiter, int) or self.maxiter < 1):
            raise InputError(f"lstsq: maxiter must be a positive int or None, got {self.maxiter!r}")
        _backend_options(self)

    def resolved(self, rtol: float) -> "LstsqOptions":
        """``atol``/``btol`` left None set to ``rtol`` (the dtype's default_rtol)."""
        if self.atol is not None and self.btol is not None:
            return self
        return self.replace(atol=rtol if self.atol is None else self.atol,  # type: ignore[no-any-return]
                            btol=rtol if self.btol is None else self.btol)
