"""Helpers shared by the cuda backend's tests: the ``gpu`` marker, random test matrices, and a
dense float64 reference."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

import sparsetorch as st


def _gpu_missing() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if importlib.util.find_spec("cuda.bindings") is None:
        return "needs cuda.bindings (pip install cuda-bindings nvidia-cuda-nvrtc)"
    return None


GPU_MISSING = _gpu_missing()
gpu = pytest.mark.skipif(GPU_MISSING is not None, reason=GPU_MISSING or "")

#: accepted ||y - ref|| / ||ref|| per dtype (ref in float64 from the same rounded inputs)
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 2e-5, torch.float64: 1e-12}


def random_dense(m: int, n: int, density: float, dtype: torch.dtype, *, seed: int = 0, empty_rows: int = 0,
                 long_rows: int = 0) -> torch.Tensor:
    """An (m, n) matrix with about ``density`` of its entries nonzero, values exactly
    representable in ``dtype`` (so the reference sees the same numbers), returned in float64.
    ``empty_rows`` rows are zeroed, ``long_rows`` rows are made dense (skew)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(m, n, generator=g) < density
    if long_rows:
        mask[torch.randperm(m, generator=g)[:long_rows]] = True
    if empty_rows:
        mask[torch.randperm(m, generator=g)[:empty_rows]] = False
    vals = (torch.rand(m, n, generator=g, dtype=torch.float64) + 0.5) * torch.where(torch.rand(m, n, generator=g) < 0.5, -1.0, 1.0)
    return (vals * mask).to(dtype).to(torch.float64)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    if not torch.isfinite(y).all():
        return float("inf")
    return float(torch.linalg.vector_norm(y - ref) / max(torch.linalg.vector_norm(ref), 1e-300))


def to_format(D: torch.Tensor, fmt, dtype: torch.dtype, index_dtype: torch.dtype, device: str = "cuda") -> st.SparseTensor:
    A = st.SparseTensor.from_dense(D.to(dtype), mask=D != 0)
    return A.convert(fmt, index_dtype=index_dtype).to(device)


def banded_dense(m: int, n: int, offsets, dtype: torch.dtype, *, seed: int = 0, holes: float = 0.1) -> torch.Tensor:
    """An (m, n) matrix nonzero on the diagonals ``j - i in offsets`` (with a fraction ``holes``
    of them zero: stored zeros in DIA), values representable in ``dtype``, in float64."""
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(m)[:, None]
    j = torch.arange(n)[None, :]
    mask = torch.zeros(m, n, dtype=torch.bool)
    for o in offsets:
        mask |= (j - i) == o
    mask &= torch.rand(m, n, generator=g) >= holes
    vals = torch.rand(m, n, generator=g, dtype=torch.float64) + 0.5
    return (vals * mask).to(dtype).to(torch.float64)


def nm_dense(m: int, n: int, nn: int, mm: int, dtype: torch.dtype, *, seed: int = 0, fill: float = 0.8) -> torch.Tensor:
    """An (m, n) matrix with at most ``nn`` nonzeros in every ``mm`` consecutive columns of a row
    (N:M), each group holding ``nn`` with probability ``fill`` (else fewer), in float64."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-n // mm)
    score = torch.rand(m, groups, mm, generator=g)
    keep = torch.zeros(m, groups, mm, dtype=torch.bool)
    top = score.topk(nn, dim=-1).indices
    keep.scatter_(-1, top, True)
    keep &= torch.rand(m, groups, mm, generator=g) < fill ** (1 / nn)
    mask = keep.reshape(m, groups * mm)[:, :n]
    vals = (torch.rand(m, n, generator=g, dtype=torch.float64) + 0.5) * torch.where(torch.rand(m, n, generator=g) < 0.5, -1.0, 1.0)
    return (vals * mask).to(dtype).to(torch.float64)


def make_plan(A: st.SparseTensor, variant: str | None = None):
    """The cuda backend's plan of ``A`` (``variant`` or the default), with ``A``'s values loaded."""
    from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: PLC0415 - needs the plugin's GPU side

    p = CudaSpmmPlan(A, variant=variant)
    p.set_values(A.values)
    return p


def random_x(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A (rows, k) right-hand side, standard normal in float64 rounded to ``dtype`` (on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g, dtype=torch.float64).to(dtype)


# The tensor-core SpMM tests' helpers (test_cuda_spmm_wd.py, test_cuda_spmm_pb.py) ---------------------------
def sm90_missing() -> str | None:
    if GPU_MISSING is not None:
        return GPU_MISSING
    if torch.cuda.get_device_capability(0)[0] < 9:
        return "needs an sm_90 GPU or later"
    return None


SM90_MISSING = sm90_missing()
sm90 = pytest.mark.skipif(SM90_MISSING is not None, reason=SM90_MISSING or "")


def csr_of(D: torch.Tensor, index: torch.dtype = torch.int64):
    nz = D != 0
    rowptr = torch.zeros(D.shape[0] + 1, dtype=torch.int64, device=D.device)
    rowptr[1:] = torch.cumsum(nz.sum(1), 0)
    col = torch.nonzero(nz)[:, 1]
    return rowptr.to(index), col.to(index), D[nz]


def nvrtc_missing() -> str | None:
    from sparsetorch_cuda import compile as c

    return c.nvrtc_missing()


@functools.lru_cache(maxsize=8)
def gpu_matrix(m: int, n: int, density: float, dtype: torch.dtype, empty: int, full: int, seed: int) -> torch.Tensor:
    """An (m, n) masked weight on the GPU in ``dtype`` (values +-[0.5, 1.5)), ``empty`` empty rows, ``full`` dense rows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    mask = torch.rand(m, n, generator=g, device="cuda") < density
    if full:
        mask[torch.randperm(m, generator=g, device="cuda")[:full]] = True
    if empty:
        mask[torch.randperm(m, generator=g, device="cuda")[:empty]] = False
    sign = torch.where(torch.rand(m, n, generator=g, device="cuda") < 0.5, -1.0, 1.0)
    vals = (torch.rand(m, n, generator=g, device="cuda") + 0.5) * sign
    return (vals * mask).to(dtype)


def masked_reference(W: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The masked dense product in float32 (X^T W^T + b), independent of the kernel."""
    y = x.float() @ W.float().T
    return y + b.float() if b is not None else y


def check_product(op, W, k: int, bias: bool, seed: int = 0, x: torch.Tensor | None = None) -> None:
    m, n = W.shape
    g = torch.Generator(device="cuda").manual_seed(seed + k)
    if x is None:
        x = torch.randn(k, n, generator=g, device="cuda").to(W.dtype)
    b = torch.randn(m, generator=g, device="cuda").to(W.dtype) if bias else None
    out = torch.full((k, m), float("nan"), dtype=W.dtype, device="cuda")
    y = op(x, b, out=out)
    torch.cuda.synchronize()
    assert y.shape == (k, m)
    assert bool(torch.isfinite(y).all()), "an output element was not written (NaN left)"
    ref = masked_reference(W, x, b)
    if float(ref.abs().max()) == 0.0:
        assert not bool(y.float().abs().max() > 0)
    else:
        assert rel_err(y, ref) < TOL[W.dtype]

