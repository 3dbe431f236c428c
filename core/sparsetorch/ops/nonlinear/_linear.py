"""The linear solvers of ``nonlinear_solve``: one dispatch plan per Jacobian pattern, reused while the
pattern stays the same (a direct backend keeps its symbolic analysis and refactorizes), and
shared across calls through the plan cache under a private copy of the pattern (GMRES on an
operator, for the matrix-free Jacobian, is ``Problem.operator_solve``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from ...autograd.solve import SolveHandle
from ...tensor import SparseTensor
from ...tensor.sparse_tensor import is_plain
from ...dispatch.plan import CALL_OPTIONS, obtain_plan
from ..info import IterationResult
from ..solve import solve_request

__all__ = ["LinearSolver", "same_pattern"]


def same_pattern(A: SparseTensor, B: SparseTensor) -> bool:
    if A.format != B.format or tuple(A.shape) != tuple(B.shape) or A.index_dtype != B.index_dtype:
        return False
    if A.pattern_key == B.pattern_key:
        return True
    for a, b in zip((*A.pos_buffers, *A.crd_buffers), (*B.pos_buffers, *B.crd_buffers)):
        if (a is None) != (b is None):
            return False
        if a is not None and (a.shape != b.shape or not torch.equal(a, b)):
            return False
    return True


#: Jacobian patterns seen by earlier calls (private copies of their index buffers, zero values), so
#: that a Jacobian rebuilt with fresh buffers on a known pattern meets its plan in the plan cache
#: across calls (a training loop), not only across Newton steps. Bounded; most recent last.
#: Under a lock: concurrent calls on different patterns raised "OrderedDict mutated during iteration"
#: (session 21's sweep).
_PATTERNS: "OrderedDict[int, SparseTensor]" = OrderedDict()
_PATTERNS_MAX = 8
_PATTERNS_LOCK = threading.Lock()


def _canonical_pattern(J: SparseTensor) -> SparseTensor:
    with _PATTERNS_LOCK:
        known = list(_PATTERNS.items())
    for key, P in known:
        if same_pattern(P, J):
            with _PATTERNS_LOCK:
                if key in _PATTERNS:
                    _PATTERNS.move_to_end(key)
            return P
    P = J.detach().with_values(torch.zeros_like(J.values.detach())).convert(J.format, copy=True)
    with _PATTERNS_LOCK:
        _PATTERNS[id(P)] = P
        while len(_PATTERNS) > _PATTERNS_MAX:
            _PATTERNS.popitem(last=False)
    return P


class LinearSolver:
    def __init__(self, options: dict[str, Any], properties: Any, policy: str, cache: bool) -> None:
        self.options = options
        self.properties = properties
        self.policy = policy
        self.cache = cache
        self.J: SparseTensor | None = None
        self.state = None
        self.offer = None
        self.plans = 0
        self.first_reused = False
        self.results: list[IterationResult] = []

    def load(self, J: SparseTensor) -> None:
        """New matrix: same pattern keeps the plan (numeric phase only), another pattern re-plans."""
        if self.J is None or not same_pattern(self.J, J):
            Jd = J.detach()
            if self.cache and is_plain(Jd.values):
                Jd = _canonical_pattern(Jd).with_values(Jd.values)
            request = solve_request(Jd, None, self.properties, self.options)
            self.state, self.offer, _ = obtain_plan("solve", Jd, request, cache=self.cache)
            if self.plans == 0:
                self.first_reused = bool(self.state.reused)
            self.plans += 1
            self.J = Jd
        else:
            self.J = self.J.with_values(J.values.detach())
        self.state.load(self.J.values)

    def solve(self, b: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        """``J x = b`` (``J^T x = b`` when ``adjoint``) for a flat ``b``, on the current plan."""
        call = {k: self.options.get(k) for k in CALL_OPTIONS}
        h = SolveHandle(self.state, self.J, adjoint, self.policy, self.results, call_options=call)
        return h.run(self.J.values, b.reshape(-1, 1)).reshape(-1)
