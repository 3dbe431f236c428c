"""The inverse-coefficient example (examples/inverse_coefficient.py): a few steps on small grids.

Checked against independent references: the assembled matrix against a dense matrix built
node by node from the stencil's definition, the solve against dense float64 LU, the gradient of
the loss with respect to theta against central finite differences, and the loss decreasing over
a short run. The full optimisation (thousands of steps) is the benchmark's business, not CI's.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

import sparsetorch as st

pytestmark = pytest.mark.usefixtures("single_thread")

_PATH = Path(__file__).resolve().parents[1] / "examples" / "inverse_coefficient.py"


@pytest.fixture(scope="module")
def ic():
    spec = importlib.util.spec_from_file_location("inverse_coefficient_example", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def _dense_reference(kappa: torch.Tensor) -> torch.Tensor:
    """A(kappa) built entry by entry from the definition: interior node (i, j) of an n x n grid,
    face conductivity = mean of the two nodal values, Dirichlet neighbours dropped from the
    coupling but kept in the diagonal."""
    n = kappa.shape[0]
    m, h2 = n - 2, (1.0 / (n - 1)) ** 2
    A = torch.zeros(m * m, m * m, dtype=torch.float64)
    k = kappa.tolist()
    for i in range(1, n - 1):
        for j in range(1, n - 1):
            r = (i - 1) * m + (j - 1)
            for di, dj in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                face = 0.5 * (k[i][j] + k[i + di][j + dj]) / h2
                A[r, r] += face
                ii, jj = i + di, j + dj
                if 1 <= ii <= n - 2 and 1 <= jj <= n - 2:
                    A[r, (ii - 1) * m + (jj - 1)] -= face
    return A


def _solver(ic):
    return ic.default_solver("cpu") if _has_scipy() else {}


def _has_scipy() -> bool:
    return importlib.util.find_spec("sparsetorch_scipy") is not None


def test_matrix_and_solve_match_dense_reference(ic):
    n = 7
    torch.manual_seed(0)
    kappa = 0.5 + torch.rand(n, n, dtype=torch.float64)
    grid = ic.make_grid(n)
    assert grid.unknowns == 25 and grid.A.format_shape == (25, 25)
    A = grid.A.with_values(ic.assemble_values(grid, kappa))
    ref = _dense_reference(kappa)
    torch.testing.assert_close(A.to_dense(), ref, rtol=1e-14, atol=1e-12)
    # The example's solver, with new values on the kept plan several times (the refactorization
    # path: the first factorization's ordering reused): each solve against dense LU.
    solver = st.Solver(grid.A, properties="spd", **_solver(ic))
    for scale in (1.0, 1.7, 0.3):
        vals = ic.assemble_values(grid, kappa * scale)
        solver.update_values(vals)
        u = solver.solve(grid.f)
        torch.testing.assert_close(u, torch.linalg.solve(ref * scale, grid.f), rtol=1e-12, atol=1e-14)


def test_kappa_star_and_parameterization(ic):
    ks = ic.kappa_star(5)
    assert ks.shape == (5, 5)
    x = torch.linspace(0, 1, 5, dtype=torch.float64)
    torch.testing.assert_close(ks[1, 3], 1 + 0.5 * torch.sin(2 * math.pi * x[3]) * torch.sin(2 * math.pi * x[1]))
    assert abs(torch.nn.functional.softplus(torch.tensor(ic.theta_for_kappa(1.0))).item() - 1.0) < 1e-14


def test_gradient_matches_central_differences(ic):
    """d loss / d theta from the adjoint (one transposed solve on the kept factors) against
    central differences of the loss in float64, on a 6 x 6 grid (16 unknowns, 36 parameters)."""
    torch.manual_seed(0)
    prob = ic.InverseProblem.build(6, **_solver(ic))
    theta = (prob.theta.detach() + 0.3 * torch.randn(6, 6, dtype=torch.float64)).requires_grad_(True)
    loss = prob.loss_at(theta)
    (grad,) = torch.autograd.grad(loss, theta)
    eps = 1e-6
    fd = torch.zeros_like(grad)
    with torch.no_grad():
        for idx in range(theta.numel()):
            tp, tm = theta.detach().clone(), theta.detach().clone()
            tp.view(-1)[idx] += eps
            tm.view(-1)[idx] -= eps
            fd.view(-1)[idx] = (prob.loss_at(tp) - prob.loss_at(tm)) / (2 * eps)
    assert grad.abs().max() > 0
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-9 * float(fd.abs().max()) + 1e-14)
    # The corner nodes touch no face of an interior node: only the regulariser moves them.
    kappa = torch.nn.functional.softplus(theta.detach()).requires_grad_(True)
    (greg,) = torch.autograd.grad(prob.reg * ic.smoothness(kappa), kappa)
    sig = torch.sigmoid(theta.detach())
    torch.testing.assert_close(grad[0, 0], greg[0, 0] * sig[0, 0])


def test_short_run_decreases_loss_and_error(ic):
    """A few Adam steps of the real loop on a small grid: the loss and the kappa error fall, and
    the plan is reused (one plan, one factorization per step plus the observations')."""
    rec = ic.run(12, steps=30, target=0.0, log=None, solver=_solver(ic))
    losses, errors = rec["losses"], rec["errors"]
    assert rec["steps"] == 30 and rec["steps_to_target"] is None
    assert losses[-1] < 0.1 * losses[0]
    assert errors[-1] < errors[0]
    assert all(math.isfinite(v) for v in losses + errors)


def test_step_reuses_one_plan(ic):
    prob = ic.InverseProblem.build(10, **_solver(ic))
    plan = prob.solver._state.plan
    for _ in range(3):
        prob.step()
    assert prob.solver._state.plan is plan
    if hasattr(plan, "factorizations"):
        assert plan.factorizations == 4  # observations + one per step: the backward refactors nothing


def test_main_cli_small(ic, capsys):
    rec = ic.main(["--n", "8", "--steps", "3", "--target", "0"])
    out = capsys.readouterr().out
    assert "[done]" in out and rec["steps"] == 3
