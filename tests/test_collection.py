"""The default ``solve(A, b)`` on matrices users bring (issue 14, item 9): a fast subset of the
collection benchmark (``benchmarks/bench_collection.py``), asserting the contract.

For every square matrix in ``tests/data`` (SuiteSparse Matrix Collection) and a few members of
each generated family (:mod:`sparsetorch.testing.families`), ``sparsetorch.solve(A, b)`` with no
options must

- return ``x`` with relative residual ``||b - A x|| / ||b|| <= max(100 x SciPy spsolve's, 1e-10)``
  in float64 / complex128 (for ``b = A x_true`` and for a random ``b``);
- return ``x`` with relative residual ``<= 1e-5`` in float32 / complex64 wherever SciPy's
  spsolve in that dtype reaches 1e-5 itself;
- raise :class:`~sparsetorch.SingularMatrixError` where SciPy reports the matrix singular, or
  where the matrix is singular by construction (a random ``b``: no solution exists);
- never raise anything else (NotConvergedError, a backend's error, an internal error).

The references are SciPy's, computed here in float64 from the same matrix; residuals are
computed here from the returned ``x``, not taken from the solver's info.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("scipy")
import scipy.io  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.testing import families as fam  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

DATA = Path(__file__).resolve().parent / "data"
CONTRACT = {np.float64: 1e-10, np.complex128: 1e-10, np.float32: 1e-5, np.complex64: 1e-5}


def _load(path: Path) -> sp.csr_matrix:
    A = sp.csr_matrix(scipy.io.mmread(str(path)))
    A = A.astype(np.complex128 if A.dtype.kind == "c" else np.float64)
    A.sum_duplicates()
    A.sort_indices()
    return A


def _square_files() -> list[Path]:
    out = []
    for p in sorted(DATA.glob("*.mtx")):
        rows, cols = scipy.io.mminfo(str(p))[:2]
        if rows == cols:
            out.append(p)
    return out


def _family_members() -> list[fam.Generated]:
    """A few members of each family, small (the full set runs in the benchmark)."""
    return [
        fam.convection_diffusion(20, 0.1, scheme="upwind", seed=1),
        fam.convection_diffusion(20, 1000.0, scheme="upwind", seed=1),
        fam.convection_diffusion(20, 1000.0, scheme="central", seed=1),
        fam.random_conditioned(300, 1e3, seed=1),
        fam.random_conditioned(300, 1e6, seed=1),
        fam.helmholtz(20, 15.0, seed=1),
        fam.graph_laplacian(500, graph="geometric", seed=1),
        fam.graph_laplacian(500, graph="powerlaw", seed=1),
        fam.badly_scaled(16, columns=False, seed=1),
        fam.badly_scaled(16, columns=True, seed=1),
        fam.near_singular(300, 1e-10, kind="nonsymmetric", seed=1),
        fam.near_singular(289, 1e-10, kind="spd", seed=1),
        fam.complex_symmetric(20, seed=1),
        fam.complex_hermitian(14, definite=False, seed=1),
        fam.complex_hermitian(14, definite=True, seed=1),
        fam.poisson(8, dim=3, seed=1),
        fam.singular(200, kind="zero_row", seed=1),
        fam.singular(200, kind="structural", seed=1),
        fam.expander(400, degree=12, seed=1),
        fam.singular(200, kind="duplicate_row", seed=1),
        fam.block_diagonal(24, 20, kind="mixed", seed=1),
        fam.block_diagonal(6, 9, kind="mesh", seed=1),
    ]


def _cases():
    cases = []
    for p in _square_files():
        cases.append(pytest.param(p.stem, None, id=p.stem))
    for g in _family_members():
        cases.append(pytest.param(g.name, g, id=g.name))
    return cases


_CACHE: dict[str, tuple[sp.csr_matrix, bool]] = {}


def _matrix(name: str, generated) -> tuple[sp.csr_matrix, bool]:
    """The matrix (float64 / complex128) and whether it is singular by construction."""
    if name not in _CACHE:
        if generated is None:
            _CACHE[name] = (_load(DATA / f"{name}.mtx"), False)
        else:
            _CACHE[name] = (generated.matrix, generated.singular)
    return _CACHE[name]


def _residual(A: sp.csr_matrix, x: np.ndarray, b: np.ndarray) -> float:
    wide = np.complex128 if np.iscomplexobj(A.data) or np.iscomplexobj(x) else np.float64
    x = np.asarray(x, dtype=wide)
    if x.shape != b.shape or not np.all(np.isfinite(x)):
        return float("inf")
    A64 = A.astype(wide)
    b64 = b.astype(wide)
    return float(np.linalg.norm(b64 - A64 @ x) / np.linalg.norm(b64))


def _scipy(A: sp.csr_matrix, b: np.ndarray) -> tuple[float, bool]:
    """SciPy spsolve's relative residual (in float64) and whether it reported the matrix singular."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = spla.spsolve(A.tocsc(), b)
    singular = any(issubclass(w.category, spla.MatrixRankWarning) for w in caught) or not np.all(np.isfinite(x))
    return (float("inf") if singular else _residual(A, x, b)), singular


def _rhs(A: sp.csr_matrix, kind: str, dtype, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = A.shape[0]
    cplx = np.iscomplexobj(A.data)
    v = rng.standard_normal(n) + (1j * rng.standard_normal(n) if cplx else 0.0)
    b = A @ v if kind == "A_x_true" else v
    return np.ascontiguousarray(b, dtype=dtype)


def _solve(A: sp.csr_matrix, b: np.ndarray):
    """sparsetorch.solve with no options; returns x as NumPy, or the exception it raised."""
    T = st.SparseTensor.from_package(A.copy())
    try:
        x = st.solve(T, torch.from_numpy(b.copy()))
    except Exception as exc:  # noqa: BLE001 - classified by the caller
        return exc
    return x.detach().cpu().numpy()


def _check(name: str, A: sp.csr_matrix, b: np.ndarray, singular_known: bool, tol: float, scipy_res: float,
           scipy_singular: bool, consistent: bool = False) -> None:
    out = _solve(A, b)
    label = f"{name} ({A.shape[0]}x{A.shape[1]}, nnz={A.nnz}, {A.dtype})"
    if scipy_singular and consistent and not isinstance(out, Exception):
        # b = A x_true on a matrix SciPy calls singular: a solution exists, and an x that meets the
        # contract's residual is a right answer (as is SingularMatrixError)
        res = _residual(A, out, b)
        assert res <= tol, f"{label}: singular (SciPy), consistent b: x returned with relative residual {res:.3e} > {tol:g}"
        return
    if scipy_singular or singular_known:
        why = "SciPy reports it singular" if scipy_singular else "it is singular by construction (b has no solution)"
        if isinstance(out, st.SingularMatrixError):
            return
        if isinstance(out, Exception):
            pytest.fail(f"{label}: {why}, so solve should raise SingularMatrixError; it raised "
                        f"{type(out).__name__}: {str(out)[:400]}")
        pytest.fail(f"{label}: {why}, so solve should raise SingularMatrixError; it returned x with relative "
                    f"residual {_residual(A, out, b):.3e}")
    if isinstance(out, Exception):
        pytest.fail(f"{label}: SciPy solves it (residual {scipy_res:.1e}); solve raised {type(out).__name__}: "
                    f"{str(out)[:400]}")
    bound = max(100 * scipy_res, tol)
    res = _residual(A, out, b)
    assert res <= bound, (f"{label}: relative residual {res:.3e} > {bound:.1e} = max(100 x SciPy's {scipy_res:.1e}, "
                          f"{tol:g})")


@pytest.mark.parametrize("rhs", ["A_x_true", "random"])
@pytest.mark.parametrize("name, generated", _cases())
def test_default_solve_double(name, generated, rhs):
    A, singular_known = _matrix(name, generated)
    if singular_known and rhs == "A_x_true":
        # a consistent system on a singular matrix: a solution exists; judged in the benchmark
        pytest.skip("consistent right-hand side on a singular matrix: not a contract case")
    dtype = np.complex128 if np.iscomplexobj(A.data) else np.float64
    b = _rhs(A, rhs, dtype)
    scipy_res, scipy_singular = _scipy(A, b)
    _check(name, A, b, singular_known, CONTRACT[dtype], scipy_res, scipy_singular, consistent=rhs == "A_x_true")


@pytest.mark.parametrize("name, generated", _cases())
def test_default_solve_single(name, generated):
    A64, singular_known = _matrix(name, generated)
    dtype = np.complex64 if np.iscomplexobj(A64.data) else np.float32
    A = A64.astype(dtype)
    kind = "random" if singular_known else "A_x_true"
    b = _rhs(A64, kind, np.complex128 if dtype == np.complex64 else np.float64).astype(dtype)
    scipy_res, scipy_singular = _scipy(A, b)
    if not (scipy_singular or singular_known) and not scipy_res <= CONTRACT[dtype]:
        pytest.skip(f"SciPy's spsolve in {np.dtype(dtype).name} reaches only {scipy_res:.1e}: no {CONTRACT[dtype]:g} "
                    f"contract to check against")
    _check(name, A, b, singular_known, CONTRACT[dtype], scipy_res, scipy_singular, consistent=kind == "A_x_true")


def test_collection_is_not_empty():
    """The contract tests above cannot pass vacuously: the data files and families are there."""
    files = _square_files()
    assert len(files) >= 15, f"tests/data holds {len(files)} square .mtx files; expected the collection's 19"
    members = _family_members()
    assert {g.family for g in members} == set(fam.FAMILIES), "every family has a member in the test"
    for g in members:
        assert g.matrix.shape[0] == g.matrix.shape[1] and g.matrix.nnz > 0
