"""The cupy Krylov plan's solve loop on the CPU: NumPy and SciPy stand in for CuPy and cupyx.

``KrylovPlan._solve_system`` is array-library code over ``cupy()``'s module, cupyx's solvers
(whose signatures follow SciPy's) and the shared true-residual loop of ``sparsetorch.backend``.
With NumPy as ``cupy()``, SciPy as ``cupyx.scipy.sparse.linalg`` and the product on a SciPy
matrix, the loop's decisions (correction solves, the GMRES restart halving and the CGS generic
start after a breakdown, CG's curvature record, maxiter, the true-residual test) run without a
GPU. The numbers are SciPy's, not cupyx's: these tests check the loop, the GPU tests the library.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from sparsetorch.backend import Status

import sparsetorch_cupy.iterative as iterative


class _Curvatures:
    """``_Curvatures`` on NumPy: a list instead of a device buffer."""

    def __init__(self, dtype) -> None:
        self._vals: list = []
        self._skip = False

    def skip_next(self) -> None:
        self._skip = True

    def add(self, v, y) -> None:
        if self._skip:
            self._skip = False
            return
        self._vals.append(np.vdot(v, y))

    def any_nonpositive(self) -> bool:
        vals, self._vals = self._vals, []
        return bool(vals) and bool((np.real(np.array(vals)) <= 0).any())


class _Matrix:
    def __init__(self, S) -> None:
        self.S = S

    def cupy_matvec(self, adjoint, member, stream):
        S = self.S.conj().T.tocsr() if adjoint else self.S
        return lambda v: S @ v.reshape(-1)


@pytest.fixture
def numpy_cupy(monkeypatch):
    """``sparsetorch_cupy.iterative`` with NumPy/SciPy in place of CuPy/cupyx (undone afterwards)."""
    for name in ("cupyx", "cupyx.scipy", "cupyx.scipy.sparse"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "cupyx.scipy.sparse.linalg", spla)
    monkeypatch.setattr(sys.modules["cupyx"], "scipy", sys.modules["cupyx.scipy"], raising=False)
    monkeypatch.setattr(sys.modules["cupyx.scipy"], "sparse", sys.modules["cupyx.scipy.sparse"], raising=False)
    monkeypatch.setattr(sys.modules["cupyx.scipy.sparse"], "linalg", spla, raising=False)
    monkeypatch.setattr(iterative, "cupy", lambda: np)
    monkeypatch.setattr(iterative, "linear_operator", lambda n, dtype, fn: spla.LinearOperator((n, n), matvec=fn, dtype=dtype))
    monkeypatch.setattr(iterative, "_Curvatures", _Curvatures)
    return iterative


def _plan(mod, S, method, *, restart=30, finite=True):
    plan = object.__new__(mod.KrylovPlan)
    plan.backend, plan.method, plan.n = "cupy", method, S.shape[0]
    plan.matrix = _Matrix(S)
    plan.matrix.dtype = torch.complex128 if S.dtype.kind == "c" else torch.float64
    plan.restart, plan.preconditioner, plan._pres, plan._finite = restart, None, [None], [finite]
    return plan


def _poisson(k: int):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    return (sp.kron(sp.identity(k), T) + sp.kron(T, sp.identity(k))).tocsr()


def _solve(mod, S, method, b, **o):
    opts = {"rtol": 1e-8, "atol": 0.0, "maxiter": None, "check_every": None, "callback": None, **o}
    with np.errstate(all="ignore"):
        return _plan(mod, S, method, restart=o.pop("restart", 30))._solve_system(0, b, False, opts, 0)


@pytest.mark.parametrize("method", ["cg", "gmres", "minres", "cgs"])
def test_converges_on_the_true_residual(numpy_cupy, method):
    S = _poisson(8)
    b = np.random.default_rng(0).standard_normal(S.shape[0])
    x, out = _solve(numpy_cupy, S, method, b)
    assert out.status is Status.CONVERGED
    # GMRES's count is derived from cupyx's products per restart cycle, which SciPy's GMRES does not match
    assert out.iterations > 0 or method == "gmres"
    assert np.linalg.norm(b - S @ x) <= 1e-8 * np.linalg.norm(b) * (1 + 1e-9)
    assert out.residual == pytest.approx(np.linalg.norm(b - S @ x) / np.linalg.norm(b))


def test_complex_minres_runs_as_the_real_system(numpy_cupy):
    rng = np.random.default_rng(1)
    R = sp.random(30, 30, density=0.1, random_state=1) + 1j * sp.random(30, 30, density=0.1, random_state=2)
    S = (R @ R.conj().T + 0.5 * sp.identity(30)).tocsr()
    b = rng.standard_normal(30) + 1j * rng.standard_normal(30)
    x, out = _solve(numpy_cupy, S, "minres", b)
    assert out.status is Status.CONVERGED and np.iscomplexobj(x)
    assert np.linalg.norm(b - S @ x) <= 1e-8 * np.linalg.norm(b) * (1 + 1e-9)


def test_maxiter_reason_and_budget(numpy_cupy):
    S = _poisson(10)
    b = np.ones(S.shape[0])
    x, out = _solve(numpy_cupy, S, "cg", b, maxiter=3)
    assert out.status is Status.MAX_ITERATIONS and out.iterations == 3
    assert out.reason.startswith("cg reached maxiter (3) with relative residual") and "rtol=1e-08" in out.reason


def test_cg_on_an_indefinite_matrix_reports_indefinite(numpy_cupy):
    S = sp.diags(np.linspace(-3.0, 5.0, 40)).tocsr()
    x, out = _solve(numpy_cupy, S, "cg", np.ones(40))
    assert out.status is Status.INDEFINITE and "v^H A v <= 0" in out.reason


def test_an_unreachable_tolerance_gives_up_with_the_advice(numpy_cupy):
    S = _poisson(6)
    x, out = _solve(numpy_cupy, S, "cg", np.ones(S.shape[0]), rtol=1e-30)
    assert out.status in (Status.MAX_ITERATIONS, Status.BREAKDOWN)
    assert ("restarts from the true residual): loosen rtol/atol or use a direct method" in out.reason
            or "made no progress" in out.reason or "reached maxiter" in out.reason)


def test_trivial_systems(numpy_cupy):
    S = _poisson(4)
    x, out = _solve(numpy_cupy, S, "gmres", np.zeros(S.shape[0]))
    assert out.status is Status.CONVERGED and out.iterations == 0 and not x.any()
    b = np.ones(S.shape[0])
    b[3] = np.nan
    x, out = _solve(numpy_cupy, S, "gmres", b)
    assert out.status is Status.NOT_FINITE and "the right-hand side hold NaN or Inf" in out.reason
