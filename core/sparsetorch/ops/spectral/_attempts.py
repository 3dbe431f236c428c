"""The fallback driver of the spectral ops (eigsh, eigs): the capable offers in the explain table's order, each run
until one returns eigenpairs that pass the checks (docs/spectral.md, "What a default call
promises"), with a record of every attempt for ``info.extra["attempts"]``."""

from __future__ import annotations

import math

import inspect
import time
import warnings

import torch

from ...dispatch.lru import LRU
from ...dispatch.plan import PlanState, obtain_plan, with_options
from ...errors import (BackendError, DegenerateEigenvalueError, IndefiniteMatrixError, NoBackendError,
                       NotConvergedError, NotConvergedWarning, NotSymmetricError, SparseTorchError)
from ...tensor import SparseTensor
from ..info import SolveInfo
from ..accuracy import backward_error_bound, default_rtol
from ._checks import WRONG_END, _check_outputs, _verify_pairs, wrong_end

__all__ = ["MIN_BUDGET"]


class _Attempts:
    """The offers an eigen call may try, in the explain table's order, and what each did.

    The accuracy contract and the fallback rule (docs/spectral.md): the chosen offer runs first; if
    it does not converge, breaks down, fails in its plugin, returns pairs whose residual
    misses the contract, or (eigsh) pairs that cheap bounds prove are not the k wanted ones (from the
    wrong end of the spectrum, or interior ones: :func:`._checks.wrong_end`), the next capable offer
    of the table runs, and so on. A method the
    user pinned (``method=``) is the only candidate. An attempt that a dense offer later in the
    table could replace is bounded by that offer's estimated seconds (``budget``, for plans
    whose ``eigsh``/``eigs`` take it): a failed attempt costs about what the dense call it
    delayed does. Plans for later offers are obtained (and cached) only when needed.

    ``eigsh``'s last resort: where the dense method was left out of the table for its size alone
    (n above its default ``dense_max``, none given) and n is at most :data:`DENSE_LAST_RESORT_MAX`,
    it is added after every offer of the table and runs only when they all failed (it bounds none
    of them: a call that succeeded before runs as before); not with ``on_nonconvergence`` "warn" /
    "ignore" (the caller takes the last iterate).
    """

    def __init__(self, op: str, A: SparseTensor, request, state: PlanState, offer, table, *, cache: bool,
                 policy: str, contract: float | None) -> None:
        self.op, self.A, self.request, self.cache, self.policy = op, A, request, cache, policy
        self.contract = contract  # relative residual the pairs must meet (None: an explicit tol)
        self.pinned = request.option("method") is not None
        self.offers = [offer]
        if not self.pinned:
            self.offers += [r.offer for r in table.offers
                            if r.offer is not None and (r.offer.backend, r.offer.method) != (offer.backend, offer.method)]
        self.states: dict[int, PlanState] = {0: state}
        self.records: list[dict] = []
        self.state, self.offer, self.result = state, offer, None
        self.answered: int | None = None  # the offer whose pairs were accepted (run)
        self.norms: dict = {}
        self.probe_budget: float | None = None
        self.probe_key = (op, A.pattern_key, A.dtype, request.option("k"), request.option("which"),
                          request.option("sigma"), request.option("generalized"))
        probe = None
        if (not self.pinned and offer.method in _DIRECT_METHODS and offer.seconds >= PROBE_MIN_DENSE
                and _PROBE_FAILED.peek(self.probe_key) is None):
            cand = [o for o in self.offers[1:] if o.method in _PROBE_METHODS]
            probe = min(cand, key=lambda o: o.seconds) if cand else None
        if probe is not None:
            # Rent before buying (as solve's route does): an iterative method's count of products is a
            # guess from the pattern (the spread of the spectrum a PDE operator of that sparsity would
            # have), far too high for matrices whose wanted end is well separated (power networks,
            # graphs: ARPACK converged in ~250 products on 494_bus where 2,359 were estimated, so a
            # dense eigh was chosen at 25x the time). The cheapest iterative offer runs first within a
            # share of the dense estimate; if it does not finish, the dense method runs (a failed try
            # costs PROBE_SHARE of it, and the pattern is not tried again).
            self.offers.remove(probe)
            self.offers.insert(0, probe)
            self.states = {1: state}
            self.probe_budget = max(PROBE_MIN_BUDGET, PROBE_SHARE * offer.seconds)
        self.last_resort: int | None = None  # index in self.offers of the dense last resort
        self.beyond_last_resort = ""  # why there is none, for the error's advice
        if op == "eigsh" and not self.pinned and policy == "raise":
            # (with "warn" / "ignore" the caller takes the last iterate: a call that returned it quickly before
            # is not made to wait for a dense eigh)
            self._add_last_resort()

    def _add_last_resort(self) -> None:
        """Append the dense eigh (torch, the method used up to ``dense_max``) when the table left it out for
        its size alone: ARPACK can miss copies of a repeated eigenvalue (the inertia check proves it) and the
        block methods stall on the clusters of a graph Laplacian of several components (n = 2076, 9
        components, M given: every method failed and the call raised after ~8 s), where a dense eigh of
        that size takes seconds."""
        req = self.request
        if req.option("dense_max") or req.option("backend") not in (None, "torch"):
            return  # the caller set the dense limit, or chose another backend: theirs to decide
        if any(o.method in _DIRECT_METHODS for o in self.offers):
            return
        n = int(self.A.format_shape[0])
        batch = math.prod(self.A.batch_shape)
        bound = DENSE_LAST_RESORT_MAX
        if n > bound or batch * float(n) ** 3 > float(bound) ** 3:
            memory = _gib(7 * n * n * self.A.values.element_size() * batch)
            self.beyond_last_resort = (
                f"the dense eigh is the last resort only up to n = {bound} unknowns (a value batch counting as "
                f"that many problems; here n = {n}" + (f", {batch} members" if batch > 1 else "") + "): pass "
                f"dense_max={n} to allow it (O(n^3) time: 15-20 s at n = 4096 on 2 CPU cores, 8x per doubling of "
                f"n; ~{memory} of memory)")
            return
        from ...dispatch.select import choose

        try:  # the torch backend's dense offer as dispatch prices it (max_bytes= still applies)
            dense, _ = choose(with_options(req, backend="torch", method="dense", dense_max=n))
        except NoBackendError:
            return
        self.last_resort = len(self.offers)
        self.offers.append(dense)

    def _state(self, i: int) -> PlanState:
        if i not in self.states:
            request = with_options(self.request, backend=self.offers[i].backend, method=self.offers[i].method)
            if i == self.last_resort:
                request = with_options(request, dense_max=int(self.A.format_shape[0]))
            self.states[i] = obtain_plan(self.op, self.A, request, cache=self.cache)[0]
        return self.states[i]

    def budget(self, i: int) -> float | None:
        """Seconds attempt ``i`` may take (None: no limit): the smaller of the estimate of the cheapest dense
        offer after it and its own overrun budget (:meth:`overrun_budget`)."""
        later = [o.seconds for j, o in enumerate(self.offers[i + 1:], i + 1)
                 if o.method in _DIRECT_METHODS and j != self.last_resort]
        dense = max(MIN_BUDGET, min(later)) if later else None
        own = self.overrun_budget(i)
        if dense is None or own is None:
            return own if dense is None else dense
        return min(dense, own)

    def overrun_budget(self, i: int) -> float | None:
        """An iterative attempt's bound by its own estimate, while another attempt remains: ``OVERRUN_FACTOR``
        times its estimated seconds, at least ``OVERRUN_MIN_BUDGET`` (None for a direct method, or without an
        estimate). Above dense_max no dense offer bounded anything, and a badly mis-estimated attempt ran to its
        own maxiter: torch's LOBPCG, estimated at 0.7 s, took 288 s on a Laplacian of 12 paths (n = 3000, twelve
        zero eigenvalues) before SciPy's LOBPCG and the Lanczos method were tried (session 28's sweep). An attempt
        stopped by this bound is run again, unbounded, after every other attempt failed (:meth:`run`)."""
        offer = self.offers[i]
        est = getattr(offer, "seconds", None)
        if offer.method in _DIRECT_METHODS or not isinstance(est, (int, float)) or not math.isfinite(est) or est <= 0:
            return None
        return max(OVERRUN_MIN_BUDGET, OVERRUN_FACTOR * float(est))

    def run(self, values: torch.Tensor, call, verify):
        """``call(plan, budget) -> (outputs, IterationResult)``; ``verify(outputs) -> (ok, residual, why)``.
        Loads ``values`` into each plan tried; returns the outputs of the first attempt that
        converged and passed ``verify``. Attempts run in the table's order, the last one unbounded; one that
        its own overrun budget stopped (:meth:`overrun_budget`) runs again, unbounded, after all of them failed
        (a slow answer is still one: it gave way to the others, not up)."""
        last_exc: BaseException | None = None
        last_out, last_res, last_i = None, None, 0
        self.records.clear()
        self.answered = None
        order = [(i, False) for i in range(len(self.offers))]  # (offer, a second, unbounded run)
        j = 0
        while j < len(order):
            i, again = order[j]
            j += 1
            offer = self.offers[i]
            label = f"{offer.backend}/{offer.method}"
            final = j == len(order)
            budget = None if final or again else self.budget(i)
            if i == 0 and not again and self.probe_budget is not None:
                budget = self.probe_budget
            # stopped by its own overrun budget (not by a dense offer's or the probe's): run again at the end
            own = None if final or again or (i == 0 and self.probe_budget is not None) else self.overrun_budget(i)
            t0 = time.perf_counter()
            phase = "build"
            try:
                state = self._state(i)
                with state.lock:  # values and the call belong together: another thread may share the plan
                    phase = "set_values"
                    state.load(values)
                    phase = self.op
                    out, res = call(state.plan, budget)
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure of a plan is recorded, then handed over
                if not isinstance(exc, SparseTorchError):
                    exc = _wrap(exc, label, phase)
                if i == 0 and self.probe_budget is not None:
                    _PROBE_FAILED.put(self.probe_key, True)
                self.records.append(_record(offer, None, False, f"raised {type(exc).__name__}: {exc}",
                                            time.perf_counter() - t0, budget))
                last_exc = exc
                if self.pinned or final:
                    raise _with_attempts(exc, self.records, final and not self.pinned) from exc.__cause__
                continue
            seconds = time.perf_counter() - t0
            ok, resid, why = (False, float("nan"), res.reason or res.status.value)
            if res.converged:
                ok, resid, why = verify(out)
            self.records.append(_record(offer, res, ok, "" if ok else why, seconds, budget, resid))
            if ok:
                self.state, self.offer, self.result = state, offer, res
                self.answered = i
                return out
            if i == 0 and self.probe_budget is not None:
                _PROBE_FAILED.put(self.probe_key, True)
            last_out, last_res, last_exc, last_i = out, res, None, i
            if self.pinned:
                break
            if own is not None and budget is not None and budget >= own and not res.converged and seconds >= budget:
                order.append((i, True))
        if last_out is None:  # pragma: no cover - the loop raises before
            raise last_exc  # type: ignore[misc]
        self.state, self.result = self.states[last_i], last_res
        self.offer = self.offers[last_i]
        self._fail(last_res)
        return last_out

    def run_eigsh(self, A: SparseTensor, values: torch.Tensor, M: SparseTensor | None, call: dict):
        """``(w, V)`` of ``A v = w M v`` with A's ``values``: the first plan whose pairs pass the
        checks (real ``w``, ``V`` of A's dtype, the contract's residual, the wanted end of the spectrum);
        ``call``: the options of ``plan.eigsh``."""
        A = A.with_values(values.detach())
        n, k = A.format_shape[0], call["k"]
        batch = tuple(A.batch_shape)

        def attempt(plan, budget):
            with torch.no_grad():
                w, V, res = plan.eigsh(M=M, **call, **_call_kwargs(plan, budget))
            return (w, V), res

        def verify(out):
            w, V = out
            why = _check_outputs(w, V, batch, n, k)
            if why is None and (w.is_complex() or V.dtype != A.dtype):
                why = f"returned w {w.dtype} and V {V.dtype}; expected real w and V of A's dtype {A.dtype}"
            if why is not None:
                return False, float("nan"), why
            ok, resid, why = _verify_pairs(A, M, w, V, self.contract)
            if ok:
                # pairs from the wrong end of the spectrum (or interior ones, where a Krylov method missed the
                # extreme ones) can meet the residual contract: refuse those that cheap bounds prove are not
                # the k wanted (_checks.wrong_end); the tolerance they were accepted at sets the slack
                tol = max(default_rtol(A.dtype) if self.contract is None else self.contract, float(call["tol"]),
                          resid if math.isfinite(resid) else 0.0, backward_error_bound(A.dtype, n))
                end = wrong_end(A, M, w, call["which"], call["sigma"], tol)
                if end is not None:
                    return False, resid, end
            return ok, resid, why

        return self.run(values, attempt, verify)

    def run_eigs(self, A: SparseTensor, values: torch.Tensor, call: dict, left: bool):
        """``(w, V, U)`` of ``A v = w v`` with A's ``values`` (``U``: the left eigenvectors when
        ``left``), from the first plan whose pairs pass the checks; ``call``: ``plan.eigs``'s options."""
        A = A.with_values(values.detach())
        n, k = A.format_shape[0], call["k"]
        batch = tuple(A.batch_shape)

        def attempt(plan, budget):
            with torch.no_grad():
                w, V, U, res = plan.eigs(left=left, **call, **_call_kwargs(plan, budget))
            return (w, V, U), res

        def verify(out):
            w, V, U = out
            why = _check_outputs(w, V, batch, n, k)
            if why is None and left and (U is None or tuple(U.shape) != tuple(V.shape)):
                why = "returned no left eigenvectors (asked for, for the gradient)"
            if why is not None:
                return False, float("nan"), why
            return _verify_pairs(A, None, w, V, self.contract)

        return self.run(values, attempt, verify)

    def _fail(self, res) -> None:
        tried = "; ".join(f"{r['backend']}/{r['method']}: {r['why']}" for r in self.records)
        if self.pinned:
            others = list(dict.fromkeys(f"'{o.method}' ({o.backend})" for o in _capable(self.op, self.A, self.request)
                                        if o.method != self.offers[0].method))  # each once, with its backend
            advice = (f"method={self.offers[0].method!r} was pinned, so no other method was tried; try "
                      + (f"method={' or '.join(others)}, or " if others else "")
                      + "drop method= to let dispatch fall back, raise maxiter, use sigma (shift-invert) for interior "
                        "or smallest eigenvalues, or pass on_nonconvergence='warn'")
        elif self.beyond_last_resort:
            advice = ("every capable method was tried (in the order of explain()); " + self.beyond_last_resort
                      + "; or raise maxiter, give tol=, use sigma (shift-invert) near the wanted eigenvalues, or pass "
                        "on_nonconvergence='warn'")
        else:
            dense_tried = any(o.method in _DIRECT_METHODS for o in self.offers)
            advice = ("every capable method was tried (in the order of explain()); raise maxiter, give tol=, use sigma "
                      "(shift-invert) near the wanted eigenvalues, "
                      + ("" if dense_tried else "raise dense_max= to allow the dense method, ")
                      + "or pass on_nonconvergence='warn'")
        if any(r["why"].startswith(WRONG_END) for r in self.records):
            advice += (" (the pairs refused as not the wanted ones met the residual contract but fail bounds that the "
                       "wanted eigenvalues satisfy: a backend returned another end of the spectrum, or a Krylov method "
                       "missed the extreme eigenvalues; another v0= or method='dense' finds them)")
        msg = f"{self.op} did not converge: {tried}. {advice}"
        if self.policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=_STACKLEVEL[self.op])
        elif self.policy == "raise":
            raise NotConvergedError(msg, res)

    def info(self) -> SolveInfo:
        res = self.result
        rec = self.records[-1] if self.records else {}
        resid = rec.get("verified_residual", float("nan"))
        return SolveInfo(
            backend=self.offer.backend, method=self.offer.method, iterations=res.iterations,
            residual=res.residual if isinstance(resid, float) and math.isnan(resid) else resid, converged=bool(rec.get("accepted", res.converged)),
            status=res.status, reason=res.reason, plan_reused=self.states[0].reused,
            extra={"estimated_seconds": self.offer.seconds, "estimated_bytes": self.offer.bytes,
                   "attempts": [dict(r) for r in self.records], "contract_rtol": self.contract,
                   **({"last_resort": f"every offer of the table failed; the dense eigh answered (n <= "
                                      f"DENSE_LAST_RESORT_MAX = {DENSE_LAST_RESORT_MAX})"}
                      if self.last_resort is not None and self.answered == self.last_resort
                      else {})},
        )

#: An iterative attempt with another after it may take OVERRUN_FACTOR times its estimated seconds, at least
#: OVERRUN_MIN_BUDGET (:meth:`_Attempts.overrun_budget`): generous for estimates from the pattern (a graph's
#: wanted end converges in far fewer products than a PDE operator's, rarely many more), a bound on a method that
#: stalls on clusters
OVERRUN_FACTOR = 20.0
OVERRUN_MIN_BUDGET = 2.0
#: Direct methods of the spectral ops: an attempt that one of these could replace is bounded by it.
_DIRECT_METHODS = ("dense",)
#: eigsh's last resort (:class:`_Attempts`): up to this n the dense eigh answers when every offer of the table
#: failed and the table left it out for its default ``dense_max`` only. Its cost, measured on the 2-core CPU
#: machine (``eigsh(..., M=diagonal, method="dense")``: M's Cholesky, two triangular solves, torch.linalg.eigh with
#: vectors; float64, 2 threads; peak RSS of the process): 1.3 s / 0.5 GiB at n = 2076, 14-22 s / 1.2 GiB at 4096,
#: 43 s / 2.3 GiB at 6144, 136 s / 4.3 GiB at 8192. Larger problems raise NotConvergedError saying that
#: dense_max=n forces it.
DENSE_LAST_RESORT_MAX = 4096
#: The least an iterative attempt is allowed before handing over (seconds): below it a budget
#: would only measure Python's overheads.
MIN_BUDGET = 0.05
#: A dense method ranked first with an estimate of at least PROBE_MIN_DENSE seconds lets the cheapest
#: of these iterative methods try first, bounded by PROBE_SHARE of the dense estimate (_Attempts)
PROBE_MIN_DENSE = 0.02
PROBE_SHARE = 0.25
#: the least such a try gets (seconds; the plans check their deadline per product)
PROBE_MIN_BUDGET = 0.005
_PROBE_METHODS = ("arpack", "lanczos")
#: patterns (with k, which, sigma) where that try did not finish: not tried again
_PROBE_FAILED: "LRU[tuple, bool]" = LRU("eigen probes that did not finish", 256)
#: Errors that no other method would avoid (the operands are wrong): raised at once.
_PASS_THROUGH = (IndefiniteMatrixError, NotSymmetricError, DegenerateEigenvalueError)

#: ``warnings.warn``'s stacklevel for a non-converged call, per op: the frames between the user's
#: ``eigsh``/``eigs`` call and :meth:`_Attempts._fail`.
_STACKLEVEL = {"eigsh": 7, "eigs": 8}


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2 ** 30:.2g} GiB" if nbytes >= 2 ** 28 else f"{nbytes / 2 ** 20:.2g} MiB"


def _capable(op, A, request):
    from ...dispatch.select import rank

    return [r.offer for r in rank(with_options(request, method=None)).offers]


def _wrap(exc: BaseException, label: str, phase: str) -> BackendError:
    err = BackendError(f"{label} failed in {phase}: {type(exc).__name__}: {exc}", label, phase)
    err.__cause__ = exc
    return err


def _with_attempts(exc: BaseException, records: list[dict], annotate: bool) -> BaseException:
    if annotate and len(records) > 1 and hasattr(exc, "add_note"):
        exc.add_note("attempts: " + "; ".join(f"{r['backend']}/{r['method']}: {r['why']}" for r in records))
    return exc


def _record(offer, res, ok: bool, why: str, seconds: float, budget, resid: float = float("nan")) -> dict:
    return {"backend": offer.backend, "method": offer.method,
            "iterations": None if res is None else res.iterations,
            "plan_residual": None if res is None else res.residual,
            "verified_residual": resid, "converged": None if res is None else res.converged,
            "accepted": ok, "status": None if res is None else res.status.value, "why": why or "accepted",
            "seconds": seconds, "budget": budget}


def _call_kwargs(plan, budget) -> dict:
    """``budget=`` for plans whose eigen call takes it (an attempt bounded in seconds)."""
    if budget is None:
        return {}
    meth = getattr(plan, "eigsh", None) or getattr(plan, "eigs", None)
    cls = type(plan)
    if cls not in _TAKES_BUDGET:
        try:
            params = inspect.signature(meth).parameters
            _TAKES_BUDGET[cls] = "budget" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            _TAKES_BUDGET[cls] = False
    return {"budget": budget} if _TAKES_BUDGET[cls] else {}


_TAKES_BUDGET: dict = {}
