"""A plan as the core holds it: the plugin's plan object, the values it holds, and the lock that
makes one shared plan safe for many callers (``PlanState``); ``guarded`` turns a plugin's own
exceptions into :class:`~sparsetorch.BackendError` naming the plan and the phase.

Contract level (below autograd and the ops): the plan cache stores PlanStates, the ops create
them, the autograd handles and the fallback route use them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import BackendError, SparseTorchError
from ..tensor.pattern import is_plain
from .plans import CheapReload, supports

__all__ = ["PlanState", "guarded"]


def _token(values: torch.Tensor) -> tuple[Any, ...]:
    return (values.data_ptr(), values._version, tuple(values.shape), values.dtype, values.device)


@dataclass
class PlanState:
    """A plan and the values it currently holds.

    Values are recognised by identity and torch's version counter, and, when those match, by
    comparing with a snapshot (O(nnz), far cheaper than a refactorization): writes through
    ``.data`` or a NumPy view keep the version unchanged and must still be seen.

    Plans are shared (the plan cache hands one plan to every call on a pattern), calls are not:
    a caller holds :attr:`lock` from loading its values to the end of its solve or product, so
    another thread can neither swap the values in between nor run the plan concurrently (a plan
    need not be thread safe itself). Per-call options travel as arguments, never on the plan.
    Exceptions a plan raises that are not sparsetorch errors come out as :class:`BackendError`
    naming the backend, method and phase, with the cause chained.
    """

    plan: Any
    token: tuple[Any, ...] | None = None
    reused: bool = False
    snapshot: torch.Tensor | None = None
    factory: Any = None
    #: products: set_values is a pointer swap or a gather, no dearer than the comparison, which
    #: on a GPU would also synchronize with the host on every call: always reload, no snapshot.
    #: A plan may say the same of itself (:class:`~.plans.CheapReload`, ``reload_cheap = True``; Krylov plans:
    #: new values are a pointer swap and a diagonal, and the snapshot would cost an nnz copy).
    reload_always: bool = False
    #: "backend/method", for error messages
    label: str = "plan"
    lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)
    _cheap_reload: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.plan is not None:  # made around an existing plan
            self._cheap_reload = supports(self.plan, CheapReload)

    def build(self) -> Any:
        """Run the plan factory if it has not run yet (pattern-dependent work)."""
        if self.plan is None:
            with self.lock:
                if self.plan is None:
                    plan = guarded(self.factory, self.label, "build")
                    # capabilities asked once per plan (a Protocol isinstance costs ~20 us)
                    self._cheap_reload = supports(plan, CheapReload)
                    self.plan = plan
                    self.factory = None
        return self.plan

    def load(self, values: torch.Tensor) -> None:
        with self.lock:
            self._load(values)

    def _load(self, values: torch.Tensor) -> None:
        self.build()
        v = values.detach()
        tok = _token(v)
        if self.reload_always or self._cheap_reload:
            self.token = None
            guarded(lambda: self.plan.set_values(v), self.label, "set_values")
            self.token = tok
            return
        if tok == self.token and self.snapshot is not None and torch.equal(self.snapshot, v):
            return
        self.token = None  # a set_values that raises leaves no values the plan is known to hold
        guarded(lambda: self.plan.set_values(v), self.label, "set_values")
        self.token = tok
        snap = self.snapshot
        if (snap is not None and snap.shape == v.shape and snap.dtype == v.dtype and snap.device == v.device
                and is_plain(snap) and is_plain(v) and not _overlaps(snap, v)):
            # Refill the snapshot's buffer: a copy into memory already mapped costs a fraction of a
            # new allocation's first touch (measured 3 vs 13 ms for 5M doubles).
            snap.copy_(v)
        else:
            self.snapshot = v.clone()


def guarded(fn: Callable[[], Any], label: str, phase: str) -> Any:
    """``fn()``, with an exception that is not a sparsetorch error (a plugin bug, a library's own
    error type) turned into :class:`BackendError` naming the plan and phase, cause chained."""
    try:
        return fn()
    except SparseTorchError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
        raise BackendError(f"{label} failed in {phase}: {type(exc).__name__}: {exc}", label=label,
                           phase=phase) from exc


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two plain tensors share storage (a snapshot must never alias the values it guards)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
