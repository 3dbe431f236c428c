"""Compiled conversion steps offered to the core (hook ``sparsetorch_conversion_kernels``).

``csr_to_bsr``: CSR -> BSR on the CPU with the blocks of each block row sorted by block column
(the canonical BSR that SciPy's ``tobsr`` + ``sort_indices`` give), in one C++ routine
(src/convert.cpp) that runs without the GIL. Its contract is ``CONVERSION_KERNELS["csr_to_bsr"]``
in ``sparsetorch.backend``.

The extension is loaded on the first call, not on import.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union, cast

import numpy as np

__all__ = ["csr_to_bsr"]

_INT64_MAX = 2**63 - 1

BsrParts = Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]


def csr_to_bsr(bh: int, bw: int, m: int, n: int, ptr: np.ndarray, col: np.ndarray, vals: Optional[np.ndarray],
               max_blocks: int, want_slots: bool) -> Union[BsrParts, int, None]:
    """CSR (``ptr``, ``col``, ``vals``) of an ``m x n`` matrix -> BSR with ``bh x bw`` blocks.

    ``ptr`` (m + 1,) and ``col`` (nnz,): contiguous NumPy arrays of one dtype, int32 or int64,
    the columns of each row strictly increasing; ``m % bh == 0`` and ``n % bw == 0``. ``vals``:
    a contiguous 1-D array of nnz values of itemsize 2, 4, 8 or 16, moved as raw bytes (-0.0 and
    NaN payloads kept bit for bit), or None.

    Returns ``(bp, bj, data, slots)``: ``bp`` (m // bh + 1,) and ``bj`` (nblocks,) int64, the
    block columns of each block row increasing; ``data`` (nblocks * bh * bw,) in vals' dtype,
    zero where no entry lies (None without vals); ``slots`` (nnz,) int64, entry e's index in
    data (``block * bh * bw + (row % bh) * bw + col % bw``), or None unless ``want_slots``.
    Returns the number of blocks (an int, nothing big allocated) when it exceeds ``max_blocks``,
    and None to decline: vals of another itemsize (or holding Python objects, or misaligned), a
    row whose columns do not increase strictly, a column outside ``[0, n)``.

    Raises ValueError for arguments that break the contract: lengths (ptr not m + 1, col not
    ptr[m], vals not nnz), index dtypes (not int32/int64, or different), layout (not 1-D and
    contiguous), shapes not divisible by the block, ptr[0] != 0 or decreasing.
    """
    for name, a in (("ptr", ptr), ("col", col)):
        if not isinstance(a, np.ndarray):
            raise ValueError(f"csr_to_bsr: {name} must be a NumPy array, got {type(a).__name__}")
    if vals is not None and not isinstance(vals, np.ndarray):
        raise ValueError(f"csr_to_bsr: vals must be a NumPy array or None, got {type(vals).__name__}")
    sizes = {"bh": bh, "bw": bw, "m": m, "n": n}
    for name, v in sizes.items():
        if not 0 <= int(v) <= _INT64_MAX:
            raise ValueError(f"csr_to_bsr: {name} = {v} is outside [0, 2**63)")
    if int(max_blocks) < 0:
        raise ValueError(f"csr_to_bsr: max_blocks must be >= 0, got {max_blocks}")
    from ._lib import lib

    got = lib().csr_to_bsr(int(bh), int(bw), int(m), int(n), ptr, col, vals, min(int(max_blocks), _INT64_MAX),
                           bool(want_slots))
    return cast("Union[BsrParts, int, None]", got)
