"""The fused CG of the cuda backend (sparsetorch_cuda/krylov.py, kernels/krylov.cu).

Without a GPU (CI): the solve offer and its declines (a Request is plain data), the cost model's
shape. With a GPU (the ``gpu`` marker): solutions against dense float64 solves, the iteration
count against a textbook float64 CG with the same stopping rule, Jacobi, DIA / CSR int32 / int64 /
COO, several right-hand sides, the stops (indefinite, maxiter, b = 0), graph replay against eager
launches (bitwise), dispatch through ``st.solve``, and the work memory."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import Decline, Offer, OperandInfo, Request, Status
from sparsetorch.format import COO, CSR, DIA, batched

import sparsetorch_cuda.plugin as plugin
from sparsetorch_cuda import krylov

from _cuda_helpers import gpu


def _request(n=10_000, nse=50_000, *, dtype=torch.float64, device="cuda", fmt=CSR, k=1, batch=(), props=("spd",),
             **options):
    A = OperandInfo("sparse", (*batch, n, n), dtype, torch.device(device), format=fmt, nse=nse, batch_shape=batch)
    B = OperandInfo("dense", (*batch, n, k), dtype, torch.device(device))
    return Request("solve", (A, B), frozenset(props), options)


def _only(answers):
    """The plugin's answer for method "cg" (with no method asked it also answers for "bicgstab")."""
    if len(answers) > 1:
        answers = [a for a in answers if getattr(a, "method", None) in (None, "cg")]
    assert len(answers) == 1, answers
    return answers[0]


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a request for a GPU, asked on any machine
    monkeypatch.setattr(plugin, "_bindings_missing", lambda: None)


# Offers and declines (no GPU needed) ---------------------------------------------------------------
def test_spd_request_gets_the_fused_cg_offer(on_gpu):
    got = _only(plugin.sparsetorch_offers(_request()))
    assert isinstance(got, Offer) and (got.backend, got.method) == ("cuda", "cg")
    assert got.preconditioner == "jacobi"  # no method, no preconditioner: Jacobi, as the torch backend
    assert got.iterations >= 1 and got.seconds > 0 and "3 kernels" in got.notes
    plain = _only(plugin.sparsetorch_offers(_request(method="cg", preconditioner=None)))
    assert plain.preconditioner is None and plain.seconds < got.seconds  # two vector passes less per iteration


@pytest.mark.parametrize(("kw", "words"), [
    ({"props": ()}, "symmetric positive definite"),
    ({"props": ("symmetric",)}, "symmetric positive definite"),
    ({"dtype": torch.float16}, "float16"),
    ({"dtype": torch.complex128}, "complex128"),
    ({"fmt": batched(CSR), "batch": (2,)}, "BATCH levels"),
    ({"method": "gmres"}, "only methods 'cg'"),
    ({"preconditioner": "ilu"}, "'ilu'"),
    ({"preconditioner": "block_jacobi"}, "'block_jacobi'"),
])
def test_declines_with_a_reason(on_gpu, kw, words):
    got = _only(plugin.sparsetorch_offers(_request(**kw)))
    assert isinstance(got, Decline) and words in got.reason, got


def test_cpu_request_is_declined():
    got = _only(plugin.sparsetorch_offers(_request(device="cpu")))
    assert isinstance(got, Decline) and "cuda" in got.reason.lower()


def test_cost_grows_with_size_and_dia_moves_no_indices(on_gpu):
    small = _only(plugin.sparsetorch_offers(_request(10_000, 50_000, method="cg")))
    large = _only(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, method="cg")))
    assert 0 < small.seconds < large.seconds and small.bytes < large.bytes
    # 5 vectors of 8 bytes (+ D^-1 with Jacobi): within issue 16's 56 bytes per unknown
    assert large.bytes <= 56 * 1_000_000
    csr = _only(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, method="cg", preconditioner=None)))
    dia = _only(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, fmt=DIA, method="cg", preconditioner=None)))
    assert dia.seconds < csr.seconds and "no index arrays" in dia.notes
    coo = _only(plugin.sparsetorch_offers(_request(1_000_000, 5_000_000, fmt=COO, method="cg")))
    assert coo.setup > 0 and "made once" in coo.notes


def test_bytes_per_iteration():
    n = 1000
    assert krylov.bytes_per_iteration(n, 40 * n, 8, False) == 40 * n + 80 * n
    assert krylov.bytes_per_iteration(n, 40 * n, 8, True) == 40 * n + 96 * n


def test_cheaper_than_the_torch_backends_cg_at_one_million_unknowns(on_gpu):
    """The estimate dispatch compares: the fused iteration (3 kernels, no host work per iteration)
    against the torch backend's graph-replayed one (16 kernels)."""
    from sparsetorch.backend import get_backends

    req = _request(1_000_000, 4_996_000, method="cg", preconditioner=None)
    ours = _only(plugin.sparsetorch_offers(req))
    theirs = next(o for o in get_backends().offers(req) if isinstance(o, Offer) and o.backend == "torch"
                  and o.method == "cg")
    assert ours.seconds < theirs.seconds


# GPU ----------------------------------------------------------------------------------------------------
def _poisson(m: int, dtype=torch.float64) -> torch.Tensor:
    """The 5-point 2-D Laplacian on an m x m grid, dense (small m only)."""
    T = 2 * torch.eye(m, dtype=dtype) - torch.diag(torch.ones(m - 1, dtype=dtype), 1) - torch.diag(torch.ones(m - 1, dtype=dtype), -1)
    eye = torch.eye(m, dtype=dtype)
    return torch.kron(T, eye) + torch.kron(eye, T)


def _spd_random(n: int, seed: int = 0) -> torch.Tensor:
    """A sparse SPD matrix with a varying diagonal (Jacobi changes the iterates)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, n, generator=g) < 0.02
    R = torch.where(mask, torch.rand(n, n, generator=g, dtype=torch.float64) - 0.5, 0.0)
    S = R + R.T
    d = S.abs().sum(1) + torch.rand(n, generator=g, dtype=torch.float64) * 10 + 0.1
    return S + torch.diag(d)


def _textbook_cg(D: torch.Tensor, b: torch.Tensor, rtol: float, maxiter: int, jacobi: bool = False) -> tuple[torch.Tensor, int]:
    """float64 CG on the dense matrix, stopping at ||r|| <= rtol ||b|| (checked every iteration)."""
    x = torch.zeros_like(b)
    r = b.clone()
    dinv = 1 / torch.diagonal(D) if jacobi else torch.ones_like(b)
    z = dinv * r
    p = z.clone()
    rz = r @ z
    tol = rtol * torch.linalg.vector_norm(b)
    it = 0
    while it < maxiter and torch.linalg.vector_norm(r) > tol:
        q = D @ p
        alpha = rz / (p @ q)
        x += alpha * p
        r -= alpha * q
        it += 1
        z = dinv * r
        rz, old = r @ z, rz
        p = z + (rz / old) * p
    return x, it


def _sparse(D: torch.Tensor, fmt, dtype=torch.float64, index_dtype=torch.int64) -> st.SparseTensor:
    A = st.SparseTensor.from_dense(D.to(dtype), mask=D != 0)
    return A.convert(fmt, index_dtype=index_dtype).cuda()


def _plan(A: st.SparseTensor, preconditioner=None, **kw) -> krylov.CudaCGPlan:
    plan = krylov.CudaCGPlan(A, preconditioner=preconditioner, **kw)
    plan.set_values(A.values)
    return plan


@gpu
@pytest.mark.parametrize("fmt,index", [(CSR, torch.int32), (CSR, torch.int64), (DIA, torch.int64), (COO, torch.int64)])
@pytest.mark.parametrize("pre", [None, "jacobi"])
def test_solution_and_iterations_match_float64_references(fmt, index, pre):
    D = _spd_random(300) if pre == "jacobi" else _poisson(17)
    if fmt == DIA:
        D = _poisson(17)
    n = D.shape[0]
    b = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    plan = _plan(_sparse(D, fmt, index_dtype=index), pre)
    X, info = plan.solve(b.cuda().reshape(n, 1), options={"rtol": 1e-10, "maxiter": 5000})
    ref = torch.linalg.solve(D, b)
    assert info.status is Status.CONVERGED and info.converged
    assert float(torch.linalg.vector_norm(D @ X.cpu()[:, 0] - b) / torch.linalg.vector_norm(b)) < 2e-10
    assert float(torch.linalg.vector_norm(X.cpu()[:, 0] - ref) / torch.linalg.vector_norm(ref)) < 1e-7
    _, it = _textbook_cg(D, b, 1e-10, 5000, jacobi=pre == "jacobi")
    assert abs(info.iterations - it) <= 2, (info.iterations, it)
    assert info.residual <= 1e-10


@gpu
def test_float32():
    D = _poisson(20)
    n = D.shape[0]
    b = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    plan = _plan(_sparse(D, CSR, torch.float32, torch.int32))
    X, info = plan.solve(b.to(torch.float32).cuda()[:, None], options={"rtol": 1e-5})
    assert info.converged and X.dtype == torch.float32
    ref = torch.linalg.solve(D, b)
    assert float(torch.linalg.vector_norm(X.cpu()[:, 0].double() - ref) / torch.linalg.vector_norm(ref)) < 1e-3


@gpu
def test_several_columns_and_batched_b():
    D = _poisson(12)
    n = D.shape[0]
    B = torch.randn(2, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    plan = _plan(_sparse(D, DIA), "jacobi")
    X, info = plan.solve(B.cuda(), options={"rtol": 1e-12})
    assert X.shape == B.shape and info.converged
    ref = torch.linalg.solve(D, B)
    assert float((X.cpu() - ref).abs().max() / ref.abs().max()) < 1e-9


@gpu
def test_graph_replay_equals_eager_launches_bitwise():
    D = _poisson(30)
    b = torch.randn(D.shape[0], 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).cuda()
    plan = _plan(_sparse(D, CSR, index_dtype=torch.int32))
    Xg, ig = plan.solve(b, options={"rtol": 1e-9, "check_every": 7})
    Xe, ie = plan.solve(b, options={"rtol": 1e-9, "check_every": 7, "backend_options": {"cuda_graph": False}})
    Xg2, ig2 = plan.solve(b, options={"rtol": 1e-9, "check_every": 7})  # the kept graph, replayed again
    assert ig.iterations == ie.iterations == ig2.iterations
    assert torch.equal(Xg, Xe) and torch.equal(Xg, Xg2)


@gpu
def test_cuda_graph_false_reaches_the_plan_through_dispatch():
    # backend_options reach a plan at its build (the per-call options carry none): the plan keeps
    # cuda_graph=False, and its answer is the graphed one
    D = _poisson(20)
    b = torch.randn(D.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    A = _sparse(D, CSR, index_dtype=torch.int32)
    s = st.Solver(A, backend="cuda", method="cg", rtol=1e-10, backend_options={"cuda_graph": False})
    x = s.solve(b.cuda())
    assert s._state.plan.cuda_graph is False
    g = st.Solver(A, backend="cuda", method="cg", rtol=1e-10)
    xg = g.solve(b.cuda())
    assert g._state.plan.cuda_graph is True
    torch.testing.assert_close(x, xg, rtol=1e-12, atol=1e-12)
    ref = torch.linalg.solve(D, b)
    assert float((x.cpu() - ref).abs().max() / ref.abs().max()) < 1e-8


@gpu
def test_stops_indefinite_maxiter_zero_rhs():
    D = _poisson(10)
    D[5, 5] = -50.0  # indefinite
    n = D.shape[0]
    b = torch.ones(n, 1, dtype=torch.float64).cuda()
    _, info = _plan(_sparse(D, CSR)).solve(b, options={"rtol": 1e-12})
    assert info.status is Status.INDEFINITE and "positive definite" in info.reason
    with pytest.raises(st.IndefiniteMatrixError):
        _plan(_sparse(D, CSR), "jacobi")  # a negative diagonal entry: Jacobi is refused at once
    D = _poisson(20)
    plan = _plan(_sparse(D, CSR))
    _, info = plan.solve(torch.ones(400, 1, dtype=torch.float64).cuda(), options={"rtol": 1e-14, "maxiter": 13})
    assert info.status is Status.MAX_ITERATIONS and info.iterations == 13
    X, info = plan.solve(torch.zeros(400, 1, dtype=torch.float64).cuda(), options={"rtol": 1e-8})
    assert info.converged and info.iterations == 0 and not X.any()


@gpu
def test_callback_is_called_per_block_with_the_residual():
    D = _poisson(20)
    seen = []
    plan = _plan(_sparse(D, CSR))
    _, info = plan.solve(torch.ones(400, 1, dtype=torch.float64).cuda(),
                         options={"rtol": 1e-10, "check_every": 5, "callback": lambda it, res: seen.append((it, res))})
    assert seen and seen[-1][0] == info.iterations and seen[-1][1] == pytest.approx(info.residual)
    assert all(b[0] - a[0] == 5 for a, b in zip(seen[:-2], seen[1:-1]))


@gpu
def test_dispatch_through_st_solve():
    D = _poisson(25)
    A = _sparse(D, CSR)
    b = torch.randn(D.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4)).cuda()
    x, info = st.solve(A, b, backend="cuda", method="cg", rtol=1e-10, return_info=True)
    assert (info.backend, info.method) == ("cuda", "cg") and info.converged
    ref = torch.linalg.solve(D, b.cpu())
    assert float(torch.linalg.vector_norm(x.cpu() - ref) / torch.linalg.vector_norm(ref)) < 1e-8


@gpu
def test_work_memory_is_within_56_bytes_per_unknown():
    m = 300
    n = m * m
    D_idx = torch.arange(n)
    r, c = D_idx // m, D_idx % m
    nb = torch.stack([D_idx - m, D_idx - 1, D_idx, D_idx + 1, D_idx + m], 1)
    ok = torch.stack([r > 0, c > 0, torch.ones_like(r, dtype=torch.bool), c < m - 1, r < m - 1], 1)
    vals = torch.where(nb == D_idx[:, None], 4.0, -1.0).double()
    counts = ok.sum(1)
    crow = torch.zeros(n + 1, dtype=torch.int32)
    crow[1:] = torch.cumsum(counts, 0)
    A = st.SparseTensor(CSR, (n, n), [None, crow.cuda()], [None, nb[ok].to(torch.int32).cuda()], vals[ok].cuda(), check=False)
    b = torch.ones(n, 1, dtype=torch.float64).cuda()
    plan = _plan(A, "jacobi")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    X, info = plan.solve(b, options={"rtol": 1e-30, "maxiter": 50})
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert info.iterations == 50
    assert extra <= 56 * n, extra / n
