"""The torch backend's offers for ``eigsh``, ``eigs`` and ``logdet``.

Costs (measured on the benchmark machine, one thread, at the built-in CPU rates):

- dense: ``torch.linalg.eigh`` with vectors (divide and conquer) took 28 / 164 / 1170 ms at
  n = 494 / 1000 / 2000, ``~3 n^3`` flops at the built-in 20 GFLOP/s plus ``2 n`` launches
  (the generalized problem adds a Cholesky and two triangular solves, ``~2.5 n^3``);
  ``eig`` ``~15 n^3`` (130 ms at n = 494, 710 ms at 1000); ``slogdet`` (LU) ``2/3 n^3``.
- Lanczos (regular mode): the products needed grow with the spread of the spectrum relative to
  the gaps at the wanted end, which a request does not carry. For second-order PDE operators of
  sparsity dimension ``d`` (the condition ``kappa ~ 0.4 n^(2/d)``) both ends need ``~25
  sqrt(kappa)`` products (this plan, basis ``k + 64``: 196 / 324 / 580 / 1220 on the 2-D
  Laplacian n = 100..6400, 228 / 612 / 3076 on the 1-D one n = 100..1000, 14,788 on 494_bus);
  each block of products costs its reorthogonalization (``16 n m`` flops per vector) and ~100
  launches of Python-driven kernels. With ``sigma`` (shift-invert) ~3 bases of products plus
  a factorization costed as 50 products.

A smallest-end request on an ill-conditioned matrix thus prices Lanczos far above dense at
moderate n (494_bus: ~0.4 s against ~25 ms), and an estimate that is still too low (the model
does not see the spectrum) is caught by the fallback: ``eigsh`` bounds an iterative attempt by
the dense offer's estimate and hands over (docs/spectral.md).
"""

from __future__ import annotations

import math

from ...dispatch.records import Decline, Offer, Request
from . import cost

DENSE_EIG_MAX = 2048
DENSE_DET_MAX = 4096
#: flops of the dense eigen-decompositions per n^3 (measured, see above)
DENSE_EIGH_FLOPS = 3.0
DENSE_EIG_FLOPS = 15.0
#: torch.lobpcg iterations when maxiter is not given (the plan's default)
LOBPCG_MAXITER = 1000


def condition_estimate(request: Request) -> float:
    """The spread of the spectrum a Krylov eigensolver sees, when nothing else is known: that of a
    second-order PDE operator whose graph grows like a grid of the request's sparsity dimension
    (``0.4 n^(2/d)``: 2-D Laplacians n = 100..1600 have 48..680, 1-D ones 0.4 n^2)."""
    from ...dispatch.helpers import sparsity_dimension

    n = max(2, request.A.shape[-1])
    return max(4.0, 0.4 * n ** (2.0 / sparsity_dimension(request)))


def lanczos_products(request: Request, k: int, basis: int, *, shift_invert: bool) -> float:
    """Products with A (or solves) a thick-restart Lanczos with ``basis`` vectors needs for k
    eigenpairs: ``25 sqrt(kappa)`` in regular mode (either end: the two ends of a PDE
    operator's spectrum are alike), three bases with shift-invert, never below one basis."""
    if shift_invert:
        return 3.0 * basis
    products = 25.0 * math.sqrt(condition_estimate(request))
    maxiter = request.option("maxiter")
    if maxiter is not None:
        products = min(products, float(maxiter) * basis / 2)
    return max(float(basis), products)


def spectral_offers(request: Request, r) -> list[Offer | Decline]:
    A = request.A
    n = A.shape[-1]
    batch = max(1, math.prod(A.batch_shape))
    vsize = cost._itemsize(A.dtype)
    op = request.op
    out: list[Offer | Decline] = []
    dense_max = int(request.option("dense_max") or (DENSE_DET_MAX if op == "logdet" else DENSE_EIG_MAX))
    if n > dense_max:
        out.append(Decline("torch", f"dense {op} only up to {dense_max} unknowns (n={n}); raise dense_max= to force", "dense"))
    else:
        coef = {"eigsh": DENSE_EIGH_FLOPS, "eigs": DENSE_EIG_FLOPS, "logdet": 2 / 3}[op]
        if op == "eigsh" and request.option("generalized"):
            coef += 2.5
        launches = (10 + (2 * n if op != "logdet" else 0)) * batch
        secs = r.seconds(bytes=4 * n * n * vsize * batch, flops=coef * n ** 3 * batch, launches=launches)
        from .spectral import DenseEigPlan

        what = {"eigsh": "torch.linalg.eigh", "eigs": "torch.linalg.eig", "logdet": "torch.linalg.slogdet (LU)"}[op]
        out.append(Offer("torch", "dense", secs, int(3 * n * n * vsize), lambda A_, req: DenseEigPlan(A_), f"{what} of the dense {n}x{n} matrix"))
    if op != "eigsh":
        return out
    k = int(request.option("k") or 6)
    which = request.option("which") or "LM"
    sigma = request.option("sigma")
    generalized = bool(request.option("generalized"))
    # Lanczos
    if generalized:
        out.append(Decline("torch", "lanczos solves the standard problem only (M given); use 'dense', 'lobpcg' or the "
                                    "scipy plugin's 'arpack'", "lanczos"))
    elif k >= n:
        out.append(Decline("torch", f"lanczos needs k < n (k={k}, n={n}); use 'dense'", "lanczos"))
    elif which == "SM" and sigma is None:
        out.append(Decline("torch", "lanczos finds smallest-magnitude eigenvalues only by shift-invert: pass sigma=0", "lanczos"))
    else:
        b = max(1, min(k, 4))
        m = min(n, max(2 * k + 2 * b, k + 64))
        products = lanczos_products(request, k, m, shift_invert=sigma is not None)
        spmv = cost.spmm_seconds(r, request, b)
        per_block = spmv + r.seconds(flops=16 * n * m * b, launches=100)
        per_restart = r.seconds(flops=9 * m ** 3 + 2 * n * m * m, launches=50)
        secs = (products / b * per_block + products / max(1, m // 2) * per_restart) * batch
        note = f"~{int(products)} products in a basis of {m} (estimate: kappa ~ {condition_estimate(request):.3g})"
        if sigma is not None:
            secs += 50 * spmv * batch
            note += "; shift-invert through sparsetorch.solve (factorized once)"
        from .lanczos import LanczosPlan

        out.append(Offer("torch", "lanczos", secs, int((m + 1) * n * vsize), lambda A_, req: LanczosPlan(A_), note))
    # LOBPCG (torch.lobpcg)
    if A.dtype.is_complex:
        # torch.lobpcg is real only: on complex Hermitian input it failed in its Cholesky or in a sort
        # ("Sort does not support complex dtypes"; session 21's sweep)
        out.append(Decline("torch", f"torch.lobpcg takes real matrices only (A is {A.dtype}); use 'lanczos', 'dense' or "
                                    f"the scipy plugin's 'arpack'", "lobpcg"))
    elif "spd" not in request.properties:
        out.append(Decline("torch", "lobpcg needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)", "lobpcg"))
    elif sigma is not None or which not in ("LA", "SA"):
        out.append(Decline("torch", f"lobpcg finds only which='LA' or 'SA' without sigma (got which={which!r}, sigma={sigma!r})", "lobpcg"))
    elif n < 3 * k:
        out.append(Decline("torch", f"torch.lobpcg needs n >= 3k (n={n}, k={k}); use 'dense'", "lobpcg"))
    else:
        spmv = cost.spmm_seconds(r, request, 3 * k)
        # block CG-like: ~0.5 sqrt(kappa) ln(2 / tol) iterations, capped by the plan's maxiter
        its = min(int(request.option("maxiter") or LOBPCG_MAXITER), int(0.5 * math.sqrt(condition_estimate(request)) * 25) + 20)
        secs = its * (spmv + r.seconds(flops=2 * n * (3 * k) ** 2, launches=40)) * batch
        from .spectral import LobpcgPlan

        out.append(Offer("torch", "lobpcg", secs, int(6 * n * k * vsize), lambda A_, req: LobpcgPlan(A_),
                         f"torch.lobpcg, ~{its} iterations (estimate)"))
    for method in ("arpack",):
        if request.option("method") == method:
            out.append(Decline("torch", f"method {method!r} is in the scipy plugin (pip install sparsetorch-scipy)", method))
    return out
