"""Session 29's outside sweep, items 3 and 5.

3. slogdet / logdet of a numerically singular matrix (two equal rows; a Neumann Laplacian whose rows sum to
   zero): its LU / LDL^T ends with a rounding-level pivot, not an exact zero, and gave a finite log|det| whose
   sign depended on the backend. Now (0, -inf) (logdet -inf, as torch.logdet), decided as solve decides
   "singular to working precision"; nonsingular matrices of condition 1e12 keep their value (against
   numpy.linalg.slogdet in float64); the gradient at a singular matrix raises SingularMatrixError.
5. SingularMatrixError.row of the Eigen LU was Eigen's 1-based index in its fill-reducing order ("zero pivot at
   column 1600" for n = 1600, the zero column being 7): now the user's 0-based index, or None.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st

pytest.importorskip("sparsetorch_eigen")


def _lap2d(m: int) -> sp.csr_matrix:
    L = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    I = sp.identity(m)
    return sp.csr_matrix(sp.kron(I, L) + sp.kron(L, I))


def _two_equal_rows(m: int = 40) -> sp.csr_matrix:
    A = _lap2d(m).tolil()
    A[8, :] = A[9, :]
    return sp.csr_matrix(A)


def _neumann(m: int) -> sp.csr_matrix:
    e = np.ones(m)
    L = sp.diags([-e[:-1], 2 * e, -e[:-1]], [-1, 0, 1]).tolil()
    L[0, 0] = L[-1, -1] = 1.0
    I = sp.identity(m)
    return sp.csr_matrix(sp.kron(I, L) + sp.kron(L, I))


def _assert_singular(sign, logabs):
    assert float(sign) == 0.0 and float(logabs) == -np.inf, (sign, logabs)


@pytest.mark.parametrize("how", [{}, {"backend": "eigen", "method": "lu"}, {"backend": "scipy", "method": "lu"},
                                 {"method": "dense"}])
def test_two_equal_rows_give_sign_zero_and_minus_inf_on_every_backend(how):
    if how.get("backend") == "scipy":
        pytest.importorskip("sparsetorch_scipy")
    A = _two_equal_rows()
    assert np.linalg.slogdet(A.toarray())[1] == -np.inf
    S = st.from_package(A)
    _assert_singular(*st.slogdet(S, **how))
    assert float(st.logdet(S, **how)) == -np.inf  # torch.logdet's convention: -inf for det 0, nan for det < 0
    assert float(st.det(S, **how)) == 0.0


def test_solve_and_slogdet_agree_on_the_singular_matrix():
    S = st.from_package(_two_equal_rows())
    b = torch.randn(1600, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(st.SingularMatrixError):
        st.solve(S, b)
    _assert_singular(*st.slogdet(S))


def test_singular_neumann_laplacian_is_singular_not_taken_from_ldlt_pivots():
    S = st.from_package(_neumann(40))
    sign, logabs, info = st.slogdet(S, return_info=True)
    _assert_singular(sign, logabs)
    assert float(st.logdet(S)) == -np.inf
    # a pinned LDL^T (no pivoting) cannot prove singularity: it raises and names the LU
    with pytest.raises(st.BackendError, match="method='lu'"):
        st.slogdet(S, method="ldlt")
    _assert_singular(*st.slogdet(S, method="lu"))


def test_singular_at_ten_thousand_unknowns():
    A = _two_equal_rows(100)
    _assert_singular(*st.slogdet(st.from_package(A)))
    _assert_singular(*st.slogdet(st.from_package(_neumann(100))))


def _ill_conditioned(n: int, eps: float, nonsymmetric: bool) -> sp.csr_matrix:
    """A 1-D Neumann Laplacian (null vector ones) plus eps I, with an upwind convection term (rows summing to
    zero, so ones stays an approximate null vector) when ``nonsymmetric``: condition ~ 1 / eps."""
    e = np.ones(n)
    L = sp.diags([-e[:-1], 2 * e, -e[:-1]], [-1, 0, 1]).tolil()
    L[0, 0] = L[-1, -1] = 1.0
    A = sp.csr_matrix(L) + eps * sp.identity(n)
    if nonsymmetric:
        C = sp.diags([-e[:-1], e], [-1, 0]).tolil()
        C[0, 0] = 0.0
        A = A + 0.5 * sp.csr_matrix(C)
    return sp.csr_matrix(A)


@pytest.mark.parametrize("nonsymmetric", [False, True])
@pytest.mark.parametrize("how", [{}, {"method": "lu"}, {"method": "dense"}])
def test_nonsingular_matrices_of_condition_1e12_keep_their_value(nonsymmetric, how):
    A = _ill_conditioned(200, 2.5e-11 if nonsymmetric else 1e-12, nonsymmetric)
    D = A.toarray()
    assert 1e11 < np.linalg.cond(D) < 1e13
    ref_sign, ref_log = np.linalg.slogdet(D)
    sign, logabs = st.slogdet(st.from_package(A), **how)
    assert float(sign) == ref_sign and np.isfinite(float(logabs))
    np.testing.assert_allclose(float(logabs), ref_log, rtol=0, atol=1e-3)


def test_gradient_at_a_singular_matrix_raises():
    S = st.from_package(_two_equal_rows())
    v = S.values.clone().requires_grad_(True)
    sign, logabs = st.slogdet(S.with_values(v))
    assert float(sign) == 0.0
    with pytest.raises(st.SingularMatrixError, match="singular"):
        logabs.backward()
    v2 = S.values.clone().requires_grad_(True)
    with pytest.raises(st.SingularMatrixError, match="singular"):
        st.logdet(S.with_values(v2)).backward()


def test_value_batch_with_one_numerically_singular_member():
    S = st.from_package(_two_equal_rows(40))  # the rounding-level pivot, not an exact zero (as at m = 12)
    coords, slot = S.entries()
    v1 = S.values.clone()
    v1[slot[(coords[0] == 8) & (coords[1] == 9)]] *= 1.5  # rows 8 and 9 no longer equal: nonsingular
    sign, logabs = st.slogdet(S.with_values(torch.stack([S.values, v1])))
    assert float(sign[0]) == 0.0 and float(logabs[0]) == -np.inf
    D = torch.zeros(1600, 1600, dtype=torch.float64)
    D[coords[0], coords[1]] = v1[slot]
    ref_sign, ref_log = np.linalg.slogdet(D.numpy())
    assert ref_sign != 0 and float(sign[1]) == ref_sign
    np.testing.assert_allclose(float(logabs[1]), ref_log, rtol=1e-10)


# ---- item 5: SingularMatrixError.row is the user's 0-based index (or None), never Eigen's permuted 1-based one


def _zero_column(m: int, col: int, fmt: str) -> sp.spmatrix:
    A = _lap2d(m)
    A.data[A.indices == col] = 0.0
    return A.tocsc() if fmt == "csc" else A


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_singular_error_row_is_the_users_index_or_none(fmt):
    A = _zero_column(40, 7, fmt)
    n = A.shape[0]
    S = st.from_package(A)
    for how in ({}, {"backend": "eigen", "method": "lu"}):
        with pytest.raises(st.SingularMatrixError) as ei:
            st.solve(S, torch.ones(n, dtype=torch.float64), **how)
        e = ei.value
        assert e.row is None or e.row == 7, (e.row, str(e))
        assert str(n) not in str(e).replace(f"n = {n}", "").replace(f"n={n}", ""), str(e)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_singular_error_of_a_batch_member_names_the_member_and_its_own_index(fmt):
    m = 10
    A = _lap2d(m)
    A = A.tocsc() if fmt == "csc" else A
    S = st.from_package(A)
    vals = torch.stack([S.values, S.values.clone()])
    coords, slot = S.entries()
    zero = (coords[0] == 5) if fmt == "csr" else (coords[1] == 5)  # row 5 (csr) / column 5 (csc) of member 1
    vals[1, slot[zero]] = 0.0
    B = S.with_values(vals)
    with pytest.raises(st.SingularMatrixError) as ei:
        st.solve(B, torch.ones(2, m * m, dtype=torch.float64), backend="eigen", method="lu")
    e = ei.value
    assert e.row is None or e.row == 5, (e.row, str(e))
    assert "45" not in str(e) and "member 1" in str(e), str(e)


def test_plan_level_zero_pivot_index_is_in_range():
    """The Eigen plan itself (no route around it): its error's row is a valid 0-based index or None."""
    from sparsetorch_eigen.direct import DirectPlan

    for fmt in ("csr", "csc"):
        A = _zero_column(12, 7, fmt)
        S = st.from_package(A)
        plan = DirectPlan(S, "lu", {}, op="solve")
        with pytest.raises(st.SingularMatrixError) as ei:
            plan.set_values(S.values)
        row = ei.value.row
        assert row is None or 0 <= row < 144, row
        if fmt == "csc":
            assert row == 7, (row, str(ei.value))
