"""The cuDSS plan itself on a GPU: the analysis runs once per pattern and new values only
refactorize, the backward pass re-uses the factorization, uniform batches equal per-member
solves, named errors with the failing row, int64 indices, hybrid memory mode, torch's current
stream, and the library's version/transposed-solve path. Skips without CUDA and libcudss."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import get_backends, reset_backends
from sparsetorch.format import CSR
from sparsetorch.testing.problems import poisson2d

import sparsetorch_cudss.plugin as plugin
from sparsetorch_cudss import _lib
from sparsetorch_cudss.plan import CudssPlan

from _cudss_helpers import gpu

pytestmark = gpu


@pytest.fixture(autouse=True)
def registered():
    backends = get_backends()
    if "cudss" not in backends.names:
        backends.register(plugin, "cudss")
    yield
    reset_backends()


def _poisson(nx: int, dtype=torch.float64, batch: int | None = None) -> st.SparseTensor:
    A = poisson2d(nx).to(dtype).cuda()
    if batch:
        scale = torch.linspace(1.0, 2.0, batch, dtype=dtype, device="cuda")[:, None]
        A = A.with_values(A.values * scale + 0.0)
    return A


def _nonsymmetric(nx: int, dtype=torch.float64) -> st.SparseTensor:
    A = poisson2d(nx).to(dtype)
    D = A.to_dense()
    D = D + torch.triu(torch.ones_like(D), 1) * (D != 0) * 0.3  # same pattern, unsymmetric values
    return st.SparseTensor.from_dense(D, CSR).cuda()


def test_library_version_and_capabilities() -> None:
    lib = _lib.load()
    assert lib.version >= (0, 8, 0)
    assert lib.transposed_solve == (lib.version >= (1, 0, 0))


@pytest.mark.parametrize("method", ["lu", "cholesky", "ldlt"])
def test_analysis_once_refactorization_after(method) -> None:
    A = _poisson(12)
    b = torch.randn(A.shape[-1], dtype=A.dtype, device="cuda")
    with st.Solver(A, backend="cudss", method=method, properties="spd") as s:
        x = s.solve(b)
        plan = s._state.plan
        assert isinstance(plan, CudssPlan) and plan.factorizations == 1 and plan.analysis_seconds > 0
        t_analysis = plan.analysis_seconds
        for scale in (2.0, 3.0):
            s.update_values(A.values * scale)
            x2 = s.solve(b)
            torch.testing.assert_close(x2, x / scale, rtol=1e-9, atol=1e-12)
        assert plan.factorizations == 3 and plan.analysis_seconds == t_analysis  # no second analysis


def test_backward_reuses_the_factorization_lu() -> None:
    A = _nonsymmetric(10)
    v = A.values.clone().requires_grad_(True)
    b = torch.randn(A.shape[-1], dtype=A.dtype, device="cuda", requires_grad=True)
    with st.Solver(A.with_values(v), backend="cudss", method="lu") as s:
        x = s.solve(b)
        plan = s._state.plan
        before = plan.factorizations
        x.square().sum().backward()
        if _lib.load().transposed_solve:
            assert plan.factorizations == before and plan._adj is None  # A^T solve from the same factors
        else:
            assert plan._adj is not None  # cuDSS 0.8: A^H factored on a second object
    D = A.to_dense().detach().requires_grad_(True)
    b2 = b.detach().clone().requires_grad_(True)
    torch.linalg.solve(D, b2).square().sum().backward()
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-8, atol=1e-10)
    coords, src = A.entries()
    torch.testing.assert_close(v.grad[src], D.grad[coords[0], coords[1]], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("method", ["lu", "cholesky"])
def test_uniform_batch_equals_member_solves(method) -> None:
    A = _poisson(8, batch=5)
    B = torch.randn(5, A.shape[-1], 3, dtype=A.dtype, device="cuda")
    X = st.solve(A, B, backend="cudss", method=method, properties="spd")
    for i in range(5):
        Ai = st.SparseTensor.from_dense(A.to_dense()[i], CSR)
        torch.testing.assert_close(X[i], torch.linalg.solve(Ai.to_dense(), B[i]), rtol=1e-9, atol=1e-11)


def test_singular_names_the_row() -> None:  # the message is printed: recorded in the H200 run
    D = poisson2d(5).to_dense().clone()
    D[7, :] = 0
    D[:, 7] = 0
    A = st.SparseTensor.from_dense(D, CSR).cuda()
    with pytest.raises(st.SingularMatrixError, match="singular") as err:
        st.solve(A, torch.ones(25, dtype=torch.float64, device="cuda"), backend="cudss", method="lu")
    print("singular message:", err.value, "row:", err.value.row)


def test_indefinite_with_cholesky_is_named() -> None:
    D = poisson2d(5).to_dense().clone()
    D[4, 4] = -10.0
    A = st.SparseTensor.from_dense(D, CSR).cuda()
    with pytest.raises(st.IndefiniteMatrixError, match="positive definite") as err:
        st.solve(A, torch.ones(25, dtype=torch.float64, device="cuda"), backend="cudss", method="cholesky",
                 properties="spd")
    print("indefinite message:", err.value)
    x = st.solve(A, torch.ones(25, dtype=torch.float64, device="cuda"), backend="cudss", method="ldlt",
                 properties="symmetric")
    torch.testing.assert_close(x, torch.linalg.solve(D.cuda(), torch.ones(25, dtype=torch.float64, device="cuda")))


def test_int64_indices_are_narrowed_once() -> None:
    A = _poisson(9).to(torch.float64)
    A64 = st.SparseTensor.from_dense(A.to_dense(), CSR.replace(index_dtype=torch.int64))
    assert A64.index_dtype == torch.int64
    b = torch.randn(81, dtype=torch.float64, device="cuda")
    x = st.solve(A64, b, backend="cudss", method="cholesky", properties="spd")
    torch.testing.assert_close(x, torch.linalg.solve(A.to_dense(), b))


def test_hybrid_memory_mode_gives_the_same_answer() -> None:
    A = _poisson(20)
    b = torch.randn(400, dtype=torch.float64, device="cuda")
    x, info = st.solve(A, b, backend="cudss", method="cholesky", properties="spd",
                       backend_options={"hybrid_memory": True}, return_info=True)
    assert "hybrid" in info.reason
    torch.testing.assert_close(x, torch.linalg.solve(A.to_dense(), b))


def test_runs_on_the_current_stream() -> None:
    A = _poisson(16)
    b = torch.randn(256, dtype=torch.float64, device="cuda")
    ref = torch.linalg.solve(A.to_dense(), b)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = st.solve(A, b * 1.0, backend="cudss", method="lu")
        y = x * 2
    s.synchronize()
    torch.testing.assert_close(y, 2 * ref)


def test_gradcheck_lu_and_cholesky() -> None:
    A = _nonsymmetric(3)
    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(9, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda vv, bb: st.solve(A.with_values(vv), bb, backend="cudss", method="lu"),
                                    (v, b), atol=1e-7)
    # Cholesky reads one triangle: check the gradient along symmetric perturbations (the values
    # are those of (M + M^T) / 2 for a dense M that gradcheck perturbs entry by entry)
    S = _poisson(3)
    coords, src = S.entries()
    M = S.to_dense().detach().clone().requires_grad_(True)

    def chol(MM, bb):
        sym = (MM + MM.mT) / 2
        vals = torch.zeros_like(S.values).index_put((src,), sym[coords[0], coords[1]])
        return st.solve(S.with_values(vals), bb, backend="cudss", method="cholesky", properties="spd")

    assert torch.autograd.gradcheck(chol, (M, b), atol=1e-7)


def test_explain_shows_analysis_and_reuse_cost() -> None:
    A = _poisson(10)
    table = st.explain("solve", A, torch.ones(100, dtype=torch.float64, device="cuda"), properties="spd")
    rows = [r for r in table.rows if r.backend == "cudss" and r.offer is not None]
    assert rows and all("analysis" in r.offer.notes for r in rows)


def test_switches_to_hybrid_when_cudss_estimate_does_not_fit(monkeypatch) -> None:
    """After the analysis the plan reads cuDSS's own peak-memory estimate; when it exceeds free
    memory (simulated here), hybrid memory mode is set and the analysis re-run: no OOM."""
    from sparsetorch_cudss import plan as plan_mod

    monkeypatch.setattr(plan_mod._Factor, "_fits", lambda self: False)
    A = _poisson(14)
    b = torch.randn(196, dtype=torch.float64, device="cuda")
    with st.Solver(A, backend="cudss", method="cholesky", properties="spd") as s:
        x = s.solve(b)
        p = s._state.plan
        assert p._fwd.switched_to_hybrid and p.hybrid
        assert p._fwd.peak_device_bytes() is not None
    torch.testing.assert_close(x, torch.linalg.solve(A.to_dense(), b))


# Non-uniform batches through cuDSS's batch API ---------------------------------------------------------
def _mixed_list(dtype=torch.float64):
    mats = [_poisson(4).to(dtype), _nonsymmetric(5).to(dtype), _poisson(3).to(dtype)]
    return st.SparseTensorList(mats)


@pytest.mark.parametrize("method", ["lu", "cholesky", "ldlt"])
def test_list_solve_matches_dense(method) -> None:
    As = _mixed_list() if method == "lu" else st.SparseTensorList([_poisson(4), _poisson(6), _poisson(3)])
    Bs = [torch.randn(a.shape[-1], k, dtype=torch.float64, device="cuda") for a, k in zip(As, (1, 3, 2))]
    Xs, infos = st.solve(As, Bs, backend="cudss", method=method, properties=None if method == "lu" else "spd",
                         return_info=True)
    assert all(i.backend == "cudss" and i.extra.get("list") for i in infos)
    for A, B, X in zip(As, Bs, Xs):
        torch.testing.assert_close(X, torch.linalg.solve(A.to_dense(), B), rtol=1e-9, atol=1e-11)


def test_list_solve_uses_one_batch_plan_and_reuses_it() -> None:
    As = _mixed_list()
    Bs = [torch.randn(a.shape[-1], dtype=torch.float64, device="cuda") for a in As]
    st.solve(As, Bs, backend="cudss", method="lu")
    from sparsetorch.backend import plan_cache

    entries = [e for e in plan_cache().entries() if e.op == "solve_list"]
    assert len(entries) == 1
    As2 = st.SparseTensorList([a.with_values(a.values * 2) for a in As])
    Xs = st.solve(As2, Bs, backend="cudss", method="lu")
    entries = [e for e in plan_cache().entries() if e.op == "solve_list"]
    assert len(entries) == 1 and entries[0].hits == 1
    for A, B, X in zip(As2, Bs, Xs):
        torch.testing.assert_close(X, torch.linalg.solve(A.to_dense(), B), rtol=1e-9, atol=1e-11)


def test_list_gradients_match_dense_autograd() -> None:
    As = _mixed_list()
    vals = [a.values.detach().clone().requires_grad_(True) for a in As]
    Bs = [torch.randn(a.shape[-1], 2, dtype=torch.float64, device="cuda", requires_grad=True) for a in As]
    Xs = st.solve(st.SparseTensorList([a.with_values(v) for a, v in zip(As, vals)]), Bs, backend="cudss", method="lu")
    sum((X * X).sum() * (i + 1) for i, X in enumerate(Xs)).backward()
    for i, (A, v, B) in enumerate(zip(As, vals, Bs)):
        D = A.to_dense().detach().requires_grad_(True)
        B2 = B.detach().clone().requires_grad_(True)
        (torch.linalg.solve(D, B2).square().sum() * (i + 1)).backward()
        coords, src = A.entries()
        torch.testing.assert_close(B.grad, B2.grad, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(v.grad[src], D.grad[coords[0], coords[1]], rtol=1e-8, atol=1e-10)


def test_list_gradcheck() -> None:
    As = st.SparseTensorList([_nonsymmetric(3), _nonsymmetric(2)])
    v0, v1 = (a.values.detach().clone().requires_grad_(True) for a in As)
    b0 = torch.randn(9, dtype=torch.float64, device="cuda", requires_grad=True)
    b1 = torch.randn(4, dtype=torch.float64, device="cuda", requires_grad=True)

    def f(x0, x1, c0, c1):
        L = st.SparseTensorList([As[0].with_values(x0), As[1].with_values(x1)])
        return tuple(st.solve(L, [c0, c1], backend="cudss", method="lu"))

    assert torch.autograd.gradcheck(f, (v0, v1, b0, b1), atol=1e-7)


def test_list_singular_member_is_named() -> None:
    D = poisson2d(3).to_dense().clone()
    D[2, :] = 0
    D[:, 2] = 0
    As = st.SparseTensorList([_poisson(3), st.SparseTensor.from_dense(D, CSR).cuda()])
    Bs = [torch.ones(9, dtype=torch.float64, device="cuda")] * 2
    with pytest.raises(st.SingularMatrixError, match="singular"):
        st.solve(As, Bs, backend="cudss", method="lu")


@pytest.mark.parametrize("host_threads", ["auto", False, 2])
def test_host_threading_layer_gives_the_same_answer(host_threads) -> None:
    """cuDSS's OpenMP layer (multithreaded analysis) when it loads; the same solution either way."""
    A = _poisson(15)
    b = torch.randn(225, dtype=torch.float64, device="cuda")
    with st.Solver(A, backend="cudss", method="cholesky", properties="spd",
                   backend_options={"host_threads": host_threads}) as s:
        x = s.solve(b)
        layer = s._state.plan._fwd.threading
    if host_threads is False:
        assert layer is None
    print("threading layer:", layer)
    torch.testing.assert_close(x, torch.linalg.solve(A.to_dense(), b))
