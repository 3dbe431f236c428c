"""SuperLU: factorization reuse, transpose/adjoint solves, singular matrices, orderings, fill model."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.format import COO, CSC, CSR
from sparsetorch.testing.problems import convection_diffusion, hermitian_pd, poisson2d, random_nonsymmetric

from sparsetorch_scipy.lu import SuperLUPlan


def _plan(A: st.SparseTensor, **backend_options) -> SuperLUPlan:
    plan = SuperLUPlan(A.detach(), {"backend_options": backend_options})
    plan.set_values(A.values)
    return plan


@pytest.mark.parametrize("fmt", [CSR, CSC, COO], ids=["CSR", "CSC", "COO"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["float64", "complex128"])
def test_solve_and_adjoint_solve_from_one_factorization(fmt, dtype) -> None:
    A = random_nonsymmetric(40, format=fmt, dtype=dtype, seed=3)
    D = A.to_dense()
    g = torch.Generator().manual_seed(1)
    B = torch.randn(40, 3, generator=g, dtype=torch.float64).to(dtype)
    plan = _plan(A)
    X, res = plan.solve(B)
    Xa, _ = plan.solve(B, adjoint=True)
    assert res.status is st.Status.DIRECT and plan.factorizations == 1
    torch.testing.assert_close(X, torch.linalg.solve(D, B))
    torch.testing.assert_close(Xa, torch.linalg.solve(D.mH, B))  # conjugate transpose for complex
    assert plan.factorizations == 1  # the adjoint reused the factors


def test_matches_scipy_directly(scipy_backend) -> None:
    A = convection_diffusion(12)
    b = torch.linspace(-1, 1, 144, dtype=torch.float64)
    x = st.solve(A, b, backend="scipy", method="lu")
    ref = spla.splu(A.to_package("scipy").tocsc()).solve(b.numpy())
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-12, atol=1e-14)


def test_value_batch_factors_each_member() -> None:
    A = poisson2d(5, 4)
    batch = A.with_values(torch.stack([A.values, 2 * A.values, A.values + 0.5]))
    plan = _plan(batch)
    assert plan.factorizations == 3
    B = torch.ones(3, 20, 2, dtype=torch.float64)
    X, _ = plan.solve(B)
    torch.testing.assert_close(X, torch.linalg.solve(batch.to_dense(), B))


def test_solver_refactors_only_on_new_values() -> None:
    from sparsetorch.backend import get_backends, reset_backends
    import sparsetorch_scipy.plugin as plugin

    get_backends().register(plugin, "scipy")
    try:
        A = convection_diffusion(8)
        D = A.to_dense()
        b = torch.ones(64, dtype=torch.float64)
        with st.Solver(A, backend="scipy", method="lu") as s:
            x1 = s.solve(b)
            s.solve(2 * b)
            plan = s._state.plan
            assert plan.factorizations == 1  # new right-hand sides: no refactorization
            s.update_values(A.values.clone())
            s.solve(b)
            assert plan.factorizations == 1  # the same numbers in another tensor: the factors are kept
            v = (2.0 * A.values).detach().clone().requires_grad_()
            s.update_values(v)
            assert plan.factorizations == 2  # new values: one numeric factorization
            x = s.solve(b)
            x.sum().backward()  # the adjoint solve reuses the same factors
            assert plan.factorizations == 2
            torch.testing.assert_close(x1, torch.linalg.solve(D, b))
            D = 2.0 * D
            torch.testing.assert_close(x, torch.linalg.solve(D, b))
            lam = torch.linalg.solve(D.T, torch.ones(64, dtype=torch.float64))
            coords, slot = A.entries()
            expect = torch.zeros_like(v)
            expect[slot] = -lam[coords[0]] * x.detach()[coords[1]]
            torch.testing.assert_close(v.grad, expect)
    finally:
        reset_backends()


@pytest.mark.parametrize("change", ["in_place", "data", "numpy_view", "with_values"])
def test_cached_plan_refactors_exactly_when_the_values_change(change, scipy_backend) -> None:
    """The one-shot solve on a cached plan: the same values again do not refactor; values changed
    in place (version counter bumped), through ``.data`` or a NumPy view (not bumped) or replaced
    do, and the answer is the new one."""
    st.plan_cache().clear()
    A = convection_diffusion(8)
    A = A.with_values(A.values.clone())
    b = torch.linspace(-1, 1, 64, dtype=torch.float64)
    x1 = st.solve(A, b, backend="scipy", method="lu")
    plan = st.plan_cache().plan(st.plan_cache().entries()[0].key).plan
    assert plan.factorizations == 1
    st.solve(A, b, backend="scipy", method="lu")
    assert plan.factorizations == 1
    if change == "in_place":
        A.values.mul_(2)
    elif change == "data":
        A.values.data.mul_(2)
    elif change == "numpy_view":
        A.values.numpy()[...] *= 2
    else:
        A = A.with_values(A.values * 2)
    x2 = st.solve(A, b, backend="scipy", method="lu")
    assert plan.factorizations == 2, change
    torch.testing.assert_close(x2, x1 / 2, rtol=1e-12, atol=1e-14)
    st.solve(A, b, backend="scipy", method="lu")
    assert plan.factorizations == 2
    st.plan_cache().clear()


def test_exactly_singular_matrix() -> None:
    D = poisson2d(4, 3).to_dense()
    D[5, :] = 0
    D[:, 5] = 0
    A = st.SparseTensor.from_dense(D)
    with pytest.raises(st.SingularMatrixError, match="exactly zero pivot"):
        _plan(A)


def test_numerically_singular_matrix_names_the_pivot() -> None:
    D = poisson2d(4, 3).to_dense()
    D[:, 7] = D[:, 2] / 3 + D[:, 4] / 7  # dependent columns: singular, but rounding leaves a tiny pivot
    A = st.SparseTensor.from_dense(D)
    # The plan calls singular only an exactly zero pivot (a small one is what badly scaled,
    # nonsingular matrices give); the core judges the answer by its residual and backward error,
    # refines, equilibrates, and then names the matrix singular to working precision.
    _plan(A, check_pivots=True)
    for kw in ({"backend": "scipy", "method": "lu"}, {}):
        with pytest.raises(st.SingularMatrixError, match="singular to working precision"):
            st.solve(A, torch.ones(12, dtype=torch.float64), **kw)


def test_ordering_follows_the_pattern() -> None:
    assert _plan(poisson2d(6)).splu_options["permc_spec"] == "MMD_AT_PLUS_A"
    assert _plan(convection_diffusion(6)).splu_options["options"]["SymmetricMode"]  # symmetric pattern
    nonsym = random_nonsymmetric(30, seed=1)
    opts = _plan(nonsym).splu_options
    assert opts["permc_spec"] == "COLAMD" and opts["diag_pivot_thresh"] == 1.0
    assert _plan(poisson2d(6), permc_spec="NATURAL").splu_options["permc_spec"] == "NATURAL"
    with pytest.raises(st.InputError, match="permc_spec"):
        _plan(poisson2d(6), permc_spec="AMD")


def test_complex_hermitian_and_float32() -> None:
    A = hermitian_pd(5, 4)
    b = torch.ones(20, dtype=torch.complex128)
    X, _ = _plan(A).solve(b[:, None])
    torch.testing.assert_close(X[:, 0], torch.linalg.solve(A.to_dense(), b))
    A32 = poisson2d(5, 4, dtype=torch.float32)
    X32, _ = _plan(A32).solve(torch.ones(20, 1))
    assert X32.dtype == torch.float32
    torch.testing.assert_close(X32[:, 0], torch.linalg.solve(A32.to_dense().double(), torch.ones(20, dtype=torch.float64)).float())


@pytest.mark.parametrize(("dim", "m"), [(2, 48), (3, 12)])
def test_fill_model_tracks_superlu(dim, m) -> None:
    """The cost model's nnz(L + U) estimate is within 1.5x of SuperLU's on Poisson."""
    from sparsetorch.backend import rates
    from sparsetorch.backend import OperandInfo, Request

    from sparsetorch_scipy import cost
    from _helpers import poisson_scipy

    S = poisson_scipy(m, dim)
    A = st.from_package(S)
    plan = _plan(A)
    n = S.shape[0]
    req = Request("solve", (OperandInfo("sparse", (n, n), torch.float64, torch.device("cpu"), format=A.format, nse=S.nnz),),
                  frozenset({"spd", "symmetric"}), {})
    est = cost.lu_estimate(rates("cpu"), req)
    assert 1 / 1.5 < est.fill / plan.factor_nnz() < 1.5, (est.fill, plan.factor_nnz())
