"""Session 31's outside sweep of the default ``st.solve``: each case failed on the tree before its fix. References:
SciPy's spsolve on the unscaled (well-conditioned) system, dense float64."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

import sparsetorch as st
from sparsetorch.errors import SingularMatrixError


def _convection_like(m: int) -> sp.csr_matrix:
    T = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    skew = sp.diags([-np.ones(m - 1), np.ones(m)], [-1, 0])
    return sp.csr_matrix(sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m)) + 0.1 * sp.kron(sp.eye(m), skew))


@pytest.mark.parametrize("seed", range(6))
def test_rows_in_other_units_are_not_called_singular(seed):
    """Rows scaled by 10^U(-8, 8) (equations in other units): the normwise condition of D A0 is ~1e16 while the
    problem is as well conditioned as A0 (Skeel's condition is invariant under row scaling). The dense LU's
    equilibrated answer had a componentwise backward error of 5.5e-12 and the call raised SingularMatrixError on
    5 of 18 cases; refinement steps judged componentwise now take it to ~u."""
    m = 10
    rng = np.random.default_rng(seed)
    A0 = _convection_like(m)
    d = 10.0 ** rng.uniform(-8, 8, m * m)
    A = sp.csr_matrix(sp.diags(d) @ A0)
    b = rng.standard_normal(m * m)
    truth = sla.spsolve(A0.tocsc(), b / d)
    x = st.solve(st.SparseTensor.from_package(A), torch.from_numpy(b))
    assert np.abs(x.numpy() - truth).max() <= 1e-12 * np.abs(truth).max()


def test_a_singular_row_scaled_matrix_still_raises():
    """The same scaling of a singular matrix (a repeated row, b outside the range) keeps its verdict."""
    m = 10
    rng = np.random.default_rng(0)
    A0 = sp.lil_matrix(_convection_like(m))
    A0[5] = A0[4]
    d = 10.0 ** rng.uniform(-8, 8, m * m)
    A = sp.csr_matrix(sp.diags(d) @ sp.csr_matrix(A0))
    b = rng.standard_normal(m * m)
    with pytest.raises(SingularMatrixError):
        st.solve(st.SparseTensor.from_package(A), torch.from_numpy(b))


def test_a_circuit_matrix_is_not_called_singular():
    """A circuit-like matrix (conductances 1e-6..1e6; condition 2.7e17 unscaled, Skeel's 1.4e5): the LU answer had
    a relative residual of 2.2e-10 (the contract's 1e-10 missed) and a normwise backward error of 1.7e-26, and every
    direct method was called singular to working precision; judged componentwise with Skeel's condition it is the
    answer. Reference: dense LAPACK in float64."""
    from pathlib import Path

    data = Path(__file__).parent / "data"
    A = sp.load_npz(data / "circuit3000_A.npz").tocsr()
    b = np.load(data / "circuit3000_b.npy")
    truth = np.linalg.solve(A.toarray(), b)
    x, info = st.solve(st.SparseTensor.from_package(A), torch.from_numpy(b), return_info=True)
    assert np.abs(x.numpy() - truth).max() <= 1e-10 * np.abs(truth).max()
    assert "componentwise backward error" in info.reason
