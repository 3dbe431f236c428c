"""Session 30: torch-sla spellings an outside parity sweep found missing, each against an independent reference:
A + number, SparseTensor.eye / diag / tridiagonal, A.to_file (Matrix Market, FROSTT) read back by from_file and by
SciPy, connected_components / to_connected_components against SciPy's csgraph, detect_matrix_type, the spectral
norm A.norm(2) against torch.linalg.matrix_norm, eigsh(return_eigenvectors=False)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

DT = torch.float64


def _block_matrix() -> torch.Tensor:
    D = torch.diag(torch.arange(2.0, 9.0, dtype=DT))
    D[0, 3] = D[3, 0] = -1.0
    D[1, 4] = -0.5  # one-sided: still joins rows 1 and 4
    D[5, 6] = D[6, 5] = -1.0
    return D


def test_adding_a_number_is_dense_and_zero_is_neutral():
    D = _block_matrix()
    A = st.SparseTensor.from_dense(D)
    torch.testing.assert_close(A + 1.5, D + 1.5)
    torch.testing.assert_close(1.5 + A, D + 1.5)
    torch.testing.assert_close(A - 2, D - 2)
    torch.testing.assert_close(2 - A, 2 - D)
    torch.testing.assert_close((A + 0).to_dense() if isinstance(A + 0, st.SparseTensor) else A + 0, D)
    assert sum([A, A]).to_dense().equal(2 * D)  # sum() starts from 0
    with pytest.raises(TypeError):
        A + True  # a bool is not a number here


def test_constructors_match_torch():
    torch.testing.assert_close(st.SparseTensor.eye(4, dtype=DT).to_dense(), torch.eye(4, dtype=DT))
    torch.testing.assert_close(st.SparseTensor.eye(3, 5).to_dense(), torch.eye(3, 5))
    v = torch.tensor([1.0, -2.0, 3.0], dtype=DT, requires_grad=True)
    for off in (0, 2, -1):
        torch.testing.assert_close(st.SparseTensor.diag(v, off).to_dense(), torch.diag(v, off))
    T = st.SparseTensor.tridiagonal(-1, 2, -1, 5, dtype=DT)
    ref = 2 * torch.eye(5, dtype=DT) - torch.diag(torch.ones(4, dtype=DT), 1) - torch.diag(torch.ones(4, dtype=DT), -1)
    torch.testing.assert_close(T.to_dense(), ref)
    lo, up = torch.arange(1.0, 4.0, dtype=DT), torch.arange(5.0, 8.0, dtype=DT)
    d = torch.full((4,), 9.0, dtype=DT, requires_grad=True)
    T2 = st.SparseTensor.tridiagonal(lo, d, up)
    torch.testing.assert_close(T2.to_dense(), torch.diag(lo, -1) + torch.diag(d.detach()) + torch.diag(up, 1))
    b = torch.ones(4, dtype=DT)
    st.solve(T2, b).sum().backward()  # differentiable in the bands
    Dd = (torch.diag(lo, -1) + torch.diag(d.detach()) + torch.diag(up, 1)).requires_grad_()
    torch.linalg.solve(Dd, b).sum().backward()
    torch.testing.assert_close(d.grad, torch.diagonal(Dd.grad))
    with pytest.raises(st.InputError, match="diagonal must hold 3 values for n = 3"):  # n from the first band
        st.SparseTensor.tridiagonal(torch.ones(2), torch.ones(4), torch.ones(3))
    with pytest.raises(st.InputError, match="give n"):
        st.SparseTensor.tridiagonal(-1, 2, -1)


def test_to_file_round_trips(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    D = _block_matrix()
    D[2, 6] = 1.0 / 3.0
    A = st.SparseTensor.from_dense(D).convert("COO")
    A.to_file(tmp_path / "a.mtx")
    assert torch.equal(st.SparseTensor.from_file(tmp_path / "a.mtx").to_dense(), D)  # full precision
    assert torch.equal(torch.from_numpy(scipy_io.mmread(str(tmp_path / "a.mtx")).toarray()), D)
    A.to_file(tmp_path / "a.tns")
    assert torch.equal(st.SparseTensor.from_file(tmp_path / "a.tns").to_dense(), D)
    C = st.SparseTensor.from_dense(torch.tensor([[1 + 2j, 0], [0, 3 - 1j]], dtype=torch.complex128))
    C.to_file(tmp_path / "c.mtx")
    assert torch.equal(st.SparseTensor.from_file(tmp_path / "c.mtx").to_dense(), C.to_dense())
    with pytest.raises(st.InputError, match="neither"):
        A.to_file(tmp_path / "a.txt")


def test_connected_components_against_scipy():
    csgraph = pytest.importorskip("scipy.sparse.csgraph")
    sp = pytest.importorskip("scipy.sparse")
    g = torch.Generator().manual_seed(3)
    for D in (_block_matrix(), torch.randn(40, 40, generator=g, dtype=DT) * (torch.rand(40, 40, generator=g) < 0.03)):
        A = st.SparseTensor.from_dense(D)
        count, labels = A.connected_components()
        want_count, want = csgraph.connected_components(sp.csr_matrix(D.numpy()), directed=False)
        assert count == want_count
        assert torch.equal(labels, torch.from_numpy(want).to(torch.int64))
        blocks, rows = A.to_connected_components()
        assert len(blocks) == count and sorted(torch.cat(rows).tolist()) == list(range(D.shape[0]))
        for B, r in zip(blocks, rows):
            torch.testing.assert_close(B.to_dense(), D[r][:, r])


def test_detect_matrix_type_and_spectral_norm():
    D = _block_matrix()
    A = st.SparseTensor.from_dense(D)
    assert A.detect_matrix_type() == "general"
    S = st.SparseTensor.from_dense(D + D.T)
    assert S.detect_matrix_type() in ("spd", "symmetric")
    assert st.SparseTensor.from_dense(torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=DT)).detect_matrix_type() == "symmetric"
    assert st.SparseTensor.eye(3, dtype=DT).detect_matrix_type() == "spd"
    g = torch.Generator().manual_seed(5)
    R = torch.randn(20, 15, generator=g, dtype=DT) * (torch.rand(20, 15, generator=g) < 0.3)
    torch.testing.assert_close(st.SparseTensor.from_dense(R).norm(2), torch.linalg.matrix_norm(R, 2))
    torch.testing.assert_close(A.norm(2), torch.linalg.matrix_norm(D, 2))


def test_eigenvalues_only():
    D = _block_matrix()
    S = st.SparseTensor.from_dense(D + D.T)
    w = S.eigsh(2, which="LA", return_eigenvectors=False)
    torch.testing.assert_close(w, torch.linalg.eigvalsh(D + D.T)[-2:])
    w2, info = S.eigsh(2, which="LA", return_eigenvectors=False, return_info=True)
    torch.testing.assert_close(w2, w)
    assert info.converged
