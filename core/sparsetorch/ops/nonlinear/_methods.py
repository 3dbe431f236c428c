"""The methods of ``nonlinear_solve`` as option records: ``Newton(...)``, ``Anderson(...)``,
``Picard(...)``, each carrying the options that method alone uses.

``nonlinear_solve(F, u0, params, method=Newton(line_search=False))`` pins that method with those
options. The string spellings (``method="newton"``) and the flat keywords (``line_search=``,
``depth=``, ...) keep working: :func:`resolve` turns them into the same records. A record and a
keyword for an option that records carry are never mixed: that raises, naming the field to set.

Operands stay arguments of ``nonlinear_solve``, not options: ``preconditioner=`` (a matrix, a
callable, or "jacobian", which depends on how the Jacobian is formed), ``jacobian=``,
``jac_pattern=``, ``linear_options=``; so do the tolerances ``rtol``/``atol``, which define
convergence for every method alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Union

from ...errors import InputError

__all__ = ["Newton", "Anderson", "Picard", "Method", "METHODS", "AUTO_ORDER", "UNSET", "resolve"]


class _Unset:
    """The default of the flat method keywords of ``nonlinear_solve``: "not given" (each method's
    own default applies), distinct from any value a caller could pass."""

    def __repr__(self) -> str:
        return "<the method's default>"


UNSET: Any = _Unset()


def _check_number(name: str, value: object, *, low: float, high: float = math.inf, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        raise InputError(f"nonlinear_solve: {name} must be a number in {lo}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _check_count(name: str, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"nonlinear_solve: {name}{what} must be an int >= 0, got {value!r}")
    return value


def _check_maxiter(value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InputError(f"nonlinear_solve: maxiter must be a positive int or None, got {value!r}")
    return value


@dataclass(frozen=True)
class Newton:
    """Newton's method: solve ``J du = -F``, then a backtracking (Armijo) line search on ``||F||``
    with a dogleg trust-region step where it fails (docs/nonlinear.md, "Methods").

    Args:
        line_search: backtrack (halving, at most ``max_backtracks`` times) until
            ``||F(u + a du)|| <= (1 - 1e-4 a) ||F(u)||``, and take a dogleg trust-region step where
            that fails; ``False``: plain Newton (full steps, no recovery).
        max_backtracks: the most halvings of one line search.
        maxiter: iteration limit of this method's attempt (None: 50).
    """

    line_search: bool = True
    max_backtracks: int = 20
    maxiter: int | None = None

    name: ClassVar[str] = "newton"
    default_maxiter: ClassVar[int] = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "line_search", bool(self.line_search))
        _check_count("max_backtracks", self.max_backtracks, "")
        _check_maxiter(self.maxiter)


@dataclass(frozen=True)
class Anderson:
    """Anderson acceleration (type II, Walker & Ni) of the fixed-point map
    ``G(u) = u - omega M^-1 F(u)`` (``M``: ``nonlinear_solve``'s ``preconditioner=``).

    Args:
        depth: memory, the number of previous differences mixed (0: damped Picard).
        damping: mixing ``beta`` in ``(0, 1]``: ``u + beta g - (dU + beta dG) gamma``.
        omega: the step of ``G``, > 0.
        maxiter: iteration limit of this method's attempt (None: 200).
    """

    depth: int = 5
    damping: float = 1.0
    omega: float = 1.0
    maxiter: int | None = None

    name: ClassVar[str] = "anderson"
    default_maxiter: ClassVar[int] = 200

    def __post_init__(self) -> None:
        _check_count("depth", self.depth, " (Anderson memory)")
        object.__setattr__(self, "damping", _check_number("damping", self.damping, low=0, high=1, low_open=True))
        object.__setattr__(self, "omega", _check_number("omega", self.omega, low=0, low_open=True))
        _check_maxiter(self.maxiter)


@dataclass(frozen=True)
class Picard:
    """Picard iteration ``u <- u + damping (G(u) - u)`` on ``G(u) = u - omega M^-1 F(u)``; for
    ``F(u) = u - g(u)`` with ``omega = damping = 1`` that is ``u <- g(u)``.

    Args:
        omega: the step of ``G``, > 0.
        damping: the fraction of the step taken, in ``(0, 1]``.
        maxiter: iteration limit of this method's attempt (None: 1000).
    """

    omega: float = 1.0
    damping: float = 1.0
    maxiter: int | None = None

    name: ClassVar[str] = "picard"
    default_maxiter: ClassVar[int] = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "damping", _check_number("damping", self.damping, low=0, high=1, low_open=True))
        object.__setattr__(self, "omega", _check_number("omega", self.omega, low=0, low_open=True))
        _check_maxiter(self.maxiter)


Method = Union[Newton, Anderson, Picard]

_CLASSES: dict[str, type] = {"newton": Newton, "anderson": Anderson, "picard": Picard}
METHODS = tuple(_CLASSES)
#: the order in which the library tries methods when the caller does not pin one
AUTO_ORDER = METHODS
#: the flat keywords of ``nonlinear_solve`` that method records carry
KEYWORDS = ("maxiter", "line_search", "max_backtracks", "depth", "damping", "omega")


def _owners(keyword: str) -> list[str]:
    return [cls.__name__ for cls in _CLASSES.values() if keyword in {f.name for f in fields(cls)}]


def check_method(method: object) -> None:
    """Raise unless ``method`` is None, a method name or a method record."""
    if method is None or isinstance(method, (Newton, Anderson, Picard)):
        return
    if isinstance(method, str) and method in METHODS:
        return
    if isinstance(method, type) and method in _CLASSES.values():
        raise InputError(f"nonlinear_solve: method={method.__name__} is the class; pass an instance, "
                         f"method={method.__name__}() (its defaults) or method={method.__name__}(...)")
    raise InputError(
        f"nonlinear_solve: method must be one of {METHODS}, a method record (Newton(...), Anderson(...), "
        f"Picard(...)), or None to let the library choose (Newton, handing over to Anderson and then Picard if it "
        f"fails), got {method!r}"
    )


def resolve(method: object, keywords: dict[str, Any]) -> tuple[bool, tuple[Method, ...]]:
    """``(pinned, order)``: whether the caller pinned a method, and the method records to try in turn.

    ``keywords`` are ``nonlinear_solve``'s flat method keywords (:data:`KEYWORDS`), :data:`UNSET`
    where not given. With a method record none may be given; with a name or None they fill the
    records (all three are built, so every keyword is checked whichever method runs)."""
    check_method(method)
    given = {k: v for k, v in keywords.items() if v is not UNSET}
    if isinstance(method, (Newton, Anderson, Picard)):
        if given:
            name = type(method).__name__
            parts = []
            for k in given:
                owners = _owners(k)
                if name in owners:
                    parts.append(f"{k}= (set it in the record: method={name}(..., {k}=...))")
                else:
                    parts.append(f"{k}= (an option of {' and '.join(owners)}, not of {name}: drop it)")
            raise InputError(
                f"nonlinear_solve: method={method!r} carries its own options, so the keywords "
                f"{', '.join(parts)} cannot be given beside it"
            )
        return True, (method,)
    records = {name: cls(**{k: v for k, v in given.items() if k in {f.name for f in fields(cls)}})
               for name, cls in _CLASSES.items()}
    if method is None:
        return False, tuple(records[name] for name in AUTO_ORDER)
    return True, (records[method],)
