"""Non-uniform batches: ``solve(SparseTensorList, [B_i])`` in one backend call (op ``"solve_list"``).

A :class:`SparseTensorList` holds matrices of different sizes and patterns. Backends that can
solve such a batch at once (cuDSS's batch API) declare the op ``"solve_list"``; the others are
never asked. :func:`try_solve_list` asks them; when one offers (and, with no backend/method
pinned, its estimate beats the sum of the members' own best offers), the whole list goes to its
plan; otherwise it returns ``None`` and :func:`sparsetorch.solve` solves member by member.

The request: ``operands[0]`` is ``OperandInfo("sparse_list", (L, n_max, n_max), ...)`` with
``nse`` the total, ``operands[1]`` the right-hand sides as ``(L, n_max, k_max)``; the exact
per-member sizes are in ``options["list_sizes"]`` as ``((n_i, nse_i, k_i), ...)``; properties are
those all members share.

Plan protocol (docs/backend-authors.md)::

    build(As: SparseTensorList, request) -> plan   # pattern work for every member
    plan.set_values(values: list[Tensor])          # numeric phase, all members
    plan.solve(Bs: list[Tensor], *, adjoint=False) -> (list[Tensor], IterationResult)

``B_i`` is ``(n_i, k_i)``; the answers have the same shapes. Gradients: one batched adjoint
solve for all members, then ``dA_i = -sddmm(A_i, Lambda_i, X_i)`` on each pattern (DESIGN.md).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..autograd.sddmm import sddmm
from ..dispatch.plan import make_request, options_key, plan_cache
from ..dispatch.records import OperandInfo, Request
from ..dispatch.select import ExplainTable, rank
from ..errors import InputError
from ..tensor import SparseTensor, SparseTensorList
from ..tensor.pattern import version_of
from .info import IterationResult, SolveInfo

__all__ = ["try_solve_list", "list_request", "ListSolveState"]


def list_request(As: SparseTensorList, Bs: Sequence[torch.Tensor], props: frozenset[str], options: dict[str, Any]) -> Request:
    first = As[0]
    n_max = max(int(a.shape[-1]) for a in As)
    k_max = max(int(b.shape[-1]) for b in Bs)
    A_info = OperandInfo("sparse_list", (len(As), n_max, n_max), first.dtype, first.device, None,
                         sum(int(a.nse) for a in As), (), any(a.requires_grad for a in As))
    B_info = OperandInfo("dense", (len(As), n_max, k_max), Bs[0].dtype, Bs[0].device, None, None, (),
                         any(b.requires_grad for b in Bs))
    opts = dict(options)
    opts["list_sizes"] = tuple((int(a.shape[-1]), int(a.nse), int(b.shape[-1])) for a, b in zip(As, Bs))
    return make_request("solve_list", (A_info, B_info), props, opts)


class ListSolveState:
    """A list plan and the values it holds (by identity and version, then by comparison)."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.tokens: tuple | None = None
        self.snapshots: list[torch.Tensor] | None = None

    def load(self, values: Sequence[torch.Tensor]) -> None:
        vs = [v.detach() for v in values]
        tokens = tuple((v.data_ptr(), version_of(v), tuple(v.shape)) for v in vs)
        if (tokens == self.tokens and self.snapshots is not None
                and all(torch.equal(s, v) for s, v in zip(self.snapshots, vs))):
            return
        self.plan.set_values(vs)
        self.tokens = tokens
        self.snapshots = [v.clone() for v in vs]


class _ListSolve(torch.autograd.Function):
    """Inputs: the state, the list length, then the L values tensors and the L right-hand sides."""

    @staticmethod
    def forward(ctx, state: ListSolveState, As: SparseTensorList, L: int, *tensors: torch.Tensor):
        values, Bs = tensors[:L], tensors[L:]
        state.load(values)
        with torch.no_grad():
            Xs, result = state.plan.solve([b.detach() for b in Bs], adjoint=False)
        ctx.state, ctx.As, ctx.L = state, As, L
        ctx.result = result
        ctx.save_for_backward(*values, *Xs)
        state.last_result = result
        return tuple(Xs)

    @staticmethod
    def backward(ctx, *dXs):
        L, state = ctx.L, ctx.state
        saved = ctx.saved_tensors
        values, Xs = saved[:L], saved[L:]
        state.load(values)
        grads = [torch.zeros_like(x) if d is None else d for d, x in zip(dXs, Xs)]
        with torch.no_grad():
            Ms, _ = state.plan.solve([g.detach() for g in grads], adjoint=True)
        need = ctx.needs_input_grad[3:]
        dV = [(-sddmm(A, M, X) if need[i] else None) for i, (A, M, X) in enumerate(zip(ctx.As, Ms, Xs))]
        dB = [(M if need[L + i] else None) for i, M in enumerate(Ms)]
        return (None, None, None, *dV, *dB)


def try_solve_list(As: SparseTensorList, Bs: list[torch.Tensor], member_requests: list[Request], props: frozenset[str],
                   options: dict[str, Any], cache: bool) -> tuple[list[torch.Tensor], ExplainTable, IterationResult] | None:
    """Solve the whole list through a backend's ``solve_list`` plan, or ``None`` (solve per member)."""
    if len(As) == 0:
        return None
    request = list_request(As, Bs, props, options)
    table = rank(request)
    chosen = table.chosen
    if chosen is None or chosen.offer is None:
        return None
    offer = chosen.offer
    pinned = options.get("backend") is not None or options.get("method") is not None
    if not pinned:
        from ..dispatch.select import choose  # noqa: PLC0415

        loop = 0.0
        for r in member_requests:
            try:
                loop += choose(r)[0].seconds
            except Exception:  # noqa: BLE001 - a member nobody can solve: the list plan it is
                loop = float("inf")
                break
        if offer.seconds >= loop:
            return None
    key = ("solve_list", offer.backend, offer.method, tuple(a.pattern_key for a in As), As[0].dtype,
           options_key(offer, request.options))
    detached = SparseTensorList([a.detach() for a in As])

    def build() -> ListSolveState:
        return ListSolveState(offer.build(detached, request))

    if cache:
        state, hit = plan_cache().get_or_build(key, As[0].pattern_key, build,
                                               ("solve_list", offer.backend, offer.method, tuple(request.A.shape)))
    else:
        state, hit = build(), False
    state.reused = hit
    Xs = _ListSolve.apply(state, detached, len(As), *[a.values for a in As], *Bs)
    return list(Xs), table, getattr(state, "last_result", None)


def list_infos(As: SparseTensorList, Bs: list[torch.Tensor], Xs: list[torch.Tensor], table: ExplainTable,
               result: IterationResult | None, reused: bool) -> list[SolveInfo]:
    """One :class:`SolveInfo` per member (true residuals), for ``return_info=True``."""
    from .matmul import matmul_exact  # noqa: PLC0415

    offer = table.chosen.offer
    out = []
    for A, B, X in zip(As, Bs, Xs):
        with torch.no_grad():
            Bn = B if B.dim() > 1 else B.unsqueeze(-1)
            Xn = X if X.dim() > 1 else X.unsqueeze(-1)
            r = Bn - matmul_exact(A.detach(), Xn.detach())
            bn = torch.linalg.vector_norm(Bn, dim=-2)
            rel = torch.linalg.vector_norm(r, dim=-2) / torch.where(bn > 0, bn, torch.ones_like(bn))
        res = result or IterationResult(0, float("nan"), True, None, "")
        out.append(SolveInfo(backend=offer.backend, method=offer.method, iterations=res.iterations,
                             residual=float(rel.max()) if rel.numel() else 0.0, converged=res.converged,
                             status=res.status, reason=res.reason, residual_history=(), preconditioner=None,
                             plan_reused=reused, extra={"estimated_seconds": offer.seconds, "list": True}))
    return out


def check_list_inputs(As: SparseTensorList, Bs: list[torch.Tensor]) -> None:
    for i, (A, B) in enumerate(zip(As, Bs)):
        if not isinstance(A, SparseTensor):
            raise InputError(f"SparseTensorList item {i} is not a SparseTensor")
        if A.shape[-1] != A.shape[-2]:
            raise InputError(f"solve needs square matrices; list item {i} is {tuple(A.shape)}")
        if B.shape[0] != A.shape[-1]:
            raise InputError(f"right-hand side {i} has {B.shape[0]} rows for a {A.shape[-1]}x{A.shape[-1]} matrix")


def solve_list_entry(As: SparseTensorList, Bs: list[torch.Tensor], *, properties, options: dict[str, Any],
                     check_finite: bool, return_info: bool, cache: bool):
    """The list path of :func:`sparsetorch.solve`: ``None`` when no backend takes the whole list
    (the caller then solves member by member), else ``Xs`` or ``(Xs, infos)``."""
    from ..dispatch import get_backends  # noqa: PLC0415
    from ..tensor.sparse_tensor import is_plain  # noqa: PLC0415
    from ._inputs import as_rhs, check_finite as check_finite_values, check_matrix, restore_rhs  # noqa: PLC0415
    from .solve import solve_request  # noqa: PLC0415

    if len(As) == 0 or not any("solve_list" in info.ops for info in get_backends().info()):
        return None
    def member(i: int, check, *args):
        # which member is wrong, as the member-by-member path says it (session 24's sweep: "the right-hand side
        # has shape (17,)" with no word of which of the list's systems)
        try:
            return check(*args)
        except InputError as exc:
            raise type(exc)(f"SparseTensorList member {i} of {len(As)}: {exc}") from exc

    mats = [member(i, lambda a: check_matrix(a, "solve", square=True), a) for i, a in enumerate(As)]
    if any(a.batch_shape for a in mats):
        return None  # members with their own value batch: member by member
    rhs = [member(i, lambda a, b: as_rhs(a, b, "solve", rows=a.format_shape[0]), a, b)
           for i, (a, b) in enumerate(zip(mats, Bs))]
    Bn, vector = [r[0] for r in rhs], [r[1] for r in rhs]
    if check_finite:
        for i, (a, b) in enumerate(zip(mats, Bn)):
            if is_plain(a.values):
                member(i, check_finite_values, a, None, "solve")
            if not bool(torch.isfinite(b).all()):
                raise InputError(f"solve: right-hand side {i} of the list has NaN or Inf entries")
    # A first, cheap question without property detection: does any backend take this list at all
    # (on this device, dtype, ...)? Only then are the members' properties detected.
    from .properties import normalize_tags  # noqa: PLC0415

    given = normalize_tags(properties)
    probe = rank(list_request(SparseTensorList(mats), Bn, given if given is not None else frozenset({"spd"}), options))
    if probe.chosen is None:
        return None
    member_requests = [solve_request(a, b, properties, options) for a, b in zip(mats, Bn)]
    props = frozenset.intersection(*[r.properties for r in member_requests])
    got = try_solve_list(SparseTensorList(mats), Bn, member_requests, props, options, cache)
    if got is None:
        return None
    Xs, table, result = got
    out = [restore_rhs(x, v) for x, v in zip(Xs, vector)]
    if return_info:
        return out, list_infos(mats, Bn, Xs, table, result, False)
    return out
