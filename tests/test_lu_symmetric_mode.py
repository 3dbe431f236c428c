"""Sparse LU's symmetric mode (a symmetric ordering, pivots on the diagonal) is chosen from the
pattern and confirmed by the first values: a diagonal that fails the pivot threshold against its
row or column (convection-dominated transport) switches the plan to COLAMD with partial pivoting
(session 19: SuperLU in symmetric mode took 28.8 s, COLAMD 0.58 s, on 8000 unknowns)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.backend import SYMMETRIC_MODE_WEAK_MAX, weak_diagonal_fraction


def _convection_diffusion_3d(m: int, conv: float) -> sp.csr_matrix:
    h = 1 / (m + 1)
    E = sp.identity(m)
    T = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    D = sp.diags([-np.ones(m - 1), np.ones(m - 1)], [-1, 1]) / (2 * h)
    L = (sp.kron(sp.kron(T, E), E) + sp.kron(sp.kron(E, T), E) + sp.kron(sp.kron(E, E), T)) / h**2
    return (L + conv * sp.kron(sp.kron(E, E), D) + 0.3 * conv * sp.kron(sp.kron(D, E), E)).tocsr()


def test_weak_diagonal_fraction():
    strong, weak = _convection_diffusion_3d(6, 10.0), _convection_diffusion_3d(6, 1e4)
    for A, want in ((strong, 0.0), (weak, 1.0)):
        for M in (A.tocsr(), A.tocsc()):  # either major
            got = weak_diagonal_fraction(M.indptr, M.indices, M.data, M.shape[0])
            assert got == want
    # one weak column among 100: a share of 1 %
    D = np.eye(100) * 4 + np.diag(np.ones(99), 1) + np.diag(np.ones(99), -1)
    D[7, 7], D[8, 7] = 0.01, 1.0
    M = sp.csr_matrix(D)
    assert weak_diagonal_fraction(M.indptr, M.indices, M.data, 100) == pytest.approx(0.01)
    assert 0.01 <= SYMMETRIC_MODE_WEAK_MAX


def _plugin(name):
    return pytest.mark.skipif(importlib.util.find_spec(name) is None, reason=f"{name} is not installed")


@pytest.mark.parametrize("backend", [pytest.param("scipy", marks=_plugin("sparsetorch_scipy")),
                                     pytest.param("eigen", marks=_plugin("sparsetorch_eigen"))])
@pytest.mark.parametrize("conv, symmetric", [(10.0, True), (1e4, False)])
def test_first_values_confirm_or_switch_the_mode(backend, conv, symmetric):
    A = _convection_diffusion_3d(8, conv)
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    s = st.Solver(st.from_package(A), backend=backend, method="lu")
    x = s.solve(torch.from_numpy(b)).numpy()
    assert np.linalg.norm(b - A @ x) <= 1e-13 * np.linalg.norm(b)
    plan = s._state.plan
    mode = plan.splu_options["options"]["SymmetricMode"] if backend == "scipy" else plan.settings["symmetric_mode"]
    assert mode == symmetric
    # a second value set on the same plan keeps the decision and the answers stay exact
    A2 = A.copy()
    A2.data = A2.data * 1.5
    x2 = s.update_values(st.from_package(A2).values).solve(torch.from_numpy(b)).numpy()
    assert np.linalg.norm(b - A2 @ x2) <= 1e-13 * np.linalg.norm(b)
    plan = s._state.plan
    assert (plan.splu_options["options"]["SymmetricMode"] if backend == "scipy" else plan.settings["symmetric_mode"]) == symmetric


@pytest.mark.parametrize("backend, bo", [pytest.param("scipy", {"permc_spec": "MMD_AT_PLUS_A"}, marks=_plugin("sparsetorch_scipy")),
                                         pytest.param("eigen", {"ordering": "amd"}, marks=_plugin("sparsetorch_eigen"))])
def test_an_explicit_ordering_is_kept(backend, bo):
    A = _convection_diffusion_3d(5, 1e4)
    s = st.Solver(st.from_package(A), backend=backend, method="lu", backend_options=bo)
    s.solve(torch.ones(A.shape[0], dtype=torch.float64))
    plan = s._state.plan
    mode = plan.splu_options["options"]["SymmetricMode"] if backend == "scipy" else plan.settings["symmetric_mode"]
    assert mode
