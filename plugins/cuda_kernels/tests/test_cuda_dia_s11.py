"""Session 11 (s11f) DIA kernels on a GPU, against float64 references: the "p"-family kernels that run
``griddepcontrol.wait`` first and are launched with programmatic dependent launch (PDL: "p1w", "p1wt",
"p2w", "p1nbw"), and the 16-byte kernels "q" / "qw" / "qwt" / "qwe" / "qwb" (16 / itemsize consecutive
rows per thread, k = 1, m a multiple of that, aligned values / X / Y; else a "p1"-family fallback).

- every variant equals dense (float16 / float32 / float64; m a multiple of 8, of 4, of 2 and odd;
  square, wide and tall; offsets that leave the matrix; NaN in the value slots outside the matrix, which
  must never be used; k = 1 and 3; values and X at addresses that are not 16-byte aligned);
- back-to-back chains y_{i+1} = A y_i on 2^19 rows (several waves of blocks, so a PDL launch really
  overlaps the one before it) through the plan's recorded launch (``Prepared``, via ``plan.apply``) and
  the bound launch (``Bound``, what ``Matmul.execute`` calls), every output NaN before the chain, the
  values changed in place by a torch kernel mid-chain, then the chain captured in a CUDA graph and
  replayed with new inputs; the chain's float64 reference is the diagonals' shifted products, itself
  checked against dense on a small matrix;
- ``Matmul.execute`` (bound) with X written in place by a torch kernel between calls.
Skips without a GPU; ``test_s11_dia_kernels_compile_on_the_host`` needs NVRTC only.
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import DIA

from _cuda_helpers import GPU_MISSING, TOL, banded_dense, make_plan as _plan, random_x as _x, rel_err, to_format

gpu = pytest.mark.skipif(GPU_MISSING is not None, reason=GPU_MISSING or "")

PDL_VARIANTS = ("p1w", "p1wt", "p2w", "p1nbw")
Q_VARIANTS = ("q", "qw", "qwt", "qwe", "qwb")
NEW = PDL_VARIANTS + Q_VARIANTS
KERNELS = ["dia_p8w_1", "dia_p8wt_1", "dia_p8w_2", "dia_p8nbw_1", "dia_q_1", "dia_qw_1", "dia_qwt_1", "dia_qwe_1", "dia_qwb_1"]
DTYPES = (torch.float16, torch.float32, torch.float64)


def _ids(d):
    return str(d).replace("torch.", "")


@pytest.mark.parametrize("value", ["float16", "float32", "float64"])
def test_s11_dia_kernels_compile_on_the_host(value):
    """The new kernels build for sm_90 (NVRTC only, no GPU) and are in the module."""
    pytest.importorskip("cuda.bindings")
    from sparsetorch_cuda import compile as c

    cubin = c.cubin("fast", value, "int64", "sm_90")  # the disk cache (prewarmed on the device)
    for name in KERNELS:
        assert name.encode() in cubin, name


def _with_nan_outside(A: st.SparseTensor, m: int, n: int) -> st.SparseTensor:
    """A with NaN in every value slot whose column falls outside [0, n) (not part of the matrix)."""
    vals = A.values.clone()
    offs = A.crd(0).to(torch.int64).cpu()
    rows = torch.arange(m)
    for d, o in enumerate(offs.tolist()):
        outside = ((rows + o) < 0) | ((rows + o) >= n)
        vals[d * m + rows[outside].to(vals.device)] = float("nan")
    return A.with_values(vals)


@gpu
@pytest.mark.parametrize("variant", NEW)
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", [(1024, 1024), (1004, 1004), (302, 280), (301, 280), (296, 400), (64, 1000)],
                         ids=["m%8", "m%4", "m%2", "odd", "wide", "short"])
def test_s11_dia_variants_match_dense(variant, dtype, shape):
    m, n = shape
    offsets = (-17, -3, -1, 0, 1, 2, 60, 270)[: 7 if variant != "p2w" else 8]
    D = banded_dense(m, n, offsets, dtype, seed=m + n)
    A = _with_nan_outside(to_format(D, DIA, dtype, torch.int64), m, n)
    plan = _plan(A, variant)
    assert plan.variant == variant
    for k, seed in ((1, 1), (3, 2), (1, 3)):  # the third call replays the recorded launch (PDL where opted in)
        X = _x(n, k, dtype, seed)
        err = rel_err(plan.apply(X.cuda()), D @ X.double())
        assert err < TOL[dtype], (variant, dtype, shape, k, err)
    # X at an address that is not 16-byte aligned (the "q" kernels fall back), then the values likewise
    X = _x(n, 1, dtype, 4)
    buf = torch.empty(n + 1, 1, dtype=dtype, device="cuda")
    buf[1:] = X.cuda()
    assert rel_err(plan.apply(buf[1:]), D @ X.double()) < TOL[dtype]
    big = torch.empty(A.values.numel() + 1, dtype=dtype, device="cuda")
    big[1:] = A.values
    plan.set_values(big[1:])
    assert rel_err(plan.apply(X.cuda()), D @ X.double()) < TOL[dtype]


@gpu
@pytest.mark.parametrize("variant", Q_VARIANTS)
def test_s11_q_kernels_are_taken_where_they_apply(variant):
    """k = 1, m % 4 == 0, aligned values / X / Y in float32: the recorded launch is the 16-byte kernel;
    an unaligned X records the fallback ("p1" / "p1w")."""
    m = n = 4096
    D = banded_dense(m, n, (-64, -1, 0, 1, 64), torch.float32, seed=5)
    A = to_format(D, DIA, torch.float32, torch.int64)
    plan = _plan(A, variant)
    X = _x(n, 1, torch.float32, 6).cuda()
    plan.apply(X)
    assert plan._prepared[(1, 0)]._kern.name == f"dia_{variant}_1"
    buf = torch.empty(n + 1, 1, dtype=torch.float32, device="cuda")
    buf[1:] = X
    plan.apply(buf[1:])
    want = "dia_p8w_1" if "w" in variant else "dia_p8_1"
    assert plan._prepared[(1, 4)]._kern.name == want


def _shifted_reference(vals: torch.Tensor, offs: list[int], m: int, n: int, x: torch.Tensor) -> torch.Tensor:
    """y[i] = sum_d vals[d, i] x[i + offs[d]] over i + offs[d] in [0, n), in float64 on x's device."""
    v = vals.double().reshape(len(offs), m)
    x = x.double().reshape(-1)
    y = torch.zeros(m, dtype=torch.float64, device=x.device)
    rows = torch.arange(m, device=x.device)
    for d, o in enumerate(offs):
        j = rows + o
        ok = (j >= 0) & (j < n)
        y[ok] += v[d][ok] * x[j[ok]]
    return y


def test_s11_shifted_reference_is_dense():
    m, n = 200, 180
    offs = [-30, -1, 0, 1, 7, 150]
    D = banded_dense(m, n, offs, torch.float64, seed=3, holes=0.0)
    vals = torch.stack([torch.tensor([D[i, i + o].item() if 0 <= i + o < n else 0.0 for i in range(m)], dtype=torch.float64) for o in offs])
    x = _x(n, 1, torch.float64, 4)
    assert rel_err(_shifted_reference(vals, offs, m, n, x), (D @ x.double())[:, 0]) < 1e-14


def _chain_matrix(dtype, m=1 << 19, s=64, seed=0):
    """A 7-point-like DIA matrix of m rows (offsets 0, +-1, +-s, +-s^2), values in [-0.25, 0.25): a
    chain of products neither grows nor vanishes fast; NaN in the slots outside the matrix. Built from
    its buffers (offsets, values by diagonal and row). Returns it and its offsets."""
    offs = [-s * s, -s, -1, 0, 1, s, s * s]
    g = torch.Generator().manual_seed(seed)
    vals = ((torch.rand(len(offs), m, generator=g, dtype=torch.float64) - 0.5) * 0.5).to(dtype)
    rows = torch.arange(m)
    for d, o in enumerate(offs):
        vals[d][((rows + o) < 0) | ((rows + o) >= m)] = float("nan")
    pos = torch.tensor([0, len(offs)], dtype=torch.int64)
    A = st.SparseTensor(DIA, (m, m), [pos.cuda(), None], [torch.tensor(offs, dtype=torch.int64).cuda(), None],
                        vals.reshape(-1).cuda())
    return A, offs


def _check_chain(A, offs, Ys, dtype, steps, vals_at=None):
    torch.cuda.synchronize()
    m = A.shape[0]
    for i in range(steps):
        y = Ys[i + 1].reshape(-1)
        assert torch.isfinite(y).all(), f"step {i + 1}: NaN (read X or the values before they were written?)"
        v = A.values if vals_at is None else vals_at(i)
        ref = _shifted_reference(v, offs, m, m, Ys[i])
        assert rel_err(y, ref) < TOL[dtype] * 4, f"step {i + 1}"


@gpu
@pytest.mark.parametrize("variant", PDL_VARIANTS + ("qw", "qwt", "qwe", "qwb"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=_ids)
def test_s11_pdl_chain(variant, dtype):
    """y_{i+1} = A y_i back to back through the recorded launch (PDL from the second launch on), NaN
    outputs before, a torch kernel writing X just before the first PDL launch and the values in place
    mid-chain; then the same chain captured in a CUDA graph, replayed with new inputs and values."""
    from sparsetorch_cuda.launch import arch_of

    A, offs = _chain_matrix(dtype)
    m = A.shape[0]
    plan = _plan(A, variant)
    steps = 8
    Ys = torch.full((steps + 1, m, 1), float("nan"), dtype=dtype, device="cuda")
    x0 = _x(m, 1, dtype, 7).cuda()
    plan.apply(x0)  # the recording (a plain launch)
    prep = plan._prepared[(1, 0)]
    assert prep.pdl == (int(arch_of(torch.cuda.current_device())[3:]) >= 90), variant
    Ys[0].copy_(x0)  # a torch kernel right before the first PDL launch: it must see its write
    v0 = A.values.clone()
    for i in range(steps):
        if i == 4:
            A.values.mul_(-1)  # a torch kernel writing the values mid-chain (read where they lie)
        prep(Ys[i].data_ptr(), Ys[i + 1].data_ptr())
    _check_chain(A, offs, Ys, dtype, steps, lambda i: v0 if i < 4 else -v0)
    # through plan.apply (the same replay; Y from torch's allocator)
    ys = [x0]
    for _ in range(4):
        ys.append(plan.apply(ys[-1]))
    torch.cuda.synchronize()
    for i in range(4):
        assert rel_err(ys[i + 1][:, 0], _shifted_reference(A.values, offs, m, m, ys[i])) < TOL[dtype] * 4
    # captured in a CUDA graph (the programmatic edges recorded), replayed with new X and new values
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(steps):
            prep(Ys[i].data_ptr(), Ys[i + 1].data_ptr())
    for seed in (8, 9):
        Ys[1:].fill_(float("nan"))
        Ys[0].copy_(_x(m, 1, dtype, seed).cuda())
        A.values.mul_(0.5)
        g.replay()
        _check_chain(A, offs, Ys, dtype, steps)


@gpu
@pytest.mark.parametrize("variant", ("p1w", "qw", "p1nbw"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=_ids)
def test_s11_pdl_bound_chain(variant, dtype):
    """The bound launch (what Matmul.execute calls per product): plain first call, PDL after; a chain
    through it with NaN outputs, the values written in place by a torch kernel mid-chain; in a graph."""
    A, offs = _chain_matrix(dtype, seed=1)
    m = A.shape[0]
    plan = _plan(A, variant)
    steps = 8
    Ys = torch.full((steps + 1, m, 1), float("nan"), dtype=dtype, device="cuda")
    Ys[0].copy_(_x(m, 1, dtype, 3).cuda())
    bound = plan.bind(A.values, Ys[0])
    assert bound is not None
    v0 = A.values.clone()
    for i in range(steps):
        if i == 3:
            A.values.mul_(-2)
        assert bound(Ys[i], Ys[i + 1])
    _check_chain(A, offs, Ys, dtype, steps, lambda i: v0 if i < 3 else -2 * v0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(steps):
            bound(Ys[i], Ys[i + 1])
    Ys[1:].fill_(float("nan"))
    Ys[0].copy_(_x(m, 1, dtype, 4).cuda())
    g.replay()
    _check_chain(A, offs, Ys, dtype, steps)


@gpu
@pytest.mark.parametrize("variant", ("p1w", "qw", "qwt", "p1nbw"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=_ids)
def test_s11_matmul_execute_pdl(monkeypatch, variant, dtype):
    """Matmul.execute with the variant as the default: bound, right after in-place writes of X and of
    the values by torch kernels, many calls back to back."""
    import sparsetorch_cuda.plan as plan_mod

    monkeypatch.setattr(plan_mod, "DIA_DEFAULT_FEW", variant)
    monkeypatch.setattr(plan_mod, "DIA_DEFAULT_FEW_F64", variant)
    A, offs = _chain_matrix(dtype, seed=2)
    m = A.shape[0]
    b = _x(m, 1, dtype, 5)[:, 0].cuda()
    mm = st.Matmul(A, b, backend="cuda")
    mm.plan()
    assert mm._state.plan.variant == variant
    outs = []
    for i in range(6):
        y = mm.execute()
        outs.append((b.clone(), A.values.clone(), y))
        b.copy_(y)  # X written in place by a torch kernel, then the next (PDL) launch reads it
        if i == 2:
            A.values.mul_(-1)
    assert mm._direct is not None
    torch.cuda.synchronize()
    for xb, vb, y in outs:
        assert rel_err(y.reshape(-1), _shifted_reference(vb, offs, m, m, xb)) < TOL[dtype] * 4
