"""PyAMG: as a preconditioner (fewer CG iterations) and as the solver (smoothed aggregation and
Ruge-Stuben), hierarchy reuse, dtypes, indefinite detection."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.testing.problems import hermitian_pd, poisson2d, symmetric_indefinite

from sparsetorch_scipy.amg import AMGPlan
from sparsetorch_scipy.iterative import KrylovPlan

CALL = {"rtol": 1e-8, "atol": 0.0, "maxiter": None, "callback": None, "check_every": None}


def test_amg_preconditioned_cg_needs_far_fewer_iterations() -> None:
    A = poisson2d(48)
    b = torch.ones(48 * 48, 1, dtype=torch.float64)
    plans = {}
    for pre in (None, "amg"):
        plan = KrylovPlan(A.detach(), "cg", {"preconditioner": pre})
        plan.set_values(A.values)
        plan.call_options = CALL
        plans[pre] = plan.solve(b)
    (x0, plain), (x1, amg) = plans[None], plans["amg"]
    assert plain.converged and amg.converged
    assert amg.iterations * 5 < plain.iterations, (amg.iterations, plain.iterations)
    torch.testing.assert_close(x1, x0, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ["smoothed_aggregation", "ruge_stuben"])
def test_amg_solver_converges_in_few_cycles(kind) -> None:
    A = poisson2d(40)
    D = A.to_dense()
    b = torch.linspace(-1, 1, 1600, dtype=torch.float64)[:, None]
    plan = AMGPlan(A.detach(), {"backend_options": {"amg": kind}})
    plan.set_values(A.values)
    plan.call_options = CALL
    X, res = plan.solve(b)
    assert res.converged and res.iterations <= 30, res
    rel = float(torch.linalg.vector_norm(b - D @ X) / torch.linalg.vector_norm(b))
    assert rel <= 1e-8 and res.history and res.history[-1] <= 1e-8


def test_hierarchy_built_once_per_value_set() -> None:
    A = poisson2d(10)
    plan = AMGPlan(A.detach(), {})
    plan.set_values(A.values)
    plan.call_options = CALL
    for _ in range(3):
        plan.solve(torch.ones(100, 2, dtype=torch.float64))
    assert plan.setups == 1
    plan.set_values(2 * A.values)
    assert plan.setups == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128], ids=["float32", "complex128"])
def test_amg_dtypes(dtype) -> None:
    A = hermitian_pd(8, 8) if dtype.is_complex else poisson2d(8, dtype=dtype)
    b = torch.ones(64, 1, dtype=dtype)
    plan = AMGPlan(A.detach(), {})
    plan.set_values(A.values)
    plan.call_options = {**CALL, "rtol": 1e-5}
    X, res = plan.solve(b)
    assert res.converged and X.dtype == dtype
    ref = torch.linalg.solve(A.to_dense().to(torch.complex128 if dtype.is_complex else torch.float64), b.to(X.dtype).to(torch.complex128 if dtype.is_complex else torch.float64))
    torch.testing.assert_close(X.to(ref.dtype), ref, rtol=1e-4, atol=1e-5)


def test_amg_on_indefinite_matrix_says_so(scipy_backend) -> None:
    A = symmetric_indefinite(6, 5)
    with pytest.raises(st.IndefiniteMatrixError, match="positive definite"):
        st.solve(A, torch.ones(30, dtype=torch.float64), backend="scipy", method="amg", properties="spd")


def test_auto_dispatch_uses_amg_cg_on_a_large_2d_poisson(scipy_backend) -> None:
    """With the default rates, 2-D Poisson 256² goes to CG + AMG (measured fastest there)."""
    from _helpers import poisson_scipy

    A = st.from_package(poisson_scipy(256, 2))
    b = torch.ones(A.shape[0], dtype=torch.float64)
    chosen = st.explain("solve", A, b).chosen
    assert (chosen.backend, chosen.method, chosen.offer.preconditioner) == ("scipy", "cg", "amg")
