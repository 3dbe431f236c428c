"""How the checked solve route gets to its answer cheaply (issue 14): an empty row or column is a
singular verdict without a second factorization, unit-valued graph matrices skip LDL^T without
pivoting, and badly scaled matrices are factored equilibrated first.

References: dense float64 NumPy/torch solves and SciPy's spsolve."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.ops.properties import detect
from sparsetorch.testing import families

DT = torch.float64


def _relres(M: sp.spmatrix, x: torch.Tensor, b: np.ndarray) -> float:
    x = x.numpy()
    return float(np.linalg.norm(b - M @ x) / np.linalg.norm(b))


def _random_system(n: int = 120, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    B = sp.random(n, n, density=5 / n, random_state=rng, format="csr")
    return sp.csr_matrix(B + sp.diags(np.abs(B).sum(axis=1).A.ravel() + 1.0))


# --- an empty row or column ------------------------------------------------------------------------
def test_empty_row_with_nonzero_rhs_names_the_row():
    M = _random_system().tolil()
    M.rows[17], M.data[17] = [], []
    M = sp.csr_matrix(M)
    b = np.ones(M.shape[0])
    with pytest.raises(st.SingularMatrixError, match=r"row 17 of A has no nonzero entry.*no solution") as info:
        st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b))
    assert info.value.row == 17


def test_empty_row_with_zero_rhs_entry_still_gets_a_solution():
    """b in the range (b_17 = 0 for the empty row 17): a solution, checked by its residual."""
    M = _random_system(seed=1).tolil()
    M.rows[17], M.data[17] = [], []
    M = sp.csr_matrix(M)
    b = M @ np.linspace(1.0, 2.0, M.shape[0])
    assert b[17] == 0
    x, info = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b), return_info=True)
    assert _relres(M, x, b) <= 1e-10 and info.converged


def test_empty_column_is_singular_with_one_factorization_verdict():
    M = _random_system(seed=2).tocsc().tolil().T.tolil()  # build by rows of the transpose
    M.rows[5], M.data[5] = [], []
    M = sp.csr_matrix(M.T)  # column 5 of M is empty
    assert M[:, 5].nnz == 0
    with pytest.raises(st.SingularMatrixError):
        st.solve(st.SparseTensor.from_package(M), torch.ones(M.shape[0], dtype=DT))


def test_empty_row_of_the_adjoint_system_is_a_column():
    M = _random_system(seed=3).tolil()
    M.rows[9], M.data[9] = [], []
    M = sp.csr_matrix(M)
    A = st.SparseTensor.from_package(M)
    # A^T x = b: the empty row 9 of A is an empty column of A^T; b with every entry nonzero is
    # still solvable in that direction only if it lies in the range, which a generic b does not
    with pytest.raises(st.SingularMatrixError):
        st.solve(A.T, torch.ones(M.shape[0], dtype=DT))


# --- unit-valued graph matrices ----------------------------------------------------------------------
def _unit_graph(m: int = 12) -> sp.csr_matrix:
    """A 2-D mesh graph with unit weights and unit diagonal (symmetric, indefinite, nonsingular
    for this size): every edge is a singular 2x2 principal minor."""
    T = sp.diags([1.0, 1.0], [-1, 1], shape=(m, m))
    Adj = sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m))
    return sp.csr_matrix(Adj + 0.5 * sp.eye(m * m) + 0.5 * sp.eye(m * m))


def test_unit_valued_graph_is_tagged_and_skips_ldlt():
    M = _unit_graph()
    A = st.SparseTensor.from_package(M)
    tags = detect(A)
    assert "symmetric" in tags and "zero_minor" in tags and "spd" not in tags
    b = M @ np.ones(M.shape[0])
    x, info = st.solve(A, torch.from_numpy(b), return_info=True)
    assert _relres(M, x, b) <= 1e-10
    assert [a.method for a in info.attempts] == [info.method] and info.method != "ldlt"


def test_real_valued_symmetric_indefinite_is_not_tagged():
    g = families.helmholtz(12, 20.0)
    assert "zero_minor" not in detect(st.SparseTensor.from_package(g.matrix))


def test_pinned_ldlt_is_still_tried_on_a_zero_minor_matrix():
    pytest.importorskip("sparsetorch_eigen")
    M = _unit_graph()
    with pytest.raises(st.SingularMatrixError):
        st.solve(st.SparseTensor.from_package(M), torch.ones(M.shape[0], dtype=DT), backend="eigen", method="ldlt")


# --- equilibrated first --------------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [False, True], ids=["rows", "rows+cols"])
def test_badly_scaled_matrix_is_factored_once_equilibrated(columns):
    g = families.badly_scaled(20, columns=columns)
    M = g.matrix
    rng = np.random.default_rng(0)
    b = M @ rng.standard_normal(M.shape[0])
    ref = sp.linalg.spsolve(M.tocsc(), b)
    ref_res = float(np.linalg.norm(b - M @ ref) / np.linalg.norm(b))
    x = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b))  # the default route
    assert _relres(M, x, b) <= max(100 * ref_res, 1e-10)
    x, info = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b), method="lu", return_info=True)
    assert _relres(M, x, b) <= max(100 * ref_res, 1e-10)
    # one attempt, equilibrated from the start (not an unscaled LU judged inaccurate, then another)
    assert len(info.attempts) == 1 and "equilibrated (badly scaled)" in info.attempts[0].reason


def test_equilibrated_answer_gradients_match_dense():
    g = families.badly_scaled(6, columns=True)
    D = torch.from_numpy(g.matrix.toarray())
    A = st.SparseTensor.from_package(g.matrix)
    b = torch.randn(D.shape[0], dtype=DT, generator=torch.Generator().manual_seed(0), requires_grad=True)
    vals = A.values.clone().requires_grad_(True)
    x = st.solve(A.with_values(vals), b, method="lu")
    gx = torch.randn_like(x)
    (x * gx).sum().backward()
    xr = torch.linalg.solve(D, b.detach())
    torch.testing.assert_close(x.detach(), xr, rtol=1e-8, atol=0)
    # adjoint: db = A^-T gx
    torch.testing.assert_close(b.grad, torch.linalg.solve(D.T, gx), rtol=1e-7, atol=0)


def test_one_unknown_constrained_twice_inconsistently_is_named():
    g = families.singular(120, kind="structural", seed=3)
    M = g.matrix
    b = np.random.default_rng(0).standard_normal(M.shape[0])
    with pytest.raises(st.SingularMatrixError, match=r"each hold a single entry, both in unknown \d+.*no solution"):
        st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b))


def test_one_unknown_constrained_twice_consistently_gets_a_solution():
    g = families.singular(120, kind="structural", seed=3)
    M = g.matrix
    b = M @ np.random.default_rng(1).standard_normal(M.shape[0])
    x = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b))
    assert _relres(M, x, b) <= 1e-10


@pytest.mark.parametrize("kind", ["zero_row", "structural", "duplicate_row"])
def test_singular_families_raise_or_solve_like_scipy(kind):
    """Random b: a named error; b = A x: a solution (SciPy's spsolve warns "exactly singular")."""
    g = families.singular(150, kind=kind, seed=5)
    M = g.matrix
    with pytest.raises(st.SingularMatrixError):
        st.solve(st.SparseTensor.from_package(M), torch.from_numpy(np.random.default_rng(2).standard_normal(150)))
    b = M @ np.linspace(-1.0, 1.0, 150)
    x = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b))
    assert _relres(M, x, b) <= 1e-10


# --- an unused unknown in a large matrix (no stored diagonal entry to shift) ---------------------------
def test_unused_unknown_without_diagonal_entry_is_solved_in_the_range_past_the_dense_size():
    n = 700  # above the dense in-range search's size: the LU of A + delta I on A's pattern plus the diagonal
    M = _random_system(n, seed=4).tolil()
    M.rows[333], M.data[333] = [], []
    M = sp.csr_matrix(M)
    M = sp.csr_matrix(M.multiply(np.arange(n) != 333)).tolil()  # and column 333
    M = sp.csr_matrix(M)
    M.eliminate_zeros()
    assert M[333].nnz == 0 and M[:, 333].nnz == 0 and M.diagonal()[333] == 0
    xt = np.random.default_rng(5).standard_normal(n)
    xt[333] = 0.0
    b = M @ xt  # b[333] = 0: consistent
    x, info = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b), return_info=True)
    assert _relres(M, x, b) <= 1e-10
    assert "diagonal added" in info.reason
    keep = np.arange(n) != 333  # the solution is unique off the unused unknown
    np.testing.assert_allclose(x.numpy()[keep], xt[keep], rtol=1e-8, atol=1e-10)
    b2 = b.copy()
    b2[333] = 1.0
    with pytest.raises(st.SingularMatrixError, match="row 333 of A has no nonzero entry"):
        st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b2))


def test_empty_row_found_before_any_factorization():
    M = _random_system(200, seed=6).tolil()
    M.rows[50], M.data[50] = [], []
    M = sp.csr_matrix(M)
    xt = np.random.default_rng(7).standard_normal(200)
    b = M @ xt  # b[50] = 0: the empty equation reads 0 = 0
    x, info = st.solve(st.SparseTensor.from_package(M), torch.from_numpy(b), return_info=True)
    assert _relres(M, x, b) <= 1e-10
    assert not any(not a.succeeded for a in info.attempts), info.attempts  # no factorization failed first
    assert "row 50 of A has no nonzero entry" in info.reason


def test_gradient_of_a_solve_with_an_empty_row_is_refused_by_name():
    M = _random_system(60, seed=8).tolil()
    M.rows[5], M.data[5] = [], []
    M = sp.csr_matrix(M)
    b = torch.from_numpy(M @ np.random.default_rng(9).standard_normal(60)).requires_grad_(True)
    x = st.solve(st.SparseTensor.from_package(M), b)  # b in the range: a solution
    assert _relres(M, x.detach(), b.detach().numpy()) <= 1e-10
    with pytest.raises(st.SingularMatrixError, match="gradient of a solve with it is not defined"):
        x.sum().backward()
