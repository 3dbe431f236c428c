"""Session 32's fixes from outside sweeps (references: dense float64 NumPy / LAPACK)."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.errors import SingularMatrixError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _ill_conditioned(n: int, cond: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    Q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    Q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return Q1 @ np.diag(np.logspace(0, -np.log10(cond), n)) @ Q2.T


def test_singular_to_float32_precision_says_float64_may_solve_it():
    """Condition 1e10: singular to working precision in float32 (1 / (8 u) = 2.1e6), an ordinary system in float64.
    The float32 error says so and names the wider dtype; the float64 call answers (checked against LAPACK)."""
    D = _ill_conditioned(12, 1e10, 3)
    b = np.random.default_rng(4).standard_normal(12)
    A32 = st.SparseTensor.from_package(sp.csr_matrix(D.astype(np.float32)))
    with pytest.raises(SingularMatrixError, match=r"float32.*solvable in float64"):
        st.solve(A32, torch.from_numpy(b).float())
    x = st.solve(st.SparseTensor.from_package(sp.csr_matrix(D)), torch.from_numpy(b))
    ref = np.linalg.solve(D, b)
    assert np.abs(D @ x.numpy() - b).max() <= 1e-12 * (np.abs(D).sum(1).max() * np.abs(ref).max() + np.abs(b).max())


def _poisson(n: int) -> sp.csr_matrix:
    T = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])
    return sp.csr_matrix(sp.kron(T, sp.eye(n)) + sp.kron(sp.eye(n), T))


@pytest.mark.parametrize("opts, match", [({"poly_degree": 10**6}, r"\[1, 1000\]"), ({"poly_degree": "x"}, "poly_degree"),
                                         ({"poly_ratio": float("inf")}, "finite"), ({"poly_ratio": "y"}, "poly_ratio")])
def test_polynomial_preconditioner_options_out_of_range_are_refused(opts, match):
    """Degree 10^6 ran for minutes (no cap); ratio inf let through to a misleading 'not positive definite'; a string
    crashed in the cost model (session 32's sweep)."""
    A = st.SparseTensor.from_package(_poisson(10))
    with pytest.raises(st.InputError, match=match):
        st.solve(A, torch.ones(100, dtype=torch.float64), method="cg", preconditioner="polynomial", backend="torch",
                 backend_options=opts)


def test_a_torch_solver_moves_to_lu_when_new_values_are_not_symmetric():
    """Solver(A SPD, backend="torch") plans Cholesky; update_values with nonsymmetric values on the same pattern raised
    NotSymmetricError (no method or properties= was given): now the next solve moves to LU, as it does for symmetric
    indefinite values. Pinned to Cholesky it still raises. Reference: dense float64 solve."""
    A = st.SparseTensor.from_package(_poisson(8))
    b = torch.ones(64, dtype=torch.float64)
    coords, slots = A.entries()
    r, c = coords[0], coords[1]
    v = A.values.clone()
    v[slots[c > r]], v[slots[c < r]], v[slots[c == r]] = -1.5, -0.5, 4.0
    D = A.with_values(v).to_dense()
    s = st.Solver(A, backend="torch")
    s.solve(b)
    s.update_values(v)
    x = s.solve(b)
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-12, atol=1e-12)
    pinned = st.Solver(A, backend="torch", method="cholesky")
    pinned.solve(b)
    with pytest.raises(st.NotSymmetricError):
        pinned.update_values(v)
        pinned.solve(b)


def _laplacian_components(count: int, size: int = 20) -> sp.csr_array:
    blocks = []
    for c in range(count):
        W = sp.random(size, size, density=0.2, random_state=c)
        W = W + W.T + sp.eye(size, k=1) + sp.eye(size, k=-1)
        W.setdiag(0)
        W.eliminate_zeros()
        blocks.append(sp.diags(np.asarray(W.sum(1)).ravel()) - W)
    return sp.csr_array(sp.block_diag(blocks))


def test_arpack_missed_copy_check_allows_rounding_at_the_answers_edge():
    """Pinned ARPACK answers that are right were rejected as missing copies (session 32's sweep): a Laplacian's zero
    (three components, k = 1: the inertia count below the returned -2e-16 found two rounding-level negatives), a
    float32 Poisson matrix (a float32 value at the region's edge), complex64 Hermitian (the inertia count in
    complex64 found 17 eigenvalues below where there are 4). References: numpy.linalg.eigvalsh in float64."""
    pytest.importorskip("sparsetorch_scipy")
    L = _laplacian_components(3)
    w = st.eigsh(st.SparseTensor.from_package(L), 1, which="SA", backend="scipy", method="arpack")[0]
    assert abs(float(w[0])) <= 1e-12
    P = _poisson(12).astype(np.float32)
    ref = np.linalg.eigvalsh(P.toarray().astype(np.float64))
    w = st.eigsh(st.SparseTensor.from_package(P), 4, which="SA", backend="scipy", method="arpack")[0]
    np.testing.assert_allclose(np.sort(w.numpy()), ref[:4], rtol=1e-5)
    Hm = sp.random(100, 100, 0.05, random_state=0)
    C = sp.csr_matrix(_poisson(10) + 0.4j * (Hm - Hm.T)).astype(np.complex64)
    ref = np.linalg.eigvalsh(C.toarray().astype(np.complex128))
    for which, want in (("SA", ref[:4]), ("LA", ref[-4:])):
        w = st.eigsh(st.SparseTensor.from_package(C), 4, which=which, backend="scipy", method="arpack")[0]
        np.testing.assert_allclose(np.sort(w.numpy()), want, rtol=1e-5, atol=1e-5)


def test_smallest_of_a_laplacian_with_more_zero_copies_than_k_is_found_first_time():
    """20 components, k = 6: the SPD probe's 20 rounding-level pivots exceeded k, so the probe of A + delta I (and
    shift-invert below 0) was skipped; ARPACK in regular mode missed copies, Lanczos spent its budget and LOBPCG
    answered after 3.7 s (session 32's sweep). Every value 0 to rounding (numpy: 20 zeros), the first attempt
    accepted, residuals small."""
    pytest.importorskip("sparsetorch_scipy")
    blocks = []
    for c in range(20):
        W = sp.random(150, 150, density=0.2, random_state=c)
        W = W + W.T + sp.eye(150, k=1) + sp.eye(150, k=-1)
        W.setdiag(0)
        W.eliminate_zeros()
        blocks.append(sp.diags(np.asarray(W.sum(1)).ravel()) - W)
    L = sp.csr_array(sp.block_diag(blocks))
    w, V, info = st.eigsh(st.SparseTensor.from_package(L), 6, which="SA", return_info=True)
    assert np.abs(w.numpy()).max() <= 1e-10
    assert np.linalg.norm(L @ V.numpy() - V.numpy() * w.numpy(), axis=0).max() <= 1e-9
    assert info.extra["attempts"][0]["accepted"], info.extra["attempts"]


def _nonsymmetric_values(A):
    coords, slots = A.entries()
    r, c = coords[0], coords[1]
    v = A.values.clone()
    v[slots[c > r]], v[slots[c < r]], v[slots[c == r]] = -1.5, -0.5, 4.0
    return v


def test_a_solver_planned_on_symmetric_values_replans_for_nonsymmetric_ones():
    """Solver(method="cg") on SPD values, then nonsymmetric ones: 1,440 iterations to a NotConvergedError; now a
    NotSymmetricError naming what to do. Solver(method="gmres") planned on the symmetric values answered adjoint
    solves (the backward pass) with the forward operator and failed there; now it plans again and the gradient
    matches the dense one (torch.linalg.solve in float64)."""
    A = st.SparseTensor.from_package(_poisson(8))
    b = torch.ones(64, dtype=torch.float64)
    v = _nonsymmetric_values(A)
    cg = st.Solver(A, method="cg")
    cg.solve(b)
    with pytest.raises(st.NotSymmetricError, match="method='cg'"):
        cg.update_values(v)
    torch.testing.assert_close(cg.solve(b), torch.linalg.solve(A.to_dense(), b))  # it keeps the values it had
    s = st.Solver(A, method="gmres", backend="torch")
    s.solve(b)
    vv = v.clone().requires_grad_()
    s.update_values(vv)
    s.solve(b).sum().backward()
    D = A.with_values(v).to_dense().requires_grad_()
    torch.linalg.solve(D, b).sum().backward()
    coords, slots = A.entries()
    torch.testing.assert_close(vv.grad[slots], D.grad[coords[0], coords[1]], rtol=1e-9, atol=1e-11)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_solver_replans_for_nonsymmetric_values():
    """The same as above on CUDA values (the torch backend's CG / GMRES on the device; reference: dense float64)."""
    A = st.SparseTensor.from_package(_poisson(8)).to("cuda")
    b = torch.ones(64, dtype=torch.float64, device="cuda")
    v = _nonsymmetric_values(A)
    cg = st.Solver(A, method="cg")
    cg.solve(b)
    with pytest.raises(st.NotSymmetricError):
        cg.update_values(v)
    s = st.Solver(A)
    s.solve(b)
    s.update_values(v)
    x = s.solve(b)
    torch.testing.assert_close(x, torch.linalg.solve(A.with_values(v).to_dense(), b), rtol=1e-10, atol=1e-10)


def _laplacian_weighted(n: int, seed: int):
    rng = np.random.default_rng(seed)
    G = sp.random(n, n, density=0.6 if n <= 100 else 8.0 / n, random_state=rng)
    G = G + G.T
    G.data[:] = abs(G.data) + 0.1
    P = sp.diags([np.ones(n - 1)], [1])
    G = (G + P + P.T).tocsr()
    G.setdiag(0)
    G.eliminate_zeros()
    return (sp.diags(np.asarray(G.sum(1)).ravel()) - G).tocsr(), rng.standard_normal(n)


@pytest.mark.parametrize("case", ["dependent_row", "laplacian10", "laplacian3000"])
def test_an_inconsistent_singular_system_raises_instead_of_a_huge_answer(case):
    """Exactly singular A, b outside its range: the componentwise verdict (session 31) accepted an x of norm 5e16 with
    a relative residual of 2.2 (its componentwise backward error small only because x was huge; the Skeel floor of
    3e12-3e14 below the threshold), converged=True. Now SingularMatrixError, as dense LAPACK's condition says."""
    if case == "dependent_row":
        rng = np.random.default_rng(3)
        n = 100
        A = (sp.random(n, n, density=0.04, random_state=rng) + sp.eye(n) * rng.uniform(0.5, 2)).tolil()
        A[n - 1, :] = A[0, :] * 0.3 + A[1, :] * 1.7
        A, b = A.tocsr(), rng.standard_normal(n)
    else:
        A, b = _laplacian_weighted(10 if case == "laplacian10" else 3000, 0)
    assert np.linalg.cond(A.toarray()) > 1e15 if A.shape[0] <= 100 else True
    with pytest.raises(SingularMatrixError):
        st.solve(st.SparseTensor.from_package(A), torch.from_numpy(b))


@pytest.mark.parametrize("expr", ["A.T @ X", "st.matmul(A.T, X)", "A.mT @ X", "A.t() @ X", "X.T @ A", "A.mH @ X"])
def test_compiled_transposed_products_of_complex_matrices(expr):
    """Under torch.compile A.T @ X of a complex A came back as A^H X (off by up to 14 on a 10 x 10 matrix): the torch
    backend kept A^T's values as a lazy conj view, and the serial SciPy product read their storage where the
    Conjugate dispatch key was not active (the compiled graph's run). Reference: the dense product, complex128."""
    torch.manual_seed(0)
    D = torch.randn(10, 10, dtype=torch.complex128) * (torch.rand(10, 10) < 0.4)
    A = st.SparseTensor.from_dense(D)
    X = torch.randn(10, 3, dtype=torch.complex128)
    fn = eval(f"lambda A, X: {expr}")  # noqa: S307 - a fixed expression of this test
    ref = eval(expr, {"A": D, "X": X, "st": st}) if "st." not in expr else D.T @ X  # noqa: S307
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(A, X)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_a_sparse_linear_checkpoint_of_another_format_is_refused():
    """A CSC layer's state dict loaded into a CSR layer of a square weight: same buffer names and shapes, and the
    layer then multiplied by W^T without a word (session 32's sweep). The format now travels in the state dict
    (_extra_state) and a mismatch loads nothing; same-format checkpoints, torch.save / load(weights_only=True) and
    checkpoints without the record (written before) load as before. Reference: the dense W."""
    import io

    from sparsetorch.format import CSC, CSR

    W = torch.tensor([[1.0, 2.0, 0.0], [0.0, 3.0, 0.0], [4.0, 0.0, 5.0]], dtype=torch.float64)
    src = st.nn.SparseLinear(st.SparseTensor.from_dense(W).convert(CSC))
    dst = st.nn.SparseLinear(st.SparseTensor.from_dense(2 * W).convert(CSR))
    with pytest.raises(RuntimeError, match="format"):
        dst.load_state_dict(src.state_dict())
    x = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(dst(x), x @ (2 * W).T)  # nothing of dst was loaded
    same = st.nn.SparseLinear(st.SparseTensor.from_dense(2 * W).convert(CSC))
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    same.load_state_dict(torch.load(buf, weights_only=True))
    torch.testing.assert_close(same(x), x @ W.T)
    older = {k: v for k, v in src.state_dict().items() if k != "_extra_state"}
    assert not same.load_state_dict(older).missing_keys


def test_a_batched_right_hand_side_with_no_inner_rows():
    """A 4 x 0 matrix against X of shape (5, 0, 2): a raw RuntimeError from reshape(0, -1); now zeros (5, 4, 2), as
    dense torch gives; an expanded c (written in place) is refused by name instead of torch's overlap error."""
    A = st.SparseTensor.from_dense(torch.zeros(4, 0, dtype=torch.float64))
    X = torch.zeros(5, 0, 2, dtype=torch.float64)
    for Y in (A @ X, st.matmul(A, X), st.SparseTensor.from_dense(torch.zeros(0, 4, dtype=torch.float64)).T @ X):
        torch.testing.assert_close(Y, torch.zeros(4, 0, dtype=torch.float64) @ X)
    eye = st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64))
    with pytest.raises(st.InputError, match="sharing"):
        st.matmul(eye, torch.ones(3, 2, dtype=torch.float64), torch.zeros(3, 1, dtype=torch.float64).expand(3, 2))


def test_reformat_model_with_subclasses_leaves_attention_out_proj_dense():
    """subclasses=True replaced MultiheadAttention's out_proj, whose owner reads out_proj.weight itself: the forward
    raised torch's TypeError. Now it stays dense with a warning, the MLP is pruned, and the block's output equals the
    masked-dense twin's (reference: the same block with the pruned weights written back dense)."""
    import copy

    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).double()
    twin = copy.deepcopy(enc)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with pytest.warns(UserWarning, match="out_proj"):
        st.nn.reformat_model(enc, st.nn.magnitude(0.5), subclasses=True)
    assert isinstance(enc.linear1, st.nn.SparseLinear) and not isinstance(enc.self_attn.out_proj, st.nn.SparseLinear)
    with torch.no_grad():
        for name in ("linear1", "linear2"):
            getattr(twin, name).weight.copy_(getattr(enc, name).weight.to_dense())
    torch.testing.assert_close(enc(x), twin(x), rtol=1e-12, atol=1e-12)


def test_a_matrix_free_solve_of_an_affine_map_says_it_is_not_linear():
    """An operator with a bias (v -> lin(v) + 3 v) failed with a message blaming the tolerance and the dtype (already
    float64); the failure now notes A(0) != 0. A linear operator still solves (reference: dense float64)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).double()
    with pytest.raises(st.NotConvergedError, match="not linear"):
        st.solve(lambda v: lin(v) + 3 * v, torch.randn(8, dtype=torch.float64))
    W = torch.randn(8, 8, dtype=torch.float64) + 8 * torch.eye(8, dtype=torch.float64)
    x = st.solve(lambda v: W @ v, torch.ones(8, dtype=torch.float64))
    torch.testing.assert_close(x, torch.linalg.solve(W, torch.ones(8, dtype=torch.float64)), rtol=1e-9, atol=1e-10)


def test_pinned_eigen_ldlt_on_an_indefinite_matrix_does_not_call_it_singular_alone():
    """A shifted 2-D Laplacian (indefinite, condition ~1e3): Eigen's LDL^T without pivoting meets a zero pivot, and
    the error said only "the matrix is singular ... check the system"; it now names the indefinite case and LU. LU
    answers it (reference: spsolve)."""
    pytest.importorskip("sparsetorch_eigen")
    import scipy.sparse.linalg as sla

    n = 40
    M = (_poisson(n) - 2.0 * sp.identity(n * n)).tocsr()
    A = st.SparseTensor.from_package(sp.csr_array(M))
    b = torch.ones(n * n, dtype=torch.float64)
    with pytest.raises(SingularMatrixError, match="indefinite"):
        st.solve(A, b, backend="eigen", method="ldlt")
    x = st.solve(A, b, backend="eigen", method="lu")
    np.testing.assert_allclose(x.numpy(), sla.spsolve(M.tocsc(), b.numpy()), rtol=1e-9, atol=1e-12)
