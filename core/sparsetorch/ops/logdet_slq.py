"""A stochastic ``log det A`` of a large Hermitian positive definite sparse matrix: stochastic Lanczos
quadrature (SLQ; Ubaru, Chen and Saad, "Fast estimation of tr(f(A)) via stochastic Lanczos quadrature",
SIAM J. Matrix Anal. Appl. 2017), differentiable in A's values.

``log det A = tr(log A) = E[z^H log(A) z]`` for random probes with ``E[z z^H] = I`` (Hutchinson).
For each probe ``z``, ``m`` Lanczos steps on A from ``q_1 = z / ||z||`` give a tridiagonal ``T``
(``m x m``) and ``z^H log(A) z ~ ||z||^2 e_1^T log(T) e_1 = ||z||^2 sum_k U[0, k]^2 log(theta_k)``
(``T = U diag(theta) U^T``: an ``m``-point Gauss quadrature of the spectral measure of ``z``). The
estimate is the mean over the probes; its standard error is the probes' standard deviation over
``sqrt(num_probes)``.

Accuracy. Two errors: the Monte-Carlo error (unbiased, relative error shrinking like
``1 / sqrt(num_probes)``; Rademacher probes have the smaller variance, ``2 sum_{i != j} |log(A)_ij|^2``
per probe) and the quadrature error of ``m`` Lanczos steps, which falls like
``((sqrt(kappa) - 1) / (sqrt(kappa) + 1))^(2m)`` (kappa: A's condition number): 30 steps suffice up to
kappa ~ 1e4 or so. The Lanczos runs keep their basis and reorthogonalize fully (twice), so memory is
``m n`` per probe column (probes run in chunks of bounded memory) and the work ``O(m^2 n)`` per
probe besides the ``m`` products with A.

Gradient. ``d log det A = tr(A^-1 dA)``, so ``d logdet / dA[r, c] = (A^-1)[c, r]`` (conjugated for complex
A), estimated with the same probes: ``(A^-1)[c, r] ~ mean_p y_p[c] conj(z_p[r])`` with ``A y_p = z_p``
solved by CG (``sparsetorch.solve(..., method="cg")``, one multi-right-hand-side solve), symmetrized
(``0.5 (y[c] conj(z[r]) + conj(y[r]) z[c])``, which A's symmetry makes an estimate of the same entry).
Unbiased for Hermitian A (up to the CG tolerance ``cg_rtol``), one CG solve per probe.
"""

from __future__ import annotations

import math

import torch

from ..autograd._first_order import first_order_only
from ..autograd.lstsq import apply_entries
from ..dispatch.accuracy import default_rtol
from ..errors import IndefiniteMatrixError, InputError, NotSymmetricError
from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain
from ._inputs import check_finite as check_finite_values, check_matrix
from .info import SolveInfo, Status
from .properties import detect_cached, normalize_tags

__all__ = ["slq_logdet", "SLQ_METHODS", "DEFAULT_NUM_PROBES", "DEFAULT_LANCZOS_STEPS"]

#: the method names that pick the estimator (``"hutchinson"``: torch-sla's name)
SLQ_METHODS = ("slq", "hutchinson")
DEFAULT_NUM_PROBES = 30
DEFAULT_LANCZOS_STEPS = 30
_DISTRIBUTIONS = ("rademacher", "gaussian")
#: the bytes one chunk of probes may hold (Lanczos bases, gathered gradient samples)
_CHUNK_BYTES = 1 << 27


class _Handle(dict):
    """One call's matrix, probes and options, handed to :class:`_SlqLogdet` as one opaque argument."""


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.empty((), dtype=dtype).real.dtype if dtype.is_complex else dtype


def _check_hermitian(A: SparseTensor, properties) -> frozenset:
    tags = normalize_tags(properties)
    props = tags if tags is not None else detect_cached(A)
    need = "hermitian" if A.dtype.is_complex else "symmetric"
    if need not in props:
        what = ("complex symmetric but not Hermitian" if A.dtype.is_complex and "symmetric" in props
                else "not symmetric" if not A.dtype.is_complex else "not Hermitian")
        raise NotSymmetricError(
            f"logdet(method='slq'): A is {what} (properties {sorted(props)}); stochastic Lanczos quadrature "
            f"estimates log det of Hermitian positive definite matrices only: for this A use the exact slogdet "
            f"(no method=: a factorization gives sign and log|det|)")
    return props


def _probes(A: SparseTensor, num_probes, seed, distribution, probes) -> torch.Tensor:
    n = A.format_shape[0]
    batch = tuple(A.batch_shape)
    if probes is not None:
        if not isinstance(probes, torch.Tensor):
            raise InputError(
                f"logdet(method='slq'): probes= takes a tensor of probe vectors (n, p) (or (*batch, n, p)), got "
                f"{type(probes).__name__}; the number of random probes is num_probes=")
        Z = probes.unsqueeze(-1) if probes.dim() == 1 else probes
        if Z.shape[-2] != n or Z.shape[-1] < 1 or tuple(Z.shape[:-2]) not in ((), batch):
            raise InputError(f"logdet(method='slq'): probes of shape {tuple(probes.shape)}; expected (n, p) or "
                             f"(*batch, n, p) with n={n}, batch={batch}")
        if Z.is_complex() and not A.dtype.is_complex:
            raise InputError("logdet(method='slq'): complex probes for a real A")
        if not bool(torch.isfinite(Z).all()):
            raise InputError("logdet(method='slq'): probes hold NaN or Inf")
        return Z.detach().to(dtype=A.dtype, device=A.device)
    if isinstance(num_probes, bool) or not isinstance(num_probes, int) or num_probes < 1:
        raise InputError(f"logdet(method='slq'): num_probes must be a positive int, got {num_probes!r}")
    if distribution not in _DISTRIBUTIONS:
        raise InputError(f"logdet(method='slq'): distribution must be one of {_DISTRIBUTIONS}, got {distribution!r}")
    gen = None
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InputError(f"logdet(method='slq'): seed must be an int or None, got {seed!r}")
        gen = torch.Generator(device=A.device).manual_seed(seed)
    rdt = _real_dtype(A.dtype)
    if distribution == "rademacher":
        Z = (torch.randint(0, 2, (n, num_probes), generator=gen, device=A.device) * 2 - 1).to(rdt)
    else:
        Z = torch.randn(n, num_probes, generator=gen, device=A.device, dtype=rdt)
    return Z.to(A.dtype)


def _chunk(n: int, width: int, per_column: int, itemsize: int, members: int) -> int:
    return max(1, min(width, _CHUNK_BYTES // max(1, per_column * n * itemsize * members)))


def _quadrature(matvec, Z: torch.Tensor, m: int):
    """``||z||^2 e_1^T log(T) e_1`` per column of ``Z`` (*B, n, k), float64 (*B, k), from ``m`` steps of
    Lanczos (full reorthogonalization, twice) run on all columns at once; and the smallest eigenvalue
    of each column's ``T`` (float64, *B, k)."""
    n, k = Z.shape[-2], Z.shape[-1]
    rdt = _real_dtype(Z.dtype)
    eps = float(torch.finfo(rdt).eps)
    norms = torch.linalg.vector_norm(Z, dim=-2)
    active = norms > 0  # a zero probe contributes zero
    q = Z / torch.where(active, norms, torch.ones_like(norms)).unsqueeze(-2).to(Z.dtype)
    V = Z.new_zeros(*Z.shape[:-2], m, n, k)
    alphas, betas = [], []
    q_prev = torch.zeros_like(q)
    beta_prev = torch.zeros_like(norms)
    scale = torch.zeros_like(norms)
    for i in range(m):
        V[..., i, :, :] = q
        w = matvec(q)
        alpha = (q.conj() * w).sum(-2).real
        w = w - alpha.unsqueeze(-2).to(w.dtype) * q - beta_prev.unsqueeze(-2).to(w.dtype) * q_prev
        Vi = V[..., : i + 1, :, :]
        for _ in range(2):  # twice is enough (Kahan, Parlett)
            c = torch.einsum("...jnk,...nk->...jk", Vi.conj(), w)
            w = w - torch.einsum("...jnk,...jk->...nk", Vi, c)
        alphas.append(torch.where(active, alpha, torch.ones_like(alpha)))  # a broken-down column: a decoupled 1
        if i == m - 1:
            break
        beta = torch.linalg.vector_norm(w, dim=-2)
        scale = torch.maximum(scale, torch.maximum(alpha.abs(), beta))
        # an invariant subspace found: w is rounding noise (the quadrature is exact for this probe)
        go = active & (beta > 10 * eps * scale)
        beta = torch.where(go, beta, torch.zeros_like(beta))
        betas.append(beta)
        q_prev = q
        q = torch.where(go.unsqueeze(-2), w / torch.where(go, beta, torch.ones_like(beta)).unsqueeze(-2).to(w.dtype),
                        torch.zeros_like(w))
        beta_prev = beta
        active = go
    a = torch.stack(alphas, -1).to(torch.float64)
    T = torch.diag_embed(a)
    if betas:
        b = torch.stack(betas, -1).to(torch.float64)
        T = T + torch.diag_embed(b, 1) + torch.diag_embed(b, -1)
    theta, U = _eigh(T)
    lowest = theta[..., 0]
    weights = U[..., 0, :] ** 2
    logs = torch.log(torch.where(theta > 0, theta, torch.ones_like(theta)))
    quad = (weights * logs).sum(-1) * norms.to(torch.float64) ** 2
    return quad, lowest


def _eigh(T: torch.Tensor):
    """``torch.linalg.eigh`` of a batch of small tridiagonal matrices; on the CPU one matrix at a time (a
    batched CPU eigh opens a parallel region that stalls on a busy machine: 200 40x40 matrices took 4 s
    with 2 threads, 0.1 s one by one)."""
    if T.device.type != "cpu" or T.dim() == 2:
        return torch.linalg.eigh(T)
    flat = T.reshape(-1, *T.shape[-2:])
    parts = [torch.linalg.eigh(t) for t in flat]
    theta = torch.stack([w for w, _ in parts]).reshape(*T.shape[:-1])
    U = torch.stack([u for _, u in parts]).reshape(T.shape)
    return theta, U


def _estimate(A: SparseTensor, values: torch.Tensor, Z: torch.Tensor, m: int) -> torch.Tensor:
    """Per-probe estimates ``z^H log(A) z`` (float64, (*batch, p)); raises IndefiniteMatrixError."""
    batch = tuple(A.batch_shape)
    n = A.format_shape[0]
    p = Z.shape[-1]
    members = math.prod(batch) if batch else 1
    Zb = Z.expand(*batch, n, p)
    step = _chunk(n, p, m + 4, Z.element_size(), members)
    outs, lows = [], []
    for s in range(0, p, step):
        quad, low = _quadrature(lambda X: apply_entries(A, values, X), Zb[..., s: s + step], m)
        outs.append(quad)
        lows.append(low)
    est = torch.cat(outs, -1)
    low = torch.cat(lows, -1)
    bad = ~(low > 0) | ~torch.isfinite(est)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0].tolist()]
        first = float(low[tuple(where)])
        member = f" of value-batch member {tuple(where[:-1])}" if batch else ""
        raise IndefiniteMatrixError(
            f"logdet(method='slq'): the Lanczos matrix of probe {where[-1]}{member} has an eigenvalue {first:.3g} <= 0 "
            f"(its eigenvalues lie within A's spectrum), so A is not positive definite, or singular to working "
            f"precision. Stochastic Lanczos quadrature estimates log det of Hermitian positive definite matrices "
            f"only: for an indefinite A use the exact slogdet (no method=: a factorization gives sign and "
            f"log|det|), or shift A (A + s I) if that is the model you mean")
    return est


def _grad_entries(A: SparseTensor, values: torch.Tensor, Z: torch.Tensor, h) -> torch.Tensor:
    """The estimate of ``(A^-1)[col, row]`` per stored entry (*batch, nnz), from CG solves ``A Y = Z``; the
    entries' standard errors go to ``h["extra"]["grad_stderr"]``."""
    from .solve import solve  # a sibling in the ops layer (imported here: solve's module imports widely)

    batch = tuple(A.batch_shape)
    n = A.format_shape[0]
    p = Z.shape[-1]
    coords, _slot = A.entries()
    rows, cols = coords[0], coords[1]
    members = math.prod(batch) if batch else 1
    Ad = A.detach().with_values(values.detach())
    step = _chunk(max(n, rows.numel()), p, 4, Z.element_size(), members)
    total = None
    total2 = None
    iters = 0
    for s in range(0, p, step):
        Zc = Z[..., s: s + step].expand(*batch, n, min(step, p - s)).contiguous()
        Y, info = solve(Ad, Zc, method="cg", rtol=h["cg_rtol"], maxiter=h["cg_maxiter"], properties="spd",
                        return_info=True, check_finite=False)
        iters = max(iters, int(info.iterations))
        zr, zc = Zc.index_select(-2, rows), Zc.index_select(-2, cols)
        yr, yc = Y.index_select(-2, rows), Y.index_select(-2, cols)
        if Y.is_complex():
            samples = 0.5 * (yc * zr.conj() + yr.conj() * zc)
        else:
            samples = 0.5 * (yc * zr + yr * zc)
        part = samples.sum(-1)
        part2 = (samples.abs() ** 2).sum(-1)
        total = part if total is None else total + part
        total2 = part2 if total2 is None else total2 + part2
    est = total / p
    h["extra"]["cg_iterations"] = iters
    h["extra"]["cg_rtol"] = h["cg_rtol"]
    if p > 1:
        var = ((total2 - p * est.abs() ** 2) / (p - 1)).clamp_min(0)
        h["extra"]["grad_stderr"] = (var / p).sqrt()
    return est


class _SlqLogdet(torch.autograd.Function):
    @staticmethod
    def forward(values, handle):
        with torch.no_grad():
            per = _estimate(handle["A"], values, handle["Z"], handle["steps"])
        handle["per_probe"] = per
        rdt = _real_dtype(values.dtype)
        return per.mean(-1).to(rdt)

    @staticmethod
    def setup_context(ctx, inputs, output):
        values, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values)

    @staticmethod
    def backward(ctx, g):
        (values,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0] or g is None:
            return None, None
        h = ctx.handle
        with torch.no_grad():
            est = _grad_entries(h["A"], values.detach(), h["Z"], h)  # (A^-1)[col, row] per stored entry
            _coords, slot = h["A"].entries()
            gg = g.to(values.dtype).unsqueeze(-1)
            per = (est.conj() if est.is_complex() else est) * gg
            out = per.new_zeros(*per.shape[:-1], values.shape[-1]).index_add(-1, slot, per)
        return first_order_only(out, "logdet(method='slq')", values, g), None


def slq_logdet(
    A: SparseTensor,
    *,
    num_probes: int | None = None,
    lanczos_steps: int | None = None,
    seed: int | None = None,
    distribution: str | None = None,
    probes: torch.Tensor | None = None,
    properties=None,
    cg_rtol: float | None = None,
    cg_maxiter: int | None = None,
    check_finite: bool = True,
    return_info: bool = False,
):
    """A stochastic estimate of ``log det A`` for a Hermitian positive definite sparse A (value batch in
    front: one estimate per member), differentiable in A's values (the module docstring).

    ``num_probes`` (30) random probes, Rademacher (``distribution="rademacher"``, the default) or
    Gaussian (``"gaussian"``), drawn on A's device from ``torch.Generator(device).manual_seed(seed)``
    (``seed=None``: from torch's global generator, fresh probes per call); ``probes=``: explicit probe
    vectors instead, a tensor ``(n, p)`` (or ``(*batch, n, p)``): the estimate is then
    ``mean_j z_j^H log(A) z_j``, exact up to the quadrature error when ``Z Z^H = p I`` (``sqrt(n)``
    times the identity, ``p = n``). ``lanczos_steps`` (30, at most n) Lanczos steps per probe.
    ``cg_rtol``: the gradient's CG tolerance (default ``max(1e-6 / sqrt(p), the dtype's contract
    tolerance)``: the CG error, at most ``kappa * cg_rtol`` relative, stays well below the probes'
    ``1 / sqrt(p)`` noise for ``kappa`` up to ~1e4); ``cg_maxiter`` its iteration limit.

    Returns the estimate (A's real dtype, shape ``A.batch_shape``); with ``return_info=True`` also a
    :class:`SolveInfo` whose ``extra`` holds ``"stderr"`` (the probes' standard error, per member),
    ``"per_probe"`` (the per-probe estimates), ``"num_probes"``, ``"lanczos_steps"`` and, after a
    backward pass, ``"grad_stderr"`` (per stored entry) and ``"cg_iterations"``.

    Raises NotSymmetricError for an A that property detection (or ``properties=``) does not find
    symmetric (Hermitian), IndefiniteMatrixError when a Lanczos matrix has an eigenvalue <= 0 (A not
    positive definite; not a certificate of definiteness otherwise)."""
    A = check_matrix(A, "logdet", square=True)
    if not is_plain(A.values):
        raise InputError("logdet(method='slq') does not run under torch.func transforms (vmap, grad); use "
                         "torch.autograd, and a value batch for many matrices")
    if A.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise InputError(f"logdet(method='slq'): A's dtype must be float32/float64 (or complex), got {A.dtype}")
    num_probes = DEFAULT_NUM_PROBES if num_probes is None else num_probes
    steps = DEFAULT_LANCZOS_STEPS if lanczos_steps is None else lanczos_steps
    distribution = "rademacher" if distribution is None else distribution
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"logdet(method='slq'): lanczos_steps must be a positive int, got {lanczos_steps!r}")
    if check_finite:
        check_finite_values(A, None, "logdet")
    props = _check_hermitian(A, properties)
    n = A.format_shape[0]
    batch = tuple(A.batch_shape)
    Z = _probes(A, num_probes, seed, distribution, probes)
    p = Z.shape[-1]
    if cg_rtol is None:
        cg_rtol = max(1e-6 / math.sqrt(p), default_rtol(A.dtype))
    rdt = _real_dtype(A.dtype)
    if n == 0:
        zero = torch.zeros(batch, dtype=rdt, device=A.device)
        est = zero + 0 * A.values.sum(-1).real if A.values.requires_grad else zero
        handle = _Handle(extra={})
        per = torch.zeros(*batch, p, dtype=torch.float64, device=A.device)
    else:
        handle = _Handle(A=A.detach(), Z=Z, steps=min(steps, n), cg_rtol=float(cg_rtol), cg_maxiter=cg_maxiter,
                         extra={})
        est = _SlqLogdet.apply(A.values, handle)
        per = handle.pop("per_probe")
    if not return_info:
        return est
    stderr = (per.std(-1) / math.sqrt(p)).to(rdt) if p > 1 else torch.full(batch, float("nan"), dtype=rdt,
                                                                                 device=A.device)
    extra = handle["extra"]
    extra.update({"stderr": stderr, "per_probe": per.to(rdt), "num_probes": p, "lanczos_steps": min(steps, max(n, 1)),
                  "distribution": "explicit" if probes is not None else distribution, "seed": seed,
                  "properties": sorted(props)})
    worst = float(stderr.abs().max()) if stderr.numel() else 0.0
    info = SolveInfo(backend="core", method="slq", iterations=min(steps, max(n, 1)), residual=float("nan"),
                     converged=True, status=Status.CONVERGED,
                     reason=(f"stochastic Lanczos quadrature: {p} probes x {min(steps, max(n, 1))} Lanczos steps; "
                             f"standard error {worst:.3g} (info.extra['stderr'])"),
                     extra=extra)
    return est, info
