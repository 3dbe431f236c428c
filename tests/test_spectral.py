"""eigsh / eigs: values against dense float64 references, gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

import sparsetorch as st
from sparsetorch.errors import DegenerateEigenvalueError, InputError, NotSymmetricError
from sparsetorch.format import CSR
from sparsetorch.ops.spectral import eigs, eigsh

TORCH_METHODS = ("dense", "lanczos")


def _sym_pattern(n, density, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, n, generator=g) < density
    mask = mask | mask.T | torch.eye(n, dtype=torch.bool)
    rows, cols = torch.nonzero(torch.tril(mask), as_tuple=True)
    return rows, cols


class SymParam:
    """A symmetric sparse matrix built from its lower triangle: every gradient check goes through
    symmetric perturbations (the only ones that keep the eigenproblem symmetric)."""

    def __init__(self, n, density=0.2, seed=0, dtype=torch.float64, shift=None):
        self.n = n
        self.rows, self.cols = _sym_pattern(n, density, seed)
        g = torch.Generator().manual_seed(seed + 1)
        p = torch.randn(self.rows.numel(), generator=g, dtype=torch.float64)
        diag = self.rows == self.cols
        spread = torch.arange(n, dtype=torch.float64) if shift is None else shift
        p[diag] += spread[self.rows[diag]]
        if dtype.is_complex:
            p = p.to(dtype) + 1j * torch.randn(p.shape, generator=g, dtype=torch.float64) * (~diag)
        self.p0 = p
        self.off = self.rows != self.cols

    def build(self, p):
        r = torch.cat([self.rows, self.cols[self.off]])
        c = torch.cat([self.cols, self.rows[self.off]])
        if p.is_complex():  # a Hermitian matrix has a real diagonal
            p = torch.where(self.off, p, p.real.to(p.dtype))
        v = torch.cat([p, p[self.off].conj()])
        return st.SparseTensor.from_coo(v, r, c, shape=(self.n, self.n), format=CSR)

    def dense(self, p=None):
        return self.build(self.p0 if p is None else p).to_dense()


def _match_vectors(V, Vref):
    """Eigenvectors are defined up to sign (phase): align before comparing."""
    phase = (Vref.conj() * V).sum(0)
    return V / (phase / phase.abs())


@pytest.mark.parametrize("method", TORCH_METHODS)
@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
def test_eigsh_values_and_vectors_match_dense(method, which):
    S = SymParam(60, seed=3)
    D = S.dense()
    w, V = eigsh(S.build(S.p0), 4, which=which, method=method)
    wall, Vall = torch.linalg.eigh(D)
    key = {"LA": -wall, "SA": wall, "LM": -wall.abs()}[which]
    idx = torch.argsort(key)[:4]
    idx = idx[torch.argsort(wall[idx])]
    torch.testing.assert_close(w, wall[idx], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(_match_vectors(V, Vall[:, idx]), Vall[:, idx], rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(V.T @ V, torch.eye(4, dtype=V.dtype), atol=1e-9, rtol=0)


@pytest.mark.parametrize("method", TORCH_METHODS)
def test_eigsh_shift_invert_finds_the_eigenvalues_nearest_sigma(method):
    S = SymParam(50, seed=5)
    wall = torch.linalg.eigvalsh(S.dense())
    sigma = float(wall[20] + 0.3 * (wall[21] - wall[20]))
    w, _ = eigsh(S.build(S.p0), 3, sigma=sigma, method=method)
    ref = wall[torch.argsort((wall - sigma).abs())[:3]].sort().values
    torch.testing.assert_close(w, ref, rtol=1e-9, atol=1e-9)


def test_eigsh_poisson_smallest_against_closed_form():
    from sparsetorch.testing.problems import poisson2d

    m = 20
    A = poisson2d(m)
    w, _ = eigsh(A, 3, which="SA", method="lanczos")
    j = torch.arange(1, m + 1, dtype=torch.float64)
    lam1 = 2 - 2 * torch.cos(j * torch.pi / (m + 1))
    ref = (lam1[:, None] + lam1[None, :]).reshape(-1).sort().values[:3]
    torch.testing.assert_close(w, ref, rtol=1e-9, atol=1e-10)


def test_eigsh_generalized_matches_scipy():
    S = SymParam(30, seed=7)
    Mp = SymParam(30, density=0.1, seed=8, shift=torch.full((30,), 40.0))  # diagonally dominant: SPD
    A, M = S.build(S.p0), Mp.build(Mp.p0)
    for method in ("dense", "lobpcg"):
        if method == "lobpcg":
            A = S.build(S.p0 + 60 * (S.rows == S.cols))  # lobpcg: SPD A
        w, V = eigsh(A, 3, M=M, which="SA", method=method, properties="spd" if method == "lobpcg" else None)
        ref = scipy.linalg.eigh(A.to_dense().numpy(), M.to_dense().numpy(), eigvals_only=True)[:3]
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-6 if method == "lobpcg" else 1e-10)
        MV = M.to_dense() @ V
        torch.testing.assert_close(V.T @ MV, torch.eye(3, dtype=V.dtype), atol=1e-6, rtol=0)


def test_eigsh_value_batch():
    S = SymParam(25, seed=9)
    p = torch.stack([S.p0, S.p0 * 2 + 0.1])
    A = S.build(S.p0).with_values(torch.stack([S.build(S.p0).values, S.build(S.p0 * 2 + 0.1).values]))
    for method in TORCH_METHODS:
        w, V = eigsh(A, 2, which="LA", method=method)
        assert w.shape == (2, 2) and V.shape == (2, 25, 2)
        for b in range(2):
            ref = torch.linalg.eigvalsh(S.dense(p[b]))[-2:]
            torch.testing.assert_close(w[b], ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method", TORCH_METHODS)
@pytest.mark.parametrize("which", ["LA", "SA"])
def test_eigsh_gradients_values_and_vectors(method, which):
    S = SymParam(24, seed=11)
    x = torch.randn(24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def loss(p):
        w, V = eigsh(S.build(p), 3, which=which, method=method, tol=1e-14)  # FD needs exact pairs
        return (w ** 2).sum() + ((V * x[:, None]).sum(0) ** 2 * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum()

    p = S.p0.clone().requires_grad_()
    assert torch.autograd.gradcheck(loss, (p,), eps=1e-6, atol=5e-6, rtol=1e-5)


def test_eigsh_gradients_match_dense_autograd():
    S = SymParam(20, seed=12)
    x = torch.randn(20, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def ours(p):
        w, V = eigsh(S.build(p), 2, which="LA", method="lanczos", tol=1e-14)
        return w.sum() + ((V * x[:, None]).sum(0) ** 2).sum()

    def dense(p):
        wall, Vall = torch.linalg.eigh(S.build(p).to_dense())
        return wall[-2:].sum() + ((Vall[:, -2:] * x[:, None]).sum(0) ** 2).sum()

    p1 = S.p0.clone().requires_grad_()
    p2 = S.p0.clone().requires_grad_()
    (g1,) = torch.autograd.grad(ours(p1), p1)
    (g2,) = torch.autograd.grad(dense(p2), p2)
    torch.testing.assert_close(g1, g2, rtol=1e-7, atol=1e-8)


def test_eigsh_generalized_gradients():
    S = SymParam(14, seed=13)
    Mp = SymParam(14, density=0.15, seed=14, shift=torch.full((14,), 30.0))
    x = torch.randn(14, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def loss(pa, pm):
        w, V = eigsh(S.build(pa), 2, M=Mp.build(pm), which="LA", method="dense")
        return w.sum() + ((V * x[:, None]).sum(0) ** 2).sum()

    pa = S.p0.clone().requires_grad_()
    pm = Mp.p0.clone().requires_grad_()
    assert torch.autograd.gradcheck(loss, (pa, pm), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_eigsh_complex_hermitian_gradients():
    S = SymParam(12, seed=15, dtype=torch.complex128)
    x = torch.randn(12, dtype=torch.complex128, generator=torch.Generator().manual_seed(6))

    def loss(p):
        w, V = eigsh(S.build(p), 2, which="LA", method="dense")
        return w.sum() + ((V.conj() * x[:, None]).sum(0).abs() ** 2).sum()  # phase invariant

    p = S.p0.clone().requires_grad_()
    assert torch.autograd.gradcheck(loss, (p,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_eigsh_repeated_eigenvalue_vector_gradient_raises_unless_told():
    n = 10
    d = torch.tensor([1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], dtype=torch.float64)
    idx = torch.arange(n)
    v = d.clone().requires_grad_()
    A = st.SparseTensor.from_coo(v, idx, idx, shape=(n, n), format=CSR)
    x = torch.arange(1.0, n + 1, dtype=torch.float64)
    w, V = eigsh(A, 3, which="SA", method="dense")
    loss = (V[:, 1] * x).sum() ** 2  # depends on which vector of the repeated pair is returned
    with pytest.raises(DegenerateEigenvalueError, match="repeated eigenvalues"):
        loss.backward()
    # A loss of the eigenspace only (the projector's diagonal) has a gradient: no error.
    w, V = eigsh(A, 3, which="SA", method="dense")
    ((V[:, 1:3] ** 2).sum(1) * x).sum().backward()
    # eigenvalue gradients are fine at repeated eigenvalues
    v.grad = None
    w, _ = eigsh(A, 3, which="SA", method="dense")
    w.sum().backward()
    assert v.grad[:3].tolist() == [1.0, 1.0, 1.0]


def test_eigsh_bad_input():
    S = SymParam(10, seed=1)
    A = S.build(S.p0)
    with pytest.raises(InputError, match="k must be"):
        eigsh(A, 0)
    with pytest.raises(InputError, match="k must be"):
        eigsh(A, 11)
    with pytest.raises(InputError, match="which must be"):
        eigsh(A, 2, which="XX")
    D = torch.randn(10, 10, dtype=torch.float64)
    with pytest.raises(NotSymmetricError, match="use sparsetorch.eigs"):
        eigsh(st.SparseTensor.from_dense(D), 2)
    with pytest.raises(st.NoBackendError, match="k < n"):
        eigsh(A, 10, method="lanczos")
    with pytest.raises(st.NoBackendError, match="sigma=0"):
        eigsh(A, 2, which="SM", method="lanczos")


def test_lanczos_nonconvergence_raises_and_warns():
    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(30)
    with pytest.raises(st.NotConvergedError, match="did not converge"):
        eigsh(A, 2, which="SA", method="lanczos", maxiter=1)
    with pytest.warns(st.NotConvergedWarning):
        eigsh(A, 2, which="SA", method="lanczos", maxiter=1, on_nonconvergence="warn")


# --- eigs ---------------------------------------------------------------------------------------------

def _nonsym(n, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.3)
    D = D + torch.diag(torch.randn(n, generator=g, dtype=torch.float64))
    return D.to(dtype)


@pytest.mark.parametrize("which", ["LM", "LR", "SR"])
def test_eigs_values_match_numpy(which):
    D = _nonsym(30, 21)
    w, V = eigs(st.SparseTensor.from_dense(D), 4, which=which, method="dense")
    ref = np.linalg.eigvals(D.numpy())
    key = {"LM": -np.abs(ref), "LR": -ref.real, "SR": ref.real}[which]
    want = ref[np.argsort(key, kind="stable")[:4]]
    for z in w.numpy():
        assert np.min(np.abs(want - z)) < 1e-9
    Dc = D.to(torch.complex128)
    torch.testing.assert_close(Dc @ V, V * w, atol=1e-9, rtol=0)


def test_eigs_eigenvalue_gradients_match_dense_autograd():
    D = _nonsym(16, 22)
    A = st.SparseTensor.from_dense(D)
    wts = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

    def ours(v):
        w, _ = eigs(A.with_values(v), 3, which="LR", method="dense")
        return (w.real * wts).sum() + (w.imag ** 2).sum()

    def dense(v):
        wall = torch.linalg.eigvals(A.with_values(v).to_dense())
        idx = torch.argsort(-wall.real.detach(), stable=True)[:3]
        return (wall[idx].real * wts).sum() + (wall[idx].imag ** 2).sum()

    v = A.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(ours, (v,), eps=1e-6, atol=1e-6, rtol=1e-5)
    v1, v2 = A.values.clone().requires_grad_(), A.values.clone().requires_grad_()
    (g1,) = torch.autograd.grad(ours(v1), v1)
    (g2,) = torch.autograd.grad(dense(v2), v2)
    torch.testing.assert_close(g1, g2, rtol=1e-7, atol=1e-9)


def test_eigs_vector_gradient_is_refused():
    D = _nonsym(10, 23)
    v = st.SparseTensor.from_dense(D).values.clone().requires_grad_()
    _, V = eigs(st.SparseTensor.from_dense(D).with_values(v), 2, method="dense")
    with pytest.raises(InputError, match="eigenvectors of a non-symmetric"):
        V.abs().sum().backward()


# --- the conformance kits, run against the torch backend ----------------------------------------

from sparsetorch.format import COO, CSC  # noqa: E402
from sparsetorch.testing import EigsConformance, EigshConformance  # noqa: E402


class TorchSpectral:
    backend = "torch"
    eigsh_methods = ("dense", "lanczos")
    eigs_methods = ("dense",)
    devices = ("cpu", "cuda")  # CUDA cases skip without a GPU
    dtypes = (torch.float64, torch.float32)
    formats = (CSR, CSC, COO)
    supports_generalized = False  # dense has it, lanczos does not: tested above for dense


class TestTorchEigsh(TorchSpectral, EigshConformance):
    pass


class TestTorchEigs(TorchSpectral, EigsConformance):
    pass


def test_explain_ranks_spectral_offers_and_shows_declines():
    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(10)
    table = str(st.explain("eigsh", A, 3, which="SM"))
    assert "lanczos" in table and "sigma=0" in table  # the decline says how to get SM
    assert "dense" in str(st.explain("eigs", A, 2)) and "dense" in str(st.explain("logdet", A))
    with pytest.raises(InputError, match="explain knows"):
        st.explain("eig", A)


def test_lanczos_finds_both_copies_of_repeated_eigenvalues():
    # A square grid's Laplacian has eigenvalue pairs lam(i, j) = lam(j, i): a one-vector Lanczos
    # would return one copy and skip to the next eigenvalue.
    from sparsetorch.testing.problems import poisson2d

    m = 24
    j = torch.arange(1, m + 1, dtype=torch.float64)
    lam1 = 2 - 2 * torch.cos(j * torch.pi / (m + 1))
    ref = (lam1[:, None] + lam1[None, :]).reshape(-1).sort().values
    w, _ = eigsh(poisson2d(m), 6, which="LA", method="lanczos")
    torch.testing.assert_close(w, ref[-6:], rtol=1e-10, atol=1e-10)
    assert float(ref[-2] - ref[-3]) < 1e-12  # the test really has a repeated eigenvalue


def test_shift_invert_uses_a_direct_solver():
    """Shift-invert needs (A - sigma I)^-1 to working precision: a Krylov offer that comes out
    cheaper (it did, by a few percent, with the Eigen plugin's BiCGStab) must not be taken."""
    from sparsetorch.backends.torch_native.lanczos import _DIRECT, _direct_choice

    S = SymParam(50, seed=5)
    choice = _direct_choice(S.build(S.p0))
    assert choice.get("method") in _DIRECT, choice


def test_old_module_path_warns_and_reexports():
    """``sparsetorch.ops.eigen`` (the module's name before "eigen" came to mean the Eigen library
    only) still imports, warns DeprecationWarning, and hands out the same objects."""
    import importlib
    import sys

    import sparsetorch.ops.spectral as spectral

    sys.modules.pop("sparsetorch.ops.eigen", None)
    with pytest.warns(DeprecationWarning, match="sparsetorch.ops.spectral"):
        old = importlib.import_module("sparsetorch.ops.eigen")
    assert old.eigsh is spectral.eigsh is st.eigsh
    assert old.eigs is spectral.eigs is st.eigs
    assert old.MASS_FIX == spectral.MASS_FIX


@pytest.mark.parametrize("old, new, name", [
    ("sparsetorch_scipy.eigen", "sparsetorch_scipy.spectral", "EigshPlan"),
    ("sparsetorch_cupy.eigen", "sparsetorch_cupy.spectral", "LanczosPlan"),
    ("sparsetorch_distributed.eigen", "sparsetorch_distributed.spectral", "eigsh"),
])
def test_plugins_old_eigen_modules_warn_and_reexport(old, new, name):
    """The plugins' eigenvalue modules are ``spectral`` now; the old ``eigen`` paths still import,
    warn DeprecationWarning and hand out the same objects (skipped where the plugin is absent)."""
    import importlib
    import sys

    pkg = pytest.importorskip(new.split(".")[0])
    assert pkg is not None
    current = importlib.import_module(new)
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        alias = importlib.import_module(old)
    assert getattr(alias, name) is getattr(current, name)


def _lap_with_isolated(n=40, isolated=(5, 17, 30)):
    import scipy.sparse as sp

    T = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tolil()
    for i in isolated:
        T[i, :] = 0
        T[:, i] = 0
    T = T.tocsr()
    T.eliminate_zeros()
    return T


@pytest.mark.parametrize("which,k", [("SA", 5), ("SM", 4), ("LA", 3), ("LM", 2)])
def test_eigsh_finds_every_eigenvalue_of_isolated_nodes(which, k):
    # empty rows and columns (isolated graph nodes) give eigenvalue 0 once each: a single-vector Krylov
    # method found the repeated 0 once (session 20's sweep: [0, 0.0039, ...] for [0, 0, 0, 0, 0.0039])
    T = _lap_with_isolated()
    D = T.toarray()
    ev = np.linalg.eigvalsh(D)
    key = {"SA": ev, "SM": np.abs(ev), "LA": -ev, "LM": -np.abs(ev)}[which]
    ref = np.sort(ev[np.argsort(key, kind="stable")[:k]])
    A = st.from_package(T)
    import importlib.util

    methods = [None] + (["lanczos"] if which != "SM" else [])  # torch's Lanczos takes SM by sigma=0 only
    methods += ["arpack"] if importlib.util.find_spec("sparsetorch_scipy") is not None else []
    for method in methods:
        w, V = st.eigsh(A, k, which=which, **({} if method is None else {"method": method}))
        np.testing.assert_allclose(w.numpy(), ref, atol=1e-10)
        Vn = V.numpy()
        assert np.abs(D @ Vn - Vn * w.numpy()).max() <= 1e-9
        np.testing.assert_allclose(Vn.T @ Vn, np.eye(k), atol=1e-9)


def test_eigsh_with_isolated_nodes_is_differentiable():
    T = _lap_with_isolated(n=12, isolated=(3,))
    A = st.from_package(T)
    v = A.values.detach().clone().requires_grad_(True)
    w, _ = st.eigsh(A.with_values(v), 3, which="SA")
    w.sum().backward()
    Dt = A.to_dense().clone().requires_grad_(True)
    torch.linalg.eigvalsh(Dt)[:3].sum().backward()
    coords, slot = A.entries()
    ref = torch.zeros_like(v).index_put_((slot,), Dt.grad[coords[0], coords[1]])
    torch.testing.assert_close(v.grad, ref, rtol=1e-8, atol=1e-10)


def test_eigsh_smallest_magnitude_of_a_singular_psd_matrix():
    # a graph Laplacian of four components (detected spd: PSD, singular): SM went through shift-invert
    # at 0 and raised; for a PSD matrix SM is SA
    import scipy.sparse as sp

    m = 25  # 4 grids of 25 x 25: n = 2500, past the dense offer, where ARPACK's SM had no way through
    P = sp.diags([np.ones(m - 1), np.ones(m - 1)], [-1, 1])
    grid = sp.kron(P, sp.identity(m)) + sp.kron(sp.identity(m), P)
    Adj = sp.block_diag([grid] * 4).tocsr()
    L = (sp.diags(np.asarray(Adj.sum(1)).ravel()) - Adj).tocsr()
    ev = np.linalg.eigvalsh(L.toarray())
    ref = np.sort(ev[np.argsort(np.abs(ev), kind="stable")[:6]])
    A = st.from_package(L)
    # (pinned ARPACK meets the 4-fold eigenvalues at both ends of the wanted range and says it did not converge)
    w, _ = st.eigsh(A, 6, which="SM")
    np.testing.assert_allclose(w.numpy(), ref, atol=1e-10)


@pytest.mark.parametrize("copies", [50, 1])
def test_eigsh_smallest_magnitude_of_a_singular_indefinite_matrix(copies):
    # indefinite and singular: shift-invert at 0 cannot factor it, and ARPACK's regular mode ran 54 s
    # on this matrix (n = 2500, a 50-fold 0 beside eigenvalues of both signs) and did not converge; a
    # tiny shift beside 0 finds them in seconds
    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    m = 30
    path = sp.diags([-np.ones(m - 1), np.r_[1, 2 * np.ones(m - 2), 1], -np.ones(m - 1)], [-1, 0, 1])  # singular
    spd = path + 0.05 * sp.identity(m)
    blocks = [path] * copies + [spd] * (50 - copies)
    t = 1000
    blocks.append(sp.diags([-np.ones(t - 1), np.linspace(-3, 3, t), -np.ones(t - 1)], [-1, 0, 1]))  # indefinite
    A = sp.block_diag(blocks).tocsr()
    perm = rng.permutation(A.shape[0])
    A = A[perm][:, perm].tocsr()
    ev = np.linalg.eigvalsh(A.toarray())
    k = 6
    w, V = st.eigsh(st.from_package(A), k, which="SM")
    got = np.sort(np.abs(w.numpy()))
    want = np.sort(np.abs(ev))[:k]
    np.testing.assert_allclose(got, want, atol=1e-9)
    Vn = V.numpy()
    np.testing.assert_allclose(A @ Vn, Vn * w.numpy(), atol=1e-9)
    np.testing.assert_allclose(Vn.T @ Vn, np.eye(k), atol=1e-9)


@pytest.mark.parametrize("k,kw", [(1, {}), (1, {"method": "arpack"}), (3, {"method": "lanczos", "backend": "torch"}), (3, {})])
def test_eigenvector_gradient_at_an_eigenvalue_repeated_outside_the_computed_ones(k, kw):
    # both copies computed: DegenerateEigenvalueError (documented); one copy outside the k computed:
    # the bordered system is singular (it raised SingularMatrixError about torch/lu) or, after Lanczos's
    # rounding, nearly so (a gradient of norm 4e13 and no error; session 21's sweep)
    if kw.get("method") == "arpack" and "scipy" not in st.registry().names:
        pytest.skip("scipy plugin not installed")
    m = 5
    L = 2 * torch.eye(m, dtype=torch.float64) - torch.diag(torch.ones(m - 1, dtype=torch.float64), 1) \
        - torch.diag(torch.ones(m - 1, dtype=torch.float64), -1)
    A = st.SparseTensor.from_dense(torch.block_diag(L, L))  # every eigenvalue twice
    z = torch.linspace(-1, 2, 2 * m, dtype=torch.float64)
    v = A.values.clone().requires_grad_()
    w, V = st.eigsh(A.with_values(v), k, which="SA", **kw)
    with pytest.raises(DegenerateEigenvalueError, match="not among the"):
        torch.autograd.grad((V[:, -1] @ z) ** 2, v)


def test_ignored_missing_copy_drops_its_coupling_exactly():
    m = 5
    L = 2 * torch.eye(m, dtype=torch.float64) - torch.diag(torch.ones(m - 1, dtype=torch.float64), 1) \
        - torch.diag(torch.ones(m - 1, dtype=torch.float64), -1)
    D = torch.block_diag(L, L)
    A = st.SparseTensor.from_dense(D)
    z = torch.linspace(-1, 2, 2 * m, dtype=torch.float64)
    v = A.values.clone().requires_grad_()
    w, V = st.eigsh(A.with_values(v), 3, which="SA", degenerate="ignore")
    x = V[:, -1]
    g = torch.autograd.grad((x @ z) ** 2, v)[0]
    # reference: q = sum over the eigenpairs at another eigenvalue of u_j (u_j^T gx) / (w - w_j), from a
    # dense eigendecomposition; the copy of w itself (outside the computed ones) contributes nothing
    W, U = torch.linalg.eigh(D)
    gx = 2 * (x @ z) * z
    far = (W - w[-1]).abs() > 1e-8
    q = U[:, far] @ ((U[:, far].T @ gx) / (w[-1] - W[far]))
    r, c = (D != 0).nonzero(as_tuple=True)
    ref = 0.5 * (q[r] * x[c] + x[r] * q[c])
    torch.testing.assert_close(g, ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("scale", [1e200, 1e-200, 1e300])
def test_eigenpairs_of_matrices_with_huge_or_tiny_entries(scale):
    # finite float64 entries >= 1e170 made ARPACK's / the checks' norms overflow (NotConvergedError after
    # 30 s, lobpcg "array must not contain infs"; session 21's sweep): A is scaled by a power of four
    import scipy.sparse as sp

    n = 60
    T = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tocsr()
    ref = np.linalg.eigvalsh(T.toarray())
    A = st.from_package((T * scale).tocsr())
    cases = [({}, ref[-3:]), ({"which": "SA"}, ref[:3]), ({"which": "SA", "method": "lanczos"}, ref[:3])]
    for kw, want in cases:
        w, V = st.eigsh(A, 3, **kw)
        np.testing.assert_allclose(w.numpy() / scale, want, rtol=1e-10)
        np.testing.assert_allclose(V.numpy().T @ V.numpy(), np.eye(3), atol=1e-10)
    N = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -0.5 * np.ones(n - 1)], [-1, 0, 1]).tocsr()
    w_ref = st.eigs(st.from_package(N), 3)[0].numpy()
    w, _ = st.eigs(st.from_package((N * scale).tocsr()), 3)
    np.testing.assert_allclose(w.numpy() / scale, w_ref, rtol=1e-7)  # eigenvalues of a non-normal matrix: ~1e-9 apart run to run


def test_generalized_eigenpairs_with_a_tiny_mass_matrix_and_gradients():
    import scipy.linalg as sl
    import scipy.sparse as sp

    n = 40
    T = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tocsr()
    Mm = sp.diags(np.linspace(1, 2, n)).tocsr()
    A, M = st.from_package((T * 1e200).tocsr()), st.from_package((Mm * 1e-100).tocsr())
    v = A.values.clone().requires_grad_()
    w, V = st.eigsh(A.with_values(v), 2, M=M, which="SA")
    ref = sl.eigh(T.toarray(), Mm.toarray(), eigvals_only=True)[:2] * 1e300
    np.testing.assert_allclose(w.detach().numpy(), ref, rtol=1e-10)
    Vn = V.detach().numpy()
    np.testing.assert_allclose(Vn.T @ (M.to_dense().numpy() @ Vn), np.eye(2), atol=1e-10)
    g = torch.autograd.grad(w.sum(), v)[0]  # Hellmann-Feynman: sum_i v_i[row] v_i[col]
    coords, slot = A.entries()
    want = (V[coords[0]] * V[coords[1]]).sum(-1).detach()
    torch.testing.assert_close(g[slot], want, rtol=1e-10, atol=0)


def test_torch_lobpcg_declines_complex_matrices():
    n = 12
    D = torch.diag(torch.arange(1.0, n + 1, dtype=torch.float64)).to(torch.complex128)
    off = torch.full((n - 1,), 0.3j, dtype=torch.complex128)
    A = st.SparseTensor.from_dense(D + torch.diag(off, 1) + torch.diag(off.conj(), -1))
    table = str(st.explain("eigsh", A, 3, which="LA"))
    assert "real matrices only" in table
    with pytest.raises(st.NoBackendError, match="real matrices only"):
        st.eigsh(A, 3, which="LA", backend="torch", method="lobpcg")
    w, _ = st.eigsh(A, 3, which="LA")
    np.testing.assert_allclose(w.numpy(), np.linalg.eigvalsh(A.to_dense().numpy())[-3:], rtol=1e-10)


@pytest.mark.parametrize("op", ["eigsh", "eigs"])
def test_vmap_over_values_is_refused_with_the_value_batch_spelling(op) -> None:
    """Under torch.func.vmap over A's values eigsh / eigs failed deep inside with torch's ".item()" message;
    they now say what to write instead, and that spelling (a value batch) answers."""
    from torch.func import vmap

    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(5)
    V = torch.stack([A.values, 2 * A.values])
    fn = getattr(st, op)
    with pytest.raises(st.InputError, match="value batch"):
        vmap(lambda v: fn(A.with_values(v), 2))(V)
    w = fn(A.with_values(V), 2)[0]
    ref = torch.linalg.eigvalsh(A.to_dense())
    key = ref if op == "eigsh" else ref.abs()
    top = ref[torch.argsort(key)[-2:]]
    torch.testing.assert_close(torch.sort(w.real, dim=-1).values, torch.stack([top, 2 * top]).sort(dim=-1).values,
                               rtol=1e-9, atol=1e-9)


def test_lanczos_finds_every_copy_of_an_eigenvalue_repeated_more_often_than_its_block() -> None:
    """3 identical 20 x 20 Neumann grid Laplacians: the second eigenvalue has 6 copies. A block of 4 start
    vectors returned 4 of the 5 wanted and the next eigenvalue in place of the 5th (every pair passing the
    residual checks; session 23's sweep); an answer holding as many copies as the block is wide now runs
    again with a wider block. Against numpy's dense eigvalsh."""
    import scipy.sparse as sp

    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(20, 20)).tolil()
    path[0, 0] = path[-1, -1] = 1.0
    grid = sp.kron(sp.eye(20), path) + sp.kron(path, sp.eye(20))
    A = sp.csr_array(sp.block_diag([grid] * 3))
    w, V = eigsh(st.from_package(A), 8, which="SA", method="lanczos")
    ref = np.linalg.eigvalsh(A.toarray())[:8]
    np.testing.assert_allclose(np.sort(w.numpy()), ref, atol=1e-10)
    np.testing.assert_allclose(A @ V.numpy(), V.numpy() * w.numpy(), atol=1e-8)


def test_forward_mode_over_eigsh_names_the_op_and_what_works() -> None:
    """jvp / jacfwd / hessian raised torch's generic "you must implement the jvp function" (or vmap) errors;
    they now name eigsh and point to reverse mode, which works (against dense eigvalsh's autograd)."""
    from torch.func import grad, hessian, jacfwd, jvp

    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(4)
    v = A.values.detach().clone()

    def f(v_):
        return eigsh(A.with_values(v_), 2, which="LA")[0].sum()

    for call in (lambda: jvp(f, (v,), (torch.ones_like(v),)), lambda: jacfwd(f)(v), lambda: hessian(f)(v)):
        with pytest.raises(NotImplementedError, match="eigsh: forward-mode"):
            call()
    g = grad(f)(v)
    D = A.to_dense().requires_grad_(True)
    torch.linalg.eigvalsh(D)[-2:].sum().backward()
    coords, slot = A.entries()
    torch.testing.assert_close(g[slot], D.grad[coords[0], coords[1]], rtol=1e-8, atol=1e-10)
