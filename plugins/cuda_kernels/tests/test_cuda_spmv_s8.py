"""Session 8 SpMV work (issue 16's stencil goals for ELL, COO and DIA), against dense float64
references on the GPU; the new kernels' host compile runs without one.

- ELL on the plan's int32 column copy (-1 in unused slots): every variant ("rows", "p", "pcs",
  "stream", "streamcs"), int32 and int64 columns, widths up to and beyond 8, garbage (NaN values,
  out-of-range columns) in the unused slots, one and several right-hand sides, Matmul.execute.
- DIA "v2" / "v2na" (two consecutive rows per thread, paired value loads): even and odd row
  counts, unaligned values (the "p" fallback), NaN in the value slots outside the matrix.
- COO stored in row-major order: no value gather (the plan's CSR reads A's values where they
  lie), so ``Matmul.execute`` takes the bound launch; a CSC (a real gather) still does not.
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import COO, CSC, CSR, DIA, ELL

from _cuda_helpers import GPU_MISSING, TOL, banded_dense, random_dense, rel_err, to_format, make_plan as _plan, random_x as _x

gpu = pytest.mark.skipif(GPU_MISSING is not None, reason=GPU_MISSING or "")

def _ell_with_garbage(D: torch.Tensor, dtype, index_dtype) -> st.SparseTensor:
    """D in ELL with NaN values and out-of-range columns in every row's unused slots (built
    unchecked: the plan validates the used slots and must never read the others)."""
    A = to_format(D, ELL, dtype, index_dtype)
    pos, col, val = A.pos(1), A.crd(1).clone(), A.values.clone()
    m = D.shape[0]
    width = val.numel() // m
    cnt = (pos[1::2] - pos[0::2]).to(torch.int64)
    unused = (torch.arange(width, device=col.device)[None, :] >= cnt[:, None]).reshape(-1)
    col[unused] = -7 if index_dtype == torch.int32 else 1 << 40
    val[unused] = float("nan")
    return st.SparseTensor(ELL, tuple(D.shape), [None, pos], [None, col], val, check=False)


@gpu
@pytest.mark.parametrize("variant", [None, "rows", "p", "pcs", "stream", "streamcs"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("density", [0.02, 0.05], ids=["narrow", "wide"])
def test_ell_variants_match_dense(variant, index_dtype, dtype, density):
    m, n = 333, 250  # density 0.02: rows of at most ~8 slots ("p" compiled); 0.05: wider (stream fallback)
    D = random_dense(m, n, density, dtype, seed=int(density * 100), empty_rows=5)
    A = _ell_with_garbage(D, dtype, index_dtype)
    plan = _plan(A, variant)
    from sparsetorch_cuda.plan import ELL_DEFAULT, ELL_DEFAULT_F32

    default = ELL_DEFAULT_F32 if dtype == torch.float32 else ELL_DEFAULT
    assert plan.kind == "ell" and plan.col32 is not None and plan.variant == (variant or default)
    assert int((plan.col32 < 0).sum()) == plan.slots - plan.nnz  # the unused slots, marked
    for k, seed in ((1, 1), (3, 2)):
        X = _x(n, k, dtype, seed)
        err = rel_err(plan.apply(X.cuda()), D @ X.double())
        assert err < TOL[dtype], (variant, index_dtype, dtype, k, plan.width, err)


@gpu
@pytest.mark.parametrize("fmt", ["ELL", "COO", "DIA"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=lambda d: str(d)[6:])
def test_stencil_matmul_execute_bound(fmt, index_dtype, dtype):
    """A small 3-D 7-point stencil through Matmul.execute: bound (one launch, values read where
    they lie) for ELL, sorted COO and DIA, equal to dense after in-place writes to A's values."""
    s = 9
    N = s ** 3
    idx = torch.arange(N)
    i, j, kk = idx // (s * s), (idx // s) % s, idx % s
    D = torch.zeros(N, N, dtype=torch.float64)
    D[idx, idx] = 6.0
    for d, ok in ((1, kk < s - 1), (s, j < s - 1), (s * s, i < s - 1)):
        r = idx[ok]
        D[r, r + d] = -1.0
        D[r + d, r] = -1.0
    A = to_format(D, {"ELL": ELL, "COO": COO, "DIA": DIA}[fmt], dtype, index_dtype)
    b = _x(N, 1, dtype, 5)[:, 0].cuda()
    mm = st.Matmul(A, b, backend="cuda")
    mm.plan()
    y = mm.execute()
    assert mm._direct is not None, fmt
    plan = mm._state.plan
    if fmt == "COO":
        assert plan.kind == "generic" and plan.gather is None
    tol = TOL[dtype]
    assert rel_err(y, D @ b.double().cpu()) < tol
    with torch.no_grad():
        A.values.mul_(-2)
    assert rel_err(mm.execute(), (-2 * D) @ b.double().cpu()) < tol
    assert mm._direct is not None


@gpu
def test_generic_with_a_real_gather_is_not_bound():
    """CSC goes through a CSR whose entries are a permutation of A's slots: the gather stays,
    ``bind`` declines, results equal dense."""
    D = random_dense(150, 120, 0.06, torch.float64, seed=9)
    A = to_format(D, CSC, torch.float64, torch.int32)
    from sparsetorch_cuda.plan import CudaSpmmPlan

    plan = CudaSpmmPlan(A, kernel="native")
    plan.set_values(A.values)
    assert plan.kind == "generic" and plan.gather is not None
    x = _x(120, 1, torch.float64, 3).cuda()
    assert plan.bind(A.values, x) is None
    assert rel_err(plan.apply(x), D @ x.double().cpu()) < TOL[torch.float64]
    C = to_format(D, CSR, torch.float64, torch.int32).convert(COO)
    pc = CudaSpmmPlan(C)
    assert pc.gather is None and pc.bind(C.values, x) is not None


@gpu
@pytest.mark.parametrize("variant", ["v2", "v2na", "v4na", "p1nb", "p1nc", "p1pd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("m", [300, 301])
def test_dia_v2_matches_dense(variant, dtype, m):
    """Two / four rows per thread with paired value loads (odd m and unaligned values run the
    "p" kernels instead), and the "p1na" builds with fewer registers or an L2 prefetch ahead;
    NaN in the value slots outside the matrix is never used."""
    n = 280
    D = banded_dense(m, n, (-17, -1, 0, 1, 3, 60, 270), dtype, seed=m)
    A = to_format(D, DIA, dtype, torch.int64)
    vals = A.values.clone()
    offs = A.crd(0).to(torch.int64).cpu()
    rows = torch.arange(m)
    for d, o in enumerate(offs.tolist()):
        outside = ((rows + o) < 0) | ((rows + o) >= n)
        vals[d * m + rows[outside].cuda()] = float("nan")
    A = A.with_values(vals)
    plan = _plan(A, variant)
    for k, seed in ((1, 1), (3, 2)):
        X = _x(n, k, dtype, seed)
        err = rel_err(plan.apply(X.cuda()), D @ X.double())
        assert err < TOL[dtype], (variant, dtype, m, k, err)
    # values at an address that is not 16-byte aligned: the "p" fallback
    big = torch.empty(vals.numel() + 1, dtype=dtype, device="cuda")
    big[1:] = A.values
    plan.set_values(big[1:])
    X = _x(n, 1, dtype, 4)
    assert rel_err(plan.apply(X.cuda()), D @ X.double()) < TOL[dtype]
