"""The operations as methods (torch-sla's spelling: ``A.solve(b)``, ``A.matvec(x)``, ``A.eigsh(k)``, ``A.det()``,
``A.norm()``) and the tensor's arithmetic (``A * s``, ``A / s``, ``-A``, ``A + B``, ``A - B``), against dense
torch float64 and its autograd (session 23: a torch-sla user's port found none of them)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.testing.problems import poisson2d

DT = torch.float64


def _pair():
    A = poisson2d(4)
    g = torch.Generator().manual_seed(0)
    Db = torch.diag(torch.rand(16, generator=g, dtype=DT)) + torch.diag(torch.randn(13, generator=g, dtype=DT), 3)
    return A, st.SparseTensor.from_dense(Db).convert("CSC")


def test_methods_are_the_functions():
    A, _ = _pair()
    D = A.to_dense()
    b = torch.linspace(-1, 1, 16, dtype=DT)
    torch.testing.assert_close(A.solve(b), torch.linalg.solve(D, b))
    torch.testing.assert_close(A.solve(b, method="cg", rtol=1e-12), torch.linalg.solve(D, b))
    torch.testing.assert_close(A.matvec(b), D @ b)
    torch.testing.assert_close(A.lstsq(b), torch.linalg.solve(D, b))
    torch.testing.assert_close(A.eigsh(3, which="LA")[0], torch.linalg.eigvalsh(D)[-3:])
    torch.testing.assert_close(A.eigsh()[0].sort().values, torch.linalg.eigvalsh(D)[-6:])  # k = 6 as torch-sla's
    torch.testing.assert_close(A.eigs(2)[0].real.sort().values, torch.linalg.eigvalsh(D)[-2:])
    torch.testing.assert_close(A.det(), torch.linalg.det(D))
    torch.testing.assert_close(A.logdet(), torch.logdet(D))
    torch.testing.assert_close(A.slogdet()[1], torch.linalg.slogdet(D)[1])
    torch.testing.assert_close(A.norm(), torch.linalg.matrix_norm(D))
    torch.testing.assert_close(A.norm(1), torch.linalg.matrix_norm(D, 1))


def test_scalar_arithmetic_keeps_the_pattern_and_the_gradient():
    A, _ = _pair()
    v = A.values.detach().clone().requires_grad_(True)
    Av = A.with_values(v)
    for got, ref in ((2 * Av, 2), (Av * 2, 2), (Av / 4, 0.25), (-Av, -1), (torch.tensor(3.0, dtype=DT) * Av, 3)):
        assert got.format == A.format and got.pattern_key == A.pattern_key
        torch.testing.assert_close(got.to_dense(), ref * A.to_dense())
    b = torch.ones(16, dtype=DT)
    (3 * Av).solve(b).sum().backward()
    Dd = (3 * A.to_dense()).requires_grad_(True)
    torch.linalg.solve(Dd, b).sum().backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], 3 * Dd.grad[coords[0], coords[1]])


def test_sums_of_one_and_of_two_patterns():
    A, B = _pair()
    D, E = A.to_dense(), B.to_dense()
    S = A + A.with_values(2 * A.values)
    assert S.format == A.format
    torch.testing.assert_close(S.to_dense(), 3 * D)
    torch.testing.assert_close((A + B).to_dense(), D + E)
    torch.testing.assert_close((A - B).to_dense(), D - E)
    b = torch.ones(16, dtype=DT)
    torch.testing.assert_close((A + B).solve(b), torch.linalg.solve(D + E, b))
    va = A.values.detach().clone().requires_grad_(True)
    vb = B.values.detach().clone().requires_grad_(True)
    (A.with_values(va) - B.with_values(vb)).solve(b).sum().backward()
    Dd = (D - E).requires_grad_(True)
    torch.linalg.solve(Dd, b).sum().backward()
    (ca, sa), (cb, sb) = A.entries(), B.entries()
    torch.testing.assert_close(va.grad[sa], Dd.grad[ca[0], ca[1]])
    torch.testing.assert_close(vb.grad[sb], -Dd.grad[cb[0], cb[1]])


def test_arithmetic_refuses_what_it_does_not_do():
    A, B = _pair()
    with pytest.raises(st.ValidationError, match="same shape"):
        A + st.SparseTensor.from_dense(torch.eye(3, dtype=DT))
    # a dense operand must broadcast to A's shape (session 30: A * t is the elementwise product on A's pattern)
    with pytest.raises(st.ValidationError, match=r"\(16, 16\).*\(5,\)"):
        A * torch.ones(5, dtype=DT)
    with pytest.raises(st.ValidationError, match=r"\(16, 16\).*\(3, 3\)"):
        A + torch.ones(3, 3, dtype=DT)
    with pytest.raises(TypeError):
        A * True


def test_messages_and_torch_sla_forms():
    A, B = _pair()
    b = torch.ones(16, dtype=DT)
    with pytest.raises(st.InputError, match="rtol"):
        A.solve(b, tol=1e-8)
    torch.testing.assert_close(A.eigsh(2, "LA")[0], A.eigsh(2, which="LA")[0])  # torch-sla's A.eigsh(k, which)
    torch.testing.assert_close((A * b).to_dense(), A.to_dense() * b)  # elementwise, as torch's A * b
    torch.testing.assert_close(A + torch.ones(16, 16, dtype=DT), A.to_dense() + 1)  # a dense sum is dense
    with pytest.raises(st.FormatError, match="did you mean 'CSR'"):
        A.convert("CSRR")
    torch.testing.assert_close(sum([A, B, A]).to_dense(), 2 * A.to_dense() + B.to_dense())
