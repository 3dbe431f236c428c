"""Helpers shared by the cuda backend's tests: the ``gpu`` marker, random test matrices, and a
dense float64 reference."""

from __future__ import annotations

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
