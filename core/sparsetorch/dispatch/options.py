"""Typed option records: what a call asked for, validated once in the core, defaults in one place.

The public functions keep their keyword arguments (nobody has to build a record); the op turns
them into a frozen record, which is what plugins receive as ``request.options`` and, for the
per-call part, as the ``options`` argument of ``plan.solve``. A record is also a read-only
``Mapping`` of its field names, so ``request.option("rtol")`` and ``options.get("maxiter")`` keep
working; new code reads attributes (``options.rtol``).

Defaults that several backends share live here (:data:`DEFAULT_RESTART`,
:data:`DEFAULT_CHECK_EVERY`): a field left ``None`` means "the standard default", and
:meth:`SolveOptions.restart_or_default` / :meth:`CallOptions.check_every_or_default` give it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Mapping

from ..errors import InputError
from .records import preconditioner_name

__all__ = ["SolveOptions", "CallOptions", "DEFAULT_RESTART", "DEFAULT_CHECK_EVERY", "CALL_FIELDS"]

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
    """A frozen dataclass that reads as a Mapping of its fields."""

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

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
        self._names()
        return key in type(self).__dict__["_field_set"]

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]



@dataclass(frozen=True, eq=False)
class CallOptions(_Record):
    """The per-call part of a solve: what ``plan.solve(B, adjoint=, options=)`` receives.

    ``rtol`` is already resolved to a number (the contract's default for the dtype when the
    caller gave none); ``atol`` absolute; ``maxiter`` None for the method's own bound;
    ``check_every`` None for :data:`DEFAULT_CHECK_EVERY`; ``callback(iteration, residual)``."""

    rtol: float | None = None
    atol: float = 0.0
    maxiter: int | None = None
    check_every: int | None = None
    callback: Callable[[int, float], Any] | None = None

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
        self.__dict__.update(rtol=rtol, atol=atol, maxiter=maxiter, check_every=check_every, callback=callback)
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
        for name in ("maxiter", "restart", "block_size", "dense_max", "check_every"):
            _positive_int(name, getattr(self, name))
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int)
                                           or self.max_bytes < 0):
            raise InputError(f"max_bytes must be a non-negative int or None, got {self.max_bytes!r}")
        if self.repeat is not None and (isinstance(self.repeat, bool) or not isinstance(self.repeat, int)
                                        or self.repeat < 1):
            raise InputError(f"repeat must be a positive int (how many solves this pattern will serve) or None, "
                             f"got {self.repeat!r}")
        for name in ("backend", "method"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise InputError(f"{name} must be a name (str) or None, got {type(v).__name__} {v!r}")
        if self.callback is not None and not callable(self.callback):
            raise InputError(f"callback must be callable(iteration, residual) or None, got {self.callback!r}")
        if self.preconditioner is not None and not callable(self.preconditioner):
            object.__setattr__(self, "preconditioner", preconditioner_name(self.preconditioner))
        bo = self.backend_options
        if bo is None:
            bo = {}
        if not isinstance(bo, Mapping):
            raise InputError(f"backend_options must be a dict of options for the backends, got {type(bo).__name__}")
        object.__setattr__(self, "backend_options", dict(bo))  # a copy: the caller's dict is not kept

    def restart_or_default(self) -> int:
        return self.restart or DEFAULT_RESTART

    def call(self, rtol: float | None = None) -> CallOptions:
        """The per-call part (``rtol`` resolved by the caller when given)."""
        return CallOptions(self.rtol if rtol is None else rtol, self.atol, self.maxiter, self.check_every,
                           self.callback)
