"""The fused BiCGStab of the cuda backend (sparsetorch_cuda/krylov.py, kernels/krylov.cu).

Without a GPU (CI): the solve offers and declines for method ``bicgstab`` (a Request is plain
data), the cost model's shape against the torch backend's BiCGStab. With a GPU (the ``gpu``
marker): solutions against dense float64 solves on 2-D upwind convection-diffusion matrices and a
random well-conditioned non-symmetric one, the iteration count against a textbook float64
BiCGStab written here (same stopping rule), Jacobi, DIA / CSR int32 / int64 / COO, float32,
several right-hand sides, adjoint solves, graph replay against eager launches (bitwise),
callback / maxiter / check_every, the breakdowns and NaN, dispatch through ``st.solve`` and the
work memory."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import Decline, Offer, OperandInfo, Request, Status
from sparsetorch.format import COO, CSR, DIA, batched

import sparsetorch_cuda.plugin as plugin
from sparsetorch_cuda import krylov

from _cuda_helpers import gpu


def _request(n=10_000, nse=50_000, *, dtype=torch.float64, device="cuda", fmt=CSR, k=1, batch=(), props=(), shape=None,
             **options):
    shape = shape or (n, n)
    A = OperandInfo("sparse", (*batch, *shape), dtype, torch.device(device), format=fmt, nse=nse, batch_shape=batch)
    B = OperandInfo("dense", (*batch, shape[0], k), dtype, torch.device(device))
    return Request("solve", (A, B), frozenset(props), options)


def _by_method(answers, method="bicgstab"):
    got = [a for a in answers if getattr(a, "method", None) == method]
    assert len(got) == 1, answers
    return got[0]


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a request for a GPU, asked on any machine
    monkeypatch.setattr(plugin, "_bindings_missing", lambda: None)


# Offers and declines (no GPU needed) ---------------------------------------------------------------
def test_non_symmetric_request_gets_the_fused_bicgstab_offer(on_gpu):
    answers = plugin.sparsetorch_offers(_request())
    assert isinstance(_by_method(answers, "cg"), Decline)  # no method asked: CG declined (not SPD) ...
    got = _by_method(answers)  # ... and BiCGStab offered, with Jacobi as the torch backend's default
    assert isinstance(got, Offer) and (got.backend, got.method, got.preconditioner) == ("cuda", "bicgstab", "jacobi")
    assert got.iterations >= 1 and got.seconds > 0 and "4 kernels" in got.notes
    plain = _by_method(plugin.sparsetorch_offers(_request(method="bicgstab")))
    assert isinstance(plain, Offer) and plain.preconditioner is None and plain.seconds < got.seconds
    jac = _by_method(plugin.sparsetorch_offers(_request(method="bicgstab", preconditioner="jacobi")))
    assert jac.preconditioner == "jacobi" and jac.seconds == pytest.approx(got.seconds)


def test_method_bicgstab_answers_for_bicgstab_only(on_gpu):
    answers = plugin.sparsetorch_offers(_request(method="bicgstab", props=("spd",)))
    assert [(type(a).__name__, a.method) for a in answers] == [("Offer", "bicgstab")]
    answers = plugin.sparsetorch_offers(_request(method="cg", props=("spd",)))
    assert [(type(a).__name__, a.method) for a in answers] == [("Offer", "cg")]


def test_spd_without_method_offers_both_and_cg_is_cheaper(on_gpu):
    answers = plugin.sparsetorch_offers(_request(1_000_000, 4_996_000, props=("spd",)))
    cg, bi = _by_method(answers, "cg"), _by_method(answers)
    assert isinstance(cg, Offer) and isinstance(bi, Offer)
    assert cg.seconds < bi.seconds  # one product per iteration against two, 0.75x the iterations


@pytest.mark.parametrize(("kw", "words"), [
    ({"dtype": torch.float16}, "float16"),
    ({"dtype": torch.bfloat16}, "bfloat16"),
    ({"dtype": torch.complex128}, "complex128"),
    ({"fmt": batched(CSR), "batch": (2,)}, "BATCH levels"),
    ({"shape": (100, 80)}, "BiCGStab needs a square matrix"),
    ({"preconditioner": "ilu"}, "'ilu'"),
    ({"preconditioner": "block_jacobi"}, "'block_jacobi'"),
])
def test_declines_with_a_reason(on_gpu, kw, words):
    got = _by_method(plugin.sparsetorch_offers(_request(method="bicgstab", **kw)))
    assert isinstance(got, Decline) and words in got.reason, got


def test_other_methods_are_declined_by_name(on_gpu):
    (got,) = plugin.sparsetorch_offers(_request(method="gmres"))
    assert isinstance(got, Decline) and got.method == "gmres" and "'bicgstab'" in got.reason


def test_cpu_request_and_missing_bindings_are_declined(monkeypatch):
    got = _by_method(plugin.sparsetorch_offers(_request(device="cpu", method="bicgstab")))
    assert isinstance(got, Decline) and "cuda" in got.reason.lower()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(plugin, "_bindings_missing", lambda: "cuda.bindings is not installed: pip install x")
    got = _by_method(plugin.sparsetorch_offers(_request(method="bicgstab")))
    assert isinstance(got, Decline) and "cuda.bindings is not installed" in got.reason


def test_backend_info_lists_bicgstab():
    assert plugin.sparsetorch_backend_info().ops["solve"] == ("cg", "bicgstab")


def test_cost_grows_with_size_dia_moves_no_indices_memory_within_48_bytes(on_gpu):
    small = _by_method(plugin.sparsetorch_offers(_request(10_000, 50_000, method="bicgstab")))
    large = _by_method(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, method="bicgstab")))
    assert 0 < small.seconds < large.seconds and small.bytes < large.bytes
    assert large.bytes == 5 * 8 * 1_000_000  # x, r, p, v, t; the shadow residual is b itself
    jac = _by_method(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, method="bicgstab", preconditioner="jacobi")))
    assert jac.bytes == 6 * 8 * 1_000_000
    dia = _by_method(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, fmt=DIA, method="bicgstab")))
    assert dia.seconds < large.seconds and "no index arrays" in dia.notes
    coo = _by_method(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, fmt=COO, method="bicgstab")))
    assert coo.setup > 0 and "made once" in coo.notes


def test_bytes_per_iteration():
    n = 1000
    assert krylov.bicgstab_bytes_per_iteration(n, 40 * n, 8, False) == 80 * n + 144 * n
    assert krylov.bicgstab_bytes_per_iteration(n, 40 * n, 8, True) == 80 * n + 168 * n
    assert krylov.bicgstab_bytes_per_iteration(n, 20 * n, 4, False) == 40 * n + 72 * n


def test_cheaper_than_the_torch_backends_bicgstab_at_one_million_unknowns(on_gpu):
    from sparsetorch.backend import get_backends

    req = _request(1_000_000, 4_996_000, method="bicgstab")
    ours = _by_method(plugin.sparsetorch_offers(req))
    theirs = next(o for o in get_backends().offers(req) if isinstance(o, Offer) and o.backend == "torch"
                  and o.method == "bicgstab")
    assert ours.iterations == theirs.iterations  # the same iteration model (the core's)
    assert ours.seconds < theirs.seconds and ours.bytes <= theirs.bytes


# GPU ----------------------------------------------------------------------------------------------------
def convection_diffusion(m: int, c: tuple[float, float] = (40.0, 20.0), dtype=torch.float64) -> torch.Tensor:
    """-Laplace(u) + c . grad(u) on the unit square, m x m interior points, first-order upwind
    differences (c > 0: backward differences), scaled by h^2; dense (small m only). Non-symmetric:
    the west / south couplings are -1 - h c, the east / north ones -1."""
    h = 1.0 / (m + 1)
    cx, cy = c
    T1 = torch.diag(torch.full((m,), 2.0 + h * cx, dtype=dtype)) + torch.diag(torch.full((m - 1,), -1.0 - h * cx, dtype=dtype), -1) \
        + torch.diag(torch.full((m - 1,), -1.0, dtype=dtype), 1)
    T2 = torch.diag(torch.full((m,), 2.0 + h * cy, dtype=dtype)) + torch.diag(torch.full((m - 1,), -1.0 - h * cy, dtype=dtype), -1) \
        + torch.diag(torch.full((m - 1,), -1.0, dtype=dtype), 1)
    eye = torch.eye(m, dtype=dtype)
    return torch.kron(eye, T1) + torch.kron(T2, eye)  # x fastest: offsets -1, +1 (T1) and -m, +m (T2)


def random_nonsymmetric(n: int, seed: int = 0) -> torch.Tensor:
    """A sparse non-symmetric matrix, diagonally dominant with a varying diagonal (well conditioned;
    Jacobi changes the iterates)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, n, generator=g) < 0.03
    R = torch.where(mask, torch.rand(n, n, generator=g, dtype=torch.float64) - 0.5, 0.0)
    d = R.abs().sum(1) * (1 + torch.rand(n, generator=g, dtype=torch.float64) * 4) + 0.5
    return R + torch.diag(d)


def textbook_bicgstab(D: torch.Tensor, b: torch.Tensor, rtol: float, maxiter: int, jacobi: bool = False
                      ) -> tuple[torch.Tensor, int, str]:
    """float64 right-preconditioned BiCGStab on the dense matrix (rh = r0 = b, x0 = 0), stopping at
    ||r|| <= rtol ||b||, tested after the half step (on s) and after the full step."""
    dinv = 1 / torch.diagonal(D) if jacobi else torch.ones_like(b)
    x = torch.zeros_like(b)
    r = b.clone()
    rh = b.clone()
    tol = rtol * torch.linalg.vector_norm(b)
    rho = rh @ r
    p = r.clone()
    v = torch.zeros_like(b)
    alpha = omega = torch.tensor(1.0, dtype=b.dtype)
    it = 0
    while it < maxiter and torch.linalg.vector_norm(r) > tol:
        if it > 0:
            rho_new = rh @ r
            p = r + (rho_new / rho) * (alpha / omega) * (p - omega * v)
            rho = rho_new
        ph = dinv * p
        v = D @ ph
        alpha = rho / (rh @ v)
        s = r - alpha * v
        it += 1
        if torch.linalg.vector_norm(s) <= tol:
            x += alpha * ph
            r = s
            break
        sh = dinv * s
        t = D @ sh
        omega = (t @ s) / (t @ t)
        x += alpha * ph + omega * sh
        r = s - omega * t
    return x, it, "converged" if torch.linalg.vector_norm(r) <= tol else "max"


def _sparse(D: torch.Tensor, fmt, dtype=torch.float64, index_dtype=torch.int64) -> st.SparseTensor:
    A = st.SparseTensor.from_dense(D.to(dtype), mask=D != 0)
    return A.convert(fmt, index_dtype=index_dtype).cuda()


def _plan(A: st.SparseTensor, preconditioner=None, **kw) -> krylov.CudaBiCGStabPlan:
    plan = krylov.CudaBiCGStabPlan(A, preconditioner=preconditioner, **kw)
    plan.set_values(A.values)
    return plan


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a.double().cpu() - b) / torch.linalg.vector_norm(b))


@gpu
@pytest.mark.parametrize("fmt,index", [(CSR, torch.int32), (CSR, torch.int64), (DIA, torch.int64), (COO, torch.int64)])
@pytest.mark.parametrize("matrix,pre", [("convdiff", None), ("convdiff", "jacobi"), ("random", None), ("random", "jacobi")])
def test_solution_and_iterations_match_float64_references(fmt, index, matrix, pre):
    D = convection_diffusion(16) if matrix == "convdiff" else random_nonsymmetric(300)
    if fmt == DIA and matrix == "random":
        D = convection_diffusion(16, (5.0, 60.0)) + torch.diag(torch.linspace(0, 1, 256, dtype=torch.float64))
    n = D.shape[0]
    b = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    plan = _plan(_sparse(D, fmt, index_dtype=index), pre)
    X, info = plan.solve(b.cuda().reshape(n, 1), options={"rtol": 1e-10, "maxiter": 2000})
    ref = torch.linalg.solve(D, b)
    assert info.status is Status.CONVERGED and info.converged, info
    assert float(torch.linalg.vector_norm(D @ X.cpu()[:, 0] - b) / torch.linalg.vector_norm(b)) < 1e-9
    assert _rel(X[:, 0], ref) < 1e-6
    _, it, how = textbook_bicgstab(D, b, 1e-10, 2000, jacobi=pre == "jacobi")
    assert how == "converged" and abs(info.iterations - it) <= max(2, it // 10), (info.iterations, it)
    assert info.residual <= 1e-10


@gpu
@pytest.mark.parametrize("fmt", [CSR, DIA])
def test_float32(fmt):
    D = convection_diffusion(20)
    n = D.shape[0]
    b = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    plan = _plan(_sparse(D, fmt, torch.float32, torch.int32))
    X, info = plan.solve(b.to(torch.float32).cuda()[:, None], options={"rtol": 1e-5})
    assert info.converged and X.dtype == torch.float32
    assert _rel(X[:, 0], torch.linalg.solve(D, b)) < 1e-3


@gpu
def test_several_columns_batched_b_and_adjoint():
    D = random_nonsymmetric(200, seed=4)
    n = D.shape[0]
    B = torch.randn(2, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    plan = _plan(_sparse(D, CSR), "jacobi")
    X, info = plan.solve(B.cuda(), options={"rtol": 1e-12})
    assert X.shape == B.shape and info.converged
    ref = torch.linalg.solve(D, B)
    assert float((X.cpu() - ref).abs().max() / ref.abs().max()) < 1e-9
    Xa, ia = plan.solve(B.cuda(), adjoint=True, options={"rtol": 1e-12})
    ref = torch.linalg.solve(D.T, B)
    assert ia.converged and float((Xa.cpu() - ref).abs().max() / ref.abs().max()) < 1e-9
    # new values on the same pattern reach the adjoint plan too
    A2 = _sparse(2 * D, CSR)
    plan.set_values(A2.values)
    Xa, ia = plan.solve(B.cuda(), adjoint=True, options={"rtol": 1e-12})
    assert float((Xa.cpu() - ref / 2).abs().max() / ref.abs().max()) < 1e-9


@gpu
def test_dia_adjoint():
    D = convection_diffusion(12)
    b = torch.randn(144, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    X, info = _plan(_sparse(D, DIA)).solve(b.cuda(), adjoint=True, options={"rtol": 1e-12})
    assert info.converged and _rel(X[:, 0], torch.linalg.solve(D.T, b[:, 0])) < 1e-9


@gpu
def test_graph_replay_equals_eager_launches_bitwise():
    D = convection_diffusion(30)
    b = torch.randn(D.shape[0], 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).cuda()
    plan = _plan(_sparse(D, CSR, index_dtype=torch.int32))
    Xg, ig = plan.solve(b, options={"rtol": 1e-9, "check_every": 7})
    Xe, ie = plan.solve(b, options={"rtol": 1e-9, "check_every": 7, "backend_options": {"cuda_graph": False}})
    Xg2, ig2 = plan.solve(b, options={"rtol": 1e-9, "check_every": 7})  # the kept graph, replayed again
    assert ig.iterations == ie.iterations == ig2.iterations and ig.converged
    assert torch.equal(Xg, Xe) and torch.equal(Xg, Xg2)


@gpu
def test_callback_maxiter_and_check_every():
    D = convection_diffusion(20)
    seen = []
    plan = _plan(_sparse(D, CSR))
    b = torch.ones(400, 1, dtype=torch.float64).cuda()
    _, info = plan.solve(b, options={"rtol": 1e-10, "check_every": 5, "callback": lambda it, res: seen.append((it, res))})
    assert info.converged and seen and seen[-1][0] == info.iterations and seen[-1][1] == pytest.approx(info.residual)
    assert len(seen) >= 2 and all(b_[0] - a[0] == 5 for a, b_ in zip(seen[:-2], seen[1:-1]))
    assert all(s[1] > 1e-10 for s in seen[:-1])
    _, it, _ = textbook_bicgstab(D, b.cpu()[:, 0], 1e-10, 1000)
    assert abs(info.iterations - it) <= 2
    _, info = plan.solve(b, options={"rtol": 1e-14, "maxiter": 13, "check_every": 4})
    assert info.status is Status.MAX_ITERATIONS and info.iterations == 13 and not info.converged
    X, info = plan.solve(torch.zeros(400, 1, dtype=torch.float64).cuda(), options={"rtol": 1e-8})
    assert info.converged and info.iterations == 0 and not X.any()


@gpu
def test_half_step_convergence():
    """A = 3 I: the first half step is exact (s = 0): one iteration, x = b / 3."""
    D = 3 * torch.eye(50, dtype=torch.float64)
    b = torch.randn(50, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).cuda()
    X, info = _plan(_sparse(D, CSR)).solve(b, options={"rtol": 1e-12})
    assert info.converged and info.iterations == 1
    assert torch.allclose(X, b / 3, rtol=1e-14, atol=0)


def _skew(n: int) -> torch.Tensor:
    return torch.diag(torch.ones(n - 1, dtype=torch.float64), 1) - torch.diag(torch.ones(n - 1, dtype=torch.float64), -1)


def _cols(*cols) -> torch.Tensor:
    """The matrix whose column j has ones at the rows cols[j]."""
    D = torch.zeros(len(cols), len(cols), dtype=torch.float64)
    for j, rows in enumerate(cols):
        D[list(rows), j] = 1.0
    return D


@gpu
def test_breakdowns_and_nan_are_reported():
    """Exact zeros, so that the device's tests meet them whatever the rounding (b = e0 throughout)."""
    e0 = torch.zeros(8, 1, dtype=torch.float64).cuda()
    e0[0] = 1.0
    # the cyclic shift (A e_i = e_{i+1}): v = A b = e1, rh^T v = 0 at once
    X, info = _plan(_sparse(_cols(*[((i + 1) % 8,) for i in range(8)]), CSR)).solve(e0, options={"rtol": 1e-10})
    assert info.status is Status.BREAKDOWN and not info.converged and "alpha is undefined" in info.reason, info
    assert info.iterations == 0 and not X.any()
    b4 = e0[:4].contiguous()
    # A e0 = e0 + e1, A e1 = e2: alpha = 1, s = -e1, t = -e2, t^T s = 0 (the step is still applied: x = e0)
    X, info = _plan(_sparse(_cols((0, 1), (2,), (3,), (0,)), CSR)).solve(b4, options={"rtol": 1e-10})
    assert info.status is Status.BREAKDOWN and "omega" in info.reason and info.iterations == 1, info
    assert X.cpu()[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    # A e0 = e0 + e1, A e1 = e1 + e2: omega = 1/2, r = (e2 - e1) / 2, rh^T r = 0
    X, info = _plan(_sparse(_cols((0, 1), (1, 2), (3,), (0,)), CSR)).solve(b4, options={"rtol": 1e-10})
    assert info.status is Status.BREAKDOWN and "rho" in info.reason and info.iterations == 1, info
    assert info.residual == pytest.approx(0.5 ** 0.5)
    # NaN in A / in b
    D = convection_diffusion(8)
    D[3, 3] = float("nan")
    _, info = _plan(_sparse(D, CSR)).solve(torch.ones(64, 1, dtype=torch.float64).cuda(), options={"rtol": 1e-10})
    assert info.status is Status.NOT_FINITE
    bn = torch.ones(64, 1, dtype=torch.float64).cuda()
    bn[5] = float("nan")
    _, info = _plan(_sparse(convection_diffusion(8), CSR)).solve(bn, options={"rtol": 1e-10})
    assert info.status is Status.NOT_FINITE and info.iterations == 0


@gpu
def test_jacobi_with_a_zero_diagonal_is_refused():
    with pytest.raises(st.SingularMatrixError):
        _plan(_sparse(_skew(16) + torch.eye(16, dtype=torch.float64) * (torch.arange(16) % 2), CSR), "jacobi")
    with pytest.raises(st.SingularMatrixError):
        _plan(_sparse(_skew(16), DIA), "jacobi")  # no main diagonal stored


@gpu
def test_dispatch_through_st_solve_and_gradient():
    D = convection_diffusion(25)
    A = _sparse(D, CSR)
    b = torch.randn(D.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4)).cuda()
    x, info = st.solve(A, b, backend="cuda", method="bicgstab", rtol=1e-11, return_info=True)
    assert (info.backend, info.method) == ("cuda", "bicgstab") and info.converged
    assert _rel(x, torch.linalg.solve(D, b.cpu())) < 1e-8
    bg = b.clone().requires_grad_(True)
    x = st.solve(A, bg, backend="cuda", method="bicgstab", rtol=1e-12)
    x.sum().backward()
    assert _rel(bg.grad, torch.linalg.solve(D.T, torch.ones(D.shape[0], dtype=torch.float64))) < 1e-8


@gpu
def test_work_memory_is_within_48_bytes_per_unknown():
    m = 300
    n = m * m
    A = _sparse(convection_diffusion(30), CSR, index_dtype=torch.int32)  # compile + load on a small one first
    _plan(A).solve(torch.ones(900, 1, dtype=torch.float64).cuda(), options={"rtol": 1e-30, "maxiter": 3})
    idx = torch.arange(n)
    r, c = idx // m, idx % m
    nb = torch.stack([idx - m, idx - 1, idx, idx + 1, idx + m], 1)
    ok = torch.stack([r > 0, c > 0, torch.ones_like(r, dtype=torch.bool), c < m - 1, r < m - 1], 1)
    vals = torch.tensor([-1.5, -1.2, 4.7, -1.0, -1.0], dtype=torch.float64).expand(n, 5)
    counts = ok.sum(1)
    crow = torch.zeros(n + 1, dtype=torch.int32)
    crow[1:] = torch.cumsum(counts, 0)
    A = st.SparseTensor(CSR, (n, n), [None, crow.cuda()], [None, nb[ok].to(torch.int32).cuda()], vals[ok].cuda(), check=False)
    b = torch.ones(n, 1, dtype=torch.float64).cuda()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    plan = _plan(A)
    X, info = plan.solve(b, options={"rtol": 1e-30, "maxiter": 50})
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert info.iterations == 50
    assert extra <= 48 * n, extra / n
