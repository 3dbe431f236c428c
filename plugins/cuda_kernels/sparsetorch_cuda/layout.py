"""The plan's layout rules: kernel variants and defaults, the format parameters the kernels take,
the SELL-C-sigma layout, and the index checks every pattern passes before a kernel reads it."""

from __future__ import annotations

import functools
from typing import Any

import torch

from sparsetorch import InputError
from sparsetorch.format import BSR, CSR, DELTA, DIA, ELL, NM, LevelFormat
from sparsetorch.format.expr import FloorDiv

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BLOCK = 256
#: nonzeros per warp in the load-balanced CSR kernel
CHUNK = 512
#: DELTA: X is copied into shared memory when it has at most this many bytes (no opt-in needed)
DELTA_SMEM_BYTES = 48 * 1024
DELTA_SMEM_BLOCK = 512
#: columns of X from which the lanes of a warp run over columns (csr_cols) instead of entries
COLS_KERNEL_FROM = 16
#: columns of a half-precision X from which the tensor-core SpMM (kernels/mma.cu) runs
MMA_MIN_K = 8
#: half-precision CSR with one right-hand side and at least this mean row length runs csr16_warp
#: (uint16 columns, a warp per row, bias fused) where the tensor-core kernel's layout exists
CSR16_MIN_MEAN = 32
#: column tiles (of 64) one block of the tensor-core kernel takes at most (kernels/mma.cu MMA_MAX_TILES)
MMA_MAX_TILES = 64
#: rows of A per block of the tensor-core kernel (CudaSpmmPlan.mma_rows)
MMA_ROWS = 128
_GRID_Y = 65535
_PACKABLE_BITS = (1, 2, 4, 8, 16)
#: the 32-bit kernels (fast.cu, nm24) run while every entry / row / X and Y offset stays below this
INT_LIMIT = 2**31 - 1024
#: CSR "stream" kernel (32 rows per warp) for mean row length <= this and longest row <= STREAM_MAX_ROW
STREAM_MEAN = 16
STREAM_MAX_ROW = 256
#: the stream kernel chosen by default: "streamcs" (columns and values with the evict-first hint;
#: cuda_kernels_h200_s4.json, 114^3 stencil, CSR int32: float64 42.8 us, float32 26.5 us, against
#: "stream"'s 45.3 and 31.5 in the same run)
STREAM_DEFAULT = "streamcs"
#: threads per block of the DELTA kernels (fast.cu) and of nm24 (structured.cu's NM_BLOCK)
ROW_KERNEL_BLOCK = 512
NM_BLOCK = 384
#: kernel variants per kind and the defaults (see CudaSpmmPlan's docstring). The defaults are the
#: variants measured fastest and tested on the H200 (benchmarks/results/cuda_kernels_h200.json and,
#: for "p1".."p4", "packed2", "s1".."s4", cuda_kernels_h200_variants.json: NM(2,4) 8192^2 "s2"
#: 21.9 us fp16 / 22.1 us bf16 against "warp"'s 24.9 / 23.8; "p1" 31.0 us against rows2's 30.9;
#: "packed2" 47.9 us against packed's 38.4).
DIA_VARIANTS = ("rows2", "rows1", "p1", "p1cs", "p2", "p4", "classic")
#: DIA default for float32 / half with at most 8 diagonals: "p1w" (session 11: "p1" after griddepcontrol.wait,
#: launched with programmatic dependent launch by the plan's replays; plan.DIA_PDL). 114^3 stencil, float32,
#: cuda_kernels_h200_s11f_dia.json, two rounds: Matmul.execute back to back 14.89 / 14.84 us against "p1"'s
#: 16.57 / 16.50 (the same kernel without PDL 16.52 / 16.33), in a CUDA graph 15.11 / 14.85 against 14.92 /
#: 15.13 (a tie). Before: "p1" (cuda_kernels_h200_s4.json: 15.1 us against rows2's 19.7; "p1cs" 26.4).
#: Float64 takes plan.DIA_DEFAULT_FEW_F64; more diagonals DIA_DEFAULT
DIA_DEFAULT_FEW = "p1w"
#: threads per block of the "p" DIA kernels (same run: 128 gave 30.3 / 15.2 us, 512 34.7 / 15.4)
DIA_BLOCK = 256
DIA_DEFAULT = "rows2"
CSR_VARIANTS = ("stream", "streamcs", "stream4", "stream16", "vector", "balanced", "sell")
DELTA_VARIANTS = ("packed", "packed2", "groups", "lanes")
DELTA_DEFAULT = "packed"
#: (session 13 tried s1 / s2 with the products on the tensor cores, the DELTA tc kernels' diagonal trick: 8192^2
#: fp16 28.7 / 23.3 us against s2's 22.1, bf16 alike; results/cuda_kernels_h200_s13_nm.json; removed)
NM_VARIANTS = ("warp", "s1", "s2", "s3", "s4")
NM_DEFAULT = "s2"


def nm_params(fmt: Any) -> tuple[int, int] | None:
    """(n, m) of an NM(n, m) format, else None."""
    if fmt is None or fmt.num_batch_levels or len(fmt.levels) != 3:
        return None
    lv = fmt.levels
    if lv[2].type.format is not LevelFormat.STRUCTURED or not isinstance(lv[1].expr, FloorDiv):
        return None
    n_, m_ = int(lv[2].type.parameter), int(lv[1].expr.c)
    return (n_, m_) if fmt == NM(n_, m_) else None


def bsr_params(fmt: Any) -> tuple[int, int] | None:
    """(bh, bw) of a BSR(bh, bw) format, else None."""
    if fmt is None or fmt.num_batch_levels or len(fmt.levels) != 4:
        return None
    lv = fmt.levels
    if not (isinstance(lv[0].expr, FloorDiv) and isinstance(lv[1].expr, FloorDiv)):
        return None
    bh, bw = int(lv[0].expr.c), int(lv[1].expr.c)
    return (bh, bw) if fmt == BSR(bh, bw) else None


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _nm_pos_bits(m_: int) -> int | None:
    for b in (1, 2, 4, 8):
        if m_ <= (1 << b):
            return b
    return None


def delta_bits(fmt: Any) -> int | None:
    """b of a DELTA(b) format (i dense, j delta(b)), else None."""
    if fmt is None or fmt.num_batch_levels or len(fmt.levels) != 2:
        return None
    lt = fmt.levels[1].type
    if lt.format is not LevelFormat.DELTA or lt.parameter is None:
        return None
    b = int(lt.parameter)
    return b if fmt == DELTA(b) else None


def native_kind(fmt: Any) -> str:
    """Which kernel family takes ``fmt`` as it is stored: csr, dia, ell, delta, or generic (a CSR
    made from the entries once per pattern)."""
    if fmt == CSR:
        return "csr"
    if fmt == DIA:
        return "dia"
    if fmt == ELL:
        return "ell"
    b = delta_bits(fmt)
    if b is not None and b in _PACKABLE_BITS:
        return "delta"
    nm = nm_params(fmt)
    if nm is not None and nm[0] <= nm[1] and _nm_pos_bits(nm[1]) is not None:
        return "nm"
    if bsr_params(fmt) is not None:
        return "bsr"
    return "generic"


#: SELL-C-sigma: slice height (a warp) and the default sorting window
SELL_C = 32
SELL_SIGMA = 1


def sell_layout(rowptr: torch.Tensor, col: torch.Tensor, *, sigma: int = SELL_SIGMA, c: int = SELL_C) -> dict[str, Any]:
    """SELL-C-sigma layout of a CSR pattern (pattern work, on any device).

    Rows are sorted by length (descending, stable) inside windows of ``sigma`` rows (``sigma = 1``:
    no sorting, no permutation), cut into slices of ``c`` rows, each slice padded to its longest
    row and stored column-major: slot ``(r, t)`` of slice ``s`` is ``slice_ptr[s] + t * c + r``.
    Returns ``slice_ptr`` (int64, nslices + 1), ``src`` (int64 per slot: the CSR entry it holds, or
    nnz for padding, so ``cat([values, 0])[src]`` gives the slot values), ``col`` (int32 per slot,
    0 for padding), ``perm`` (int32: matrix row of each row position, or None when sigma == 1),
    ``nslices`` and ``slots``."""
    m = rowptr.numel() - 1
    dev = rowptr.device
    r64 = rowptr.to(torch.int64)
    lengths = r64[1:] - r64[:-1]
    nnz = int(r64[-1]) if m >= 0 else 0
    perm = None
    order = torch.arange(m, device=dev, dtype=torch.int64)
    if sigma > 1 and m:
        win = order // sigma
        key = win * (int(lengths.max()) + 1) + (int(lengths.max()) - lengths)  # window, then longest first
        order = torch.argsort(key, stable=True)
        perm = order.to(torch.int32)
    nslices = -(-m // c) if m else 0
    plen = torch.zeros(nslices * c, dtype=torch.int64, device=dev)
    plen[:m] = lengths[order]
    width = plen.reshape(nslices, c).amax(1) if nslices else plen[:0]
    slice_ptr = torch.zeros(nslices + 1, dtype=torch.int64, device=dev)
    slice_ptr[1:] = torch.cumsum(width * c, 0)
    slots = int(slice_ptr[-1])
    src = torch.full((slots,), nnz, dtype=torch.int64, device=dev)
    if m and nnz:
        q = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), plen[:m])  # row position per entry
        t = torch.arange(nnz, device=dev, dtype=torch.int64) - torch.repeat_interleave(torch.cumsum(plen[:m], 0) - plen[:m], plen[:m])
        start = r64[:-1][order]  # CSR start of each row position
        entry = torch.repeat_interleave(start, plen[:m]) + t
        slot = slice_ptr[q // c] + t * c + q % c
        src[slot] = entry
    col_s = torch.zeros(slots, dtype=torch.int32, device=dev)
    used = src < nnz
    col_s[used] = col.to(torch.int64)[src[used]].to(torch.int32)
    return {"slice_ptr": slice_ptr, "src": src, "col": col_s, "perm": perm, "nslices": nslices, "slots": slots}


def _vec_for(mean_row: float) -> int:
    v = 1
    while v < 32 and v * 2 <= max(mean_row, 1.0):
        v *= 2
    return max(2, v)


def _check_rowptr(rowptr: torch.Tensor, m: int, nnz: int, what: str) -> None:
    if rowptr.numel() != m + 1:
        raise InputError(f"{what}: row pointers have {rowptr.numel()} entries, expected m + 1 = {m + 1}")
    if m + 1 and (int(rowptr[0]) != 0 or int(rowptr[-1]) != nnz):
        raise InputError(f"{what}: row pointers must run from 0 to nnz = {nnz}, got {int(rowptr[0])} .. {int(rowptr[-1])}")
    if m and bool((rowptr[1:] < rowptr[:-1]).any()):
        raise InputError(f"{what}: row pointers decrease somewhere; the pattern is not a valid CSR")


def _check_cols(col: torch.Tensor, n: int, what: str) -> None:
    if col.numel() and (int(col.min()) < 0 or int(col.max()) >= n):
        raise InputError(f"{what}: column indices must lie in [0, {n}), got {int(col.min())} .. {int(col.max())}")


def _index_dtype(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) < 2**31 - 1 else torch.int64
