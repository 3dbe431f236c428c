"""The pure-PyTorch Krylov solvers against dense NumPy/SciPy float64 references.

Covers values (SPD, non-symmetric, symmetric indefinite, complex Hermitian; several right-hand
sides and a batch of different matrices), SciPy's rtol/atol semantics and iteration counts, every
stop status, preconditioners, input immutability, and the number of convergence checks (each
check is the loop's only host synchronisation).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetorch.backends.torch_native.krylov import (
    bicgstab, block_jacobi, cg, gmres, identity, jacobi, minres,
)
from sparsetorch.errors import InputError, SingularMatrixError
from sparsetorch.ops.info import Status

ALL = [cg, minres, gmres, bicgstab]
HERMITIAN = [cg, minres]
GENERAL = [gmres, bicgstab]
DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]
IDS = lambda f: f.__name__  # noqa: E731


# ----------------------------------------------------------------------------- matrices

def poisson2d(m: int) -> np.ndarray:
    """The 5-point Laplacian on an m x m grid (SPD), dense float64."""
    T = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    return (sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m))).toarray()


def convection_diffusion(m: int, c: float = 40.0) -> np.ndarray:
    """Upwind-free central convection-diffusion on an m x m grid (non-symmetric), dense float64."""
    h = 1.0 / (m + 1)
    T = sp.diags([(-1 - c * h / 2) * np.ones(m - 1), 2 * np.ones(m), (-1 + c * h / 2) * np.ones(m - 1)],
                 [-1, 0, 1])
    return (sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m))).toarray()


def mv(A: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.float64):
    At = torch.as_tensor(A).to(dtype)
    return lambda X: At @ X


def rhs(rng: np.random.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    b = rng.standard_normal(shape)
    if dtype.is_complex:
        b = b + 1j * rng.standard_normal(shape)
    return torch.tensor(b).to(dtype)


def true_rel_residual(A: np.ndarray, x: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """max over columns of ||b - A x|| / ||b||, in float64/complex128."""
    xn = x.to(torch.complex128).numpy()
    bn = b.to(torch.complex128).numpy()
    r = bn - A @ xn
    return (np.linalg.norm(r, axis=-2) / np.linalg.norm(bn, axis=-2)).max()


def tol_for(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol to ask for, allowed relative error of x against the float64 reference)."""
    single = dtype in (torch.float32, torch.complex64)
    return (1e-5, 2e-3) if single else (1e-10, 1e-7)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# ----------------------------------------------------------------------------- values

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_spd_poisson_matches_dense_reference(solver, dtype, rng) -> None:
    A = poisson2d(10)
    b = rhs(rng, (A.shape[0], 1), dtype)
    rtol, xtol = tol_for(dtype)
    x, info = solver(mv(A, dtype), b, rtol=rtol)
    assert info.status is Status.CONVERGED and info.converged, info.reason
    assert x.dtype == dtype and x.shape == b.shape
    ref = np.linalg.solve(A, b.to(torch.complex128).numpy())
    assert np.linalg.norm(x.to(torch.complex128).numpy() - ref) <= xtol * np.linalg.norm(ref)
    # the reported residual is the true one, and it meets the tolerance
    true = true_rel_residual(A, x, b)
    assert info.residual <= rtol
    assert true <= 2 * rtol
    assert info.residual == pytest.approx(true, rel=0.05, abs=1e-6 if rtol > 1e-6 else 1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("solver", GENERAL, ids=IDS)
def test_nonsymmetric_convection_diffusion(solver, dtype, rng) -> None:
    A = convection_diffusion(10)
    if dtype.is_complex:
        A = A + 0.3j * rng.standard_normal(A.shape) / math.sqrt(A.shape[0])
    assert np.abs(A - A.conj().T).max() > 0.1
    b = rhs(rng, (A.shape[0], 2), dtype)
    rtol, xtol = tol_for(dtype)
    x, info = solver(mv(A, dtype), b, rtol=rtol)
    assert info.status is Status.CONVERGED, info.reason
    ref = np.linalg.solve(A, b.to(torch.complex128).numpy())
    assert np.linalg.norm(x.to(torch.complex128).numpy() - ref) <= 10 * xtol * np.linalg.norm(ref)
    assert true_rel_residual(A, x, b) <= 2 * rtol


def test_minres_symmetric_indefinite(rng) -> None:
    A = poisson2d(10) - 1.3 * np.eye(100)
    eig = np.linalg.eigvalsh(A)
    assert eig.min() < 0 < eig.max() and np.abs(eig).min() > 1e-3
    b = rhs(rng, (100, 2), torch.float64)
    x, info = minres(mv(A), b, rtol=1e-10)
    assert info.status is Status.CONVERGED, info.reason
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(A, b.numpy()), rtol=0, atol=1e-7)
    # CG on the same matrix must not pretend
    _, info_cg = cg(mv(A), b, rtol=1e-10)
    assert info_cg.status is Status.INDEFINITE and not info_cg.converged


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("solver", HERMITIAN, ids=IDS)
def test_complex_hermitian(solver, dtype, rng) -> None:
    n = 60
    B = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    H = B @ B.conj().T / n + 0.5 * np.eye(n)
    assert np.abs(H.imag).max() > 0.1
    b = rhs(rng, (n, 3), dtype)
    rtol, xtol = tol_for(dtype)
    x, info = solver(mv(H, dtype), b, rtol=rtol)
    assert info.status is Status.CONVERGED, info.reason
    ref = np.linalg.solve(H, b.to(torch.complex128).numpy())
    assert np.linalg.norm(x.to(torch.complex128).numpy() - ref) <= 10 * xtol * np.linalg.norm(ref)


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_multiple_rhs_and_batch_of_different_matrices(solver, rng) -> None:
    n = 64
    A0 = poisson2d(8)
    if solver in GENERAL:
        A0 = convection_diffusion(8)
    A1 = A0 + np.diag(rng.uniform(0.5, 2.0, n))  # a different matrix per batch entry
    Ab = torch.tensor(np.stack([A0, A1]))
    b = rhs(rng, (2, n, 3), torch.float64)
    b[1, :, 2] = 0.0  # a zero column inside the batch
    x, info = solver(lambda X: torch.bmm(Ab, X), b, rtol=1e-10)
    assert info.status is Status.CONVERGED, info.reason
    ref = np.linalg.solve(Ab.numpy(), b.numpy())
    np.testing.assert_allclose(x.numpy(), ref, rtol=0, atol=1e-7)
    assert torch.all(x[1, :, 2] == 0)
    # each (batch, column) pair is independent: solving one alone gives the same answer
    x1, _ = solver(mv(A1), b[1, :, :1], rtol=1e-10)
    np.testing.assert_allclose(x1.numpy(), x[1, :, :1].numpy(), rtol=0, atol=1e-8)


def test_torch_csr_matvec(rng) -> None:
    A = sp.csr_matrix(poisson2d(16))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        At = torch.sparse_csr_tensor(
            torch.tensor(A.indptr), torch.tensor(A.indices), torch.tensor(A.data), A.shape,
            check_invariants=True,
        )
    b = rhs(rng, (A.shape[0], 2), torch.float64)
    for solver in ALL:
        x, info = solver(lambda X: At @ X, b, rtol=1e-8)
        assert info.converged, info.reason
        assert true_rel_residual(A.toarray(), x, b) <= 1e-8


# ----------------------------------------------------------------------------- tolerances

@pytest.mark.parametrize("solver, reference", [
    (cg, spla.cg), (minres, spla.minres), (bicgstab, spla.bicgstab), (gmres, spla.gmres),
], ids=["cg", "minres", "bicgstab", "gmres"])
def test_iteration_count_close_to_scipy(solver, reference, rng) -> None:
    A = poisson2d(12)
    b = rng.standard_normal(A.shape[0])
    count = [0]
    kwargs = dict(rtol=1e-8, callback=lambda _: count.__setitem__(0, count[0] + 1))
    if reference is spla.gmres:
        kwargs.update(restart=10, callback_type="pr_norm")
    _, flag = reference(A, b, **kwargs)
    assert flag == 0
    extra = dict(restart=10) if solver is gmres else {}
    x, info = solver(mv(A), torch.tensor(b)[:, None], rtol=1e-8, check_every=1, **extra)
    assert info.converged
    assert count[0] / 1.5 <= info.iterations <= 1.5 * count[0], (info.iterations, count[0])
    if solver is not minres:  # MINRES: SciPy stops on its own (looser) estimate
        assert abs(info.iterations - count[0]) <= 2


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_atol_alone_is_absolute(solver, rng) -> None:
    A = poisson2d(10)
    b = 1e3 * rhs(rng, (100, 1), torch.float64)
    atol = 1e-4
    x, info = solver(mv(A), b, rtol=0.0, atol=atol)
    assert info.converged, info.reason
    r = b.numpy() - A @ x.numpy()
    assert np.linalg.norm(r) <= atol
    # the loosest of the two wins: a huge atol converges at once
    _, info2 = solver(mv(A), b, rtol=1e-12, atol=10 * float(torch.linalg.norm(b)))
    assert info2.converged and info2.iterations == 0


# ----------------------------------------------------------------------------- statuses

@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_maxiter_reports_max_iterations(solver, rng) -> None:
    A = poisson2d(12)
    b = rhs(rng, (144, 1), torch.float64)
    extra = dict(restart=2) if solver is gmres else {}
    x, info = solver(mv(A), b, maxiter=3, rtol=1e-12, **extra)
    assert info.status is Status.MAX_ITERATIONS and not info.converged
    assert info.iterations == (6 if solver is gmres else 3)
    assert "maxiter" in info.reason
    assert info.residual == pytest.approx(true_rel_residual(A, x, b), rel=1e-6)
    assert 1e-12 < info.residual < 1


def test_cg_indefinite_reports_indefinite(rng) -> None:
    A = np.diag(np.r_[np.linspace(1, 2, 20), -1.0])
    b = torch.ones(21, 1, dtype=torch.float64)
    x, info = cg(mv(A), b)
    assert info.status is Status.INDEFINITE and not info.converged
    assert "p^T A p" in info.reason and "not positive definite" in info.reason
    assert torch.isfinite(x).all()
    Ac = A.astype(complex)
    _, info_c = cg(mv(Ac, torch.complex128), b.to(torch.complex128))
    assert info_c.status is Status.INDEFINITE and "p^H A p" in info_c.reason


def test_bicgstab_breakdown() -> None:
    # rh^H A p = 0 whatever the shadow residual: restarts cannot help, BREAKDOWN after them
    A = np.array([[0.0, 1.0], [1.0, 0.0]])
    b = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    x, info = bicgstab(mv(A), b, check_every=1)
    assert info.status is Status.BREAKDOWN and not info.converged
    assert "broke down" in info.reason and "rh^H A M^-1 p" in info.reason
    assert torch.isfinite(x).all() and info.iterations <= 8
    x, info = gmres(mv(A), b)  # GMRES has no such breakdown
    assert info.converged
    np.testing.assert_allclose(x.numpy(), [[0.0], [1.0]], atol=1e-12)


def test_bicgstab_restarts_on_unit_vector_right_hand_sides(rng) -> None:
    # Sparse right-hand sides (columns of I, as for jacrev cotangents) on a sparse random
    # matrix meet rh^H A p = 0 exactly; a restart with rh = r gets past it.
    n = 40
    A = np.diag(rng.uniform(2.0, 3.0, n))
    rows, cols = rng.integers(0, n, 80), rng.integers(0, n, 80)
    A[rows, cols] += rng.uniform(-0.5, 0.5, 80)
    x, info = bicgstab(mv(A), torch.eye(n, dtype=torch.float64), rtol=1e-10)
    assert info.converged, info.reason
    np.testing.assert_allclose(x.numpy(), np.linalg.inv(A), atol=1e-8)


@pytest.mark.parametrize("solver", [gmres, minres], ids=IDS)
def test_singular_matrix_with_b_outside_its_range_breaks_down(solver, rng) -> None:
    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    for D in (np.diag([1.0, 2.0, 0.0]), Q @ np.diag([1.0, 2.0, 3.0, -1.0, 0.5, 0.0]) @ Q.T):
        b = torch.ones(D.shape[0], 1, dtype=torch.float64)
        x, info = solver(mv(D), b)
        assert info.status is Status.BREAKDOWN and not info.converged, info.reason
        assert "singular" in info.reason
        assert torch.isfinite(x).all()
        # x is still the minimal-residual answer: ||b - A x|| = distance of b to range(A)
        lsq = np.linalg.lstsq(D, b.numpy(), rcond=1e-12)[0]
        assert info.residual == pytest.approx(
            np.linalg.norm(b.numpy() - D @ lsq) / np.linalg.norm(b.numpy()), rel=1e-6)


@pytest.mark.parametrize("solver", HERMITIAN, ids=IDS)
def test_indefinite_preconditioner_is_reported(solver, rng) -> None:
    A = poisson2d(5)
    M = jacobi(-torch.tensor(np.diag(A).copy()))
    x, info = solver(mv(A), rhs(rng, (25, 1), torch.float64), M=M)
    assert info.status is Status.INDEFINITE and "preconditioner" in info.reason
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_nan_in_b_is_not_finite(solver, rng) -> None:
    A = poisson2d(6)
    b = rhs(rng, (36, 2), torch.float64)
    b[5, 1] = float("nan")
    x, info = solver(mv(A), b, rtol=1e-8)
    assert info.status is Status.NOT_FINITE and not info.converged
    assert "NaN" in info.reason and "column 1" in info.reason
    # the healthy column was still solved
    np.testing.assert_allclose(x[:, 0].numpy(), np.linalg.solve(A, b[:, 0].numpy()), atol=1e-6)


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_nan_from_the_operator_keeps_last_good_x(solver, rng) -> None:
    A = torch.tensor(poisson2d(6))
    calls = [0]

    def bad(X: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        Y = A @ X
        return Y * float("nan") if calls[0] >= 4 else Y

    x, info = solver(bad, rhs(rng, (36, 1), torch.float64), rtol=1e-10)
    assert info.status is Status.NOT_FINITE
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_zero_b_gives_zero_x_in_zero_iterations(solver) -> None:
    A = poisson2d(5)
    b = torch.zeros(2, 25, 3, dtype=torch.float64)
    x0 = torch.ones_like(b)
    seen: list[int] = []
    x, info = solver(mv(A), b, x0=x0, callback=lambda i, r: seen.append(i))
    assert info.status is Status.CONVERGED and info.iterations == 0 and info.residual == 0.0
    assert torch.all(x == 0) and not seen and info.history == ()


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_exact_x0_needs_no_iteration(solver, rng) -> None:
    A = poisson2d(6)
    b = rhs(rng, (36, 1), torch.float64)
    x0 = torch.tensor(np.linalg.solve(A, b.numpy()))
    x, info = solver(mv(A), b, x0=x0, rtol=1e-8)
    assert info.converged and info.iterations == 0
    assert torch.equal(x, x0)


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_inputs_are_not_modified(solver, rng) -> None:
    A = poisson2d(6)
    b = rhs(rng, (36, 2), torch.float64)
    x0 = rhs(rng, (36, 2), torch.float64)
    diag = torch.tensor(np.diag(A).copy())
    b_copy, x0_copy, diag_copy = b.clone(), x0.clone(), diag.clone()
    x, info = solver(mv(A), b, x0=x0, M=jacobi(diag), rtol=1e-8)
    assert info.converged
    assert torch.equal(b, b_copy) and torch.equal(x0, x0_copy) and torch.equal(diag, diag_copy)
    assert x.data_ptr() not in (b.data_ptr(), x0.data_ptr())


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_no_autograd_graph_through_the_iterations(solver, rng) -> None:
    A = torch.tensor(poisson2d(5), requires_grad=True)
    b = rhs(rng, (25, 1), torch.float64).requires_grad_()
    x, info = solver(lambda X: A @ X, b, rtol=1e-10)
    assert info.converged and not x.requires_grad and x.grad_fn is None


def test_empty_systems() -> None:
    for shape in [(0, 1), (4, 0), (3, 0, 2)]:
        b = torch.zeros(shape, dtype=torch.float64)
        for solver in ALL:
            x, info = solver(lambda X: X, b)
            assert x.shape == b.shape and info.converged and info.iterations == 0


@pytest.mark.parametrize("check_every", [1, 3, 8])
@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_checks_are_the_only_syncs_and_are_counted(solver, check_every, rng) -> None:
    A = poisson2d(10)
    b = rhs(rng, (100, 2), torch.float64)
    seen: list[tuple[int, float]] = []
    x, info = solver(mv(A), b, rtol=1e-8, check_every=check_every,
                     callback=lambda i, r: seen.append((i, r)))
    assert info.converged
    assert len(seen) == math.ceil(info.iterations / check_every) == len(info.history)
    assert [i for i, _ in seen] == [check_every * (j + 1) for j in range(len(seen))]
    assert [r for _, r in seen] == list(info.history)
    assert seen[-1][1] <= 1e-8 < seen[0][1]
    # also when stopped by maxiter at a non-multiple of check_every
    seen.clear()
    _, info = solver(mv(A), b, rtol=1e-14, maxiter=7, check_every=check_every,
                     callback=lambda i, r: seen.append((i, r)), **({"restart": 1} if solver is gmres else {}))
    assert len(seen) == math.ceil(info.iterations / check_every) and seen[-1][0] == info.iterations


def test_residual_gap_in_float32_is_reported_not_hidden(rng) -> None:
    A = poisson2d(12)
    b = rhs(rng, (144, 1), torch.float32)
    for solver in (cg, gmres, bicgstab):
        x, info = solver(mv(A, torch.float32), b, rtol=1e-10)  # below float32's reach
        assert not info.converged and info.status is Status.MAX_ITERATIONS, info.reason
        assert info.residual == pytest.approx(true_rel_residual(A, x, b), rel=0.2)
        assert info.residual > 1e-10


# ----------------------------------------------------------------------------- preconditioners

@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_jacobi_beats_no_preconditioner_on_badly_scaled_matrix(solver, rng) -> None:
    n = 64
    d = np.logspace(0, 4, n)
    rng.shuffle(d)
    S = np.diag(np.sqrt(d))
    A = S @ poisson2d(8) @ S
    b = rhs(rng, (n, 1), torch.float64)
    _, plain = solver(mv(A), b, rtol=1e-8, check_every=1)
    x, pre = solver(mv(A), b, rtol=1e-8, check_every=1, M=jacobi(torch.tensor(np.diag(A).copy())))
    _, ident = solver(mv(A), b, rtol=1e-8, check_every=1, M=identity())
    assert pre.converged, pre.reason
    assert pre.iterations < plain.iterations / 2, (pre.iterations, plain.iterations)
    assert ident.iterations == plain.iterations
    assert true_rel_residual(A, x, b) <= 1e-8


def _spd_blocks(rng: np.random.Generator, nblocks: int, bs: int) -> np.ndarray:
    B = rng.standard_normal((nblocks, bs, bs))
    return B @ B.transpose(0, 2, 1) + bs * np.eye(bs)


@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_block_jacobi_is_exact_on_block_diagonal_matrix(solver, rng) -> None:
    bs, nblocks, n = 4, 9, 34  # n not a multiple of bs: the last block is cut
    blocks = _spd_blocks(rng, nblocks, bs)
    A = scipy.linalg.block_diag(*blocks)[:n, :n]
    M = block_jacobi(torch.tensor(blocks), n)
    b = rhs(rng, (n, 3), torch.float64)
    np.testing.assert_allclose(M(b).numpy(), np.linalg.solve(A, b.numpy()), atol=1e-12)
    x, info = solver(mv(A), b, M=M, rtol=1e-10, check_every=1)
    assert info.converged and info.iterations == 1, info
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(A, b.numpy()), atol=1e-10)


def test_block_jacobi_batched_and_complex(rng) -> None:
    bs, nblocks = 3, 5
    n = bs * nblocks
    blocks = np.stack([_spd_blocks(rng, nblocks, bs), _spd_blocks(rng, nblocks, bs)])
    M = block_jacobi(torch.tensor(blocks), n)
    b = rhs(rng, (2, n, 2), torch.complex128)
    ref = np.stack([np.linalg.solve(scipy.linalg.block_diag(*blocks[i]), b[i].numpy()) for i in range(2)])
    np.testing.assert_allclose(M(b).numpy(), ref, atol=1e-12)
    with pytest.raises(InputError, match="float64"):
        M(b.to(torch.complex64))


def test_jacobi_zero_diagonal_names_the_row() -> None:
    with pytest.raises(SingularMatrixError, match="diagonal entry 2 ") as err:
        jacobi(torch.tensor([1.0, 3.0, 0.0, 0.0], dtype=torch.float64))
    assert err.value.row == 2
    with pytest.raises(SingularMatrixError, match=r"entry 1 of batch \(1,\)"):
        jacobi(torch.tensor([[1.0, 2.0], [1.0, 0.0]]))


def test_block_jacobi_singular_block_names_the_block(rng) -> None:
    blocks = _spd_blocks(rng, 4, 3)
    blocks[2] = np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]])  # rank 2
    with pytest.raises(SingularMatrixError, match=r"block 2 \(rows 6..8\)") as err:
        block_jacobi(torch.tensor(blocks), 12)
    assert 6 <= err.value.row <= 8
    with pytest.raises(InputError, match="ceil"):
        block_jacobi(torch.tensor(blocks), 20)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_bad_input_raises_input_error(solver) -> None:
    A = mv(poisson2d(3))
    b = torch.ones(9, 1, dtype=torch.float64)
    with pytest.raises(InputError, match="unsqueeze"):
        solver(A, torch.ones(9, dtype=torch.float64))
    with pytest.raises(InputError, match="dtype"):
        solver(A, torch.ones(9, 1, dtype=torch.int64))
    with pytest.raises(InputError, match="x0"):
        solver(A, b, x0=torch.ones(9, 2, dtype=torch.float64))
    with pytest.raises(InputError, match="check_every"):
        solver(A, b, check_every=0)
    with pytest.raises(InputError, match="rtol"):
        solver(A, b, rtol=-1.0)
    with pytest.raises(InputError, match="matvec returned"):
        solver(lambda X: X[:-1], b)


# ----------------------------------------------------------------------------- properties

@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 12), k=st.integers(1, 3), seed=st.integers(0, 2**16),
    zero_col=st.booleans(), method=st.sampled_from(ALL),
)
def test_random_spd_systems(n, k, seed, zero_col, method) -> None:
    r = np.random.default_rng(seed)
    B = r.standard_normal((n, n))
    A = B @ B.T + n * np.eye(n)
    b = r.standard_normal((n, k))
    if zero_col:
        b[:, 0] = 0.0
    x, info = method(mv(A), torch.tensor(b), rtol=1e-10)
    assert info.converged, info.reason
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(A, b), rtol=0, atol=1e-8 * max(1.0, np.abs(b).max()))


# ----------------------------------------------------------------------------- GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("solver", ALL, ids=IDS)
def test_cuda_matches_cpu_and_syncs_only_at_checks(solver, rng) -> None:
    A = poisson2d(16)
    b = rhs(rng, (2, 256, 3), torch.float64)
    x_cpu, info_cpu = solver(mv(A), b, rtol=1e-8)
    Ad = torch.tensor(A, device="cuda")
    bd = b.cuda()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            x, info = solver(lambda X: Ad @ X, bd, rtol=1e-8, check_every=4)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert x.device.type == "cuda" and info.converged, info.reason
    torch.testing.assert_close(x.cpu(), x_cpu, rtol=0, atol=1e-7)
    checks = math.ceil(info.iterations / 4)
    assert len(info.history) == checks
    assert len(syncs) <= checks + 8, (len(syncs), checks)


def test_cg_with_an_unreachable_tolerance_stops_at_maxiter_not_with_nan():
    # The recurrence residual underflows long before the true one stops improving; that is not
    # a NaN in the data (it used to be reported as NOT_FINITE at iteration 1664).
    import sparsetorch as st
    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(48)
    b = torch.ones(48 * 48, dtype=torch.float64)
    x, info = st.solve(A, b, method="cg", backend="torch", rtol=1e-300, maxiter=3000, preconditioner="none",
                       on_nonconvergence="ignore", return_info=True)
    assert info.status is st.Status.MAX_ITERATIONS
    assert info.residual < 1e-12 and bool(torch.isfinite(x).all())
