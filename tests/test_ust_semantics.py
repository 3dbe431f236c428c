"""UST semantics where we take nvmath-python's spelling: Matmul/matmul defaults for alpha, beta and
c, the one-shot matmul, reset_operands_unchecked, TensorFormat's dim2lvl/lvl2dim and property
queries, and to_package() returning a tensor to the package it came from.

Values are checked against dense float64 products; the format maps against coordinates worked
out by hand (CSC [0, 4] -> [4, 0]; BSR(2, 2) [1, 2] -> [1 // 2, 2 // 2, 1 % 2, 2 % 2] = [0, 1, 1, 0]).
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import FormatError, InputError
from sparsetorch.format import (
    BATCHED_CSR, BSC, BSR, COO, CSC, CSR, DCSR, DELTA, DENSE, DENSE_COL, DIA, DIA_J, ELL, NM, Dimension, LevelFormat,
    LevelProperty, TensorFormat, named_formats,
)
from sparsetorch.tensor.interop import origin_package, to_package


def _problem(seed: int = 0, k: int = 3):
    gen = torch.Generator().manual_seed(seed)
    D = torch.randn(6, 5, generator=gen, dtype=torch.float64) * (torch.rand(6, 5, generator=gen) < 0.5)
    b = torch.randn(5, k, generator=gen, dtype=torch.float64)
    c = torch.randn(6, k, generator=gen, dtype=torch.float64)
    return st.SparseTensor.from_dense(D), D, b, c


# Matmul defaults (nvmath: alpha 1, beta 1 when c is given) ----------------------------------------
def test_matmul_with_c_defaults_to_accumulate() -> None:
    A, D, b, c = _problem()
    c0 = c.clone()
    with st.Matmul(A, b, c) as mm:
        assert (mm.alpha, mm.beta) == (1.0, 1.0)
        mm.plan()
        r = mm.execute()
    assert r is c
    torch.testing.assert_close(c, D @ b + c0, rtol=1e-12, atol=1e-12)


def test_matmul_alpha_beta_and_defaults_without_c() -> None:
    A, D, b, c = _problem(1)
    c0 = c.clone()
    r = st.Matmul(A, b, c, alpha=2.5, beta=-0.5).execute()
    torch.testing.assert_close(r, 2.5 * (D @ b) - 0.5 * c0, rtol=1e-12, atol=1e-12)
    c[:] = float("nan")  # beta=0 overwrites c: its old contents (NaN here) never enter
    r = st.Matmul(A, b, c, beta=0).execute()
    torch.testing.assert_close(r, D @ b, rtol=1e-12, atol=1e-12)
    mm = st.Matmul(A, b)
    assert (mm.alpha, mm.beta) == (1.0, 0.0)
    torch.testing.assert_close(mm.execute(), D @ b, rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match="needs an output operand c"):
        st.Matmul(A, b, beta=1.0)


def test_one_shot_matmul_with_c_alpha_beta() -> None:
    A, D, b, c = _problem(2)
    c0 = c.clone()
    r = st.matmul(A, b, c, alpha=0.5, beta=2.0)
    assert r is c  # in place, as nvmath's matmul
    torch.testing.assert_close(r, 0.5 * (D @ b) + 2.0 * c0, rtol=1e-12, atol=1e-12)
    c1 = c.clone()
    torch.testing.assert_close(st.matmul(A, b, c), D @ b + c1, rtol=1e-12, atol=1e-12)  # beta defaults to 1
    torch.testing.assert_close(st.matmul(A, b, alpha=-3.0), -3.0 * (D @ b), rtol=1e-12, atol=1e-12)
    # a vector b with a vector c
    x, y = b[:, 0].clone(), c[:, 0].clone()
    y0 = y.clone()
    torch.testing.assert_close(st.matmul(A, x, y, beta=-1.0), D @ x - y0, rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match="c has shape"):
        st.matmul(A, b, torch.zeros(5, 3, dtype=torch.float64))
    with pytest.raises(InputError, match="dtype"):
        st.matmul(A, b, torch.zeros(6, 3, dtype=torch.float32))
    with pytest.raises(InputError, match="needs an output operand c"):
        st.matmul(A, b, beta=0.5)


def test_one_shot_matmul_gradients_leave_c_alone() -> None:
    A, D, b, c = _problem(3)
    v = A.values.clone().requires_grad_(True)
    bg = b.clone().requires_grad_(True)
    cg = c.clone().requires_grad_(True)
    c_before = cg.detach().clone()
    out = st.matmul(A.with_values(v), bg, cg, alpha=1.5, beta=0.25)
    assert out is not cg and torch.equal(cg.detach(), c_before)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    Dw = D.clone().requires_grad_(True)
    b2, c2 = b.clone().requires_grad_(True), c.clone().requires_grad_(True)
    ((1.5 * Dw @ b2 + 0.25 * c2) * g).sum().backward()
    torch.testing.assert_close(bg.grad, b2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cg.grad, c2.grad, rtol=1e-12, atol=1e-12)
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], Dw.grad[coords[0], coords[1]], rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda v, b, c: st.matmul(A.with_values(v), b, c, alpha=0.7, beta=-1.3),
        (A.values.clone().requires_grad_(True), b.clone().requires_grad_(True), c.clone().requires_grad_(True)))


# reset_operands / reset_operands_unchecked ---------------------------------------------------------
def test_reset_operands_unchecked_swaps_without_checks_and_keeps_the_plan() -> None:
    A, D, b, c = _problem(4)
    mm = st.Matmul(A, b, c, beta=0)
    mm.plan()
    state = mm._state
    mm.execute()
    b2 = torch.randn_like(b)
    A2 = A.with_values(A.values * 3)  # same pattern
    c2 = torch.empty_like(c)
    mm.reset_operands_unchecked(a=A2, b=b2, c=c2, alpha=2.0)
    r = mm.execute()
    assert r is c2 and mm._state is state  # the plan survived
    torch.testing.assert_close(r, 2.0 * (3 * D) @ b2, rtol=1e-12, atol=1e-12)
    # another pattern: still right (re-planned), even though nothing was checked
    B = st.SparseTensor.from_dense(D + torch.eye(6, 5, dtype=torch.float64))
    assert B.pattern_key != A.pattern_key
    mm.reset_operands_unchecked(a=B, beta=1.0)
    c3 = c2.clone()
    torch.testing.assert_close(mm.execute(), 2.0 * B.to_dense() @ b2 + c3, rtol=1e-12, atol=1e-12)
    assert mm._state is not state


def test_reset_operands_with_nothing_raises() -> None:
    A, _, b, c = _problem(5)
    mm = st.Matmul(A, b, c)
    with pytest.raises(InputError, match="changes nothing"):
        mm.reset_operands()
    with pytest.raises(InputError, match="c has shape"):  # the checked reset still checks
        mm.reset_operands(c=torch.zeros(2, 2, dtype=torch.float64))


# TensorFormat queries -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, dim, lvl", [
    (CSR, [0, 4], [0, 4]),
    (CSC, [0, 4], [4, 0]),
    (BSR(2, 2), [1, 2], [0, 1, 1, 0]),
    (BSR(2, 3), [5, 7], [2, 2, 1, 1]),
    (BSC(2, 2), [3, 1], [0, 1, 1, 1]),
    (DIA, [2, 5], [3, 2]),
    (DIA_J, [2, 5], [3, 5]),
    (COO, [3, 1], [3, 1]),
    (DELTA(2), [1, 6], [1, 6]),
    (NM(2, 4), [1, 6], [1, 1, 2]),
    (BATCHED_CSR, [2, 0, 3], [2, 0, 3]),
])
def test_dim2lvl_and_lvl2dim_invert_each_other(fmt, dim, lvl) -> None:
    assert fmt.dim2lvl(dim) == lvl
    assert fmt.lvl2dim(lvl) == dim


def test_dim2lvl_on_tensors_matches_every_point_of_a_grid() -> None:
    i, j = torch.meshgrid(torch.arange(7), torch.arange(9), indexing="ij")
    i, j = i.flatten(), j.flatten()
    for fmt in (CSR, CSC, BSR(2, 3), BSC(3, 2), DIA, DIA_J, DENSE_COL, NM(2, 3)):
        lv = fmt.dim2lvl([i, j])
        back = fmt.lvl2dim(lv)
        assert torch.equal(back[0], i) and torch.equal(back[1], j), fmt
        # and the scalar path agrees with the vectorized one at a few points
        for p in (0, 17, 62):
            assert fmt.dim2lvl([int(i[p]), int(j[p])]) == [int(x[p]) for x in lv]


def test_dim2lvl_as_size_gives_the_level_sizes() -> None:
    assert CSC.dim2lvl([6, 4], as_size=True) == [4, 6]
    assert DIA.dim2lvl([6, 4], as_size=True) == [9, 6]  # m + n - 1 diagonals, m rows
    assert BSR(2, 2).dim2lvl([6, 4], as_size=True) == [3, 2, 2, 2]
    assert BSR(4, 4).dim2lvl([6, 4], as_size=True) == [2, 1, 4, 4]  # padded edge blocks (UST: must divide)
    with pytest.raises(FormatError, match="one coordinate per dimension"):
        CSR.dim2lvl([1, 2, 3])
    with pytest.raises(FormatError, match="one coordinate per level"):
        BSR(2, 2).lvl2dim([1, 2])
    with pytest.raises(FormatError, match="integers"):
        CSR.dim2lvl([torch.tensor([0.5]), torch.tensor([1.0])])


def test_property_queries_on_the_named_formats() -> None:
    identity = {"COO", "CSR", "DCSR", "DENSE", "ELL", "BATCHED_CSR", "BATCHED_CSC"}
    for name, fmt in named_formats().items():
        assert fmt.num_dimensions == fmt.ndim and fmt.dimensions == fmt.dims
        assert fmt.is_ordered, name  # every named format keeps its coordinates in order
        assert fmt.is_unique, name  # COO included: its unique singleton resolves the nonunique level
        if name in identity:
            assert fmt.is_identity, name
    for fmt in (CSC, BSR(2, 2), DIA, DIA_J, DENSE_COL, NM(2, 4)):
        assert not fmt.is_identity, fmt
    for fmt in (CSR, COO, DCSR, DENSE, ELL, DELTA(3)):
        assert fmt.is_identity, fmt
    i, j = Dimension("i"), Dimension("j")
    unsorted_coo = TensorFormat([i, j], {i: (LevelFormat.COMPRESSED, LevelProperty.NONUNIQUE, LevelProperty.UNORDERED),
                                         j: (LevelFormat.SINGLETON, LevelProperty.NONUNIQUE, LevelProperty.UNORDERED)})
    assert not unsorted_coo.is_ordered and not unsorted_coo.is_unique
    unordered_csr = TensorFormat([i, j], {i: LevelFormat.DENSE, j: (LevelFormat.COMPRESSED, LevelProperty.UNORDERED)})
    assert not unordered_csr.is_ordered and unordered_csr.is_unique and unordered_csr.is_identity


# to_package() returns the tensor to its origin --------------------------------------------------------
def test_to_package_without_argument_returns_the_origin() -> None:
    sp = pytest.importorskip("scipy.sparse")
    np = pytest.importorskip("numpy")
    dense = np.array([[1.0, 0, 2], [0, 0, 3], [4, 5, 0]])
    for obj, cls in ((sp.csr_matrix(dense), sp.csr_matrix), (sp.csr_array(dense), sp.csr_array),
                     (sp.coo_array(dense), sp.coo_array)):
        t = st.from_package(obj)
        assert origin_package(t) == "scipy"
        back = to_package(t)
        assert type(back) is cls
        np.testing.assert_array_equal(back.toarray(), dense)
        # views and new values on the same pattern keep the origin; the transpose comes back transposed
        np.testing.assert_array_equal(to_package(t.T).toarray(), dense.T)
        np.testing.assert_array_equal(to_package(t.with_values(t.values * 2)).toarray(), 2 * dense)
        assert type(to_package(t, "torch")) is torch.Tensor  # an explicit package still wins
    n = st.from_package(dense)
    assert origin_package(n) == "numpy" and isinstance(to_package(n), np.ndarray)
    np.testing.assert_array_equal(to_package(n), dense)


def test_to_package_of_torch_built_tensors_is_torch() -> None:
    csr = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).to_sparse_csr()
    t = st.from_package(csr)
    assert origin_package(t) == "torch"
    back = to_package(t)
    assert back.layout == torch.sparse_csr and torch.equal(back.to_dense(), csr.to_dense())
    built = st.SparseTensor.from_dense(torch.eye(3))
    assert origin_package(built) == "torch" and isinstance(to_package(built), torch.Tensor)
    # a conversion makes new buffers: a tensor of its own, built in torch
    sp = pytest.importorskip("scipy.sparse")
    moved = st.from_package(sp.csr_array(torch.eye(3).numpy())).convert(CSC)
    assert origin_package(moved) == "torch"


# Batched operands and broadcasting (numpy.matmul / nvmath rules, one side may be unbatched) -------
def _value_batch(seed: int = 6, B: int = 3):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(4, 5, generator=gen) < 0.5
    D = torch.randn(B, 4, 5, generator=gen, dtype=torch.float64) * mask
    return st.SparseTensor.from_dense(D, mask=mask.expand(B, 4, 5), batch_dims=1), D


def _pattern_batch(seed: int = 7, B: int = 3, layout: str = "csr"):
    """torch's batched CSR (one pattern per member, same nnz) and its dense twin."""
    gen = torch.Generator().manual_seed(seed)
    D = torch.zeros(B, 4, 6, dtype=torch.float64)
    for b in range(B):
        idx = torch.randperm(24, generator=gen)[:7]
        D[b].view(-1)[idx] = torch.randn(7, generator=gen, dtype=torch.float64)
    if layout == "bsr":
        D = torch.randn(B, 4, 6, generator=gen, dtype=torch.float64)
        return st.from_package(D.to_sparse_bsr((2, 2))), D
    return st.from_package(D.to_sparse_csr()), D


@pytest.mark.parametrize("shape", [(5,), (5, 2)], ids=["vector", "matrix"])
def test_value_batched_a_with_an_unbatched_b_broadcasts(shape) -> None:
    A, D = _value_batch()
    v = A.values.clone().requires_grad_(True)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y = st.matmul(A.with_values(v), x)
    Dw, x2 = D.clone().requires_grad_(True), x.detach().clone().requires_grad_(True)
    ref = torch.matmul(Dw, x2)
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    y.sin().sum().backward()
    ref.sin().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=1e-12)  # summed over the batch
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[..., slot], Dw.grad[..., coords[0], coords[1]], rtol=1e-12, atol=1e-12)


def test_unbatched_a_with_a_batched_b_folds_into_columns() -> None:
    A, D = _value_batch()
    A0, D0 = A.with_values(A.values[0].detach()), D[0]
    X = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(st.matmul(A0, X), D0 @ X, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(A0 @ X, D0 @ X, rtol=1e-12, atol=1e-12)
    Z = torch.randn(2, 7, 4, dtype=torch.float64)
    torch.testing.assert_close(Z @ A0, Z @ D0, rtol=1e-12, atol=1e-12)
    v = A0.values.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, X: st.matmul(A0.with_values(v), X),
                                    (v, X[:, :2, :, :2].clone().requires_grad_(True)))
    c = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    c0 = c.clone()
    with st.Matmul(A0, X, c, alpha=0.5) as mm:
        torch.testing.assert_close(mm.execute(), 0.5 * (D0 @ X) + c0, rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match="must be"):
        st.matmul(A, torch.randn(2, 5, 2, dtype=torch.float64))  # a batch of 2 against A's 3


@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_pattern_batched_a_torch_batched_csr_and_bsr(layout) -> None:
    A, D = _pattern_batch(layout=layout)
    assert A.format.num_batch_levels == 1
    Xb = torch.randn(3, 6, 2, dtype=torch.float64)
    x = torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(st.matmul(A, Xb), D @ Xb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(st.matmul(A, x), D @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(A @ Xb[:, :, 0], (D @ Xb[:, :, :1])[..., 0], rtol=1e-12, atol=1e-12)
    c = torch.randn(3, 4, 2, dtype=torch.float64)
    c0 = c.clone()
    r = st.matmul(A, Xb, c, alpha=2.0, beta=-1.0)
    assert r is c
    torch.testing.assert_close(r, 2.0 * (D @ Xb) - c0, rtol=1e-12, atol=1e-12)
    with st.Matmul(A, Xb, torch.zeros(3, 4, 2, dtype=torch.float64)) as mm:
        mm.plan()
        torch.testing.assert_close(mm.execute(), D @ Xb, rtol=1e-12, atol=1e-12)
        X2 = torch.randn_like(Xb)
        mm.reset_operands_unchecked(b=X2, beta=0.0)
        torch.testing.assert_close(mm.execute(), D @ X2, rtol=1e-12, atol=1e-12)
    # gradients reach every member's values and X
    v = A.values.clone().requires_grad_(True)
    Xg = Xb.clone().requires_grad_(True)
    Ag = st.SparseTensor(A.format, A.shape, [A.pos(k) for k in range(A.format.num_levels)],
                         [A.crd(k) for k in range(A.format.num_levels)], v)
    st.matmul(Ag, Xg).square().sum().backward()
    Dw = D.clone().requires_grad_(True)
    X2g = Xb.clone().requires_grad_(True)
    (Dw @ X2g).square().sum().backward()
    torch.testing.assert_close(Xg.grad, X2g.grad, rtol=1e-12, atol=1e-12)
    dW = Ag.with_values(v.grad).to_dense()
    stored = Ag.with_values(torch.ones_like(v)).to_dense() != 0
    torch.testing.assert_close(dW, Dw.grad * stored, rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match="batch"):
        st.matmul(A, torch.randn(2, 6, 2, dtype=torch.float64))


def test_to_package_without_argument_returns_the_origin_package_and_repr_names_it():
    import scipy.sparse as sp

    import sparsetorch as st

    m = sp.random(6, 5, density=0.4, format="csr", random_state=3)
    A = st.SparseTensor.from_package(m)
    back = A.to_package()
    assert sp.issparse(back) and back.format == "csr"
    assert (back != m).nnz == 0
    assert "package=scipy" in repr(A)
    T = st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64))
    assert isinstance(T.to_package(), torch.Tensor) and "package=torch" in repr(T)


def test_numpy_origin_survives_detach_and_with_values():
    """A dense tensor's origin is keyed by its values: detach() / with_values() made new values and handed a torch
    tensor back from a NumPy array (sparse formats keep it through their index buffers; session 26's sweep)."""
    import numpy as np

    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    T = st.SparseTensor.from_package(a)
    for U in (T.detach(), T.with_values(T.values * 2), T.T):
        got = U.to_package()
        assert isinstance(got, np.ndarray), type(got)
    np.testing.assert_array_equal(T.with_values(T.values * 2).to_package(), 2 * a)
    assert isinstance(st.SparseTensor.from_dense(torch.eye(2)).detach().to_package(), torch.Tensor)
