"""Sparse @ sparse (session 30): ``A @ B`` and ``sparsetorch.matmul(A, B)`` of two SparseTensors give
a CSR SparseTensor equal to the dense product, differentiable in both operands' values
(``dA = (dC B^H)`` at A's pattern, ``dB = (A^H dC)`` at B's pattern).

References: dense float64 / complex128 torch products and NumPy; gradients by ``gradcheck`` and
against dense autograd restricted to the patterns.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.format import COO, CSC, CSR

pytestmark = pytest.mark.usefixtures("single_thread")

DT = torch.float64


def _rand(m: int, n: int, seed: int, density: float = 0.35, dtype=DT) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(m, n, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        d = d + 1j * torch.randn(m, n, generator=g, dtype=torch.float64)
    return (d * (torch.rand(m, n, generator=g) < density)).to(dtype)


@pytest.mark.parametrize("fa,fb", [(CSR, CSR), (CSR, CSC), (COO, CSR), (CSC, COO)])
def test_the_product_equals_the_dense_product(fa, fb):
    Da, Db = _rand(7, 5, 0), _rand(5, 9, 1)
    A, B = st.SparseTensor.from_dense(Da, fa), st.SparseTensor.from_dense(Db, fb)
    for C in (A @ B, st.matmul(A, B), st.spgemm(A, B)):
        assert isinstance(C, st.SparseTensor) and C.format == CSR and C.shape == (7, 9)
        torch.testing.assert_close(C.to_dense(), Da @ Db, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose((A @ B).to_dense().numpy(), Da.numpy() @ Db.numpy(), rtol=1e-12, atol=1e-14)


def test_the_pattern_is_the_structural_product_sorted_and_unique():
    Da, Db = _rand(6, 6, 2, 0.5), _rand(6, 6, 3, 0.5)
    C = st.SparseTensor.from_dense(Da) @ st.SparseTensor.from_dense(Db)
    structural = ((Da != 0).double() @ (Db != 0).double()) != 0
    coords, _ = C.coordinates()
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[coords[0], coords[1]] = True
    assert torch.equal(mask, structural) and C.nse == int(structural.sum())
    key = coords[0] * 6 + coords[1]
    assert bool((key[1:] > key[:-1]).all())


def test_cancellation_keeps_the_entry_and_duplicates_sum():
    A = st.SparseTensor.from_coo(torch.tensor([1.0, -1.0], dtype=DT), torch.tensor([0, 0]), torch.tensor([0, 1]), shape=(1, 2))
    B = st.SparseTensor.from_coo(torch.tensor([2.0, 2.0], dtype=DT), torch.tensor([0, 1]), torch.tensor([0, 0]), shape=(2, 1))
    C = A @ B  # no gradient asked (SciPy's product on the CPU where installed): the cancelled entry is kept too
    assert C.nse == 1 and float(C.to_dense()) == 0.0
    Cg = A.with_values(A.values.clone().requires_grad_()) @ B  # the differentiable pairing keeps it
    assert Cg.nse == 1 and float(Cg.to_dense().detach()) == 0.0
    # an unordered COO with a repeated coordinate (the repeats sum wherever read)
    R = st.SparseTensor.from_coo(torch.tensor([1.0, 2.0, 3.0], dtype=DT), torch.tensor([1, 0, 1]), torch.tensor([0, 1, 0]),
                                 shape=(2, 2))
    D = R.to_dense()
    torch.testing.assert_close((R @ R).to_dense(), D @ D)


def test_empty_and_degenerate_shapes():
    A = st.SparseTensor.from_dense(torch.zeros(3, 4, dtype=DT))
    B = st.SparseTensor.from_dense(_rand(4, 2, 4))
    C = A @ B
    assert C.shape == (3, 2) and C.nse == 0 and torch.equal(C.to_dense(), torch.zeros(3, 2, dtype=DT))
    E = st.SparseTensor.from_dense(torch.zeros(0, 4, dtype=DT)) @ B
    assert E.shape == (0, 2)
    F = st.SparseTensor.from_dense(_rand(3, 4, 5)) @ st.SparseTensor.from_dense(torch.zeros(4, 0, dtype=DT))
    assert F.shape == (3, 0) and F.nse == 0


def test_gradcheck_both_operands():
    A = st.SparseTensor.from_dense(_rand(4, 3, 6, 0.6))
    B = st.SparseTensor.from_dense(_rand(3, 5, 7, 0.6), CSC)
    va, vb = A.values.clone().requires_grad_(), B.values.clone().requires_grad_()

    def f(a, b):
        return (A.with_values(a) @ B.with_values(b)).values

    assert torch.autograd.gradcheck(f, (va, vb))
    assert torch.autograd.gradgradcheck(f, (va, vb))


def test_gradients_match_dense_autograd_on_the_patterns():
    Da, Db = _rand(6, 5, 8), _rand(5, 4, 9)
    A, B = st.SparseTensor.from_dense(Da), st.SparseTensor.from_dense(Db)
    va, vb = A.values.clone().requires_grad_(), B.values.clone().requires_grad_()
    W = torch.randn(6, 4, dtype=DT)
    ((A.with_values(va) @ B.with_values(vb)).to_dense() * W).sum().backward()
    da, db = Da.clone().requires_grad_(), Db.clone().requires_grad_()
    ((da @ db) * W).sum().backward()
    (ra, ca), (rb, cb) = A.coordinates()[0], B.coordinates()[0]
    torch.testing.assert_close(va.grad, da.grad[ra, ca])  # (dC B^T) sampled at A's pattern
    torch.testing.assert_close(vb.grad, db.grad[rb, cb])  # (A^T dC) sampled at B's pattern


def test_complex_values_and_gradients():
    Da, Db = _rand(4, 4, 10, 0.5, torch.complex128), _rand(4, 3, 11, 0.5, torch.complex128)
    A, B = st.SparseTensor.from_dense(Da), st.SparseTensor.from_dense(Db)
    torch.testing.assert_close((A @ B).to_dense(), Da @ Db, rtol=1e-13, atol=1e-14)
    va, vb = A.values.clone().requires_grad_(), B.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: (A.with_values(a) @ B.with_values(b)).values, (va, vb))


def test_value_batches_broadcast():
    Da, Db = _rand(5, 4, 12), _rand(4, 3, 13)
    A, B = st.SparseTensor.from_dense(Da), st.SparseTensor.from_dense(Db)
    Ab = A.with_values(torch.stack([A.values, 2 * A.values, -A.values]))
    C = Ab @ B
    assert C.shape == (3, 5, 3)
    torch.testing.assert_close(C.to_dense(), torch.stack([Da, 2 * Da, -Da]) @ Db)
    Bb = B.with_values(torch.stack([B.values, 3 * B.values, B.values]))
    torch.testing.assert_close((Ab @ Bb).to_dense(), torch.stack([Da, 2 * Da, -Da]) @ torch.stack([Db, 3 * Db, Db]))
    va = Ab.values.clone().requires_grad_()
    vb = B.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: (Ab.with_values(a) @ B.with_values(b)).values, (va, vb))


def test_repeated_products_reuse_the_pairing_and_see_new_values():
    Da, Db = _rand(6, 6, 14), _rand(6, 6, 15)
    A, B = st.SparseTensor.from_dense(Da), st.SparseTensor.from_dense(Db)
    C1 = A @ B
    C2 = A.with_values(2 * A.values) @ B.with_values(-B.values)
    torch.testing.assert_close(C1.to_dense(), Da @ Db)
    torch.testing.assert_close(C2.to_dense(), -2 * (Da @ Db))
    # an index buffer written in place (still valid): the pairing kept on the old pattern is dropped
    P = st.SparseTensor.from_dense(torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=DT)))
    Q = st.SparseTensor.from_dense(_rand(3, 3, 24, 0.7))
    torch.testing.assert_close((P @ Q).to_dense(), P.to_dense() @ Q.to_dense())
    P.crd(1)[0] = 2  # row 0's entry moves from column 0 to column 2
    torch.testing.assert_close((P @ Q).to_dense(), P.to_dense() @ Q.to_dense())


def test_a_list_of_matrices_times_a_list_of_matrices():
    L = st.SparseTensorList([st.SparseTensor.from_dense(_rand(3, 4, 16)), st.SparseTensor.from_dense(_rand(5, 2, 17))])
    M = st.SparseTensorList([st.SparseTensor.from_dense(_rand(4, 3, 18)), st.SparseTensor.from_dense(_rand(2, 6, 19))])
    P = L @ M
    assert isinstance(P, st.SparseTensorList)
    for p, a, b in zip(P, L, M):
        torch.testing.assert_close(p.to_dense(), a.to_dense() @ b.to_dense())


def test_errors_name_the_shapes():
    A = st.SparseTensor.from_dense(_rand(3, 4, 20))
    with pytest.raises(st.InputError, match=r"A of shape \(3, 4\) and B of shape \(3, 4\).*4 columns, B has 3 rows"):
        A @ A
    with pytest.raises(st.InputError, match=r"A has dtype torch.float64 but B has torch.float32"):
        A @ st.SparseTensor.from_dense(_rand(4, 2, 21).float())
    with pytest.raises(st.InputError, match="takes no alpha"):
        st.matmul(A, A.T, alpha=2.0)
    with pytest.raises(st.InputError, match=r"value batch \(2,\).*\(3,\)"):
        A.with_values(torch.stack([A.values] * 2)) @ A.T.with_values(torch.stack([A.T.values] * 3))
    # dense right-hand sides are unchanged
    x = torch.ones(4, dtype=DT)
    torch.testing.assert_close(A @ x, A.to_dense() @ x)
    with pytest.raises(st.InputError, match="must be a torch.Tensor"):
        A @ [1.0, 2.0, 3.0, 4.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_spgemm_on_cuda():
    Da, Db = _rand(40, 30, 22, 0.1), _rand(30, 50, 23, 0.1)
    A, B = st.SparseTensor.from_dense(Da.cuda()), st.SparseTensor.from_dense(Db.cuda(), CSC)
    C = A @ B
    assert C.device.type == "cuda" and C.format == CSR
    torch.testing.assert_close(C.to_dense().cpu(), Da @ Db, rtol=1e-12, atol=1e-13)
    va, vb = A.values.clone().requires_grad_(), B.values.clone().requires_grad_()
    W = torch.randn(40, 50, dtype=DT, device="cuda")
    ((A.with_values(va) @ B.with_values(vb)).to_dense() * W).sum().backward()
    da, db = Da.clone().cuda().requires_grad_(), Db.clone().cuda().requires_grad_()
    ((da @ db) * W).sum().backward()
    (ra, ca), (rb, cb) = A.coordinates()[0], B.coordinates()[0]
    torch.testing.assert_close(va.grad, da.grad[ra, ca])
    torch.testing.assert_close(vb.grad, db.grad[rb, cb])


def test_the_no_gradient_cpu_path_agrees_with_the_differentiable_one():
    pytest.importorskip("scipy")
    g = torch.Generator().manual_seed(29)
    for dtype in (torch.float64, torch.float32, torch.complex128):
        Da = torch.randn(30, 20, generator=g, dtype=torch.float64) * (torch.rand(30, 20, generator=g) < 0.2)
        Db = torch.randn(20, 25, generator=g, dtype=torch.float64) * (torch.rand(20, 25, generator=g) < 0.2)
        A = st.SparseTensor.from_dense(Da.to(dtype)).convert("COO")
        B = st.SparseTensor.from_dense(Db.to(dtype))
        fast = A @ B
        slow = A.with_values(A.values.clone().requires_grad_()) @ B
        torch.testing.assert_close(fast.to_dense(), (Da @ Db).to(dtype))
        torch.testing.assert_close(fast.to_dense(), slow.to_dense().detach())
        assert fast.dtype == dtype and not fast.values.requires_grad


@pytest.mark.parametrize("fa", ["CSR", "COO", "CSC", "DIA", "ELL", "DCSR", "DELTA(4)", "DENSE"])
@pytest.mark.parametrize("fb", ["CSR", "DIA", "DCSC", "BSR(2,2)"])
def test_every_format_pair_without_gradients(fa, fb):
    g = torch.Generator().manual_seed(41)
    Da = torch.randn(6, 8, generator=g, dtype=torch.float64) * (torch.rand(6, 8, generator=g) < 0.4)
    Db = torch.randn(8, 4, generator=g, dtype=torch.float64) * (torch.rand(8, 4, generator=g) < 0.4)
    A = st.SparseTensor.from_dense(Da).convert(fa)
    B = st.SparseTensor.from_dense(Db).convert(fb)
    C = A @ B
    torch.testing.assert_close(C.to_dense(), Da @ Db)
    Cg = A.with_values(A.values.clone().requires_grad_()) @ B
    assert C.nse == Cg.nse  # one pattern with or without gradients


def test_torch_func_transforms():
    M = st.SparseTensor.from_dense(torch.tensor([[4.0, 1, 0], [1, 4, 1], [0, 1, 4]], dtype=torch.float64))
    v = M.values.clone().requires_grad_()
    (M.with_values(v) @ M).values.sum().backward()
    g = torch.func.grad(lambda w: (M.with_values(w) @ M).values.sum())(M.values.clone())
    torch.testing.assert_close(g, v.grad)
    batch = torch.stack([M.values, 2 * M.values])
    got = torch.func.vmap(lambda w: (M.with_values(w) @ M).values.sum())(batch)
    torch.testing.assert_close(got, torch.stack([(M.to_dense() @ M.to_dense()).sum(), 2 * (M.to_dense() @ M.to_dense()).sum()]))
