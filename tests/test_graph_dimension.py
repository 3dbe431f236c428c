"""The growth dimension of a pattern's graph (``ops/_graph.py``) and what dispatch does with it
(issue 14): direct solvers' fill estimates follow a matrix without small separators (an
expander: Gset's G51, random sparse patterns) instead of the mesh model, so the default solve
of such a matrix takes a dense LU where a sparse one would take several times longer.

References are independent: SciPy's SuperLU factor sizes (``splu``), dense NumPy solves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("scipy")
import scipy.io  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.backend import fill_dimension, lu_fill_flops, sparsity_dimension  # noqa: E402
from sparsetorch.dispatch.helpers import EXPANDER_FROM  # noqa: E402
from sparsetorch.dispatch.records import make_request  # noqa: E402
from sparsetorch.ops._graph import MIN_SIZE, graph_dimension  # noqa: E402
from sparsetorch.ops._inputs import describe_factored  # noqa: E402
from sparsetorch.testing import families as fam  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


def _mtx(name: str) -> sp.csr_matrix:
    return sp.csr_matrix(scipy.io.mmread(str(DATA / f"{name}.mtx"))).astype(np.float64)


def _tensor(M: sp.spmatrix) -> st.SparseTensor:
    return st.SparseTensor.from_package(sp.csr_matrix(M).copy())


def _superlu_fill(M: sp.spmatrix) -> int:
    lu = spla.splu(sp.csc_matrix(M), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                   options={"SymmetricMode": True})
    return int(lu.L.nnz + lu.U.nnz)


@pytest.mark.parametrize("M", [fam.poisson(40).matrix, fam.poisson(12, dim=3).matrix,
                               fam.convection_diffusion(30, 10.0).matrix, fam.helmholtz(30).matrix],
                         ids=["poisson2d", "poisson3d", "convdiff", "helmholtz"])
def test_meshes_are_not_expanders(M):
    g = graph_dimension(_tensor(M))
    assert g is None or g < 2.6


@pytest.mark.parametrize("gen", [lambda: fam.expander(1000, degree=12, seed=1), lambda: fam.expander(600, degree=20, seed=2),
                                 lambda: fam.random_conditioned(500)], ids=["expander12", "expander20", "randcond"])
def test_random_graphs_are_expanders(gen):
    g = graph_dimension(_tensor(gen().matrix))
    assert g is not None and g > EXPANDER_FROM + 0.3


def test_g51_and_lp_basis():
    """G51 (a random graph) is priced as an expander; bp_1200 (an LP basis: small diameter through
    hub rows, yet cheap factors) is not."""
    g51 = graph_dimension(_tensor(_mtx("G51")))
    assert g51 is not None and g51 > EXPANDER_FROM
    bp = graph_dimension(_tensor(_mtx("bp_1200")))
    assert bp is None or bp < EXPANDER_FROM


def test_small_sparse_and_cached():
    small = _tensor(fam.expander(MIN_SIZE - 1, degree=12).matrix)
    assert graph_dimension(small) is None  # below MIN_SIZE: not measured
    path = _tensor(sp.diags([np.ones(999), 4 * np.ones(1000), np.ones(999)], [-1, 0, 1]))
    assert graph_dimension(path) is None  # 3 per row: below MIN_PER_ROW
    A = _tensor(fam.expander(800, degree=12).matrix)
    g = graph_dimension(A)
    assert A._cache[("graph", "dimension")][0] == g
    # a copy in fresh buffers (the same pattern by content) gets the same answer
    assert graph_dimension(_tensor(fam.expander(800, degree=12).matrix)) == g


def _request(A: st.SparseTensor, **options) -> object:
    return make_request("solve", (describe_factored(A),), frozenset({"symmetric"}), options)


def test_fill_dimension_and_estimate_against_superlu():
    """The shared fill tables at the fill dimension land within 3x of SuperLU's factor size on an
    expander (the mesh reading alone was ~10x low), and where the graph is a mesh the fill
    dimension is the nonzeros-per-row one."""
    gen = fam.expander(1200, degree=12, seed=3)
    A = _tensor(gen.matrix)
    req = _request(A)
    assert fill_dimension(req) == pytest.approx(4.0)
    fill, _ = lu_fill_flops(req, symmetric_ordering=True)
    actual = _superlu_fill(gen.matrix)
    assert actual / 3 <= fill <= actual * 3
    assert fill <= 1200 ** 2
    # the user's dimension still overrides
    assert fill_dimension(_request(A, backend_options={"dimension": 2})) == 2.0
    mesh = _tensor(fam.poisson(40).matrix)
    mreq = _request(mesh)
    assert fill_dimension(mreq) == sparsity_dimension(mreq)
    mfill, _ = lu_fill_flops(mreq, symmetric_ordering=True)
    assert _superlu_fill(fam.poisson(40).matrix) / 2 <= mfill <= _superlu_fill(fam.poisson(40).matrix) * 2


def test_default_solve_of_an_expander_takes_a_dense_lu():
    """A 1000-unknown random graph: explain ranks the dense LU above every sparse factorization
    (a sparse LU would store ~0.6 n^2 entries at a far lower rate than a dense LU's), and the
    default solve returns the answer to the contract's accuracy (dense NumPy reference)."""
    gen = fam.expander(1000, degree=12, seed=4)
    A = _tensor(gen.matrix)
    rng = np.random.default_rng(0)
    b = torch.from_numpy(gen.matrix @ rng.standard_normal(1000))
    ex = st.explain("solve", A, b, backend=None)
    ranked = [(r.offer.backend, r.offer.method) for r in ex.offers if r.offer is not None]
    sparse_direct = [i for i, (_, m) in enumerate(ranked) if m in ("lu", "ldlt", "qr") and ranked[i][0] != "torch"]
    dense = ranked.index(("torch", "lu"))
    assert all(dense < i for i in sparse_direct), ranked
    x, info = st.solve(A, b, return_info=True)
    ref = np.linalg.solve(gen.matrix.toarray(), b.numpy())
    res = np.linalg.norm(gen.matrix @ x.numpy() - b.numpy()) / np.linalg.norm(b.numpy())
    assert res <= 1e-10
    assert np.linalg.norm(x.numpy() - ref) <= 1e-6 * np.linalg.norm(ref)
    assert info.backend == "torch" and info.method == "lu", info.attempts


def test_storage_order_and_symmetry_hint_do_not_change_the_measure():
    """Entries in any order (a shuffled COO) and the symmetric-pattern shortcut give the CSR
    answer; a nonsymmetric pattern is searched as its symmetrization."""
    M = fam.expander(700, degree=12, seed=5).matrix
    csr = graph_dimension(_tensor(M))
    C = sp.coo_matrix(M)
    perm = np.random.default_rng(1).permutation(C.nnz)
    coo = st.SparseTensor.from_package(sp.coo_matrix((C.data[perm], (C.row[perm], C.col[perm])), shape=C.shape))
    assert graph_dimension(coo) == pytest.approx(csr)
    hinted = _tensor(M)
    assert graph_dimension(hinted, symmetric=True) == pytest.approx(csr)
    upper = _tensor(sp.triu(M, 1).tocsr() + sp.eye(700) * 5)  # one triangle: the same graph undirected
    assert graph_dimension(upper) == pytest.approx(csr, rel=0.05)


def test_hub_rows_are_left_out():
    """An arrow (dense first row and column) on a mesh: the hub would make the diameter 2 and
    every mesh an expander; left out, the mesh is seen."""
    P = sp.lil_matrix(fam.poisson(30).matrix)
    P[0, :] = 1.0
    P[:, 0] = 1.0
    g = graph_dimension(_tensor(sp.csr_matrix(P)))
    assert g is None or g < 2.6


@pytest.mark.parametrize("decoupled", [1, 4, 40])
def test_decoupled_unknowns_do_not_hide_an_expander(decoupled):
    """The sweeps started from the lowest-degree node, and an unknown whose only entry is its diagonal has the
    lowest: a sweep from it reached itself alone, graph_dimension answered None, and the fill model took a random
    pattern for a 3-D mesh (~1000x too little LU fill; the default solve of a 12000-row random matrix with four
    such unknowns took 25 s in an LU dispatch expected at 42 ms; session 26's sweep). The sweeps now start in the
    largest component, from a node with an edge."""
    n = 4000
    rng = np.random.default_rng(3)
    R = sp.random(n, n, density=6 / n, random_state=1, data_rvs=rng.standard_normal) + 2.0 * sp.eye(n)
    whole = graph_dimension(st.from_package(sp.csr_array(R)))
    assert whole is not None and whole > 3.5
    M = sp.lil_array(R)
    for k in range(decoupled):
        M[k, :] = 0
        M[:, k] = 0
        M[k, k] = 2.0
    M = sp.csr_array(M)
    M.eliminate_zeros()
    got = graph_dimension(st.from_package(M))
    assert got is not None and abs(got - whole) < 0.3
