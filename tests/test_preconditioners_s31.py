"""The torch backend's pattern preconditioners (torch-sla's names): ``ic0``, ``ilu0``, ``ssor``, ``polynomial``
(krylov/incomplete.py). Each application against a dense float64 reference of its definition (ILU(0) by the textbook
IKJ loop on the pattern), then through ``st.solve``: answers against SciPy's spsolve, fewer iterations than Jacobi,
adjoint gradients by gradcheck, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

import sparsetorch as st
from sparsetorch.backends.torch_native.krylov.incomplete import IncompletePattern, ic0, ilu0, polynomial, ssor
from sparsetorch.errors import InputError, NoBackendError, SingularMatrixError
from sparsetorch.testing import families

CPU = torch.device("cpu")


def _dense_ilu0(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ILU(0) by the textbook IKJ loop on A's pattern plus the diagonal: (unit L, U)."""
    A = A.astype(np.result_type(A, np.float64)).copy()
    n = A.shape[0]
    P = A != 0
    np.fill_diagonal(P, True)
    for i in range(1, n):
        for k in range(i):
            if not P[i, k]:
                continue
            A[i, k] /= A[k, k]
            for j in range(k + 1, n):
                if P[i, j] and P[k, j]:
                    A[i, j] -= A[i, k] * A[k, j]
    return np.tril(A, -1) * P + np.eye(n), np.triu(A) * P


def _pattern(S) -> tuple[IncompletePattern, torch.Tensor]:
    c = sp.coo_matrix(S)
    return IncompletePattern(torch.tensor(c.row), torch.tensor(c.col), S.shape[0], CPU), torch.tensor(c.data)


def _random(n: int, seed: int, complex_: bool = False, density: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    S = sp.random(n, n, density=density, random_state=rng)
    if complex_:
        S = S + 1j * sp.random(n, n, density=density, random_state=rng)
    return (S + 4 * sp.identity(n)).toarray()


def _hermitian_pd(A: np.ndarray) -> np.ndarray:
    """A Hermitian positive definite matrix on A's symmetrized pattern (strictly diagonally dominant)."""
    H = np.where((A != 0) | (A.T != 0), (A + A.conj().T) / 2, 0)
    return H + np.eye(A.shape[0]) * np.abs(H).sum(1).max()


def _rhs(n: int, complex_: bool, k: int = 3) -> torch.Tensor:
    rng = np.random.default_rng(7)
    X = rng.standard_normal((n, k)) + (1j * rng.standard_normal((n, k)) if complex_ else 0)
    return torch.tensor(X)


def _poisson(m: int) -> sp.csr_matrix:
    return families.poisson(m).matrix


def _convection(m: int, peclet: float = 20.0) -> sp.csr_matrix:
    """Upwind 2-D convection-diffusion: unsymmetric, an M-matrix."""
    return families.convection_diffusion(m, peclet).matrix


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("n, seed", [(30, 0), (60, 1)])
def test_ilu0_is_the_textbook_factorization(n, seed, complex_):
    A = _random(n, seed, complex_)
    pat, v = _pattern(A)
    L, U = _dense_ilu0(A)
    M, Mh = ilu0(pat, v)
    X = _rhs(n, complex_)
    np.testing.assert_allclose(M(X).numpy(), np.linalg.solve(L @ U, X.numpy()), rtol=0, atol=1e-12)
    np.testing.assert_allclose(Mh(X).numpy(), np.linalg.solve((L @ U).conj().T, X.numpy()), rtol=0, atol=1e-12)
    assert pat.levels > 1 and len(pat.groups) >= pat.levels - 1


@pytest.mark.parametrize("complex_", [False, True])
def test_ic0_ssor_and_polynomial_match_their_definitions(complex_):
    n = 40
    H = _hermitian_pd(_random(n, 3, complex_))
    pat, v = _pattern(H)
    X = _rhs(n, complex_)
    L, U = _dense_ilu0(H)
    C = ic0(pat, v)
    assert C.shift == 0.0
    np.testing.assert_allclose(C(X).numpy(), np.linalg.solve(L @ U, X.numpy()), rtol=0, atol=1e-12)
    D, Lo, Up = np.diag(np.diag(H)), np.tril(H, -1), np.triu(H, 1)
    for omega in (1.0, 1.5):
        M, Mh = ssor(pat, v, omega)
        ref = omega / (2 - omega) * (D / omega + Lo) @ np.linalg.inv(D) @ (D / omega + Up)
        np.testing.assert_allclose(M(X).numpy(), np.linalg.solve(ref, X.numpy()), rtol=0, atol=1e-12)
        np.testing.assert_allclose(Mh(X).numpy(), np.linalg.solve(ref.conj().T, X.numpy()), rtol=0, atol=1e-12)
    Ht = torch.tensor(H)
    P, Ph = polynomial(pat, v, lambda Y: Ht @ Y, lambda Y: Ht.mH @ Y, degree=5)
    # p(D^-1 H) D^-1 by its recurrence in dense arithmetic: Chebyshev's iteration for H y = x from y = 0
    d = np.diag(H)
    hi = float((np.abs(H).sum(1) / np.abs(d)).max())
    lo = hi / 30
    theta, delta = (hi + lo) / 2, (hi - lo) / 2
    sigma, rho = theta / delta, delta / theta
    Xn = X.numpy()
    R, Dv = Xn.copy(), (Xn / d[:, None]) / theta
    Y = Dv.copy()
    for _ in range(4):
        R = R - H @ Dv
        rho_next = 1 / (2 * sigma - rho)
        Dv = rho_next * rho * Dv + 2 * rho_next / delta * (R / d[:, None])
        Y, rho = Y + Dv, rho_next
    np.testing.assert_allclose(P(X).numpy(), Y, rtol=0, atol=1e-12)
    # positive definite and Hermitian as an operator
    E = torch.eye(n, dtype=Ht.dtype)
    Pm = P(E).numpy()
    assert np.abs(Pm - Pm.conj().T).max() < 1e-12
    assert np.linalg.eigvalsh((Pm + Pm.conj().T) / 2).min() > 0


def test_value_batches_are_factored_member_by_member():
    n = 25
    H1, H2 = _hermitian_pd(_random(n, 4)), _hermitian_pd(_random(n, 4))
    H2 = H2 * np.where(H2 != 0, 1.5, 0) + np.eye(n)  # same pattern, other values
    pat, v1 = _pattern(H1)
    c2 = sp.coo_matrix(H2)
    v2 = torch.tensor(c2.data)
    C = ic0(pat, torch.stack([v1, v2]))
    X = torch.stack([_rhs(n, False), _rhs(n, False)])
    got = C(X).numpy()
    for i, H in enumerate((H1, H2)):
        L, U = _dense_ilu0(H)
        np.testing.assert_allclose(got[i], np.linalg.solve(L @ U, X[i].numpy()), rtol=0, atol=1e-12)


def test_ic0_shifts_where_it_breaks_down():
    """Kershaw's SPD matrix: IC(0) meets a negative pivot; the preconditioner is IC(0) of A + alpha diag(A)."""
    K = np.array([[3, -2, 0, 2], [-2, 3, -2, 0], [0, -2, 3, -2], [2, 0, -2, 3]], dtype=float)
    pat, v = _pattern(K)
    C = ic0(pat, v)
    assert C.shift > 0
    L, U = _dense_ilu0(K + C.shift * np.diag(np.diag(K)))
    X = _rhs(4, False)
    np.testing.assert_allclose(C(X).numpy(), np.linalg.solve(L @ U, X.numpy()), rtol=0, atol=1e-12)
    x = st.solve(st.SparseTensor.from_package(sp.csr_array(K)), torch.ones(4, dtype=torch.float64), method="cg",
                 preconditioner="ic0", backend="torch")
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(K, np.ones(4)), rtol=1e-10)


@pytest.mark.parametrize("pre", ["ic0", "ssor", "polynomial"])
def test_cg_with_each_preconditioner_beats_jacobi_and_is_right(pre):
    A = _poisson(30)
    T = st.SparseTensor.from_package(A)
    b = torch.from_numpy(np.random.default_rng(0).standard_normal(A.shape[0]))
    ref = sla.spsolve(A.tocsc(), b.numpy())
    _, jac = st.solve(T, b, backend="torch", method="cg", preconditioner="jacobi", rtol=1e-8, return_info=True)
    x, info = st.solve(T, b, backend="torch", method="cg", preconditioner=pre, rtol=1e-8, return_info=True)
    assert info.preconditioner == pre and info.backend == "torch"
    assert info.iterations < 0.6 * jac.iterations
    assert np.abs(x.numpy() - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("method", ["bicgstab", "gmres"])
@pytest.mark.parametrize("pre", ["ilu0", "ssor", "polynomial"])
def test_unsymmetric_krylov_with_each_preconditioner(method, pre):
    A = _convection(25)
    T = st.SparseTensor.from_package(A)
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(A.shape[0]))
    x = st.solve(T, b, backend="torch", method=method, preconditioner=pre)  # the default accuracy contract
    ref = sla.spsolve(A.tocsc(), b.numpy())
    assert np.abs(x.numpy() - ref).max() <= 1e-9 * np.abs(ref).max()


@pytest.mark.parametrize("pre, method, sym", [("ic0", "cg", True), ("ssor", "cg", True), ("polynomial", "cg", True),
                                             ("ilu0", "gmres", False), ("ssor", "bicgstab", False)])
def test_adjoint_gradients(pre, method, sym):
    """The backward pass is an adjoint solve with the same plan (M^H for ilu0 / ssor on an unsymmetric A)."""
    A = _poisson(4) if sym else _convection(4)
    A = sp.coo_matrix(A)
    rows, cols = torch.tensor(A.row), torch.tensor(A.col)
    vals = torch.tensor(A.data, requires_grad=True)
    b = torch.randn(A.shape[0], dtype=torch.float64, requires_grad=True)
    props = "spd" if sym else None

    def f(v, rhs):
        T = st.SparseTensor.from_coo(v, rows, cols, shape=A.shape, format="CSR")
        return st.solve(T, rhs, backend="torch", method=method, preconditioner=pre, rtol=1e-13, properties=props)

    assert torch.autograd.gradcheck(f, (vals, b), atol=1e-6, fast_mode=True)


def test_refusals_name_the_problem():
    A = st.SparseTensor.from_package(_poisson(5))
    b = torch.ones(25, dtype=torch.float64)
    with pytest.raises(NoBackendError, match="ILU\\(0\\) is not symmetric"):
        st.solve(A, b, method="cg", preconditioner="ilu0", backend="torch")
    C = st.SparseTensor.from_package(_convection(5))
    with pytest.raises(NoBackendError, match="IC\\(0\\) needs a Hermitian"):
        st.solve(C, b, method="gmres", preconditioner="ic0", backend="torch")
    with pytest.raises(InputError, match="omega"):
        st.solve(A, b, method="cg", preconditioner="ssor", backend="torch", backend_options={"ssor_omega": 2.5})
    with pytest.raises(InputError, match="degree"):
        st.solve(A, b, method="cg", preconditioner="polynomial", backend="torch", backend_options={"poly_degree": 0})
    # a diagonal entry not stored: SSOR divides by it
    S = sp.lil_matrix(_poisson(5))
    S[3, 3] = 0
    S = sp.csr_matrix(S)
    S.eliminate_zeros()
    with pytest.raises(SingularMatrixError, match=r"A\[3, 3\]"):
        st.solve(st.SparseTensor.from_package(S), b, method="gmres", preconditioner="ssor", backend="torch")


def test_explain_prices_them_and_other_backends_decline():
    A = st.SparseTensor.from_package(_poisson(20))
    b = torch.ones(400, dtype=torch.float64)
    table = st.explain("solve", A, b, preconditioner="ic0")
    chosen = table.chosen
    assert chosen.backend == "torch" and chosen.offer.preconditioner == "ic0"
    assert "preconditioner ic0" in chosen.reason
    scipy_rows = [r for r in table.rows if r.backend == "scipy"]
    assert all("'ic0' is not available" in r.reason for r in scipy_rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pre, method", [("ic0", "cg"), ("ssor", "cg"), ("polynomial", "cg"), ("ilu0", "bicgstab"),
                                         ("ilu0", "gmres")])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.complex128])
def test_cuda_preconditioners(pre, method, dtype):
    """On the GPU: cuSPARSE's triangular solves (ic0 / ilu0 / ssor) and the products of the polynomial; the answer
    against SciPy's spsolve in float64 (float32: to its own contract), with gradients in b against the adjoint
    formula A^-H (dL/dx)."""
    A = _poisson(20) if method == "cg" else _convection(20)
    dev = torch.device("cuda")
    T = st.SparseTensor.from_package(A).to(dtype=dtype, device=dev)
    rng = np.random.default_rng(2)
    bn = rng.standard_normal(A.shape[0])
    b = torch.tensor(bn, dtype=dtype, device=dev, requires_grad=True)
    x, info = st.solve(T, b, backend="torch", method=method, preconditioner=pre, return_info=True)
    assert info.preconditioner == pre and x.device.type == "cuda"
    ref = sla.spsolve(A.tocsc(), bn)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    assert np.abs(x.detach().cpu().numpy() - ref).max() <= tol * np.abs(ref).max()
    w = torch.tensor(rng.standard_normal(A.shape[0]), dtype=dtype, device=dev)
    (x * w).real.sum().backward()
    # L = Re(w^T A^-1 b): torch's gradient in b is conj(A^-T w) = A^-T conj(w) (A real)
    gref = sla.spsolve(A.T.tocsc(), w.conj().resolve_conj().cpu().numpy())
    got = b.grad.cpu().numpy()
    assert np.abs(got - gref).max() <= tol * np.abs(gref).max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cg_with_the_polynomial_replays_graphs():
    """The Chebyshev preconditioner is products and vector operations on fixed buffers: CG captures its blocks of
    iterations with it as with Jacobi (a capture that fails warns and runs eagerly: no such warning here), and the
    answer is SciPy's."""
    import warnings

    A = _poisson(30)
    T = st.SparseTensor.from_package(A).to(device="cuda")
    bn = np.random.default_rng(5).standard_normal(A.shape[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, info = st.solve(T, torch.tensor(bn, device="cuda"), backend="torch", method="cg", preconditioner="polynomial",
                           rtol=1e-10, return_info=True)
    assert not [w for w in caught if "eagerly" in str(w.message)], [str(w.message) for w in caught]
    assert info.iterations > 24  # several blocks of check_every = 8: captured and replayed
    ref = sla.spsolve(A.tocsc(), bn)
    assert np.abs(x.cpu().numpy() - ref).max() <= 1e-8 * np.abs(ref).max()
