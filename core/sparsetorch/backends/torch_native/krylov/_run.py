"""The iteration driver of the torch backend's Krylov solvers: run a solver's steps, check
convergence every ``check_every`` iterations (a CUDA graph replays the steps in between on a GPU),
and turn the book of what happened into an :class:`~sparsetorch.IterationResult`."""

from __future__ import annotations
import math
from typing import Mapping
import torch
from torch import Tensor
from ....dispatch.results import IterationResult, Status
from ._common import (
    _COMMON_EVENTS, _PRIORITY, CONVERGED, MAX_ITER, MAX_REFRESH, RUNNING, STAGNATED, Event, Iteration, Problem, Start,
    norm,
)

__all__ = ["run"]


def _where_text(index: int, shape: tuple[int, ...], count: int) -> str:
    """' (column j of batch (i,))' for systems with several columns; '' for one system."""
    if math.prod(shape) <= 1:
        return ""
    batch = shape[:-1]
    pos = []
    rest = index
    for size in reversed(shape):
        pos.append(rest % size)
        rest //= size
    pos.reverse()
    text = f" (column {pos[-1]}" + (f" of batch {tuple(pos[:-1])}" if batch else "") + ")"
    if count > 1:
        text += f" and {count - 1} other system(s)"
    return text


def _finish(
    problem: Problem, x: Tensor, r: Tensor, iterations: int, refreshes: int,
    history: list[float], events: Mapping[int, Event],
) -> tuple[Tensor, IterationResult]:
    """Classify every column from its true residual ``r`` and build the result record."""
    book = problem.book
    rn = norm(r)
    rel = rn / book.scale
    ok = torch.isfinite(rn) & (rn <= book.target)
    code = book.code
    code = torch.where(~ok & (code == RUNNING), MAX_ITER, code)
    code = torch.where(~ok & (code == CONVERGED), STAGNATED, code)
    code = torch.where(ok, CONVERGED, code)
    flat = [t.reshape(-1).cpu().tolist() for t in (code, book.event_it, book.event_val, rel)]
    codes, its, vals, rels = flat
    worst = max(rels, key=lambda v: (math.isnan(v), v)) if rels else 0.0
    table = {**_COMMON_EVENTS, **events}
    fields = dict(
        name=problem.name, iterations=iterations, maxiter=problem.maxiter_text,
        rtol=problem.rtol, atol=problem.atol, refreshes=refreshes,
    )
    if all(c == CONVERGED for c in codes):
        reason = (
            f"{problem.name} converged in {iterations} iterations: worst relative residual "
            f"{worst:.2e} meets max(rtol * ||b||, atol) (rtol={problem.rtol:g}, atol={problem.atol:g})"
        )
        status = Status.CONVERGED
    else:
        failed = [i for i, c in enumerate(codes) if c != CONVERGED]
        status = min((table[codes[i]].status for i in failed), key=_PRIORITY.index)
        chosen = [i for i in failed if table[codes[i]].status is status]
        first = chosen[0]
        reason = table[codes[first]].template.format(
            it=its[first], value=vals[first], rel=rels[first],
            where=_where_text(first, tuple(code.shape), len(chosen)), **fields,
        )
    result = IterationResult(
        iterations=iterations, residual=float(worst), converged=status is Status.CONVERGED,
        status=status, reason=reason, history=tuple(history),
    )
    return x, result


def _to_next_check(problem: Problem, it: int) -> int:
    """Iterations from ``it`` to the next check: the next multiple of check_every, or maxiter."""
    return min(problem.check_every - it % problem.check_every, problem.maxiter - it)


def _advance(state: Iteration, it: int, k: int) -> None:
    """Iterations ``it + 1 .. it + k``: at once for solvers that run blocks (CG's CUDA graph)."""
    advance = getattr(state, "advance", None)
    if advance is not None:
        advance(it, k)
    else:
        for j in range(k):
            state.step(it + j + 1)


def _settle(state: Iteration, ahead: bool) -> None:
    """The loop stops here: solvers that run blocks ahead (CG's graph) fix ``x`` first."""
    settle = getattr(state, "settle", None)
    if settle is not None:
        settle(ahead)


@torch.no_grad()
def run(problem: Problem, start: Start, events: Mapping[int, Event]) -> tuple[Tensor, IterationResult]:
    """Iterate ``start``'s solver until every column has stopped or maxiter; report honestly.

    Convergence checks (one host sync each, plus ``callback`` and a ``history`` entry) happen at
    iterations ``check_every, 2 * check_every, ...`` and at maxiter, so a run of ``it``
    iterations makes exactly ``ceil(it / check_every)`` checks.
    """
    b, book = problem.b, problem.book
    history: list[float] = []
    x, r = problem.x, problem.r
    if b.numel() == 0:
        return _finish(problem, x, r, 0, 0, history, events)
    _, running = book.snapshot()
    it = 0
    refreshes = 0
    fresh = True  # r is the true residual of x
    state = start(problem, x, r, 0) if running and problem.maxiter > 0 else None
    ahead = False  # the block after the last check is already queued (speculation, below)
    while state is not None and it < problem.maxiter:
        k = _to_next_check(problem, it)
        if ahead:
            ahead = False
        else:
            _advance(state, it, k)
        it += k
        fresh = False
        sync = getattr(state, "sync", None)
        if sync is not None:  # solvers that defer their per-iteration bookkeeping to checks
            sync(it)
        wait = book.snapshot_async()
        if getattr(state, "speculate", False) and it < problem.maxiter:
            # Queue the next block before waiting for this check, so the device never idles
            # while the host decides; if the check says stop, the state rolls back to the
            # iterate of this check (the next block's work is discarded, its count not taken).
            state.advance(it, _to_next_check(problem, it))
            ahead = True
        worst, running = wait()
        history.append(worst)
        if problem.callback is not None:
            problem.callback(it, worst)
        if running:
            continue
        _settle(state, ahead)
        ahead = False
        # Every column has stopped: verify the converged ones against the true residual.
        state.flush()
        x = state.x
        r = b - problem.matvec(x)
        fresh = True
        if refreshes >= MAX_REFRESH or it >= problem.maxiter:
            break
        rn = norm(r)
        gap = (book.code == CONVERGED) & ~(rn <= book.target)
        if not bool(gap.any()):
            break
        refreshes += 1
        book.restart(gap, rn)
        state = start(problem, x, r, it)
    if state is not None and not fresh:
        _settle(state, False)
        state.flush()
        x = state.x
        r = b - problem.matvec(x)
    return _finish(problem, x, r, it, refreshes, history, events)
