"""Conversion steps in this plugin's kernels, offered to the core through the
``sparsetorch_conversion_kernels`` hook (``sparsetorch.backend.CONVERSION_KERNELS`` holds
each step's contract).

``csr_rows`` (CSR -> COO on a GPU): the row of every entry, one launch of ``csr_rows``
(kernels/spmv.cu): blocks of 2048 consecutive entries, whatever the rows, so any mix of row lengths
takes the same time per entry; each block finds its first and last row by a 32-way search of the
pointers and each entry its row by a binary search of those rows' pointers in shared memory. The
core's own path (``torch.searchsorted`` of every entry in the row ends) runs where this declines.
"""

from __future__ import annotations

import torch

from .launch import _REC, kernel

__all__ = ["csr_rows", "KERNELS", "ENTRIES_PER_BLOCK"]

#: entries per block of the csr_rows kernel (kernels/spmv.cu CR_PER_BLOCK)
ENTRIES_PER_BLOCK = 2048


def csr_rows(ptr: torch.Tensor, out: torch.Tensor) -> bool:
    """``out[e] = i`` for ``ptr[i] <= e < ptr[i + 1]`` on ``ptr``'s GPU, on torch's current stream.
    ``ptr``: the core's validated pointers (contiguous, int32 or int64); ``out``: ``ptr[-1]`` entries of
    the same dtype and device. Returns False (nothing launched) where it does not apply: not a CUDA
    tensor, mismatched dtypes or devices, non-contiguous buffers, or inside a plan's recording of its
    launches (a conversion is not part of a product's replay)."""
    dev = ptr.device
    dt = ptr.dtype
    if (dev.type != "cuda" or out.device != dev or out.dtype is not dt or (dt is not torch.int32 and dt is not torch.int64)
            or ptr.dim() != 1 or out.dim() != 1 or not ptr.is_contiguous() or not out.is_contiguous() or ptr.numel() < 1):
        return False
    if _REC.calls is not None:
        return False
    m, nnz = ptr.numel() - 1, out.numel()
    if nnz == 0:
        return True
    if m == 0:
        return False  # not a validated pointer array of nnz entries
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    kern = _KERNELS.get((idx, dt))
    if kern is None:  # the value type is unused
        kern = _KERNELS[(idx, dt)] = kernel("spmv", "csr_rows", torch.float32, dt, idx, 4)
    kern((-(-nnz // ENTRIES_PER_BLOCK), 1), 256, (m, nnz, ptr.data_ptr(), out.data_ptr()), device=idx)
    return True


#: (device index, index dtype) -> the loaded csr_rows kernel (``launch.kernel`` caches it too; this
#: saves its six-argument lookup on a path whose whole host time is a few microseconds)
_KERNELS: dict = {}


#: what the plugin's ``sparsetorch_conversion_kernels`` hook returns
KERNELS = {"csr_rows": csr_rows}
