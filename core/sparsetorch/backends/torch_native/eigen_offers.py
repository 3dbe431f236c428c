"""The torch backend's offers for ``eigsh``, ``eigs`` and ``logdet``.

Costs: dense methods ``~9 n^3`` flops (``eigh``), ``~25 n^3`` (``eig``), ``2/3 n^3`` (LU for
``slogdet``) plus the dense matrix; Lanczos about ``ncv`` products and an ``n * ncv^2``
reorthogonalization per restart, with a restart count that grows with the number of wanted
eigenpairs (a guess: ``10 + k`` restarts; interior spectra take longer); shift-invert adds a
factorization costed as 50 products.
"""

from __future__ import annotations

import math

from ...dispatch.records import Decline, Offer, Request
from . import cost

DENSE_EIG_MAX = 2048
DENSE_DET_MAX = 4096


def eigen_offers(request: Request, r) -> list[Offer | Decline]:
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
        flops = {"eigsh": 9, "eigs": 25, "logdet": 2 / 3}[op] * n ** 3 * batch
        secs = r.seconds(bytes=4 * n * n * vsize * batch, flops=flops, launches=10 * batch)
        from .eigen import DenseEigPlan

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
        out.append(Decline("torch", "lanczos solves the standard problem only (M given); use 'dense', 'lobpcg' or the scipy plugin's 'arpack'", "lanczos"))
    elif k >= n:
        out.append(Decline("torch", f"lanczos needs k < n (k={k}, n={n}); use 'dense'", "lanczos"))
    elif which == "SM" and sigma is None:
        out.append(Decline("torch", "lanczos finds smallest-magnitude eigenvalues only by shift-invert: pass sigma=0", "lanczos"))
    else:
        m = min(n, max(2 * k + 1, k + 32))
        restarts = 10 + k
        spmv = cost.spmm_seconds(r, request, 1)
        per_restart = m * spmv + r.seconds(flops=4 * n * m * m, bytes=2 * n * m * m * vsize // max(m, 1), launches=8 * m)
        secs = restarts * per_restart * batch
        note = f"~{restarts} restarts of {m} Lanczos vectors (estimate)"
        if sigma is not None:
            secs += 50 * spmv * batch
            note += "; shift-invert through sparsetorch.solve (factorized once)"
        from .eigen import LanczosPlan

        out.append(Offer("torch", "lanczos", secs, int((m + 1) * n * vsize), lambda A_, req: LanczosPlan(A_), note))
    # LOBPCG (torch.lobpcg)
    if "spd" not in request.properties:
        out.append(Decline("torch", "lobpcg needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)", "lobpcg"))
    elif sigma is not None or which not in ("LA", "SA"):
        out.append(Decline("torch", f"lobpcg finds only which='LA' or 'SA' without sigma (got which={which!r}, sigma={sigma!r})", "lobpcg"))
    elif n < 3 * k:
        out.append(Decline("torch", f"torch.lobpcg needs n >= 3k (n={n}, k={k}); use 'dense'", "lobpcg"))
    else:
        spmv = cost.spmm_seconds(r, request, 3 * k)
        its = 200
        secs = its * (spmv + r.seconds(flops=2 * n * (3 * k) ** 2, launches=40)) * batch
        from .eigen import LobpcgPlan

        out.append(Offer("torch", "lobpcg", secs, int(6 * n * k * vsize), lambda A_, req: LobpcgPlan(A_), "torch.lobpcg, ~200 iterations (estimate)"))
    for method in ("arpack",):
        if request.option("method") == method:
            out.append(Decline("torch", f"method {method!r} is in the scipy plugin (pip install sparsetorch-scipy)", method))
    return out
