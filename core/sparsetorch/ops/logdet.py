"""``slogdet``, ``logdet`` and ``det`` of sparse matrices through dispatch, with gradients.

The value comes from the chosen direct backend's factorization, in log space (the sum of
``log |pivot|`` and the product of pivot signs and the permutation's sign): no overflow, no
underflow, whatever the scaling (a 4096-unknown Poisson matrix has ``det`` far below the
smallest float64, its ``logdet`` is an ordinary number).

Properties are detected as :func:`sparsetorch.solve` detects them (symmetric; SPD by diagonal
dominance) unless ``properties=`` says, so an SPD matrix gets a Cholesky-based method where a
backend offers one (the Eigen plugin's SimplicialLLT). A chosen method that fails (a Cholesky
that meets a non-positive pivot, a plugin error, a NaN result) hands over to the next offer of
``explain("logdet", A)``; a pinned ``method=`` raises. ``info.extra["attempts"]`` lists them.

Gradient (DESIGN.md): ``d logdet / dA_vals[k] = (A^-1)[col_k, row_k]`` on the pattern. Three ways
to get those entries of the inverse (``grad_method=``):

- ``"exact"`` (default): the plan's selected inversion when it offers ``inverse_entries``;
  otherwise solves with the factorization against blocks of unit vectors (``n`` solves in
  blocks of 256; refused above ``exact_max`` unknowns, 20,000 by default, with the advice below).
- ``"hutchinson"``: the unbiased stochastic estimate ``(A^-1)[c, r] ~ mean_p (A^-1 z_p)[c] z_p[r]``
  with ``probes`` Rademacher vectors ``z_p`` (one multi-right-hand-side solve on the same
  factorization). Its variance per entry is ``sum_{j != r} (A^-1)[c, j]^2 / probes``: small for
  matrices whose inverse decays away from the diagonal (the GMRF precision matrices this is for),
  large otherwise. After the backward pass, the estimated standard error of each entry (in
  A's value slots' order of stored entries) is in ``info.extra["grad_stderr"]`` of
  ``slogdet(..., return_info=True)``.

A *value* that is itself an estimate, for Hermitian positive definite matrices too large to factor:
``method="slq"`` (alias ``"hutchinson"``, torch-sla's name), stochastic Lanczos quadrature with its own
stochastic gradient (``ops/logdet_slq.py``). Only that method name selects it: the default stays exact.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


from ..autograd.lstsq import apply_entries
from ..autograd._route_checks import _equilibrated, _norm2_floor, _singular_growth
from ..autograd._first_order import first_order_only
from ..dispatch.accuracy import backward_error_bound, normwise_backward_error
from ..errors import BackendError, InputError, NotSymmetricError, SingularMatrixError, SparseTorchError
from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain, vmapped
from ..dispatch.options import LogdetOptions
from ..dispatch.plan import make_request, obtain_plan, with_options
from ._inputs import check_finite as check_finite_values, check_matrix, describe_factored
from .info import SolveInfo
from ..dispatch.plans import InverseEntries, supports
from .properties import detect_cached, normalize_tags
from .logdet_slq import SLQ_METHODS, slq_logdet

__all__ = ["slogdet", "logdet", "det"]

EXACT_MAX = 20_000
_BLOCK = 256


class _Handle(dict):
    """One call's plan and options, handed to :class:`_Slogdet` as one opaque argument: torch.func
    transforms flatten a plain dict (a pytree) and meet the SparseTensor inside it."""


class _Slogdet(torch.autograd.Function):
    @staticmethod
    def forward(values, handle):
        sign, logabs = _run(values, handle)
        return sign, logabs

    @staticmethod
    def setup_context(ctx, inputs, output):
        values, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, output[0])
        ctx.save_for_forward(values, output[0])
        if not values.is_complex():
            ctx.mark_non_differentiable(output[0])

    @staticmethod
    def jvp(ctx, dvalues, _):
        """Forward mode: ``d log det A = tr(A^-1 dA) = sum_k (A^-1)[col_k, row_k] dvalues_k``; log|det| moves by
        its real part, a complex sign turns by its imaginary part."""
        values, sign = ctx.saved_tensors
        d = (_InverseEntries.apply(values, ctx.handle) * dvalues).sum(-1)
        if not values.is_complex():
            return None, d  # a real sign is marked non-differentiable
        return 1j * sign * d.imag, d.real

    @staticmethod
    def vmap(info, in_dims, values, handle):
        return _per_member(_Slogdet.apply, info, in_dims[0], values, handle), (0, 0)

    @staticmethod
    def backward(ctx, gsign, glogabs):
        values, sign = ctx.saved_tensors
        h = ctx.handle
        if not ctx.needs_input_grad[0]:
            return None, None
        Z = _InverseEntries.apply(values, h)  # (A^-1)[col_k, row_k] per stored slot, batch in front
        coef = torch.zeros_like(sign.real if sign.is_complex() else sign) if glogabs is None else glogabs
        if values.is_complex():
            g = coef.to(values.dtype)
            if gsign is not None:
                g = g - 1j * (gsign.conj() * sign).imag
            out = Z.conj() * g.unsqueeze(-1)
        else:
            out = Z * coef.unsqueeze(-1)
        # Z (entries of A^-1) is computed without a graph: a second derivative must raise, not read 0
        return first_order_only(out, "slogdet / logdet / det", values, glogabs, gsign), None


class _InverseEntries(torch.autograd.Function):
    """``(A^-1)[col_k, row_k]`` per stored slot for ``values``: the gradient of log|det A|, computed by the
    plan outside autograd. A Function so that under torch.func transforms the plan reads the plain
    tensors the transform hands over."""

    @staticmethod
    def forward(values, handle):
        # load and solves under the plan's lock: another thread's call on the same cached plan
        # must not load its values between this load and these solves
        with handle["state"].lock, torch.no_grad():
            eq = _equilibration(handle["A"], values) if handle.get("equilibrate") else None
            handle["state"].load(values if eq is None else eq[2])
            try:
                A = handle["A"]
                # the plan's solves of a numerically singular matrix answer (huge, meaningless entries): decided
                # as the forward's value (sign 0, -inf) was, before any entry of A^-1 is computed
                plan = handle["state"].plan
                if bool(_singular_members(plan, values if eq is None else eq[2], A, plan.slogdet()[0],
                                          eq is not None).any()):
                    raise SingularMatrixError("the matrix is singular to working precision (slogdet's sign is 0)")
                return _inverse_transpose_entries(handle, eq)
            except (torch.linalg.LinAlgError, SingularMatrixError) as exc:
                raise SingularMatrixError(
                    f"the gradient of slogdet / logdet / det at a singular matrix: log|det| is -inf there and its "
                    f"gradient, A^-T, does not exist (det's own gradient, the adjugate, is not implemented); "
                    f"({type(exc).__name__}: {str(exc)[:160]})") from exc

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, gZ):
        raise NotImplementedError("slogdet / logdet / det: second derivatives are not implemented (the gradient's "
                                  "entries of A^-1 are computed by the plan outside autograd)")

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError("slogdet / logdet / det: second derivatives (torch.func.hessian, jvp of a gradient) "
                                  "are not implemented; first derivatives work in either mode (grad, jacrev, jvp, "
                                  "jacfwd)")

    @staticmethod
    def vmap(info, in_dims, values, handle):
        return _per_member(_InverseEntries.apply, info, in_dims[0], values, handle), 0


def _per_member(apply, info, dim, values, handle):
    """A vmap rule: one call per member of the mapped values (each needs its own factorization)."""
    members = [apply(values.select(dim, i) if dim is not None else values, handle) for i in range(info.batch_size)]
    if isinstance(members[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*members))
    return torch.stack(members)


def _inverse_transpose_entries(h, eq=None) -> torch.Tensor:
    """``(A^-1)[col_k, row_k]`` in A's value slots (padding slots get zero). ``eq``: ``(r, c, _)`` where the
    plan holds ``S = diag(r) A diag(c)`` (:func:`_equilibration`): ``A^-1 = diag(c) S^-1 diag(r)``."""
    A: SparseTensor = h["A"]
    plan = h["state"].plan
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    n = A.format_shape[0]
    nslots = A.values.shape[-1]
    batch = tuple(A.batch_shape)
    with torch.no_grad():
        if h["grad_method"] == "hutchinson":
            per = _hutchinson(plan, rows, cols, n, batch, A, h)
        elif supports(plan, InverseEntries):
            per = plan.inverse_entries(cols, rows)
        else:
            if n > h["exact_max"]:
                raise InputError(
                    f"logdet gradient: exact entries of A^-1 by solves need {n} solves (n={n} > exact_max={h['exact_max']}) "
                    f"and the {plan.backend}/{plan.method} plan has no selected inversion; pass grad_method='hutchinson' "
                    f"(stochastic, unbiased) or raise exact_max="
                )
            per = _by_solves(plan, rows, cols, n, batch, A)
        if eq is not None:
            per = per * (eq[1].index_select(-1, cols) * eq[0].index_select(-1, rows)).to(per.dtype)
        out = per.new_zeros(*per.shape[:-1], nslots)
        return out.index_add(-1, slot, per)


def _by_solves(plan, rows, cols, n, batch, A) -> torch.Tensor:
    per = torch.zeros(*batch, rows.numel(), dtype=A.dtype, device=A.device)
    order = torch.argsort(rows, stable=True)
    rs = rows[order]
    for start in range(0, n, _BLOCK):
        stop = min(n, start + _BLOCK)
        lo, hi = (int(x) for x in torch.searchsorted(rs, torch.tensor([start, stop], device=rs.device)))
        if lo == hi:
            continue
        E = torch.zeros(*batch, n, stop - start, dtype=A.dtype, device=A.device)
        idx = torch.arange(start, stop, device=A.device)
        E[..., idx, idx - start] = 1
        X, _ = plan.solve(E)  # columns start..stop-1 of A^-1
        sel = order[lo:hi]
        per[..., sel] = X[..., cols[sel], rows[sel] - start]
    return per


def _hutchinson(plan, rows, cols, n, batch, A, h) -> torch.Tensor:
    probes = h["probes"]
    g = torch.Generator(device="cpu").manual_seed(h["seed"])
    Z = (torch.randint(0, 2, (*batch, n, probes), generator=g) * 2 - 1).to(dtype=A.dtype, device=A.device)
    X, _ = plan.solve(Z)
    samples = X[..., cols, :] * Z[..., rows, :]  # (*batch, nnz, probes)
    est = samples.mean(-1)
    if probes > 1:
        h["extra"]["grad_stderr"] = (samples.var(-1) / probes).sqrt()
    return est


def logdet_request(A, backend=None, method=None, properties=None):
    """Properties as solve finds them: the user's tags, else :func:`detect` (symmetric, SPD by
    diagonal dominance), so an SPD matrix is offered Cholesky-based methods."""
    tags = normalize_tags(properties)
    props = tags if tags is not None else detect_cached(A)
    return make_request("logdet", (describe_factored(A, props),), props, LogdetOptions(backend=backend, method=method))


#: Errors after which another method would not do better (the operands are wrong). NotSymmetricError:
#: a plan that assumes ``A^H = A`` (Cholesky, LDL^H) found values that are not Hermitian, taken on a
#: tag (``properties="spd"`` / ``"hermitian"``) or a pin that the values contradict: raised, not
#: answered by the next method (a wrong tag is the caller's to fix; solve raises it too)
_PASS_THROUGH = (InputError, NotSymmetricError)


def _run(values: torch.Tensor, handle) -> tuple[torch.Tensor, torch.Tensor]:
    """The fallback rule of DESIGN.md: the chosen offer first; a plan that fails (a Cholesky of
    a matrix that is not SPD after all, a plugin error, a non-finite or mis-shaped result) hands
    over to the next capable offer of the table, unless the user pinned the method. A singular
    matrix is an answer (sign 0, logabsdet -inf), not a failure, when a factorization with pivoting
    says so; a zero pivot of one without (LDL^T) proves nothing, and a pinned or last LDL^T that meets
    one raises (:func:`_unstable`). Attempts go to ``info.extra``."""
    offers, records = handle["offers"], handle["extra"]["attempts"]
    records.clear()
    A = handle["A"]
    batch = tuple(A.batch_shape)
    for i, offer in enumerate(offers):
        label = f"{offer.backend}/{offer.method}"
        final = i == len(offers) - 1
        phase = "build"
        try:
            state = handle["state_of"](i)
            with state.lock, torch.no_grad():
                phase = "set_values"
                # an LU of a badly scaled A is factored equilibrated (exact powers of two: det(R A C) = det(R)
                # det(A) det(C)), as the solve's route does; session 28's sweep: D1 L D2 (scales 1e-20..1e20)
                # got log|det| 47 off from a sparse LU of the unscaled values
                eq = _equilibration(A, values) if offer.method == "lu" else None
                state.load(values if eq is None else eq[2])
                phase = "slogdet"
                sign, logabs = state.plan.slogdet()
                if eq is not None:
                    logabs = logabs - (torch.log2(eq[0].real).sum(-1) + torch.log2(eq[1].real).sum(-1)).to(
                        logabs.dtype) * _LN2
                why = _bad_result(sign, logabs, batch)
                if why is None and offer.method not in _PIVOTING:
                    # also when pinned or last: its (0, -inf) for a nonsingular matrix was returned as the answer
                    # (a pinned LDL^T of a 4x4 indefinite matrix of det 125; session 26's sweep)
                    why = _unstable(state.plan, values, A, sign)
                if why is None:
                    # a numerically singular matrix's factors end with a rounding-level pivot, not an exact zero:
                    # its log enters the sum (a finite log|det| whose sign depended on the backend; session 29's
                    # sweep). Decided as the solve's route decides "singular to working precision"
                    singular = _singular_members(state.plan, values if eq is None else eq[2], A, sign, eq is not None)
                    if offer.method in _PIVOTING:
                        sign = torch.where(singular, torch.zeros_like(sign), sign)
                        logabs = torch.where(singular, torch.full_like(logabs, -math.inf), logabs)
                    elif bool(singular.any()):
                        why = ("met a pivot that is zero to working precision without pivoting (not a proof of "
                               "singularity): an LU decides")
                if why is not None and offer.method not in _PIVOTING and (handle["pinned"] or final):
                    why = why.replace(": an LU decides", "") + (
                        "; pin method='lu' (or pass no method) for a factorization with pivoting")
            if why is not None:
                raise BackendError(f"{label} {why}", label, "result")
        except _PASS_THROUGH:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded, then handed over
            if not isinstance(exc, SparseTorchError):
                err = BackendError(f"{label} failed in {phase}: {type(exc).__name__}: {exc}", label, phase)
                err.__cause__ = exc
                exc = err
            records.append({"backend": offer.backend, "method": offer.method, "accepted": False,
                            "why": f"raised {type(exc).__name__}: {exc}"})
            if handle["pinned"] or final:
                if len(records) > 1 and hasattr(exc, "add_note"):
                    exc.add_note("attempts: " + "; ".join(f"{r['backend']}/{r['method']}: {r['why']}" for r in records))
                raise exc
            continue
        records.append({"backend": offer.backend, "method": offer.method, "accepted": True, "why": "accepted"})
        handle["state"], handle["offer"] = state, offer
        handle["equilibrate"] = eq is not None
        return sign + 0, logabs  # + 0: a singular matrix's sign -0. (a product of signs with a zero) reads 0.
    raise AssertionError("unreachable")  # pragma: no cover


_LN2 = 0.6931471805599453
#: an LU's values are equilibrated first where the row or the column scaling spreads over more than this
#: (the solve route's bar, autograd/fallback.py)
_EQUILIBRATE_FIRST = 2.0 ** 10


def _equilibration(A: SparseTensor, values: torch.Tensor):
    """``(r, c, scaled values)`` of :func:`~sparsetorch.autograd._route_checks._equilibrated` where the scaling
    spreads over more than :data:`_EQUILIBRATE_FIRST` (a badly scaled A), else None."""
    eq = _exact_equilibration(A, values)
    if eq is None:
        return None
    r, c, _ve = eq
    spread = max(float((r.real.amax(-1) / r.real.amin(-1)).max()), float((c.real.amax(-1) / c.real.amin(-1)).max()))
    return eq if spread > _EQUILIBRATE_FIRST else None


def _exact_equilibration(A: SparseTensor, values: torch.Tensor):
    """``(r, c, scaled values)`` of :func:`~sparsetorch.autograd._route_checks._equilibrated`, or None where the
    scaled values would not be exact."""
    if not values.numel() or not is_plain(values):
        return None
    r, c, ve = _equilibrated(A, values)
    # the determinant's correction is exact only where every scaled entry is exact: finite, and a normal number
    # where the entry is nonzero (an underflow to a subnormal or to zero, an overflow, changes the matrix factored;
    # float32 entries of 1e-42 next to 2^100, session 28's review)
    vm = ve.abs()
    nz = values.abs() > 0
    tiny = torch.finfo(vm.dtype).tiny
    if not bool(torch.isfinite(ve).all()) or bool((nz & (vm < tiny)).any()):
        return None
    return r, c, ve


#: factorizations whose pivots are chosen for stability (partial pivoting), or that cannot meet a
#: small pivot without failing outright (Cholesky refuses a non-positive one): their determinant
#: is accepted as computed
_PIVOTING = frozenset({"lu", "cholesky", "dense", "qr"})


def _unstable(plan, values: torch.Tensor, A: SparseTensor, sign: torch.Tensor) -> str | None:
    """Why the determinant of a factorization without pivoting (LDL^T of a symmetric matrix that is not
    positive definite) is not to be trusted, or None. Its pivots are the determinant's factors: a tiny
    one (a zero one reads as "singular") makes them meaningless, as a 2-D Helmholtz-like
    ``lap2d - 2 I`` showed (cond ~300: sign and log|det| wrong, or (0, -inf); session 20's sweep). The
    test is the one that catches growth: a solve with the same factors, judged by its normwise
    backward error ``||b - A x|| / (||A||_F ||x|| + ||b||)`` against a backward-stable solve's bound.
    Then an LU (partial pivoting) of the ranking answers instead."""
    if bool((sign == 0).any()):
        return "met a zero pivot without pivoting (not a proof of singularity): an LU decides"
    n = A.format_shape[0]
    batch = tuple(A.batch_shape)
    g = torch.Generator(device="cpu").manual_seed(20)
    x0 = torch.randn(*batch, n, 1, generator=g, dtype=torch.float64).to(dtype=A.dtype, device=A.device)
    b = apply_entries(A, values, x0)
    try:
        X, _ = plan.solve(b)
    except Exception as exc:  # noqa: BLE001 - a failing solve is an answer here
        return f"could not solve with its factors ({type(exc).__name__}): an LU decides"
    if not bool(torch.isfinite(X).all()):
        return "solved to NaN / Inf with its factors: an LU decides"
    r = torch.linalg.vector_norm(b - apply_entries(A, values, X), dim=-2)
    eta = float(normwise_backward_error(values, X, r, torch.linalg.vector_norm(b, dim=-2))[0].max())
    bound = backward_error_bound(A.dtype, n)
    if eta > bound:
        return (f"factors without pivoting that are not backward stable (a solve with them: backward error "
                f"{eta:.2g} > {bound:.1g}; small pivots make the determinant's factors meaningless): an LU decides")
    return None


def _singular_members(plan, values: torch.Tensor, A: SparseTensor, sign: torch.Tensor, scaled: bool) -> torch.Tensor:
    """Per value-batch member, whether the factored matrix (``values``: what the plan holds; ``scaled``: those
    are already equilibrated) is singular to working precision, by the solve route's rule
    (``autograd/_route_checks.py``'s ``_singular_growth`` on a lower bound of the condition number,
    ``||S||_2 ||S^-1 x|| / ||x||`` with ``_norm2_floor``'s ``||S||_2``, reaching ``1 / (8 u)``), judged on the
    equilibrated ``S = diag(r) A diag(c)`` (exact powers of two; with the plan's factors of A, ``S^-1 y =
    diag(c)^-1 A^-1 diag(r)^-1 y``): singularity is invariant under scalings, a normwise condition is not (a
    nonsingular ``D1 L D2`` with scales 1e-6..1e6 has condition 2e20). Two steps of inverse iteration from a
    fixed random vector, ``x_1 = S^-1 x_0``, ``x_2 = S^-1 x_1 / ||x_1||``: each ratio is at most
    ``||S||_2 ||S^-1||_2`` (never more, whatever the matrix: a nonsingular ill-conditioned matrix, cond 1e12 in
    float64, stays below the bar), and the solve's route would call S singular for the right-hand side ``x_k``
    that reaches it. A numerically singular matrix's rounding-level pivot (1e-13 relative, or less) gives
    ratios of order 1 / u. A zero sign (an exact zero pivot) is singular; so is a member whose solve returns
    NaN / Inf, and every member when a solve raises SingularMatrixError with no zero sign known (where one is
    known, the batch's other members keep their factors' answer: a plan solves its whole value batch at once)."""
    singular = sign == 0
    n = A.format_shape[0]
    if n == 0 or bool(singular.all()):
        return singular
    batch = tuple(A.batch_shape)
    eq = None if scaled else _exact_equilibration(A, values)
    if eq is None:
        def solve(Y: torch.Tensor) -> torch.Tensor:
            return plan.solve(Y)[0]
        sv = values
    else:
        r, c, sv = eq
        r, c = r.to(A.dtype).unsqueeze(-1), c.to(A.dtype).unsqueeze(-1)

        def solve(Y: torch.Tensor) -> torch.Tensor:
            return plan.solve(Y / r)[0] / c
    g = torch.Generator(device="cpu").manual_seed(29)
    x = torch.randn(*batch, n, 1, generator=g, dtype=torch.float64).to(dtype=A.dtype, device=A.device)
    return singular | _singular_growths(solve, _norm2_floor(A, sv).to(torch.float64), x, A.dtype, singular)


def _singular_growths(solve, anorm: torch.Tensor, x: torch.Tensor, dtype: torch.dtype,
                      known: torch.Tensor) -> torch.Tensor:
    singular = torch.zeros(anorm.shape, dtype=torch.bool, device=anorm.device)
    for _ in range(2):
        try:
            y = solve(x)
        except SingularMatrixError:
            return known if bool(known.any()) else torch.ones_like(singular)
        xn = torch.linalg.vector_norm(x, dim=(-2, -1)).to(torch.float64)
        yn = torch.linalg.vector_norm(y, dim=(-2, -1)).to(torch.float64)
        growth = anorm * yn / xn
        singular = singular | ~torch.isfinite(growth) | torch.tensor(
            [_singular_growth(float(gr), dtype) for gr in growth.reshape(-1).tolist()],
            dtype=torch.bool, device=anorm.device).reshape(growth.shape)
        if bool(singular.all()):
            break
        x = y / torch.where(yn > 0, yn, torch.ones_like(yn)).to(y.dtype)[..., None, None]
    return singular


def _bad_result(sign, logabs, batch) -> str | None:
    if not isinstance(sign, torch.Tensor) or not isinstance(logabs, torch.Tensor):
        return f"returned {type(sign).__name__}/{type(logabs).__name__}, not tensors"
    if tuple(sign.shape) != batch or tuple(logabs.shape) != batch:
        return f"returned sign {tuple(sign.shape)} and logabsdet {tuple(logabs.shape)}; expected {batch}"
    if bool(torch.isnan(logabs).any()) or bool(torch.isposinf(logabs).any()):
        return "returned a NaN or +Inf log|det|"
    return None


def _prepare(A, op, backend, method, properties, grad_method, probes, seed, exact_max, check_finite, cache):
    A = check_matrix(A, op, square=True)
    if grad_method not in ("exact", "hutchinson"):
        raise InputError(f"{op}: grad_method must be 'exact' or 'hutchinson', got {grad_method!r}")
    if not isinstance(probes, int) or probes < 1:
        raise InputError(f"{op}: probes must be a positive int, got {probes!r}")
    if check_finite and is_plain(A.values):
        check_finite_values(A, None, op)
    Ap = A
    if vmapped(A.values):
        # torch.func.vmap over A's values: planning sees the pattern (detection cannot branch on a batched
        # tensor, a plan cannot hold one), and the Functions' vmap rules factor member by member with plain
        # values (as solve)
        Ap = A.detach().with_values(torch.zeros(A.values.shape, dtype=A.dtype, device=A.device))
        properties = "general" if properties is None else properties
    request = logdet_request(Ap, backend, method, properties)
    state, offer, table = obtain_plan("logdet", Ap, request, cache=cache)
    pinned = method is not None
    offers = [offer] + ([] if pinned else [r.offer for r in table.offers if r.offer is not None
                                           and (r.offer.backend, r.offer.method) != (offer.backend, offer.method)])
    states = {0: state}

    def state_of(i):
        if i not in states:
            states[i] = obtain_plan("logdet", Ap, with_options(request, backend=offers[i].backend,
                                                              method=offers[i].method), cache=cache)[0]
        return states[i]

    handle = _Handle({"state": state, "offer": offer, "offers": offers, "state_of": state_of, "pinned": pinned,
              "A": Ap.detach(), "grad_method": grad_method, "probes": probes, "seed": seed, "exact_max": exact_max,
              "extra": {"estimated_seconds": offer.seconds, "estimated_bytes": offer.bytes, "attempts": [],
                        "properties": sorted(request.properties)}})
    return A, state, offer, handle


def slogdet(
    A: SparseTensor,
    *,
    backend: str | None = None,
    method: str | None = None,
    properties: str | Sequence[str] | None = None,
    grad_method: str = "exact",
    probes: int | torch.Tensor | None = None,
    seed: int | None = None,
    exact_max: int = EXACT_MAX,
    check_finite: bool = True,
    return_info: bool = False,
    cache: bool = True,
    num_probes: int | None = None,
    lanczos_steps: int | None = None,
    distribution: str | None = None,
    cg_rtol: float | None = None,
    cg_maxiter: int | None = None,
):
    """``(sign, logabsdet)`` of a square sparse ``A`` (value batch in front), differentiable in
    A's values (see the module docstring for ``grad_method``). ``sign`` is ``+-1`` (``0`` for a
    singular A, with ``logabsdet = -inf``), a unit complex number for complex A.

    ``method="slq"`` (alias ``"hutchinson"``, torch-sla's name) is never chosen by default: it is a
    *stochastic estimate* for Hermitian positive definite A (sign 1), by stochastic Lanczos
    quadrature (:func:`sparsetorch.ops.logdet_slq.slq_logdet`, which documents ``num_probes``,
    ``lanczos_steps``, ``seed``, ``distribution``, ``probes`` (a tensor of probe vectors there),
    ``cg_rtol`` and ``cg_maxiter``)."""
    if method in SLQ_METHODS:
        return _slq(A, backend, properties, grad_method, probes, seed, exact_max, check_finite, return_info,
                    num_probes, lanczos_steps, distribution, cg_rtol, cg_maxiter)
    slq_only = {k: v for k, v in (("num_probes", num_probes), ("lanczos_steps", lanczos_steps),
                                  ("distribution", distribution), ("cg_rtol", cg_rtol), ("cg_maxiter", cg_maxiter))
                if v is not None}
    if slq_only or isinstance(probes, torch.Tensor):
        raise InputError(f"slogdet: {sorted(slq_only) or ['probes (a tensor)']} apply to the stochastic estimate "
                         f"(method='slq'), not to the exact log-determinant")
    probes = 64 if probes is None else probes
    seed = 0 if seed is None else seed
    A, state, offer, handle = _prepare(A, "slogdet", backend, method, properties, grad_method, probes, seed, exact_max,
                                       check_finite, cache)
    sign, logabs = _Slogdet.apply(A.values, handle)
    if return_info:
        used = handle["offer"]
        info = SolveInfo(backend=used.backend, method=used.method, iterations=0, residual=float("nan"), converged=True,
                         status=_direct(), plan_reused=state.reused,
                         extra=handle["extra"])
        return sign, logabs, info
    return sign, logabs


def _slq(A, backend, properties, grad_method, probes, seed, exact_max, check_finite, return_info, num_probes,
         lanczos_steps, distribution, cg_rtol, cg_maxiter):
    """slogdet's ``method="slq"``: ``(1, estimate)`` (``+ info``)."""
    A = check_matrix(A, "slogdet", square=True)
    if backend not in (None, "torch"):
        raise InputError(f"slogdet: method='slq' runs in the core on torch operations (any device); backend={backend!r} "
                         f"does not apply")
    if grad_method != "exact" or exact_max != EXACT_MAX:
        raise InputError("slogdet: grad_method= and exact_max= belong to the exact log-determinant; method='slq' "
                         "always differentiates by its own probes (one CG solve per probe)")
    if probes is not None and not isinstance(probes, torch.Tensor):
        raise InputError(f"slogdet(method='slq'): probes= takes a tensor of probe vectors; pass the number of random "
                         f"probes as num_probes= (got probes={probes!r})")
    got = slq_logdet(A, num_probes=num_probes, lanczos_steps=lanczos_steps, seed=seed, distribution=distribution,
                     probes=probes, properties=properties, cg_rtol=cg_rtol, cg_maxiter=cg_maxiter,
                     check_finite=check_finite, return_info=return_info)
    est = got[0] if return_info else got
    sign = torch.ones_like(est).detach()
    return (sign, est, got[1]) if return_info else (sign, est)


def _direct():
    from .info import Status

    return Status.DIRECT


def logdet(A: SparseTensor, **options):
    """``log det A``: real for a matrix with positive determinant (SPD matrices, for example);
    ``nan`` where the determinant is negative (like ``torch.logdet``), ``-inf`` where it is 0.
    Options as :func:`slogdet` (``return_info=True``: ``(logdet, info)``). ``method="slq"`` (alias
    ``"hutchinson"``): a stochastic estimate for Hermitian positive definite A, by stochastic Lanczos
    quadrature (:func:`sparsetorch.ops.logdet_slq.slq_logdet`), never chosen by default."""
    check_matrix(A, "logdet", square=True)  # errors name the op called
    if options.get("method") in SLQ_METHODS:
        return slogdet(A, **options)[1:] if options.get("return_info") else slogdet(A, **options)[1]
    if options.get("return_info"):
        sign, logabs, info = slogdet(A, **options)
        return _logdet_of(sign, logabs), info
    sign, logabs = slogdet(A, **options)
    return _logdet_of(sign, logabs)


def _logdet_of(sign: torch.Tensor, logabs: torch.Tensor) -> torch.Tensor:
    if logabs.is_complex() or sign.is_complex():
        return logabs + torch.log(sign)
    return torch.where(sign > 0, logabs, torch.where(sign == 0, torch.full_like(logabs, float("-inf")), torch.full_like(logabs, float("nan"))))


def det(A: SparseTensor, **options):
    """``det A = sign * exp(logabsdet)`` (overflows/underflows like any determinant: prefer
    :func:`slogdet` for large matrices). Options as :func:`slogdet`."""
    check_matrix(A, "det", square=True)  # errors name the op called
    sign, logabs = slogdet(A, **options)
    return sign * torch.exp(logabs).to(sign.dtype)
