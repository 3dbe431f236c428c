"""eigsh refuses eigenpairs from the wrong end of the spectrum (``_checks.wrong_end``): pairs whose residuals
meet the contract but which cheap bounds (Rayleigh quotients of e_i and of the all-ones vector, the diagonal's
partial sums, the columns' norms) prove are not the k wanted ones are a failed attempt, so the next method
answers, or a pinned one raises :class:`NotConvergedError`. And correct answers, in float32 too, generalized,
indefinite, with equal diagonal entries, at tiny and huge scales, are never refused (checked against
``numpy.linalg.eigh`` / ``scipy.linalg.eigh`` in float64).

The backends are registered in-process (tests/test_plugins.py's ``backends`` fixture and ``FakeBackend``): a
backend whose plan computes the pencil's eigenpairs exactly (float64 LAPACK) and returns the wanted ones, or
those of the other end.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

import sparsetorch
from sparsetorch import BackendInfo
from sparsetorch.errors import NoBackendError, NotConvergedError

from test_plugins import FakeBackend, backends  # noqa: F401

WRONG = "returned eigenvalues that are not the"


# Test doubles -------------------------------------------------------------------------------------------------------
def _select(lam: np.ndarray, k: int, which: str, sigma: float | None, wrong: bool) -> np.ndarray:
    """Indices of the k wanted eigenvalues of ``lam`` (ascending), or of the k at the other end."""
    if sigma is not None:
        key = np.abs(lam - sigma)
    else:
        key = {"LA": -lam, "SA": lam, "LM": -np.abs(lam), "SM": np.abs(lam)}[which]
    return np.argsort(-key if wrong else key, kind="stable")[:k]


class EigPlan:
    """eigsh by LAPACK in float64 on A's (and M's) values as stored: the wanted pairs (``mode="exact"``), those
    of the other end (``"wrong"``), the other end for value-batch member 1 only (``"wrong1"``), or the k after
    the most wanted one (``"missed"``: interior pairs, the extreme one missed); returned in
    A's dtype, ascending, ``V^H M V = I``."""

    preconditioner = None

    def __init__(self, A: sparsetorch.SparseTensor, backend: str, method: str, mode: str) -> None:
        self.A, self.backend, self.method, self.mode = A, backend, method, mode
        self.D: torch.Tensor | None = None
        self.calls = 0

    def set_values(self, values: torch.Tensor) -> None:
        self.D = self.A.with_values(values.detach()).to_dense()

    def eigsh(self, k, *, which="LM", sigma=None, M=None, tol=0.0, maxiter=None, v0=None):
        self.calls += 1
        D = self.D
        batch = tuple(D.shape[:-2])
        n = D.shape[-1]
        Dn = D.reshape(-1, n, n).to(torch.complex128 if D.is_complex() else torch.float64).numpy()
        Mn = None
        if M is not None:
            Md = M.to_dense()
            Mn = Md.to(torch.complex128 if Md.is_complex() else torch.float64).numpy()
        ws, Vs = [], []
        for b in range(Dn.shape[0]):
            Mb = None if Mn is None else (Mn if Mn.ndim == 2 else Mn.reshape(-1, n, n)[b])
            lam, X = scipy.linalg.eigh(Dn[b], Mb, lower=True)  # the lower triangle, as torch.linalg.eigh reads
            wrong = self.mode == "wrong" or (self.mode == "wrong1" and b == 1)
            if self.mode == "missed":  # the k after the most wanted one (missed: interior pairs)
                idx = np.sort(_select(lam, k + 1, which, sigma, False)[1:])
            else:
                idx = np.sort(_select(lam, k, which, sigma, wrong))
            ws.append(lam[idx])
            Vs.append(X[:, idx])
        real = D.real.dtype if D.is_complex() else D.dtype
        w = torch.as_tensor(np.stack(ws)).to(real).reshape(*batch, k)
        V = torch.as_tensor(np.stack(Vs)).to(D.dtype).reshape(*batch, n, k)
        return w, V, sparsetorch.IterationResult(0, float("nan"), True, sparsetorch.Status.DIRECT, f"LAPACK ({self.mode})")


class EigBackend(FakeBackend):
    """test_plugins.FakeBackend declaring eigsh ("dense", cheaper than anything) with :class:`EigPlan`."""

    def __init__(self, name: str, mode: str) -> None:
        super().__init__(name, seconds=1e-12, method="dense")
        self.mode = mode
        self.plans: list[EigPlan] = []

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=self.name, version="1", description="test double", devices=("cpu",),
                           dtypes=(torch.float32, torch.float64, torch.complex64, torch.complex128),
                           ops={"eigsh": ("dense",)})

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        if request.op != "eigsh":
            return []
        return super().sparsetorch_offers(request)

    def build(self, A, request) -> EigPlan:
        self.built += 1
        self.plans.append(EigPlan(A, self.name, self.method, self.mode))
        return self.plans[-1]


# Matrices -----------------------------------------------------------------------------------------------------------
def _tridiag(diag: np.ndarray, off: float) -> np.ndarray:
    n = diag.shape[0]
    return np.diag(diag) + off * (np.eye(n, k=1) + np.eye(n, k=-1))


def _indefinite(n: int = 24) -> np.ndarray:
    """Tridiagonal, diagonal from -3 to 4, off-diagonal 1: eigenvalues in about [-4.3, 5.3], none near 0, no two
    of one magnitude."""
    return _tridiag(np.linspace(-3.0, 4.0, n), 1.0)


def _random_indefinite(n: int = 20, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    R = rng.standard_normal((n, n)) * (rng.random((n, n)) < 0.3)
    return (R + R.T) / 2 + np.diag(rng.standard_normal(n))


def _laplacian(n: int = 24) -> np.ndarray:
    """The 1-D Laplacian: every diagonal entry 2, eigenvalues in (0, 4)."""
    return _tridiag(np.full(n, 2.0), -1.0)


def _mass(n: int = 24) -> np.ndarray:
    """The 1-D linear finite-element mass matrix (SPD, not diagonal)."""
    return _tridiag(np.full(n, 4.0 / 6.0), 1.0 / 6.0)


def _sparse(D: np.ndarray, dtype=torch.float64) -> sparsetorch.SparseTensor:
    return sparsetorch.SparseTensor.from_dense(torch.as_tensor(D).to(dtype))


def _reference(D: np.ndarray, M: np.ndarray | None, k: int, which: str, sigma: float | None = None) -> np.ndarray:
    """The k wanted eigenvalues, ascending: numpy.linalg.eigh in float64 (scipy.linalg.eigh for a pencil)."""
    lam = np.linalg.eigvalsh(D) if M is None else scipy.linalg.eigh(D, M, eigvals_only=True)
    return np.sort(lam[_select(lam, k, which, sigma, False)])


def _refused(info) -> list[dict]:
    return [a for a in info.extra["attempts"] if WRONG in a["why"]]


# The wrong end is refused -------------------------------------------------------------------------------------------
# (a generalized "SM" is not checked: its bound needs M^-1)
@pytest.mark.parametrize("which, generalized", [("LA", False), ("SA", False), ("LM", False), ("SM", False),
                                                ("LA", True), ("SA", True), ("LM", True)])
def test_pairs_from_the_wrong_end_are_refused_and_the_next_method_answers(backends, which, generalized) -> None:  # noqa: F811
    fake = EigBackend("wrongend", "wrong")
    backends.register(fake, "wrongend")
    D = _indefinite()
    Mn = _mass() if generalized else None
    M = None if Mn is None else _sparse(Mn)
    k = 3
    w, V, info = sparsetorch.eigsh(_sparse(D), k, M=M, which=which, return_info=True)
    first = info.extra["attempts"][0]
    assert (first["backend"], first["accepted"]) == ("wrongend", False), info.extra["attempts"]
    assert WRONG in first["why"] and f"which={which!r}" in first["why"], first["why"]
    assert fake.plans and fake.plans[0].calls == 1  # it ran, and its residuals were fine: the end was wrong
    assert info.backend == "torch" and info.converged
    np.testing.assert_allclose(w.numpy(), _reference(D, Mn, k, which), rtol=1e-9, atol=1e-9)


def test_nearest_to_sigma_refuses_the_farthest(backends) -> None:  # noqa: F811
    backends.register(EigBackend("wrongend", "wrong"), "wrongend")
    D = _indefinite()
    w, V, info = sparsetorch.eigsh(_sparse(D), 3, sigma=0.4, which="LM", return_info=True)
    assert info.extra["attempts"][0]["backend"] == "wrongend" and WRONG in info.extra["attempts"][0]["why"]
    assert "sigma=0.4" in info.extra["attempts"][0]["why"]
    np.testing.assert_allclose(w.numpy(), _reference(D, None, 3, "LM", 0.4), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("which", ["LA", "SA"])
def test_a_missed_isolated_extreme_eigenvalue_is_refused(backends, which) -> None:  # noqa: F811
    """Interior pairs where the extreme one is missed (a Krylov start vector with no component along an
    isolated unknown): the returned extreme is inside that unknown's diagonal entry."""
    D = _laplacian(30)
    D[0, 1] = D[1, 0] = 0.0
    D[0, 0] = 10.0 if which == "LA" else -10.0  # an eigenvalue 10 (-10) decoupled from the rest
    fake = EigBackend("missed", "missed")
    backends.register(fake, "missed")
    w, V, info = sparsetorch.eigsh(_sparse(D), 3, which=which, return_info=True)
    assert info.extra["attempts"][0]["backend"] == "missed" and WRONG in info.extra["attempts"][0]["why"]
    np.testing.assert_allclose(w.numpy(), _reference(D, None, 3, which), rtol=1e-9, atol=1e-9)


def test_a_pinned_backend_from_the_wrong_end_raises_naming_why(backends) -> None:  # noqa: F811
    backends.register(EigBackend("wrongend", "wrong"), "wrongend")
    with pytest.raises(NotConvergedError, match="not the wanted ones \\(k=2, which='LA'\\)") as err:
        sparsetorch.eigsh(_sparse(_laplacian()), 2, which="LA", backend="wrongend")
    msg = str(err.value)
    assert ("Rayleigh quotient" in msg or "Ky Fan" in msg) and "another v0=" in msg, msg
    with pytest.raises(NotConvergedError, match=WRONG):
        sparsetorch.eigsh(_sparse(_laplacian()), 2, which="LA", backend="wrongend", method="dense")


def test_an_explicit_tolerance_still_refuses_the_wrong_end(backends) -> None:  # noqa: F811
    backends.register(EigBackend("wrongend", "wrong"), "wrongend")
    with pytest.raises(NotConvergedError, match=WRONG):
        sparsetorch.eigsh(_sparse(_indefinite()), 3, which="SA", backend="wrongend", tol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_wrong_end_in_float32_and_in_one_member_of_a_value_batch(backends, dtype) -> None:  # noqa: F811
    backends.register(EigBackend("wrongend", "wrong1"), "wrongend")
    D = _indefinite()
    A = _sparse(D, dtype)
    vals = torch.stack([A.values, 2.0 * A.values, A.values - 0.5 * (A.values == A.values.max())])
    with pytest.raises(NotConvergedError, match="value-batch member 1"):
        sparsetorch.eigsh(A.with_values(vals), 3, which="LA", backend="wrongend")


# Correct answers are never refused ----------------------------------------------------------------------------------
def _cases():
    rng = np.random.default_rng(7)
    n = 20
    lap, ind = _laplacian(n), _indefinite(n)
    B = rng.standard_normal((n, n))
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    ill = (Q * np.logspace(-6, 0, n)) @ Q.T  # SPD, condition number 1e6, dense
    pm = (Q * np.r_[np.full(n // 2, -1.0), np.full(n - n // 2, 1.0)]) @ Q.T  # eigenvalues -1 and 1 only
    H = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    H = (H + H.conj().T) * (np.abs(H + H.conj().T) > 1.5)
    adj = np.triu((rng.random((n, n)) < 0.2).astype(float), 1)
    return {
        "laplacian (equal diagonal)": (lap, None, torch.float64),
        "laplacian float32": (lap, None, torch.float32),
        "indefinite": (ind, None, torch.float64),
        "indefinite float32": (ind, None, torch.float32),
        "random indefinite": (_random_indefinite(n), None, torch.float64),
        "random indefinite float32": (_random_indefinite(n, 3), None, torch.float32),
        "diagonal (the bounds are tight)": (np.diag(np.linspace(-2.0, 5.0, n)), None, torch.float64),
        "diagonal float32": (np.diag(np.linspace(-2.0, 5.0, n)), None, torch.float32),
        "all ones (the all-ones bound is tight)": (np.ones((n, n)), None, torch.float64),
        "all ones float32": (np.ones((n, n)), None, torch.float32),
        "3 I (every eigenvalue equal)": (3.0 * np.eye(n), None, torch.float64),
        "+-1 (two clusters, equal diagonal magnitudes)": (pm, None, torch.float64),
        "graph adjacency (zero diagonal)": (adj + adj.T, None, torch.float64),
        "shifted laplacian 1e6 I + L": (1e6 * np.eye(n) + lap, None, torch.float64),
        "shifted laplacian float32": (1e3 * np.eye(n) + lap, None, torch.float32),
        "tiny 1e-30": (1e-30 * ind, None, torch.float64),
        "huge 1e30": (1e30 * ind, None, torch.float64),
        "huge 1e250 (rescaled)": (1e250 * ind, None, torch.float64),
        "tiny float32 1e-12 (rescaled)": (1e-12 * ind, None, torch.float32),
        "complex Hermitian": (H, None, torch.complex128),
        "generalized, FEM mass": (ind, _mass(n), torch.float64),
        "generalized float32": (lap, _mass(n), torch.float32),
        "generalized, diagonal M": (ind, np.diag(np.linspace(0.1, 3.0, n)), torch.float64),
        "generalized, dense SPD M": (_random_indefinite(n), B @ B.T + n * np.eye(n), torch.float64),
        "generalized, ill-conditioned M": (ind, ill, torch.float64),
        "generalized, equal diagonal, 1e-20 scale": (1e-20 * lap, 1e-20 * _mass(n), torch.float64),
    }


CASES = _cases()


@pytest.mark.parametrize("which", ["LA", "SA", "LM", "SM", "sigma"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_correct_pairs_are_never_refused(backends, case, which) -> None:  # noqa: F811
    D, Mn, dtype = CASES[case]
    if which == "SM" and Mn is not None:
        which = "LM"  # (a generalized SM is not checked; LM is)
    fake = EigBackend("exact", "exact")
    backends.register(fake, "exact")
    A = _sparse(D, dtype)
    M = None if Mn is None else _sparse(Mn, dtype)
    # the reference on the values as stored (rounded to the dtype), in float64
    Dr = A.to_dense().to(torch.complex128 if dtype.is_complex else torch.float64).numpy()
    Mr = None if M is None else M.to_dense().to(torch.float64).numpy()
    scale = float(np.abs(np.linalg.eigvalsh(Dr)).max()) if Mr is None else float(
        np.abs(scipy.linalg.eigh(Dr, Mr, eigvals_only=True)).max())
    sigma = None
    if which == "sigma":
        which, sigma = "LM", 0.3 * scale
    n = D.shape[0]
    for k in (1, 3, n - 1):
        w, V, info = sparsetorch.eigsh(A, k, M=M, which=which, sigma=sigma, backend="exact", return_info=True)
        assert info.backend == "exact" and not _refused(info), info.extra["attempts"]
        want = _reference(Dr, Mr, k, which, sigma)
        atol = (1e-9 if dtype in (torch.float64, torch.complex128) else 1e-5) * scale
        got = w.double().numpy()
        if which in ("LM", "SM") and "clusters" in case:  # -1 and 1 tie in magnitude: either is wanted
            got, want = np.sort(np.abs(got)), np.sort(np.abs(want))
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)


@pytest.mark.parametrize("case, which", [
    (case, which) for case in ("generalized, FEM mass", "graph adjacency (zero diagonal)", "random indefinite float32",
                               "huge 1e30") for which in ("LA", "SA")
] + [("laplacian float32", "SA")])  # (torch's LOBPCG takes seconds on the Laplacian's largest)
def test_the_builtin_methods_answers_are_not_refused(backends, case, which) -> None:  # noqa: F811
    """torch's own methods (the backends fixture leaves only them), each pinned: whatever they return that
    meets the contract is not refused by the end check."""
    D, Mn, dtype = CASES[case]
    A = _sparse(D, dtype)
    M = None if Mn is None else _sparse(Mn, dtype)
    ran = []
    for method in ("dense", "lanczos", "lobpcg"):
        try:
            w, V, info = sparsetorch.eigsh(A, 3, M=M, which=which, method=method, on_nonconvergence="ignore",
                                           return_info=True)
        except NoBackendError:
            continue  # lanczos: no M; lobpcg: SPD only
        assert not _refused(info), (method, info.extra["attempts"])
        ran.append(method)
    assert "dense" in ran


def test_a_declared_symmetric_matrix_with_some_asymmetry_is_not_refused(backends) -> None:  # noqa: F811
    """properties='symmetric' on a matrix whose upper triangle differs from the lower (an explicit tol: no
    residual contract): the backend reads the lower triangle, the bounds read A's Hermitian part; the skew part's
    norm is in the slack."""
    backends.register(EigBackend("exact", "exact"), "exact")
    n = 20
    D = _indefinite(n)
    D[np.triu_indices(n, 1)] *= 1.3  # the upper off-diagonal entries 30 % larger
    L = np.tril(D) + np.tril(D, -1).T
    for which in ("LA", "SA", "LM", "SM"):
        w, V, info = sparsetorch.eigsh(_sparse(D), 3, which=which, properties="symmetric", tol=1e-3,
                                       backend="exact", return_info=True)
        assert not _refused(info)
        np.testing.assert_allclose(w.numpy(), _reference(L, None, 3, which), rtol=1e-9, atol=1e-9)


def test_duplicate_entries_are_summed(backends) -> None:  # noqa: F811
    """A nonunique COO (each entry stored as two halves): the bounds read the summed entries, so the wanted pairs
    pass and the other end does not."""
    D = _indefinite()
    r, c = np.nonzero(D)
    v = torch.as_tensor(D[r, c] / 2)
    rows, cols = torch.as_tensor(np.r_[r, r]), torch.as_tensor(np.r_[c, c])
    A = sparsetorch.SparseTensor.from_coo(torch.cat([v, v]), rows, cols, shape=D.shape)
    assert A.values.numel() == 2 * len(r)
    backends.register(EigBackend("exact", "exact"), "exact")
    backends.register(EigBackend("wrongend", "wrong"), "wrongend")
    for which in ("LA", "SA", "LM", "SM"):
        w, V, info = sparsetorch.eigsh(A, 3, which=which, backend="exact", return_info=True)
        assert not _refused(info)
        np.testing.assert_allclose(w.numpy(), _reference(D, None, 3, which), rtol=1e-9, atol=1e-9)
        with pytest.raises(NotConvergedError, match=WRONG):
            sparsetorch.eigsh(A, 3, which=which, backend="wrongend")
