"""Adjoint rule of sparse least squares ``X = argmin ||A X - B||_F^2 + damp^2 ||X||_F^2``.

Math (A is m x n with full column rank when ``damp == 0``; K = A^H A + damp^2 I, invertible):

    forward   X = K^{-1} A^H B,   R = B - A X
    backward  from  K dX = dA^H R - A^H dA X  (differentiate K X = A^H B):
              Lambda = K^{-1} G                      (G = dL/dX)
              dB     = A Lambda
              dA     = R Lambda^H - (A Lambda) X^H   kept on A's pattern:
                       dA_vals[k] = sum_c R[row_k, c] conj(Lambda[col_k, c]) - W[row_k, c] conj(X[col_k, c])

W = A Lambda comes from one *adjoint* least-squares solve on the same plan, without forming K:
W = argmin ||A^H W - G||^2 + damp^2 ||W||^2 = (A A^H + damp^2 I)^{-1} A G = A K^{-1} G
(for damp = 0 the minimum-norm solution of the underdetermined A^H W = G, which is what LSQR/LSMR
return from a zero start). Then Lambda:

- ``damp == 0``: Lambda = A^+ W (a second least-squares solve; exact when A has full column
  rank, since A^+ A = I). Rank-deficient A (and any wide one, m < n): the minimum-norm solution
  x = A^+ b is not differentiable in A's values there (it jumps where the rank changes), and even
  the constant-rank derivative (torch.linalg.pinv's autograd; Golub & Pereyra) has a third term,
  ``(I - A^+ A) dA^H A^+H x``, that the rule above lacks. So the values-gradient raises
  :class:`~sparsetorch.SingularMatrixError` instead of returning a wrong number (m < n: InputError,
  before any solve). The test costs one product: for damp == 0, ``A^H W = A^+ A G`` is G's part in
  A's row space, so the defect ``A^H W - G`` is G's part in A's null space; it is zero for full
  column rank (up to the adjoint solve's backward error) and generically not otherwise, measured as
  that solve's consistency ``||A^H W - G|| / (||A||_F ||W|| + ||G||)`` per column against
  ``max(sqrt(eps), 10 max(atol, btol))``. Where G lies in A's row space (the defect is zero) the
  missing term vanishes and the rule is the constant-rank derivative exactly, so it is returned. The
  gradient in B needs no test: it is ``A^+H G = W`` for any rank and shape. Forward mode has no G:
  the missing term is ``P_null dA^H A^+H x``, so its adjoint solve carries one more column,
  ``dA^H q`` (q fixed), whose part in A's null space is generically nonzero exactly when the
  tangent dA reaches it.
- ``damp != 0``: Lambda = (G - A^H W) / damp^2 (from K Lambda = G; valid for any rank). Its
  error is about ``||A||^2 / damp^2`` times the adjoint solve's relative error, so tight
  tolerances (``atol``/``btol``) are needed when ``damp`` is small against ``||A||``.

Plans never see autograd: inputs arrive detached; this backward is not differentiable again
(``first_order_only``: differentiating it again raises).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dispatch.accuracy import backward_error_bound
from ._fast_apply import FastFunction, vmap_columns
from ._first_order import first_order_only
from ..dispatch.results import Attempt, IterationResult, Status
from ..dispatch.records import DIRECT_METHODS
from ..errors import BackendError, InputError, NotConvergedError, NotConvergedWarning, SingularMatrixError
from ..format import CSR
from ..tensor import SparseTensor
from ..tensor.interop.torch_io import compressed_tensor
from ..tensor._serial import SerialCsr, serial_ok
from ..tensor.pattern import is_plain
from ..dispatch.plan import PlanState, guarded
from ._route_checks import _one_line, safe_column_scales
from .sddmm import sddmm

__all__ = ["LstsqHandle", "lstsq_function", "apply_entries"]

#: value dtypes torch's CPU CSR kernel multiplies (others take the entry-wise product)
_CSR_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def apply_entries(A: SparseTensor, values: torch.Tensor, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
    """``A X`` (``A^H X`` when ``adjoint``) from A's stored entries; ``values`` (*batch, slots),
    ``X`` (*batch, cols, k). Plain torch (any device), used by the backward pass and the solves'
    residual checks. A CPU CSR matrix with one value set and no gradient to record takes one call: a small
    product the serial NumPy one (``tensor/_serial.py``: torch's CSR kernel opens a parallel region that
    stalls on a busy machine), a larger one torch's CSR kernel (the gathers, product and scatter below are
    ~4x its time)."""
    if (not adjoint and A.format == CSR and not A.format.num_batch_levels and values.device.type == "cpu"
            and is_plain(values) and is_plain(X)):  # a torch.func wrapper has no buffer to hand over
        if serial_ok(values, X):  # small: no parallel region (tensor/_serial.py)
            return SerialCsr(A.pos(1), A.crd(1), tuple(A.format_shape))(values, X)
        if (values.dim() == 1 and X.dim() == 2 and values.dtype in _CSR_DTYPES and X.dtype == values.dtype
                and values.layout == torch.strided and X.layout == torch.strided
                and not (torch.is_grad_enabled() and (values.requires_grad or X.requires_grad))):
            return compressed_tensor("csr", A.pos(1), A.crd(1), values.contiguous(), tuple(A.format_shape)) @ X
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    m, n = A.format_shape
    v = values.index_select(-1, slot)  # index_select: torch's advanced indexing opens a parallel region
    if adjoint:
        v = v.conj() if v.is_complex() else v
        rows, cols, m = cols, rows, n
    per = v.unsqueeze(-1) * X.index_select(-2, cols)
    out = per.new_zeros(*per.shape[:-2], m, X.shape[-1])
    return out.index_add(-2, rows, per)


@dataclass
class LstsqHandle:
    """Runs the least-squares plan in ``state`` (``adjoint``: for ``A^H``) with one call's options.

    ``fallbacks``: the offers to hand over to when the method dispatch chose fails (in the explain table's
    order; a plugin that raised or returned something that is not an answer, :func:`_checked_answer`; an
    answer that did not converge or was refused; after an LSQR / LSMR that stalled only the direct ones:
    another Krylov method would stall alike), built by ``rebuild``; empty when the caller pinned the method
    (as in ``solve``, a backend alone still lets dispatch choose among its offers; a pinned plan's error is
    raised, naming it).
    The backward pass runs on whichever plan answered the forward one."""

    state: PlanState
    A: SparseTensor
    options: dict
    on_nonconvergence: str = "raise"
    results: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)
    rebuild: Any = None
    #: what was tried before the plan that answers now (one line each)
    tried: list = field(default_factory=list)
    offer: Any = None
    #: no tolerance given (and no damp): an iterative answer is refined to a direct method's backward
    #: error (:meth:`_sharpen`), as ``solve`` does
    sharpen: bool = False
    #: ``finite(A, B, op)`` checks A's values and B for NaN / Inf here (the call could not: its tensors were a
    #: torch.func transform's wrappers, with no storage to read); None: checked by the call, or not asked for
    finite: Any = None

    def __post_init__(self) -> None:
        #: where this call's results start in ``results`` (a Lstsq object's list spans its calls)
        self.start = len(self.results)
        #: where the results of the plan that answers start (after the last hand-over)
        self.answer_start = self.start
        #: the attempts that handed over, as :class:`~sparsetorch.dispatch.results.Attempt` records
        self.failed: list = []
        #: an iterative method dispatch chose stopped short: only direct offers are handed over to from then on
        self.stalled = False

    def run(self, values: torch.Tensor, B: torch.Tensor, adjoint: bool = False) -> torch.Tensor:
        return self.run_converged(values, B, adjoint)[0]

    def run_converged(self, values: torch.Tensor, B: torch.Tensor, adjoint: bool = False) -> tuple[torch.Tensor, bool]:
        """:meth:`run`, and whether the answer converged (False: the policy, ``warn`` / ``ignore``, let an
        unconverged answer through)."""
        if self.finite is not None:
            self.finite(self.A.with_values(values), B, "lstsq")
        scale = safe_column_scales(B)
        if scale is not None:
            # columns of B outside the range where squared norms are safe: ||b||^2 underflowed (b * 1e-200 answered
            # x = 0, no error) or overflowed (b * 1e200: "backward error nan" on a correct answer; session 26's
            # sweep). Least squares is column by column: each such column (of each batch member) is solved for
            # 2^p b, forward and adjoint alike, and its x divided by 2^p; the others as they are
            X, converged = self._run(values, B * scale, adjoint)
            return X / scale, converged
        return self._run(values, B, adjoint)

    def _run(self, values: torch.Tensor, B: torch.Tensor, adjoint: bool) -> tuple[torch.Tensor, bool]:
        while True:
            state = self.state
            try:
                X, res = self._attempt(state, values, B, adjoint)
            except (BackendError, SingularMatrixError) as exc:
                # a plugin that raised (in its factory, set_values or lstsq) or returned something that is not an
                # answer (_checked_answer): the next offer when dispatch chose the method, as solve's route does;
                # a pinned method's error is raised as it is (it names the plan and the phase)
                self._broken_pattern_check(state, exc)
                if self._hand_over(state, IterationResult(0, math.inf, False, Status.BREAKDOWN, _one_line(exc)),
                                   "error"):
                    continue
                if not self.tried or not isinstance(exc, BackendError):
                    raise
                raise BackendError(f"{exc} (tried before it: {'; '.join(self.tried)})", label=exc.label,
                                   phase=exc.phase) from exc
            if res.converged:
                return X, True
            # an iterative method that stalled: another Krylov method would stall alike (direct ones only from now);
            # a direct answer refused by the checks (not a least-squares answer of A): any other method may answer
            stalled = res.status is not Status.INACCURATE or not _is_direct(state)
            if self._hand_over(state, res, "iterative" if stalled else "inaccurate"):
                continue
            break
        plan = state.plan
        what = "adjoint " if adjoint else ""
        before = f"; tried before it: {'; '.join(self.tried)}" if self.tried else ""
        try_qr = "" if plan.method in ("qr", "dense") else "try method='qr' (a sparse QR) or 'dense' (an SVD), "
        msg = (f"{plan.backend}/{plan.method} ({what}least squares) stopped after {res.iterations} iterations "
               f"({res.status.value}: {res.reason or 'no reason given'}){before}. (||b - A x|| need not go to zero: an "
               f"inconsistent system's least-squares residual is what it is; LSQR / LSMR stop on ||A^H r||.) Raise "
               f"maxiter, loosen atol/btol, raise conlim or add damp, {try_qr}or pass on_nonconvergence='warn' "
               f"to get x anyway")
        if self.on_nonconvergence == "warn":
            import warnings

            warnings.warn(msg, NotConvergedWarning, stacklevel=5)
        elif self.on_nonconvergence != "ignore":
            raise NotConvergedError(msg, res)
        return X, False

    def _attempt(self, state: PlanState, values: torch.Tensor, B: torch.Tensor,
                 adjoint: bool) -> tuple[torch.Tensor, IterationResult]:
        """One plan's answer, checked (:func:`_checked_answer`; a direct one's backward error; an iterative one
        refined where :attr:`sharpen`); its results appended to :attr:`results`. Raises BackendError for a plan that
        failed or returned something that is not an answer."""
        with state.lock, torch.no_grad():
            state._load(values)
            plan = state.plan
            Bd = B.detach()
            X, res = _checked_answer(state, guarded(lambda: plan.lstsq(Bd, adjoint=adjoint, options=dict(self.options)),
                                                    state.label, "lstsq"), self.A, values, Bd, adjoint)
        limit = 16 * backward_error_bound(B.dtype, max(1, self.A.format_shape[0 if adjoint else 1]))
        if res.converged and res.status is Status.DIRECT:
            # a direct answer is checked too: Eigen's SparseQR in float32 took lp_e226 (rank 223, cond 9e3)
            # for rank 51 (its threshold, 20 (m + n) eps max |col|, dropped the small columns) and answered
            # with a relative residual of 0.9 as "direct" (session 21)
            ec, R = self._eta_cols(values, B.detach(), X, adjoint)
            e = float(ec.max()) if ec.numel() else 0.0
            if not e <= limit:
                # neither measure certifies it: a nearly consistent system's answer (residual 1e-10) is certified by
                # its correction, one more solve on the factorization (:meth:`_projected`)
                D, cres = self._correction(state, values, R, adjoint, dict(self.options))
                if cres.converged:
                    ec = torch.minimum(ec, self._projected(values, B.detach(), X, R, D, adjoint))
                    e = float(ec.max()) if ec.numel() else 0.0
            if not e <= limit:
                res = _inaccurate(res, e, limit, "not a least-squares answer of A", "a rank decision that dropped "
                                  "columns, or an unstable factorization); try method='lsqr', a wider dtype, or "
                                  "scale A's columns")
        self.results.append(res)
        if res.converged and self.sharpen and res.status is not Status.DIRECT:
            at = len(self.results) - 1  # the refinement's results follow this one
            X, e = self._sharpen(values, B.detach(), X, adjoint)
            if not e <= limit:
                # refinement on the same plan did not reach a backward-stable answer: not an answer (columns
                # scaled 1e-6..1e6: LSQR stopped 100 % from the solution with Stewart's error 8e-11; session 23)
                res = _inaccurate(res, e, limit, "refined, still not a least-squares answer of A to working "
                                  "accuracy", "A's columns or rows badly scaled, or A ill conditioned)")
                self.results[at] = res
        return X, res

    def _hand_over(self, state: PlanState, res: IterationResult, kind: str) -> bool:
        """Record the failed attempt on ``state`` and move to the next offer dispatch ranked (when it chose the
        method): after an iterative method stalled, the direct ones only. False when none is left (or pinned)."""
        if not self.fallbacks or self.rebuild is None:
            return False
        self.tried.append(f"{state.label}: {res.status.value} after {res.iterations} iterations ({res.reason})")
        backend, _, method = state.label.partition("/")
        self.failed.append(Attempt(backend, method, None, res.iterations, res.status, res.residual, res.reason))
        if kind == "iterative" and not _is_direct(state):
            self.stalled = True
        while self.fallbacks:
            nxt = self.fallbacks.pop(0)
            if self.stalled and not nxt.direct:
                continue
            try:
                new = self.rebuild(nxt)
            except BackendError as exc:
                self.tried.append(f"{nxt.backend}/{nxt.method}: {_one_line(exc)}")
                self.failed.append(Attempt(nxt.backend, nxt.method, None, 0, Status.BREAKDOWN, math.inf, _one_line(exc)))
                continue
            self.answer_start = len(self.results)
            self.offer, self.state = nxt, new
            return True
        return False

    def _broken_pattern_check(self, state: PlanState, exc: BaseException) -> None:
        """Raise BackendError where the failed plan left A's index buffers invalid (a plugin that wrote into them):
        no other method may read them (solve's route does the same)."""
        if not self.fallbacks:
            return
        from .fallback import _broken_pattern  # noqa: PLC0415 - failure path only (fallback imports this module)

        broken = _broken_pattern(self.A)
        if broken is not None:
            raise BackendError(
                f"{state.label} failed ({_one_line(exc)}) and A's index buffers are no longer valid after it "
                f"({broken}): a plan that wrote into its inputs (plans must not modify them: a bug of that "
                f"backend; report it to its authors). Nothing else read them; rebuild A, and pass backend= "
                f"to avoid that backend", label=state.label, phase="lstsq") from exc

    def _eta(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, adjoint: bool) -> tuple[float, torch.Tensor]:
        """:meth:`_eta_cols`'s worst column, and the residual."""
        e, R = self._eta_cols(values, B, X, adjoint)
        return (float(e.max()) if e.numel() else 0.0), R

    def _eta_cols(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor,
                  adjoint: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Per right-hand side ``(*batch, k)``, an upper bound on the backward error of a least-squares answer,
        and the residual: the smaller of ``||r|| / (||A||_F ||x|| + ||b||)`` (Rigal-Gaches: x solves
        ``(A + E) x = b + f`` exactly, a consistent system) and the worst over A's columns of Stewart's
        ``|a_j^H r| / (||a_j|| ||r||)`` (x is the least-squares solution of ``A + E``, ``E = r r^H A / ||r||^2``,
        whose column j has that relative size: a small column's optimality judged at its own scale). Either
        small bounds a backward error; both large (r neither small nor orthogonal to range(A)) is no answer.

        Until session 28 the column measure had ``||A||_F ||x|| + ||b||`` added to ``||r||`` in its denominator
        (a floor for rounding in r: session 23's nearly consistent systems, where neither measure certifies a
        correct answer; :meth:`_projected` does that now). That made it a lower bound, not an upper one: on rows
        scaled 1e-5..1e5 ``||A|| ||x||`` (the large rows) buried the small rows' residual, and a wide A's LSQR
        answer, residual 0.39 and 97 % from the minimum-norm solution, read 5e-14 and was accepted. A damped
        problem keeps that floor (below)."""
        A = self.A
        damp = float(self.options.get("damp") or 0.0)
        anorm = torch.linalg.vector_norm(values, dim=-1).unsqueeze(-1)
        bn = torch.linalg.vector_norm(B, dim=-2)
        R = B - apply_entries(A, values, X, adjoint=adjoint)
        rn = torch.linalg.vector_norm(R, dim=-2)
        xn = torch.linalg.vector_norm(X, dim=-2)
        if damp:  # the damped problem is the plain one of [A; damp I] with b = [B; 0]: r = [R; -damp X]
            rn = torch.sqrt(rn * rn + (damp * xn) ** 2)
            anorm = torch.sqrt(anorm * anorm + X.shape[-2] * damp * damp)
        den = anorm * xn + bn
        consistent = rn / torch.where(den > 0, den, torch.ones_like(den))
        AR = apply_entries(A, values, R, adjoint=not adjoint)  # (*batch, columns of the operator, k)
        if damp:
            AR = AR - (damp * damp) * X
        if AR.shape[-2]:
            coords, slot = A.entries()
            mag = values.index_select(-1, slot).abs()
            cn = mag.new_zeros(*mag.shape[:-1], AR.shape[-2]).index_add(-1, coords[0] if adjoint else coords[1],
                                                                       mag * mag)
            cn = (cn + damp * damp).sqrt()
            # damped: r's rounding floor ||A||_F ||x|| + ||b|| stays in the denominator (a damped answer of columns
            # 1e-4..1e4, 2e-11 from the solution, read Stewart 1e-13 to 3e-12 and no cheap correction certifies it:
            # the damped problem's is K^-1 (A^H r - damp^2 x), not one call of the plan). [A; damp I] has
            # sigma_min >= damp, so that floor loosens Stewart's measure by at most ~||A||_F / damp
            floor = anorm * xn + bn if damp else torch.zeros_like(rn)
            den_c = cn.unsqueeze(-1) * (rn + floor).unsqueeze(-2)
            # a zero column (a_j = 0) is optimal whatever r is; a nonzero A^H r over a zero denominator is not
            colwise = torch.where(den_c > 0, AR.abs() / torch.where(den_c > 0, den_c, torch.ones_like(den_c)),
                                  torch.where(AR.abs() > 0, torch.full_like(den_c, math.inf),
                                              torch.zeros_like(den_c))).amax(-2)
        else:
            colwise = torch.zeros_like(rn)
        e = torch.minimum(consistent, torch.where(rn > 0, colwise, torch.zeros_like(rn)))
        return e, R

    def _correction(self, state: PlanState, values: torch.Tensor, R: torch.Tensor, adjoint: bool,
                    options: dict) -> tuple[torch.Tensor, IterationResult]:
        """``D = argmin ||A D - R||`` on ``state``'s plan (``A^H`` when ``adjoint``), with ``options``."""
        with state.lock, torch.no_grad():
            state._load(values)
            return _checked_answer(state, guarded(lambda: state.plan.lstsq(R, adjoint=adjoint, options=options),
                                                  state.label, "lstsq"), self.A, values, R, adjoint, finite=False)

    def _projected(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor, R: torch.Tensor, D: torch.Tensor,
                   adjoint: bool) -> torch.Tensor:
        """Per right-hand side, a backward-error bound of ``X`` from the correction ``D = argmin ||A D - R||``:
        ``A D`` is r's part in range(A), and with ``P r = A D`` the perturbation ``E = (1 - t) P r x^H / ||x||^2``,
        ``f = -t P r`` leaves the residual ``(I - P) r``, orthogonal to range(A + E): X is the least-squares
        solution of a problem within ``||A D|| / (||A||_F ||x|| + ||b||)``, plus D's own backward error
        (:meth:`_eta_cols` of the correction problem). It certifies a nearly consistent system's answer
        (residual 1e-10: neither of :meth:`_eta_cols`'s measures does, session 23) and refuses one whose residual
        lies in range(A) (a wide A of full row rank: ``A D = r``, the consistent measure again). Inf where
        ``damp`` is set (the damped problem's correction is not one call of the plan) or D is not finite."""
        damp = float(self.options.get("damp") or 0.0)
        bn = torch.linalg.vector_norm(B, dim=-2)
        if damp or not bool(torch.isfinite(D).all()):
            return torch.full_like(bn, math.inf)
        ed, _ = self._eta_cols(values, R, D, adjoint)
        anorm = torch.linalg.vector_norm(values, dim=-1).unsqueeze(-1)
        den = anorm * torch.linalg.vector_norm(X, dim=-2) + bn
        pn = torch.linalg.vector_norm(apply_entries(self.A, values, D, adjoint=adjoint), dim=-2)
        return ed + pn / torch.where(den > 0, den, torch.ones_like(den))

    def _sharpen(self, values: torch.Tensor, B: torch.Tensor, X: torch.Tensor,
                 adjoint: bool) -> tuple[torch.Tensor, float]:
        """An LSQR / LSMR answer stopped by the contract's atol / btol (1e-10 in float64) is ~1e-7 from
        the least-squares solution on a matrix of condition 1e4, where a QR gives 1e-13 (session 20's
        sweep). Its backward error (:meth:`_eta_cols`) is brought to a backward-stable solve's level
        (``backward_error_bound``) by refinement on the same plan: the correction ``d = argmin ||A d - r||``
        (``A^+ r``, the error itself for full column rank; in the row space, so the minimum-norm answer stays
        minimum-norm) with the tolerance the bound needs; at most ``_REFINE_STEPS`` steps, each kept only if the
        backward error drops. Each correction also bounds the backward error of the answer it corrects
        (:meth:`_projected`; a nearly consistent system's)."""
        n = self.A.format_shape[0 if adjoint else 1]
        bound = backward_error_bound(B.dtype, max(1, n))
        ec, R = self._eta_cols(values, B, X, adjoint)
        e = float(ec.max()) if ec.numel() else 0.0
        for _ in range(_REFINE_STEPS):
            if not e > bound:
                break
            # LSQR / LSMR's atol test is Stewart's measure itself (||A^H r|| <= atol ||A|| ||r||): the bound is
            # its target as it stands; btol (||r|| <= btol ||b||, the consistent case) shrinks this residual
            inner = min(0.5, 0.25 * bound / e)
            opts = {**self.options, "atol": 0.25 * bound, "btol": inner}
            D, res = self._correction(self.state, values, R, adjoint, opts)
            self.results.append(res)
            if not bool(torch.isfinite(D).all()):
                break
            if res.converged:
                ec = torch.minimum(ec, self._projected(values, B, X, R, D, adjoint))
                e = float(ec.max()) if ec.numel() else 0.0
                if not e > bound:
                    break
            X2 = X + D
            ec2, R2 = self._eta_cols(values, B, X2, adjoint)
            e2 = float(ec2.max()) if ec2.numel() else 0.0
            if not e2 < e:
                break
            X, e, ec, R = X2, e2, ec2, R2
        return X, e


def _is_direct(state: PlanState) -> bool:
    return state.label.partition("/")[2] in DIRECT_METHODS


def _checked_answer(state: PlanState, out: Any, A: SparseTensor, values: torch.Tensor, B: torch.Tensor, adjoint: bool,
                    *, finite: bool = True) -> tuple[torch.Tensor, IterationResult]:
    """A least-squares plan's ``(X, IterationResult)`` checked: X a strided tensor of shape ``(*batch, n, k)``
    (``m`` rows when ``adjoint``), B's dtype and device; with ``finite``, a converged X free of NaN / Inf where A's
    values and B are. Else :class:`BackendError` naming the plan, phase "lstsq" (what solve's ``_checked`` does for
    its plans; a wrong shape surfaced as "SerialCsr: shapes do not match", a bare tensor as "too many values to
    unpack", a NumPy array as "no attribute 'data_ptr'": session 27's plugin sweep)."""
    label = state.label
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)
            and isinstance(out[1], IterationResult)):
        got = type(out).__name__ if not isinstance(out, tuple) else (
            f"a tuple of {len(out)} ({', '.join(type(o).__name__ for o in out)})")
        raise BackendError(f"{label} failed in lstsq: returned {got}, expected (X, IterationResult) with X a "
                           f"torch.Tensor (plugin bug)", label=label, phase="lstsq")
    X, res = out
    m, n = A.format_shape
    want = (*torch.broadcast_shapes(tuple(values.shape[:-1]), tuple(B.shape[:-2])), m if adjoint else n, B.shape[-1])
    if tuple(X.shape) != want or X.dtype != B.dtype or X.device != B.device or X.layout != torch.strided:
        lay = "" if X.layout == torch.strided else f" ({X.layout})"
        raise BackendError(f"{label} failed in lstsq: returned X of shape {tuple(X.shape)}, {X.dtype} on {X.device}"
                           f"{lay}; expected {want}, {B.dtype} on {B.device} ({'A^H' if adjoint else 'A'} is "
                           f"{(n, m) if adjoint else (m, n)}; plugin bug)", label=label, phase="lstsq")
    if finite and res.converged and X.numel() and not bool(torch.isfinite(X).all()):
        if bool(torch.isfinite(values).all()) and bool(torch.isfinite(B).all()):
            raise BackendError(f"{label} failed in lstsq: returned X with NaN or Inf entries as converged "
                               f"({res.status.value}) for a finite A and B (plugin bug)", label=label, phase="lstsq")
    return X, res


def _inaccurate(res: IterationResult, e: float, limit: float, what: str, why: str) -> IterationResult:
    """``res`` refused: not converged, INACCURATE, the reason saying what and why."""
    return IterationResult(res.iterations, res.residual, False, Status.INACCURATE,
                           f"{res.reason}: {what} (backward error {e:.2g} > {limit:.1g}; {why}")


#: refinement steps of a default least-squares answer
_REFINE_STEPS = 2


@dataclass(frozen=True)
class _Adjoint:
    """A handle's solves with ``A^H`` (the backward pass's first solve), as :class:`_Run` takes them."""

    handle: LstsqHandle

    def run(self, values: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return self.handle.run(values, B, adjoint=True)


def _rank_tolerance(dtype: torch.dtype, options: dict) -> float:
    """Where the adjoint solve's consistency defect means "A is rank deficient" (:func:`_check_rank`): above
    the noise of a backward-stable solve (``sqrt(eps)``, far above ``kappa eps`` for any A whose gradient is
    worth having) and of one stopped by the call's ``atol`` / ``btol``."""
    tols = [float(options.get(k) or 0.0) for k in ("atol", "btol")]
    return max(math.sqrt(torch.finfo(dtype).eps), 10.0 * max(tols))


def _check_rank(h: LstsqHandle, values: torch.Tensor, G: torch.Tensor, W: torch.Tensor, what: str) -> None:
    """Raise :class:`~sparsetorch.SingularMatrixError` where ``W`` (the minimum-norm solution of
    ``A^H W = G``, damp == 0) does not solve it: G has a part in A's null space, so A is rank deficient and
    the values-gradient rule would be wrong (module docstring). Plain tensors only (run inside ``_Run``)."""
    if G.numel() == 0 or W.numel() == 0:
        return
    s = G.abs().amax(-2, keepdim=True)  # per column: G's magnitude out of the norms (1e-200 or 1e200 columns)
    s = torch.where(s > 0, s, torch.ones_like(s))
    Gs, Ws = G / s, W / s
    D = apply_entries(h.A, values, Ws, adjoint=True) - Gs
    anorm = torch.linalg.vector_norm(values, dim=-1).unsqueeze(-1)
    den = anorm * torch.linalg.vector_norm(Ws, dim=-2) + torch.linalg.vector_norm(Gs, dim=-2)
    e = torch.linalg.vector_norm(D, dim=-2) / torch.where(den > 0, den, torch.ones_like(den))
    worst = float(e.max())
    tol = _rank_tolerance(values.dtype, h.options)
    if not worst > tol:
        return
    m, n = h.A.format_shape
    raise SingularMatrixError(
        f"lstsq: A ({m}x{n}) is rank deficient (damp == 0; found by {h.state.label}'s adjoint solve: {what} has a "
        f"part of relative size {worst:.2g} > {tol:.2g} in A's null space). The minimum-norm least-squares "
        f"solution x = pinv(A) b is not differentiable in A's values there (it jumps where the rank changes), and "
        f"lstsq's gradient rule needs full column rank. Pass damp > 0 (the regularised solution has a well-defined "
        f"gradient for any rank), remove the dependent columns, or differentiate in B only (detach A's values: "
        f"the gradient in B, pinv(A)^H G, is defined for any rank). If A is only ill conditioned, tighten "
        f"atol / btol")


def _fixed_vector(m: int) -> torch.Tensor:
    """An ``(m, 1)`` vector with no structure (entries ``cos(1 + 2.39996 i)``, the golden angle's steps), the
    same every call: no random numbers (torch.func.vmap refuses them)."""
    return torch.cos(1.0 + 2.399963229728653 * torch.arange(m, dtype=torch.float64)).unsqueeze(-1)


@dataclass(frozen=True)
class _AdjointRankChecked:
    """The adjoint solve ``W = A^+H G`` of a derivative in A's values at damp == 0, then :func:`_check_rank`
    on every column of G (``what`` names them in the error) where that solve converged; where it did not, the
    call's on_nonconvergence policy (applied by the handle) is all that happens."""

    handle: LstsqHandle
    what: str = "the gradient with respect to x"

    def run(self, values: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        W, converged = self.handle.run_converged(values, G, adjoint=True)
        if converged:
            # an unconverged W (let through by on_nonconvergence='warn' / 'ignore', which the handle applied) does
            # not solve A^H W = G: its defect is the solve's error, not G's part in A's null space (a well-conditioned
            # 30 x 10 A, cond 2.9, maxiter=4, was called rank deficient at 0.01)
            _check_rank(self.handle, values, G, W, self.what)
        return W


class _Run(FastFunction):
    """One least-squares solve on the plan with no derivative of its own: the backward pass's solves.
    Through a Function so that under torch.func transforms (grad, vmap) the plan sees the plain
    tensors the transform hands over (a plan cannot read a transform's wrapper: it has no storage)."""

    @staticmethod
    def forward(values: torch.Tensor, B: torch.Tensor, handle) -> torch.Tensor:
        return handle.run(values, B)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.what = "lstsq"

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        raise NotImplementedError("lstsq: second derivatives are not implemented (its gradient is computed by "
                                  "least-squares solves outside autograd); differentiate once, or use finite "
                                  "differences of the gradient")

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError("lstsq: second derivatives (torch.func.hessian, jvp of a gradient) are not "
                                  "implemented; first derivatives work in either mode (grad, jacrev, jvp, jacfwd)")

    @staticmethod
    def vmap(info, in_dims, values, B, handle):
        return vmap_columns(_Run.apply, info, in_dims, values, B, handle)


def _all_zero(t: torch.Tensor) -> bool:
    """Whether a tangent is all zeros (False where that cannot be read: a tangent batched by torch.func.vmap,
    as jacfwd in A's values hands over, refuses data-dependent control flow; it is then taken as given)."""
    try:
        return not bool(t.any())
    except RuntimeError:
        return False


class _Lstsq(FastFunction):
    @staticmethod
    def forward(values: torch.Tensor, B: torch.Tensor, handle: LstsqHandle) -> torch.Tensor:
        return handle.run(values, B)

    @staticmethod
    def vmap(info, in_dims, values, B, handle):
        return vmap_columns(_Lstsq.apply, info, in_dims, values, B, handle)

    @staticmethod
    def jvp(ctx, dvalues, dB, _):
        """Forward mode, from ``K dX = A^H (dB - dA X) + dA^H R`` (``K = A^H A + damp^2 I``): the first part is
        one least-squares solve, ``K^-1`` of the second the backward pass's two (one with damp)."""
        values, B, X = ctx.saved_tensors
        h: LstsqHandle = ctx.handle
        m, n = h.A.format_shape
        damp = float(h.options.get("damp") or 0.0)
        if dvalues is not None and _all_zero(dvalues):
            # torch.func.jvp / jacfwd / forward_ad with a tangent on B alone hand over zeros for A's values: no
            # derivative in them is asked for (a wide A raised "derivatives in A's values need full column rank",
            # and the rank probe's column cost two more solves)
            dvalues = None
        if damp == 0.0 and m < n and dvalues is not None:
            raise InputError(f"lstsq derivatives in A's values need full column rank (m >= n) when damp == 0; A is "
                             f"{m}x{n} (underdetermined). Pass damp > 0 (the derivative in B alone is defined)")
        rhs = dB if dB is not None else torch.zeros_like(B)
        if dvalues is not None:
            rhs = rhs - apply_entries(h.A, dvalues, X)
        dX = _Run.apply(values, rhs, h)
        if dvalues is not None:
            z = apply_entries(h.A, dvalues, B - apply_entries(h.A, values, X), adjoint=True)  # dA^H R
            if damp == 0.0:
                # rank test (module docstring): the missing term is (I - A^+ A) dA^H (.), nonzero where dA^H
                # reaches A's null space; one more column of the same solve, dA^H q (q fixed), tells (zero for a
                # zero tangent that could not be read as one above: one batched by torch.func.vmap)
                q = _fixed_vector(m).to(device=z.device, dtype=z.dtype).expand(*values.shape[:-1], m, 1)
                zq = torch.cat([z, apply_entries(h.A, dvalues, q, adjoint=True).expand(*z.shape[:-1], 1)], dim=-1)
                W = _Run.apply(values, zq, _AdjointRankChecked(h, "the tangent dA^H q"))[..., :-1]
            else:
                W = _Run.apply(values, z, _Adjoint(h))
            dX = dX + (_Run.apply(values, W, h) if damp == 0.0 else (z - apply_entries(h.A, values, W, adjoint=True)) / damp**2)
        return dX

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        values, B, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, B, output)
        ctx.save_for_forward(values, B, output)

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        with torch.no_grad():
            dV, dB = _Lstsq._grads(ctx, G)
        values, B, _X = ctx.saved_tensors
        # no second-order rule: differentiating these again raises (first_order_only)
        return first_order_only(dV, "lstsq", values, B, G), first_order_only(dB, "lstsq", values, B, G), None

    @staticmethod
    def _grads(ctx, G: torch.Tensor):
        values, B, X = ctx.saved_tensors
        h: LstsqHandle = ctx.handle
        need_v, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_v or need_b):
            return None, None
        m, n = h.A.format_shape
        damp = float(h.options.get("damp") or 0.0)
        if damp == 0.0 and m < n and need_v:
            raise InputError(f"lstsq gradients need full column rank (m >= n) when damp == 0; A is {m}x{n} "
                             f"(underdetermined). Pass damp > 0 or do not require grad of A's values (the "
                             f"gradient in B alone is defined)")
        G = G.detach()
        # A K^{-1} G; for a values-gradient at damp == 0 checked for rank deficiency (G's part in A's null space)
        W = _Run.apply(values, G, _AdjointRankChecked(h) if need_v and damp == 0.0 else _Adjoint(h))
        if damp == 0.0:
            Lam = _Run.apply(values, W, h)  # A^+ W = K^{-1} G for full column rank
        else:
            Lam = (G - apply_entries(h.A, values, W, adjoint=True)) / damp**2
        dB = W if need_b else None
        dV = None
        if need_v:
            R = B - apply_entries(h.A, values, X)
            dV = sddmm(h.A, R, Lam) - sddmm(h.A, W, X)
        return dV, dB


def lstsq_function(values: torch.Tensor, B: torch.Tensor, handle: LstsqHandle) -> torch.Tensor:
    """``X`` minimising ``||A(values) X - B||^2 + damp^2 ||X||^2`` through the plan, differentiable."""
    return _Lstsq.apply(values, B, handle)
