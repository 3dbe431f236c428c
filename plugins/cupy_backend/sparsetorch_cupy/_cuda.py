"""CuPy on torch's terms: lazy import, torch's current stream, zero-copy DLPack hand-off.

The solvers run inside :func:`on_torch_stream`: CuPy's current device and stream are set to the
tensor's device and ``torch.cuda.current_stream()``, so CuPy kernels, cuSPARSE calls (the
handle's stream is set explicitly before each call) and torch's own work are ordered on one
stream without a synchronization. Products alone (``spmm``) launch no CuPy kernel and only set
the handle's stream. Tensors cross with ``cupy.from_dlpack`` / ``torch.from_dlpack`` (no copy); the
memory stays owned by its producer.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import numpy as np
import torch

__all__ = ["cupy", "on_torch_stream", "to_cupy", "to_torch", "numpy_dtype", "cuda_major_mismatch", "mark_canonical"]


@functools.lru_cache(maxsize=None)
def cupy() -> Any:
    """The ``cupy`` module (imported on first use; a clear error when it is missing)."""
    try:
        import cupy as cp  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - the plugin declines before a plan is built
        raise ImportError("the cupy backend needs CuPy: pip install 'sparsetorch-cupy[cuda12]' or "
                          "'sparsetorch-cupy[cuda13]' (cupy-cuda12x / cupy-cuda13x, matching torch.version.cuda)") from exc
    return cp


_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.complex64: np.complex64, torch.complex128: np.complex128}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(_NP[dtype])


@functools.lru_cache(maxsize=64)
def _external_stream(ptr: int, device_index: int) -> Any:
    return cupy().cuda.ExternalStream(ptr, device_index)


@contextlib.contextmanager
def on_torch_stream(device: torch.device) -> Iterator[int]:
    """CuPy's current device and stream = ``device`` and torch's current stream on it.

    Yields the stream pointer (for cuSPARSE's ``setStream``)."""
    cp = cupy()
    index = device.index if device.index is not None else torch.cuda.current_device()
    ptr = torch.cuda.current_stream(index).cuda_stream
    with cp.cuda.Device(index):
        with _external_stream(ptr, index):
            yield ptr


def to_cupy(t: torch.Tensor) -> Any:
    """A CuPy view of a CUDA tensor (DLPack, no copy). Conjugate/negative views are resolved first."""
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return cupy().from_dlpack(t.detach())


def to_torch(a: Any) -> torch.Tensor:
    """A torch view of a CuPy array (DLPack, no copy)."""
    return torch.from_dlpack(a)


def cuda_major_mismatch() -> str | None:
    """A warning text when CuPy and torch were built for different CUDA major versions."""
    try:
        cp = cupy()
        runtime = cp.cuda.runtime.runtimeGetVersion() // 1000
    except Exception:  # noqa: BLE001 - only informative
        return None
    tv = torch.version.cuda
    if tv is None:
        return None
    if int(tv.split(".")[0]) != runtime:
        return (f"CuPy runs CUDA {runtime}.x but torch was built for CUDA {tv}: install the matching wheel "
                f"(cupy-cuda{tv.split('.')[0]}x)")
    return None


def mark_canonical(mat: Any) -> None:
    """Tell cupyx a CSR is sorted and duplicate-free (true by construction here): no re-check."""
    try:
        mat.has_canonical_format = True
    except AttributeError:  # a CuPy without the setter computes it on demand
        pass
