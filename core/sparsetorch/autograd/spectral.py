"""Adjoint rules of the sparse symmetric eigenproblem ``A v = w M v`` (``M = I`` when absent).

The computed pairs are ``(w_i, v_i)``, ``i < k``, normalised ``V^H M V = I``. For a loss with
gradients ``gw`` (eigenvalues) and ``gV`` (eigenvectors) the rules (derivation in
docs/spectral.md) are, on the stored entries of A and M:

    eigenvalues    dA += sum_i gw_i  v_i[row] conj(v_i[col])            (Hellmann-Feynman)
                   dM -= sum_i gw_i w_i v_i[row] conj(v_i[col])
    eigenvectors   q_i = sum_{j != i, j computed} v_j (v_j^H gv_i) / (w_i - w_j)  -  y_i
                   with y_i from the bordered system  [A - w_i M   M V] [y_i]   [gv_i]
                                                      [V^H M       0 ] [s_i] = [ 0  ]
                   (y_i is the part of (A - w_i M)^+ gv_i outside the computed eigenspace)
                   dA += sum_i (q_i[row] conj(v_i[col]) + v_i[row] conj(q_i[col])) / 2
                   dM -= sum_i (w_i (q_i[row] conj(v_i[col]) + v_i[row] conj(q_i[col])) / 2
                                + 1/2 Re(gv_i^H v_i) v_i[row] conj(v_i[col]))
                   (the Hermitian part of q_i v_i^H: A and M are read as Hermitian, so an entry's
                   gradient equals its mirror's conjugate and a gradient step keeps them so)

One bordered solve per eigenvector that receives a gradient, through dispatch (the bordered
matrix of every i shares one pattern, so one plan serves them all). The coupling between two
computed eigenvalues ``1 / (w_i - w_j)`` does not exist at a repeated eigenvalue: a gap below
``degenerate_tol`` (relative to ``max |w|``) with a non-zero coupling raises
:class:`DegenerateEigenvalueError` (or warns, per the handle's policy); losses that depend on
the eigenspace only (for example ``sum_i v_i v_i^H``) have zero coupling and pass. A loss that
reads some vectors of a repeated eigenvalue and not the others (one computed but unread, or a
copy outside the computed pairs, found by the bordered solve's probe) raises too, unless its
gradient lies within the vectors it reads (``_vector_adjoint`` has the three tests). The bordered
system is assembled and solved by the ops layer (``ops/spectral/_bordered.py``), which hands its
class to the handle (``EigshHandle.bordered``): solving means dispatch, above this layer.

For a general A (``eigs``) the eigenvalues' rule, with left eigenvectors ``u_i`` (``u_i^H A = w_i
u_i^H``), is ``dA += sum_i gw_i / conj(u_i^H v_i)  u_i[row] conj(v_i[col])``; eigenvector
gradients of a non-symmetric A are not supported.

The forward passes run the ops layer's fallback driver (``handle.attempts``: it loads the values
into each plan it tries, runs it, checks the pairs and hands over to the next capable offer); the
backward passes need A, M and the pairs only, so gradients follow whichever method succeeded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ._first_order import first_order_only

from ..errors import DegenerateEigenvalueError, InputError
from ..tensor import SparseTensor
from ..dispatch.plan import PlanState
from .sddmm import sddmm

__all__ = ["EigshHandle", "eigsh_function", "EigsHandle", "eigs_function"]


@dataclass
class EigshHandle:
    """What the forward pass needs: the first plan, the call's options, and ``attempts`` (the
    ops module's fallback driver: it loads the values into each plan it tries, runs it, checks
    the pairs, and hands over to the next capable offer when one fails; ``None``: the one plan
    only). The backward pass needs A, M and the pairs only, so gradients follow whichever
    method succeeded, and ``bordered`` (the class of the bordered system, ``(A, M, k) ->`` an
    object with ``solve(avals, mvals, V, shift, rhs)``) for eigenvector gradients."""

    state: PlanState
    A: SparseTensor
    M: SparseTensor | None
    call: dict
    degenerate: str = "raise"
    degenerate_tol: float = 1e-8
    check: Any = None
    results: list = field(default_factory=list)
    attempts: Any = None
    bordered: Any = None

    def run(self, values: torch.Tensor, mvalues: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        M = None if self.M is None else self.M.with_values(mvalues.detach())
        if self.attempts is None:
            with self.state.lock, torch.no_grad():
                self.state.load(values)
                w, V, res = self.state.plan.eigsh(M=M, **self.call)
            self.results.append(res)
            if self.check is not None:
                self.check(res, self.state.plan)
            return w, V
        w, V = self.attempts.run_eigsh(self.A, values, M, self.call)
        self.state = self.attempts.state
        self.results.append(self.attempts.result)
        return w, V


def _no_forward_mode(op: str):
    raise NotImplementedError(
        f"{op}: forward-mode derivatives (torch.func.jvp, jacfwd, hessian) are not implemented; use reverse mode "
        f"(torch.func.grad / jacrev, or backward()), and for second derivatives of eigenvalues backward() with "
        f"create_graph=True")


def _no_vmap(op: str):
    raise InputError(
        f"{op} under torch.func.vmap (or jacfwd / hessian, which vmap over tangents) is not supported; give "
        f"several matrices as a value batch instead (A.with_values(V), V of shape (batch, nnz)), and take "
        f"derivatives with torch.func.grad / jacrev")


class _Eigsh(torch.autograd.Function):
    @staticmethod
    def forward(values, mvalues, handle):
        return handle.run(values, mvalues)

    @staticmethod
    def jvp(ctx, *tangents):
        _no_forward_mode("eigsh")

    @staticmethod
    def vmap(info, in_dims, values, mvalues, handle):
        _no_vmap("eigsh")

    @staticmethod
    def setup_context(ctx, inputs, output):
        values, mvalues, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, mvalues, *output)

    @staticmethod
    def backward(ctx, gw, gV):
        values, mvalues, w, V = ctx.saved_tensors
        h: EigshHandle = ctx.handle
        need_a, need_m = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_a or need_m):
            return None, None, None
        if gw is None:
            gw = torch.zeros_like(w)
        Q = torch.zeros_like(V)
        has_q = gV is not None and bool((gV != 0).any())
        if has_q:
            with torch.no_grad():
                Q = _vector_adjoint(h, values, mvalues, w, V, gV)
            # the eigenvector adjoint (bordered solves) has no second-order rule: raise, not a wrong Hessian
            Q = first_order_only(Q, "eigsh (eigenvector gradient)", values, mvalues, gV, V)
        wc = w.to(V.dtype).unsqueeze(-2)
        gwc = gw.to(V.dtype).unsqueeze(-2)
        # The Hermitian part of Q V^H: eigsh reads A (and M) as Hermitian, w(A) = w((A + A^H) / 2), so
        # the gradient of one stored entry equals its mirror's conjugate and a gradient step keeps A
        # Hermitian (Q V^H alone differed between (i, j) and (j, i): a step made A non-symmetric, and
        # the Hessian of eigenvalues was wrong entry by entry; session 21's sweep). V diag(gw) V^H is
        # Hermitian already.
        dA = None
        if need_a:
            dA = sddmm(h.A, V * gwc, V)
            if has_q:
                dA = dA + 0.5 * (sddmm(h.A, Q, V) + sddmm(h.A, V, Q))
        dM = None
        if need_m:
            norm_term = torch.zeros_like(w) if gV is None else (gV.conj() * V).sum(-2).real
            P = V * (gwc * wc) + 0.5 * V * norm_term.to(V.dtype).unsqueeze(-2)
            dM = -sddmm(h.M, P, V)
            if has_q:
                Qw = Q * wc
                dM = dM - 0.5 * (sddmm(h.M, Qw, V) + sddmm(h.M, V, Qw))
        return dA, dM, None


def _vector_adjoint(h: EigshHandle, values, mvalues, w, V, gV) -> torch.Tensor:
    """``Q`` of the module docstring, for every member of the value batch.

    Degeneracy (the eigenvector gradient does not exist) is found three ways, each raising
    :class:`DegenerateEigenvalueError` under ``degenerate="raise"``:

    - two computed eigenvalues closer than ``wtol`` (``degenerate_tol * max|w|``, and never below
      ``100 eps`` times the eigenvalues' scale) whose coupling rotates the pair: ``C - C^H`` non-zero,
      ``C = V_S^H gV_S`` on the cluster ``S`` (the loss is not invariant to rotations of it at first order);
    - a cluster of which the loss reads some vectors and not others (a column of ``gV`` exactly
      zero) while a read one's gradient has a part outside the cluster: the loss is then a function
      of some vectors of the eigenspace only, which has a gradient only when that part is zero. The
      first-order test above cannot see this: on a 4 x 4 grid Laplacian ``(v_1^2 * arange(16)).sum()``
      is constant on the repeated eigenvalue's eigenspace, so ``C - C^H`` is exactly 0, and the
      gradient came back different for every method (session 27's sweep);
    - a copy of ``w_i`` outside the computed pairs (the bordered system's probe, ``ops/spectral/
      _bordered.py``, puts an eigenvalue not computed within ``wtol`` of it) while ``gv_i`` has a
      part outside the computed vectors of ``w_i``: the same argument, the missing copy being unread.
      When that part is zero the gradient exists and ``y_i`` is 0 (the solve's answer is then only
      the arbitrary component along the missing copy, which an LU returned as garbage).
    """
    batch = tuple(V.shape[:-2])
    n, k = V.shape[-2], V.shape[-1]
    flat = lambda t, tail: t.reshape(-1, *tail)  # noqa: E731
    Vf, gVf, wf = flat(V, (n, k)), flat(gV, (n, k)), flat(w, (k,))
    vals = values.reshape(-1, values.shape[-1]) if values.dim() > 1 else values.unsqueeze(0).expand(Vf.shape[0], -1)
    mv = None
    if h.M is not None:
        mv = mvalues.reshape(-1, mvalues.shape[-1]) if mvalues.dim() > 1 else mvalues.unsqueeze(0).expand(Vf.shape[0], -1)
    eps = torch.finfo(V.dtype).eps
    ptol = eps ** 0.5  # a gradient's part outside a cluster below ptol * its norm counts as none
    out = []
    bordered = None
    for b in range(Vf.shape[0]):
        Vb, gb, wb = Vf[b], gVf[b], wf[b]
        MVb = Vb if h.M is None else h.M.with_values(mv[b].detach()) @ Vb  # type: ignore[index]
        coupling = Vb.mH @ gb  # (k, k): v_j^H gv_i
        gap = wb.unsqueeze(0) - wb.unsqueeze(1)  # [j, i] = w_i - w_j
        scale = float(wb.abs().max()) if k else 1.0
        # the eigenvalues' scale: max|w|, or A's entries (over M's) when the computed ones are all small
        amax = float(vals[b].detach().abs().max()) if vals.shape[-1] else 0.0
        if mv is not None and mv.shape[-1]:
            amax = amax / max(float(mv[b].detach().abs().max()), 1e-300)
        wscale = max(scale, amax)
        wtol = max(h.degenerate_tol * scale, 100 * eps * wscale, 1e-300)
        eye = torch.eye(k, dtype=torch.bool, device=gap.device)
        close = (gap.abs() <= wtol) & ~eye
        # Within a (nearly) repeated pair only the part of the coupling that rotates the pair
        # needs 1/gap; a loss that depends on the eigenspace alone has none of it.
        ctol = max(1e-8, 100 * eps) * max(float(coupling.abs().max()), 1e-300)
        rotating = (coupling - coupling.mH).abs() > ctol
        if bool((close & rotating).any()):
            j, i = (int(x) for x in torch.nonzero(close & rotating)[0])
            msg = (
                f"eigenvector gradient at (nearly) repeated eigenvalues w[{j}]={float(wb[j]):.6g} and "
                f"w[{i}]={float(wb[i]):.6g} (gap {float(gap[j, i].abs()):.3g} <= degenerate_tol={h.degenerate_tol:g} * "
                f"max|w|): the eigenvectors are not unique there and this loss depends on which ones are returned, "
                f"so its gradient does not exist. Use a loss that depends only on the eigenspace, or pass "
                f"degenerate='warn' (drops the coupling of the pair) or degenerate_tol= to change the threshold"
            )
            _degenerate(h, msg)
        wanted = [i for i in range(k) if bool((gb[:, i] != 0).any())]
        read = (gb != 0).any(0)
        # each wanted gradient's part outside its cluster S (its own vector and the computed ones close to it)
        outside: dict[int, float] = {}
        for i in wanted:
            S = close[:, i] | eye[:, i]
            g = gb[:, i]
            r = g - MVb[:, S] @ (Vb[:, S].mH @ g)
            outside[i] = _ratio(float(torch.linalg.vector_norm(r)), float(torch.linalg.vector_norm(g)))
            unread = close[:, i] & ~read
            if outside[i] > ptol and bool(unread.any()):
                j = int(torch.nonzero(unread)[0])
                _degenerate(h, (
                    f"eigenvector gradient at (nearly) repeated eigenvalues w[{i}]={float(wb[i]):.6g} and "
                    f"w[{j}]={float(wb[j]):.6g} (gap {float(gap[j, i].abs()):.3g} <= degenerate_tol={h.degenerate_tol:g} "
                    f"* max|w|): the loss reads eigenvector {i} and not eigenvector {j} of the same eigenspace, so it "
                    f"depends on which vectors are returned and its gradient does not exist. Use a loss of the whole "
                    f"eigenspace (every vector of it, e.g. a projector sum_i v_i v_i^H), or pass degenerate='ignore' "
                    f"if the loss is known to depend on the eigenspace only ('warn' to be told)"))
        skip = close | eye
        safe = torch.where(skip, torch.ones_like(gap), gap)
        coef = torch.where(skip, torch.zeros_like(coupling), coupling / safe.to(coupling.dtype))
        Qb = Vb @ coef
        if k < n:
            if bordered is None:
                bordered = h.bordered(h.A, h.M, k)
            for i in wanted:
                g = gb[:, i]
                gn = float(torch.linalg.vector_norm(g))
                if _ratio(float(torch.linalg.vector_norm(g - MVb @ (Vb.mH @ g))), gn) <= 100 * eps:
                    continue  # g in the span of M V: y is 0 (and a missing copy's arbitrary part is not taken)
                sol = bordered.solve(vals[b], None if mv is None else mv[b], Vb, float(wb[i]), g,
                                     gap_tol=wtol, drop_null=h.degenerate != "raise")
                y = sol.y
                # y = sum over the eigenpairs not computed of v_j v_j^H g / (w_j - w_i): its norm bounds
                # the nearest such gap too, min |w_j - w_i| <= ||g|| / ||y||. A copy of w_i outside the
                # computed ones that rounding leaves just apart (Lanczos) gave a gradient of norm 4e13
                # and no error (session 21's sweep)
                yn = 0.0 if y is None else float(torch.linalg.vector_norm(y))
                near = min(sol.gap, _ratio(gn, yn))
                if y is None or sol.dropped or near <= wtol:
                    if outside[i] <= ptol:
                        continue  # gv_i within the computed vectors of w_i: the gradient exists and y is 0
                    _degenerate(h, (
                        f"eigenvector gradient at eigenvalue w[{i}]={float(wb[i]):.6g}: an eigenvalue not among the {k} "
                        f"computed lies within {near:.3g} of it (<= degenerate_tol={h.degenerate_tol:g} * max|w|, or "
                        f"rounding), so the eigenvector is (nearly) not unique and this loss's gradient does not exist. "
                        f"Compute more eigenpairs (a larger k) so that every copy is among them and use a loss of the "
                        f"whole eigenspace, or pass degenerate='warn' / 'ignore' (drops the coupling to the missing "
                        f"copy)"))
                if y is not None:
                    Qb[:, i] = Qb[:, i] - y
        out.append(Qb)
    return torch.stack(out).reshape(*batch, n, k)


def _degenerate(h: EigshHandle, msg: str) -> None:
    """Raise, warn or pass, per the handle's ``degenerate`` policy."""
    if h.degenerate == "raise":
        raise DegenerateEigenvalueError(msg)
    if h.degenerate == "warn":
        warnings.warn(msg, stacklevel=4)


def _ratio(num: float, den: float) -> float:
    return 0.0 if num == 0.0 else (float("inf") if den == 0.0 else num / den)


def eigsh_function(values: torch.Tensor, mvalues: torch.Tensor, handle: EigshHandle):
    return _Eigsh.apply(values, mvalues, handle)


# --- eigs (general A) -------------------------------------------------------------------------------

@dataclass
class EigsHandle:
    """What ``eigs``'s forward pass needs (``attempts``: the ops layer's fallback driver, see
    :class:`EigshHandle`) and what it leaves for the backward pass: the left eigenvectors ``U``
    (computed when ``left``: A requires a gradient)."""

    attempts: Any
    call: dict
    left: bool
    A: SparseTensor
    U: torch.Tensor | None = None


class _Eigs(torch.autograd.Function):
    """Eigenvalue gradients of a general A: dw_i = u_i^H dA v_i / (u_i^H v_i)."""

    @staticmethod
    def forward(values, handle: EigsHandle):
        w, V, U = handle.attempts.run_eigs(handle.A, values, handle.call, handle.left)
        handle.U = U
        return w, V

    @staticmethod
    def jvp(ctx, *tangents):
        _no_forward_mode("eigs")

    @staticmethod
    def vmap(info, in_dims, values, handle):
        _no_vmap("eigs")

    @staticmethod
    def setup_context(ctx, inputs, output):
        values, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(*output)

    @staticmethod
    def backward(ctx, gw, gV):
        w, V = ctx.saved_tensors
        h: EigsHandle = ctx.handle
        if gV is not None and bool((gV != 0).any()):
            raise InputError("eigs: gradients through the eigenvectors of a non-symmetric matrix are not supported; "
                             "differentiate the eigenvalues (or use eigsh for symmetric matrices)")
        if gw is None or h.U is None:
            return None, None
        U = h.U
        denom = (U.conj() * V).sum(-2)  # u_i^H v_i
        tiny = denom.abs() <= 1e-12
        if bool(tiny.any()):
            raise InputError("eigs: an eigenvalue is defective (u^H v ~ 0 for its left/right eigenvectors): its "
                             "derivative does not exist")
        P = U * (gw / denom.conj()).unsqueeze(-2)
        d = sddmm(h.A, P, V)
        # U comes from the forward pass without a graph: no second-order rule
        return first_order_only(d if h.A.dtype.is_complex else d.real, "eigs", V, gw), None


def eigs_function(values: torch.Tensor, handle: EigsHandle):
    return _Eigs.apply(values, handle)
