"""The product plan: ``Y = A X`` / ``Y = A^H X`` and the SDDMM of its backward, on this backend's
kernels.

Pattern work (``__init__``, once per sparsity pattern; may synchronize with the host):

- **CSR** (and any format without a kernel of its own: COO, CSC, BSR, DIA_J, N:M, ... go
  through a CSR made once from the pattern's entries, after which new values cost one gather):
  row pointers and columns validated (monotone from 0 to nnz, columns in range); the vector
  kernel's lanes per row from the mean row length; for the load-balanced variant, the first row
  of every warp's chunk of nonzeros.
- **DIA** (diagonals indexed by row): the offsets, validated, as int64 on the device.
- **ELL**: every row's slot range checked to be ``[r * width, r * width + count)``; counts as int32.
- **DELTA(b)** with b in {1, 2, 4, 8, 16}: gaps checked to fit b bits and to decode to columns
  inside the matrix, then **bit-packed** into uint32 words (b bits per gap instead of one
  index-dtype word): done once here, so the tensor's own storage stays as it is.

The adjoint direction uses the transposed CSR of the pattern (made on first use), its values a
gather of A's per value set. Values are used where they lie (no copy) when the format has its own
kernel; a call with the same values tensor (same storage and version) as the previous one skips
even the gather.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from sparsetorch import InputError, SparseTensor
from sparsetorch.format import BSR, CSR, DELTA, DIA, ELL, NM, LevelFormat
from sparsetorch.format.expr import FloorDiv

from .launch import Prepared, kernel, recording

__all__ = ["CudaSpmmPlan", "DTYPES", "delta_bits", "nm_params", "bsr_params", "native_kind", "sell_layout", "BLOCK"]

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
#: DIA default: "p1" for at most 8 diagonals (114^3 stencil, cuda_kernels_h200_s4.json: float32
#: 15.1 us against rows2's 19.7, float64 30.9 against 31.2; "p1cs" 35.0 / 26.4), else DIA_DEFAULT
DIA_DEFAULT_FEW = "p1"
#: threads per block of the "p" DIA kernels (same run: 128 gave 30.3 / 15.2 us, 512 34.7 / 15.4)
DIA_BLOCK = 256
DIA_DEFAULT = "rows2"
CSR_VARIANTS = ("stream", "streamcs", "stream4", "stream16", "vector", "balanced", "sell")
DELTA_VARIANTS = ("packed", "packed2", "groups", "lanes")
DELTA_DEFAULT = "packed"
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


class CudaSpmmPlan:
    """Sparse @ dense on a fixed pattern with this backend's kernels; values by :meth:`set_values`.

    ``variant`` picks the CSR kernel: ``"streamcs"`` / ``"stream"`` (with / without the
    evict-first hint on the entries; ``"stream4"``, ``"stream16"``: chunks of 128 / 512) (32 rows per warp, the warp's nonzeros read
    in coalesced chunks; for short rows), ``"vector"`` (VEC lanes per row, VEC from the mean row
    length), ``"balanced"`` (equal nonzeros per warp, for skewed rows) or ``"sell"`` (a
    SELL-C-sigma copy of the pattern made once, see :func:`sell_layout`; its values are one
    gather per value set; not yet run on a GPU, never chosen by default); ``None`` chooses
    by the rows' lengths (see :func:`sparsetorch_cuda.cost.csr_variant`). For DIA: ``"p1"``,
    ``"p2"``, ``"p4"`` (at most 8 diagonals, offsets as kernel parameters, 1/2/4 rows per
    thread), ``"rows1"``, ``"rows2"`` (offsets staged in shared memory, any count of diagonals,
    in batches of 8) or ``"classic"`` (64-bit kernel of spmv.cu); a "p" variant on more than 8
    diagonals runs as rows1/rows2. For DELTA: ``"packed2"`` / ``"packed"`` (b a compile-time
    constant, one gap load per 8 entries, two / one 8-entry groups per lane per step),
    ``"groups"`` or ``"lanes"`` (spmv.cu's earlier kernels); all copy X into shared memory when
    it fits in 48 KB. For N:M 2:4 with one right-hand side: ``"warp"`` (a warp per row) or
    ``"s1"`` .. ``"s4"`` (blocks of 384 threads, that many warps share a row). Defaults:
    :data:`DIA_DEFAULT`, :data:`DELTA_DEFAULT`, :data:`NM_DEFAULT` (the measured ones)."""

    method = "spmm"
    preconditioner = None
    #: apply(X, bias=) adds a bias per output row (fused where the kernel can; SparseLinear passes it)
    accepts_bias = True

    def __init__(self, A: SparseTensor, *, backend: str = "cuda", variant: str | None = None) -> None:
        from .cost import csr_variant  # noqa: PLC0415

        self.backend = backend
        fs = A.format_shape
        if len(fs) != 2 or A.format.num_batch_levels:
            raise InputError(f"{backend}: needs a matrix (2 format dimensions, no BATCH levels), got format {A.format}")
        if A.device.type != "cuda":
            raise InputError(f"{backend}: runs on CUDA tensors; A is on {A.device} (move it with .cuda())")
        if A.dtype not in DTYPES:
            raise InputError(f"{backend}: kernels exist for float16, bfloat16, float32, float64; A is {A.dtype}")
        self.shape = (int(fs[0]), int(fs[1]))
        self.device = A.device
        self.dev_index = A.device.index if A.device.index is not None else torch.cuda.current_device()
        self.dtype = A.dtype
        self.batch_shape = tuple(A.batch_shape)
        self.slots = int(A.values.shape[-1])
        self.kind = native_kind(A.format)
        self._source = A.detach()
        self._values: torch.Tensor | None = None
        self._values_t: torch.Tensor | None = None
        self._t: dict[str, Any] | None = None  # transposed CSR (adjoint), on first use
        self.gather: torch.Tensor | None = None  # generic: value slot of each CSR entry
        m, n = self.shape
        build = getattr(self, f"_build_{self.kind}")
        build(A)
        self.small = max(self.nnz, self.slots, m, n) < INT_LIMIT
        if self.kind in ("csr", "generic"):
            lengths = (self.rowptr[1:] - self.rowptr[:-1]) if m else self.rowptr[:0]
            self.max_row = int(lengths.max()) if m else 0
            self.variant = variant or csr_variant(m, self.nnz, self.max_row)
            if self.variant not in CSR_VARIANTS:
                raise InputError(f"{backend}: CSR variant must be one of {CSR_VARIANTS}, got {variant!r}")
            self.sell = None
            if self.variant == "sell":
                if not (self.small and n < INT_LIMIT):
                    raise InputError(f"{backend}: the SELL-C-sigma kernel needs fewer than {INT_LIMIT} entries, rows and columns")
                self.sell = sell_layout(self.rowptr, self.col, sigma=SELL_SIGMA)
            self.vec = _vec_for(self.nnz / max(m, 1))
            warps = max(1, math.ceil(self.nnz / CHUNK))
            starts = torch.arange(warps, device=self.device, dtype=torch.int64) * CHUNK
            self.first_row = (torch.searchsorted(self.rowptr.to(torch.int64), starts, right=True) - 1).clamp_(0, max(m - 1, 0)).to(self.idx)
        if self.kind == "delta":
            self.variant = variant or (DELTA_DEFAULT if self.small else "groups")
            if self.variant not in DELTA_VARIANTS:
                raise InputError(f"{backend}: DELTA variant must be one of {DELTA_VARIANTS}, got {variant!r}")
        if self.kind == "dia":
            self.variant = variant or ((DIA_DEFAULT_FEW if self.ndiag <= 8 else DIA_DEFAULT) if self.small else "classic")
            if self.variant not in DIA_VARIANTS:
                raise InputError(f"{backend}: DIA variant must be one of {DIA_VARIANTS}, got {variant!r}")
        if self.kind == "nm":
            self.variant = variant or NM_DEFAULT
            if self.variant not in NM_VARIANTS:
                raise InputError(f"{backend}: N:M variant must be one of {NM_VARIANTS}, got {variant!r}")
        self.reload_cheap = True
        #: the tensor-core SpMM for half-precision X of MMA_MIN_K or more columns (False: the other kernels)
        self.use_mma = True
        #: a cluster size for the tensor-core kernel (1, 2, 4, 8) instead of :meth:`mma_split`'s choice
        self.mma_split_override: int | None = None
        #: csr16_warp for half-precision CSR, one right-hand side, long rows (False: the other kernels)
        self.use_csr16 = variant is None
        self._mma: dict[str, Any] | None = None
        #: rows of A per block of the tensor-core kernel: 128 (256 threads, 2 blocks per SM) or 64
        #: (128 threads, 4 blocks per SM)
        self.mma_rows = MMA_ROWS
        #: benchmarking only (wrong results): 1 skips the products, 2 the zeroing of the A tile, 4 the loads
        self.mma_flags = 0
        #: the one launch of the common call (no adjoint, one matrix, X (n, k) contiguous), recorded on
        #: its first run, per (k, X's address mod 16): replayed with the new X and Y pointers
        self._prepared: dict[tuple[int, int], Prepared | None] = {}

    # Pattern builders ---------------------------------------------------------------------------
    def _build_csr(self, A: SparseTensor) -> None:
        m, n = self.shape
        rowptr, col = A.pos(1), A.crd(1)
        if rowptr.dtype != col.dtype:
            rowptr, col = rowptr.to(torch.int64), col.to(torch.int64)
        self.nnz = int(col.numel())
        _check_rowptr(rowptr, m, self.nnz, f"{self.backend} CSR")
        _check_cols(col, n, f"{self.backend} CSR")
        if rowptr.dtype == torch.int64 and max(self.nnz, m, n) < INT_LIMIT:
            # int32 copies of the indices, made once (as the torch backend narrows them): the 32-bit
            # kernels read 4 bytes less per entry (114^3 stencil, float64: 44 against 53 us)
            rowptr, col = rowptr.to(torch.int32), col.to(torch.int32)
        self.rowptr, self.col, self.idx = rowptr.contiguous(), col.contiguous(), rowptr.dtype

    def _build_generic(self, A: SparseTensor) -> None:
        m, n = self.shape
        coords, slot = A.entries()
        rows, cols = coords[0].to(torch.int64), coords[1].to(torch.int64)
        self.nnz = int(rows.numel())
        if self.nnz and (int(rows.min()) < 0 or int(rows.max()) >= m):
            raise InputError(f"{self.backend}: entry rows outside [0, {m})")
        _check_cols(cols, n, self.backend)
        order = torch.argsort(rows * max(n, 1) + cols, stable=True)
        idx = _index_dtype(self.nnz, m, n)
        counts = torch.bincount(rows, minlength=m)
        rowptr = torch.zeros(m + 1, dtype=torch.int64, device=self.dev_index)
        rowptr[1:] = torch.cumsum(counts, 0)
        self.rowptr, self.col, self.idx = rowptr.to(idx), cols[order].to(idx).contiguous(), idx
        self.gather = slot.to(torch.int64)[order].contiguous()

    def _build_dia(self, A: SparseTensor) -> None:
        m, n = self.shape
        offs = A.crd(0).to(torch.int64).contiguous()
        self.ndiag = int(offs.numel())
        if self.ndiag and (int(offs.min()) <= -max(m, 1) or int(offs.max()) >= max(n, 1)):
            raise InputError(f"{self.backend} DIA: offsets must lie in (-{m}, {n}), got {int(offs.min())} .. {int(offs.max())}")
        if self.slots != self.ndiag * m:
            raise InputError(f"{self.backend} DIA: {self.slots} value slots for {self.ndiag} diagonals of {m} rows")
        if self.ndiag > 4096:
            raise InputError(f"{self.backend} DIA: {self.ndiag} diagonals is more than the kernel's 4096")
        self.offs, self.nnz, self.idx = offs, self.ndiag * m, torch.int64
        self.offs32 = offs.to(torch.int32).contiguous()
        self.offs_host = offs.tolist() if self.ndiag <= 8 else []

    def _build_ell(self, A: SparseTensor) -> None:
        m, n = self.shape
        pos, col = A.pos(1), A.crd(1)
        width = self.slots // max(m, 1) if m else 0
        if m and width * m != self.slots:
            raise InputError(f"{self.backend} ELL: {self.slots} slots is not a multiple of {m} rows")
        lo, hi = pos[0::2].to(torch.int64), pos[1::2].to(torch.int64)
        expect = torch.arange(m, device=self.device, dtype=torch.int64) * width
        cnt = hi - lo
        if lo.numel() != m or bool((lo != expect).any()) or bool(((cnt < 0) | (cnt > width)).any()):
            raise InputError(f"{self.backend} ELL: row slot ranges are not [r * {width}, r * {width} + count)")
        if col.numel() != self.slots:
            raise InputError(f"{self.backend} ELL: {col.numel()} column slots for {self.slots} value slots")
        used = torch.arange(width, device=self.dev_index)[None, :] < cnt[:, None]
        _check_cols(col.reshape(m, width)[used] if m else col, n, f"{self.backend} ELL")
        idx = col.dtype
        self.col, self.cnt, self.width, self.idx = col.contiguous(), cnt.to(torch.int32).contiguous(), width, idx
        self.nnz = int(cnt.sum())

    def _build_delta(self, A: SparseTensor) -> None:
        m, n = self.shape
        b = delta_bits(A.format)
        rowptr, gaps = A.pos(1), A.crd(1)
        self.nnz = int(gaps.numel())
        _check_rowptr(rowptr, m, self.nnz, f"{self.backend} DELTA({b})")
        g = gaps.to(torch.int64)
        if self.nnz and (int(g.min()) < 0 or int(g.max()) >= (1 << b)):
            raise InputError(f"{self.backend} DELTA({b}): gaps must lie in [0, {1 << b}), got {int(g.min())} .. {int(g.max())}")
        # the last column of each row is (sum of gap + 1 over the row) - 1: it must be < n
        csum = torch.zeros(self.nnz + 1, dtype=torch.int64, device=self.dev_index)
        csum[1:] = torch.cumsum(g + 1, 0)
        r64 = rowptr.to(torch.int64)
        span = csum[r64[1:]] - csum[r64[:-1]]
        if m and int(span.max()) > n:
            raise InputError(f"{self.backend} DELTA({b}): gaps of a row decode past column {n - 1}")
        per = 32 // b
        # whole 8-entry groups (8 b bits each), rounded up to whole words
        words = -(-(-(-self.nnz // 8) * 8 * b) // 32) if self.nnz else 0
        padded = torch.zeros(words * per, dtype=torch.int64, device=self.dev_index)
        padded[: self.nnz] = g
        shifts = torch.arange(per, device=self.device, dtype=torch.int64) * b
        packed = (padded.reshape(words, per) << shifts).sum(1) if words else padded
        # uint32 words carried in an int32 tensor (two's complement of the same bits)
        packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
        self.words = torch.cat([packed, packed.new_zeros(4)]).contiguous()  # four spare words
        self.bits, self.rowptr, self.idx = b, rowptr.contiguous(), rowptr.dtype
        self.max_row = int((r64[1:] - r64[:-1]).max()) if m else 0

    def _build_nm(self, A: SparseTensor) -> None:
        m, n = self.shape
        self.nm_n, self.nm_m = nm_params(A.format)
        pb = _nm_pos_bits(self.nm_m)
        groups = -(-n // self.nm_m)
        S = groups * self.nm_n
        if self.slots != m * S:
            raise InputError(f"{self.backend} NM({self.nm_n},{self.nm_m}): {self.slots} value slots for {m} rows of {S}")
        pos = A.crd(2).to(torch.int64)
        if pos.numel() != self.slots:
            raise InputError(f"{self.backend} NM: {pos.numel()} positions for {self.slots} value slots")
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= self.nm_m):
            raise InputError(f"{self.backend} NM({self.nm_n},{self.nm_m}): in-group positions must lie in [0, {self.nm_m})")
        # slots of a last, partial group may point past column n - 1 (padding): the kernels skip them
        per = 32 // pb
        words = -(-self.slots // per) if self.slots else 0
        padded = torch.zeros(words * per, dtype=torch.int64, device=self.dev_index)
        padded[: self.slots] = pos
        shifts = torch.arange(per, device=self.device, dtype=torch.int64) * pb
        packed = (padded.reshape(words, per) << shifts).sum(1) if words else padded
        packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
        self.words = torch.cat([packed, packed.new_zeros(4)]).contiguous()
        self.pos_bits, self.row_slots, self.idx = pb, S, torch.int32
        self.nnz = self.slots

    def _build_bsr(self, A: SparseTensor) -> None:
        m, n = self.shape
        bh, bw = bsr_params(A.format)
        bptr, bcol = A.pos(1), A.crd(1)
        if bptr.dtype != bcol.dtype:
            bptr, bcol = bptr.to(torch.int64), bcol.to(torch.int64)
        brows, bcols = -(-m // bh), -(-n // bw)
        nblocks = int(bcol.numel())
        _check_rowptr(bptr, brows, nblocks, f"{self.backend} BSR({bh},{bw}) block rows")
        _check_cols(bcol, bcols, f"{self.backend} BSR({bh},{bw}) block columns")
        if self.slots != nblocks * bh * bw:
            raise InputError(f"{self.backend} BSR({bh},{bw}): {self.slots} value slots for {nblocks} blocks")
        self.bh, self.bw, self.rowptr, self.col, self.idx = bh, bw, bptr.contiguous(), bcol.contiguous(), bptr.dtype
        self.nnz = self.slots
        self.vec = _vec_for(nblocks * bw / max(brows, 1))

    # Values -------------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """Values of a tensor on this plan's pattern: ``(*batch, slots)``."""
        if values.shape[-1] != self.slots or values.dtype != self.dtype or values.device != self.device:
            raise InputError(f"{self.backend}: values of shape {tuple(values.shape)}, {values.dtype} on {values.device}; "
                             f"this plan takes (*batch, {self.slots}) {self.dtype} on {self.device}")
        # No shortcut on "the same tensor as last time": a gather or an alignment copy must be
        # redone, since writes through .data (gradcheck) or NumPy leave the version unchanged.
        # Formats with their own kernel read the values where they lie, so that costs nothing.
        self._values_t = None
        v = values
        if self.gather is not None:
            v = v.index_select(-1, self.gather)
        v = v.contiguous()
        if self.kind in ("delta", "nm") and v.data_ptr() % 16:
            v = v.clone()  # the DELTA / N:M kernels' 16-byte loads need an aligned base
        old = self._values
        self._values = v
        if getattr(self, "sell", None) is not None:  # SELL-C-sigma slots: one gather per value set
            ext = torch.cat([v, v.new_zeros(*v.shape[:-1], 1)], -1)
            self._values_sell = ext.index_select(-1, self.sell["src"]).contiguous()
            self._prepared = {}
        elif old is None or old.data_ptr() != v.data_ptr() or old.shape != v.shape:
            self._prepared = {}  # the recorded launches hold the old values' address

    # Products -----------------------------------------------------------------------------------
    def apply(self, X: torch.Tensor, *, adjoint: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``A @ X`` (``A^H @ X`` when ``adjoint``) for ``X`` of shape ``(*batch, n, k)``, plus
        ``bias[row]`` on every row when ``bias`` (a vector of the output's rows, A's dtype and
        device) is given: fused into the tensor-core SpMM kernel, a separate add otherwise.

        Half-precision X of 8 or more columns (CSR, formats through the generic CSR, N:M 2:4)
        runs the tensor-core kernel (kernels/mma.cu), which reads X^T and writes Y^T: an X given
        as the transpose of a contiguous ``(k, n)`` tensor (a linear layer's input, ``x.mT``) is
        read where it lies and Y comes back the same way (``Yt.mT``, Yt contiguous ``(k, m)``);
        a contiguous X is transposed first and Y returned contiguous."""
        m, n = self.shape
        if bias is not None:
            rows_b = n if adjoint else m
            if bias.shape != (rows_b,) or bias.dtype != self.dtype or bias.device != self.device:
                raise InputError(f"{self.backend}: bias must be ({rows_b},) {self.dtype} on {self.device}; got "
                                 f"{tuple(bias.shape)} {bias.dtype} on {bias.device}")
            bias = bias.contiguous()
        if not adjoint and X.dim() == 2 and X.shape[0] == n and X.dtype == self.dtype and X.device == self.device \
                and self._values is not None and self._values.dim() == 1:
            k = X.shape[1]
            if self._mma_ok(k):
                return self._apply_mma(X, k, bias)
        if not adjoint and X.dim() == 2 and X.shape[0] == n and X.dtype == self.dtype and X.is_contiguous() \
                and X.device == self.device and self._values is not None:
            k = X.shape[1]
            xp = X.data_ptr()
            key = (k, xp & 15) if bias is None else (k, xp & 15, bias.data_ptr())
            prep = self._prepared.get(key)
            if prep is not None:
                Y = torch.empty((m, k), dtype=self.dtype, device=self.device)
                yp = Y.data_ptr()
                if yp & 15:  # never seen from torch's allocator; the recorded kernel may store 16 bytes at once
                    self._launch(self._values, X, Y, k, False, 0, bias)
                else:
                    prep(xp, yp)
                return Y
            if self._values.dim() == 1 and key not in self._prepared:
                if len(self._prepared) >= 64:  # many different k: keep the dictionary small
                    self._prepared.clear()
                Y = torch.empty((m, k), dtype=self.dtype, device=self.device)
                with recording() as calls:
                    self._launch(self._values, X, Y, k, False, 0, bias)
                self._prepared[key] = self._prepare(calls, xp, Y.data_ptr())
                return Y
        if self._values is None:
            raise RuntimeError(f"{self.backend}/spmm: apply() before set_values()")
        rows_in = m if adjoint else n
        if X.dtype != self.dtype or X.device != self.device or X.dim() < 2 or X.shape[-2] != rows_in:
            raise InputError(f"{self.backend}: X of shape {tuple(X.shape)}, {X.dtype} on {X.device}; expected (*batch, {rows_in}, k) "
                             f"{self.dtype} on {self.device}")
        X = X.contiguous()
        k = X.shape[-1]
        rows_out = n if adjoint else m
        Y = torch.empty(*X.shape[:-2], rows_out, k, dtype=self.dtype, device=self.dev_index)
        vals = self._adjoint_values() if adjoint else self._values
        if vals.dim() == 1 and X.dim() == 2:  # one matrix, one right-hand-side block: no reshapes
            self._launch(vals, X, Y, k, adjoint, 0, bias)
            return Y
        vb = vals.reshape(-1, vals.shape[-1])
        xb = X.reshape(-1, rows_in, k)
        yb = Y.view(-1, rows_out, k)
        if vb.shape[0] not in (1, xb.shape[0]):
            raise InputError(f"{self.backend}: {vb.shape[0]} value sets for {xb.shape[0]} right-hand-side batches")
        for b in range(xb.shape[0]):
            bi = b if vb.shape[0] > 1 else 0
            self._launch(vb[bi], xb[b], yb[b], k, adjoint, bi)
        if bias is not None:
            Y += bias.unsqueeze(-1)
        return Y

    # Tensor-core SpMM (kernels/mma.cu) ---------------------------------------------------------
    def _mma_ok(self, k: int) -> bool:
        """Whether ``k`` columns run the tensor-core kernel (see :meth:`apply`)."""
        if not self.use_mma or k < MMA_MIN_K or self.dtype not in (torch.float16, torch.bfloat16):
            return False
        m, n = self.shape
        if not (self.small and m * k < INT_LIMIT and n * k < INT_LIMIT and k <= _GRID_Y * 64):
            return False
        return self._mma_layout() is not None

    def _mma_layout(self) -> dict[str, Any] | None:
        """Pattern work of the tensor-core kernel, once (None where it does not apply): CSR: the
        columns as uint16 and per (column tile of 64, row) the offset of the row's first entry in
        the tile from the row's start (uint16, ``(T + 1) x m``, tile-major); N:M 2:4: nothing
        beyond the packed positions."""
        if self._mma is not None:
            return self._mma or None
        m, n = self.shape
        self._mma = {}
        major, _ = torch.cuda.get_device_capability(self.dev_index)
        if major < 8 or n % 8 or n >= 65535 or not m or not n:
            return None
        T = -(-n // 64)
        if self.kind == "nm":
            if (self.nm_n, self.nm_m) != (2, 4) or self.pos_bits != 2:
                return None
            self._mma = {"T": T, "nm": True, "cluster": major >= 9}
            return self._mma
        if self.kind not in ("csr", "generic") or self.nnz >= INT_LIMIT or T > MMA_MAX_TILES * (8 if major >= 9 else 1):
            return None  # a block stages the offsets of at most MMA_MAX_TILES column tiles
        r64 = self.rowptr.to(torch.int64)
        lengths = r64[1:] - r64[:-1]
        if int(lengths.max()) >= 65535:
            return None
        c64 = self.col.to(torch.int64)
        tile = c64 // 64
        rows = torch.repeat_interleave(torch.arange(m, device=self.device, dtype=torch.int64), lengths)
        if self.nnz > 1:  # the kernel needs a row's entries grouped by column tile (true of sorted columns)
            same = rows[1:] == rows[:-1]
            if bool((same & (tile[1:] < tile[:-1])).any()):
                return None
        counts = torch.bincount(rows * T + tile, minlength=m * T).reshape(m, T)
        toff = torch.zeros(T + 1, m, dtype=torch.int64, device=self.device)
        toff[1:] = torch.cumsum(counts, 1).T
        as16 = lambda t: torch.where(t >= 32768, t - 65536, t).to(torch.int16).contiguous()  # noqa: E731 - uint16 bits
        self._mma = {"T": T, "nm": False, "cluster": major >= 9, "rowptr": self.rowptr.to(torch.int32).contiguous(),
                     "toff": as16(toff), "col": as16(torch.cat([c64, c64.new_zeros(-(-self.nnz // 8) * 8 + 8 - self.nnz)]))}
        return self._mma

    def mma_split(self, k: int) -> int:
        """Cluster size S of the tensor-core kernel (the column tiles split over S blocks whose
        partial sums meet in distributed shared memory): the smallest of 1, 2, 4, 8 that makes
        at least two blocks per SM, with at least two column tiles per block; 1 without clusters."""
        lay = self._mma_layout()
        if lay is None or not lay["cluster"]:
            return 1
        least = 1
        while -(-lay["T"] // least) > MMA_MAX_TILES:
            least *= 2
        if self.mma_split_override:
            return max(int(self.mma_split_override), least)
        m, n = self.shape
        rows = self.mma_rows
        blocks = -(-m // rows) * -(-k // 64)
        s = 1
        while s < 8 and blocks * s < (256 // rows) * _sm_count(self.dev_index) and lay["T"] >= 4 * s:
            s *= 2
        return max(s, least)

    def _apply_mma(self, X: torch.Tensor, k: int, bias: torch.Tensor | None) -> torch.Tensor:
        m, n = self.shape
        transposed = X.mT.is_contiguous()
        Xt = X.mT
        if not transposed or Xt.data_ptr() % 16:
            Xt = Xt.clone(memory_format=torch.contiguous_format)
        xp = Xt.data_ptr()
        bp = bias.data_ptr() if bias is not None else 0
        key = ("mma", k, xp & 15, bp)
        prep = self._prepared.get(key)
        Yt = torch.empty((k, m), dtype=self.dtype, device=self.device)
        if prep is not None and Yt.data_ptr() % 16 == 0:
            prep(xp, Yt.data_ptr())
        else:
            with recording() as calls:
                self._launch_mma(Xt, Yt, k, bp)
            if len(self._prepared) >= 64:
                self._prepared.clear()
            self._prepared[key] = self._prepare(calls, xp, Yt.data_ptr())
        return Yt.mT if transposed else Yt.mT.contiguous()

    def _launch_mma(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        m, n = self.shape
        lay = self._mma_layout()
        s = self.mma_split(k)
        rows = self.mma_rows
        grid = (-(-m // rows) * s, -(-k // 64))
        v = self._values
        r64 = "_r64" if rows == 64 else ""
        if lay["nm"]:
            kern = kernel("mma", f"spmm_mma24{r64}_s{s}", self.dtype, torch.int32, self.dev_index, 12)
            args = (m, n, k, lay["T"], 0, 0, self.words.data_ptr(), v.data_ptr(), Xt.data_ptr(), bp, Yt.data_ptr(), self.mma_flags)
        else:
            kern = kernel("mma", f"spmm_mma{r64}_s{s}", self.dtype, torch.int32, self.dev_index, 12)
            args = (m, n, k, lay["T"], lay["rowptr"].data_ptr(), lay["toff"].data_ptr(), lay["col"].data_ptr(), v.data_ptr(),
                    Xt.data_ptr(), bp, Yt.data_ptr(), self.mma_flags)
        kern(grid, 2 * rows, args, device=self.dev_index)

    def _prepare(self, calls: list, xp: int, yp: int) -> Prepared | None:
        """A :class:`Prepared` launch from one recorded call, or None (several launches, no launch,
        or X / Y pointers that cannot be told from the other arguments)."""
        if len(calls) != 1 or xp == yp or yp % 16:
            return None
        kern, grid, block, args, shared = calls[0]
        if args.count(xp) != 1 or args.count(yp) != 1:
            return None
        return Prepared(kern, grid, block, args, shared, args.index(xp), args.index(yp), self.dev_index)

    def _launch(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, adjoint: bool, bi: int = 0,
                bias: torch.Tensor | None = None) -> None:
        fused = self._launch_product(v, x, y, k, adjoint, bi, bias)
        if bias is not None and not fused:  # the kernel did not add it: one more launch, in place
            rows, cols = y.shape[-2], y.shape[-1]
            kern = kernel("mma", "add_bias", self.dtype, torch.int32, self.dev_index, 6)
            kern((-(-rows * cols // BLOCK), 1), BLOCK, (rows, cols, y.stride(-2), y.stride(-1), bias.data_ptr(), y.data_ptr()),
                 device=self.dev_index)

    def _launch_product(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, adjoint: bool, bi: int = 0,
                        bias: torch.Tensor | None = None) -> bool:
        """Launch the product; True when the kernel also added ``bias``."""
        m, n = self.shape
        dev = self.dev_index
        gy = min(k, _GRID_Y)
        bp = bias.data_ptr() if bias is not None else 0
        if (not adjoint and k == 1 and self.kind in ("csr", "generic") and self.sell is None and self.use_csr16
                and self.dtype in (torch.float16, torch.bfloat16) and self.nnz >= CSR16_MIN_MEAN * max(m, 1)
                and v.data_ptr() % 16 == 0 and self._mma_ok(MMA_MIN_K)):
            lay = self._mma_layout()
            kern = kernel("mma", "csr16_warp", self.dtype, torch.int32, dev, 7)
            kern((-(-m // (ROW_KERNEL_BLOCK // 32)), 1), ROW_KERNEL_BLOCK,
                 (m, lay["rowptr"].data_ptr(), lay["col"].data_ptr(), v.data_ptr(), x.data_ptr(), bp, y.data_ptr()),
                 device=self.dev_index)
            return True
        if adjoint:
            t = self._transposed()
            fits_t = max(int(t["col"].numel()), m, n) < INT_LIMIT and m * k < INT_LIMIT and n * k < INT_LIMIT
            self._csr(t["rowptr"], t["col"], v, x, y, n, k, t["vec"], "vector", None, t["idx"], fits_t)
            return
        kind = self.kind
        fits = self.small and m * k < INT_LIMIT and n * k < INT_LIMIT  # the 32-bit kernels apply
        if kind in ("csr", "generic") and self.sell is not None and fits:
            sl = self.sell
            sv = self._values_sell.reshape(-1, sl["slots"])[bi]
            perm = sl["perm"]
            kern = kernel("structured", "sell32_perm" if perm is not None else "sell32", self.dtype, torch.int32, dev, 9)
            kern((-(-sl["nslices"] * SELL_C // BLOCK), gy), BLOCK,
                 (m, k, sl["nslices"], sl["slice_ptr"].data_ptr(), sl["col"].data_ptr(), sv.data_ptr(),
                  perm.data_ptr() if perm is not None else 0, x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind in ("csr", "generic"):
            variant = "vector" if self.variant == "sell" else self.variant
            self._csr(self.rowptr, self.col, v, x, y, m, k, self.vec, variant, self.first_row, self.idx, fits)
        elif kind == "dia":
            if self.variant == "classic" or not fits:
                kern = kernel("spmv", "dia_rows", self.dtype, torch.int64, dev, 8)
                kern((-(-m // BLOCK), gy), BLOCK, (m, n, k, self.ndiag, self.offs.data_ptr(), v.data_ptr(), x.data_ptr(),
                                                   y.data_ptr()), shared=8 * self.ndiag, device=self.dev_index)
                return
            if self.variant.startswith("p") and self.ndiag <= 8:  # offsets as kernel parameters
                rows = int(self.variant[1])
                offs = [int(o) for o in self.offs_host] + [0] * (8 - self.ndiag)
                name = "dia_p8cs_1" if self.variant == "p1cs" else f"dia_p8_{rows}"
                kern = kernel("fast", name, self.dtype, torch.int64, dev, 15)
                kern((-(-m // (DIA_BLOCK * rows)), gy), DIA_BLOCK, (m, n, k, self.ndiag, *(o & 0xFFFFFFFFFFFFFFFF for o in offs),
                                                            v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
                return
            rows = 2 if self.variant in ("rows2", "p2", "p4") else 1
            kern = kernel("fast", f"dia_fast{rows}", self.dtype, torch.int64, dev, 8)
            kern((-(-m // (BLOCK * rows)), gy), BLOCK, (m, n, k, self.ndiag, self.offs32.data_ptr(), v.data_ptr(), x.data_ptr(),
                                                        y.data_ptr()), shared=4 * (-(-max(self.ndiag, 1) // 8) * 8),
                 device=self.dev_index)
        elif kind == "ell":
            kern = kernel("spmv", "ell_rows", self.dtype, self.idx, dev, 8)
            kern((-(-m // BLOCK), gy), BLOCK, (m, k, self.width, self.cnt.data_ptr(), self.col.data_ptr(), v.data_ptr(),
                                               x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind == "nm":
            S = self.row_slots
            if (fits and k == 1 and (self.nm_n, self.nm_m) == (2, 4) and n % 16 == 0 and x.data_ptr() % 16 == 0
                    and v.data_ptr() % 16 == 0):
                args = (m, S, self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr())
                if self.variant == "warp":  # a warp per row, grid capped at 4 blocks per SM (row loop)
                    kern = kernel("structured", "nm24", self.dtype, torch.int32, dev, 6)
                    wpb = ROW_KERNEL_BLOCK // 32
                    kern((min(-(-m // wpb), 4 * _sm_count(dev)), 1), ROW_KERNEL_BLOCK, args, device=self.dev_index)
                    return
                split = int(self.variant[1])
                kern = kernel("structured", f"nm24_s{split}", self.dtype, torch.int32, dev, 7)
                kern((-(-m // (NM_BLOCK // 32 // split)), 1), NM_BLOCK, (*args[:5], bp, args[5]), device=self.dev_index)
                return True
            kern = kernel("structured", "nm_any", self.dtype, torch.int32, dev, 11)
            kern((-(-m * 32 // BLOCK), gy), BLOCK, (m, n, k, S, self.nm_n, self.nm_m, self.pos_bits, self.words.data_ptr(),
                                                    v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind == "bsr":
            kern = kernel("structured", f"bsr_vec{self.vec}", self.dtype, self.idx, dev, 10)
            kern((-(-m * self.vec // BLOCK), gy), BLOCK, (m, n, k, self.bh, self.bw, self.rowptr.data_ptr(), self.col.data_ptr(),
                                                          v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif self.variant in ("packed", "packed2") and fits:
            # bit-packed DELTA, b a compile-time constant; X in shared memory (8-entry pads) when it fits
            smem = (n + 16) * k * x.element_size()
            name = ("delta2_b" if self.variant == "packed2" else "delta_b") + str(self.bits)
            if smem <= DELTA_SMEM_BYTES:
                name += "_smem"
            kern = kernel("fast", name, self.dtype, self.idx, dev, 9)
            wpb = ROW_KERNEL_BLOCK // 32
            grid = -(-m // wpb) if self.variant == "packed2" else min(-(-m // wpb), 4 * _sm_count(dev))  # packed: row loop
            kern((grid, 1), ROW_KERNEL_BLOCK,
                 (m, n, k, self.nnz, self.rowptr.data_ptr(), self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                 shared=smem if smem <= DELTA_SMEM_BYTES else 0, device=self.dev_index)
        else:  # delta, spmv.cu's kernels: X in shared memory when it fits (the gathers then stay on the SM)
            xbytes = n * k * x.element_size()
            smem = xbytes <= DELTA_SMEM_BYTES
            name = ("delta_lanes" if self.variant == "lanes" else "delta_rows") + ("_smem" if smem else "")
            block = DELTA_SMEM_BLOCK if smem else BLOCK
            kern = kernel("spmv", name, self.dtype, self.idx, dev, 10)
            kern((-(-m * 32 // block), 1), block, (m, n, k, self.nnz, self.bits, self.rowptr.data_ptr(), self.words.data_ptr(),
                                                   v.data_ptr(), x.data_ptr(), y.data_ptr()),
                 shared=xbytes if smem else 0, device=self.dev_index)

    def _csr(self, rowptr, col, v, x, y, rows: int, k: int, vec: int, variant: str, first_row, idx, fits: bool = False) -> None:
        dev = self.dev_index
        nnz = int(col.numel())
        if variant == "balanced" and first_row is not None:
            acc = self.dtype if self.dtype in (torch.float32, torch.float64) else torch.float32
            out = y if acc == self.dtype else torch.empty(y.shape, dtype=acc, device=self.dev_index)
            out.zero_()
            warps = max(1, -(-nnz // CHUNK))
            kern = kernel("spmv", "csr_balanced", self.dtype, idx, dev, 11)
            kern((-(-warps * 32 // BLOCK), min(k, _GRID_Y)), BLOCK,
                 (rows, k, nnz, CHUNK, int(first_row.numel()), rowptr.data_ptr(), col.data_ptr(), v.data_ptr(),
                  first_row.data_ptr(), x.data_ptr(), out.data_ptr()), device=self.dev_index)
            if out is not y:
                cast = kernel("spmv", "cast_out", self.dtype, idx, dev, 3)
                total = out.numel()
                cast((-(-total // BLOCK), 1), BLOCK, (total, out.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        if k >= COLS_KERNEL_FROM:
            kern = kernel("spmv", "csr_cols", self.dtype, idx, dev, 7)
            kern((-(-rows * 32 // BLOCK), min(-(-k // 32), _GRID_Y)), BLOCK,
                 (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        if fits and variant in ("stream", "stream4", "stream16", "streamcs"):  # stream4 / 16: chunks of 128 / 512 nonzeros
            name = {"stream": "csr_stream8", "stream4": "csr_stream4", "stream16": "csr_stream16", "streamcs": "csr_stream8cs"}[variant]
            kern = kernel("fast", name, self.dtype, idx, dev, 7)
            kern((-(-rows // BLOCK), min(k, _GRID_Y)), BLOCK,
                 (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        if fits and vec >= 2:
            kern = kernel("fast", f"csr_v32_{vec}", self.dtype, idx, dev, 7)
            kern((-(-rows * vec // BLOCK), min(k, _GRID_Y)), BLOCK,
                 (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        kern = kernel("spmv", f"csr_vec{vec}", self.dtype, idx, dev, 7)
        kern((-(-rows * vec // BLOCK), min(k, _GRID_Y)), BLOCK,
             (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)

    # Adjoint ------------------------------------------------------------------------------------
    def _transposed(self) -> dict[str, Any]:
        """CSR of A^T's pattern and, per entry, the value slot it reads (pattern work, once)."""
        if self._t is None:
            m, n = self.shape
            coords, slot = self._source.entries()
            rows, cols = coords[0].to(torch.int64), coords[1].to(torch.int64)
            order = torch.argsort(cols * max(m, 1) + rows, stable=True)
            idx = _index_dtype(rows.numel(), m, n)
            rowptr = torch.zeros(n + 1, dtype=torch.int64, device=self.dev_index)
            rowptr[1:] = torch.cumsum(torch.bincount(cols, minlength=n), 0)
            self._t = {"rowptr": rowptr.to(idx), "col": rows[order].to(idx).contiguous(), "idx": idx,
                       "slot": slot.to(torch.int64)[order].contiguous(), "vec": _vec_for(rows.numel() / max(n, 1))}
        return self._t

    def _adjoint_values(self) -> torch.Tensor:
        if self._values_t is None:
            t = self._transposed()
            raw = self._source_values()
            self._values_t = raw.index_select(-1, t["slot"]).contiguous()
        return self._values_t

    def _source_values(self) -> torch.Tensor:
        """The values in A's own slot order (undoing the generic path's gather)."""
        if self.gather is None:
            return self._values
        out = self._values.new_zeros(*self._values.shape[:-1], self.slots)
        return out.index_copy_(-1, self.gather, self._values)

    # SDDMM (backward with respect to the values) ------------------------------------------------------
    def sddmm(self, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
        """``out[slot] = sum_c P[row, c] Q[col, c]`` for every stored entry, in A's value slots
        (padding slots get zero): the gradient of ``<dY, A X>`` is ``sddmm(dY, X)``. ``P`` is
        ``(*batch, m, k)``, ``Q`` is ``(*batch, n, k)``."""
        m, n = self.shape
        if (P.dtype != self.dtype or Q.dtype != self.dtype or P.dim() < 2 or P.shape[-2] != m or Q.shape[-2] != n
                or P.shape[-1] != Q.shape[-1] or P.device != self.device or Q.device != self.device):
            raise InputError(f"{self.backend}: sddmm takes P (*batch, {m}, k) and Q (*batch, {n}, k) in {self.dtype} on "
                             f"{self.device}; got {tuple(P.shape)} {P.dtype} and {tuple(Q.shape)} {Q.dtype}")
        batch = torch.broadcast_shapes(P.shape[:-2], Q.shape[:-2])
        k = P.shape[-1]
        P = P.expand(*batch, m, k).contiguous().reshape(-1, m, k)
        Q = Q.expand(*batch, n, k).contiguous().reshape(-1, n, k)
        nb = P.shape[0]
        entries = self.nnz if self.kind in ("csr", "generic", "delta") else self.slots
        out = torch.empty(nb, entries, dtype=self.dtype, device=self.dev_index)
        dev = self.dev_index
        for b in range(nb):
            p, q, o = P[b], Q[b], out[b]
            if self.kind in ("csr", "generic"):
                vec = 1 if self.vec <= 2 else (4 if self.vec <= 8 else 32)
                kern = kernel("sddmm", f"csr_sddmm{vec}", self.dtype, self.idx, dev, 7)
                kern((-(-m * vec // BLOCK), 1), BLOCK, (m, k, self.rowptr.data_ptr(), self.col.data_ptr(), p.data_ptr(),
                                                      q.data_ptr(), o.data_ptr()), device=self.dev_index)
            elif self.kind == "dia":
                kern = kernel("sddmm", "dia_sddmm", self.dtype, torch.int64, dev, 8)
                kern((-(-self.slots // BLOCK), 1), BLOCK, (m, n, k, self.ndiag, self.offs.data_ptr(), p.data_ptr(), q.data_ptr(),
                                                          o.data_ptr()), device=self.dev_index)
            elif self.kind in ("nm", "bsr"):  # torch gathers over the stored entries (no kernel of its own yet)
                rows, cols, slot = self._entry_coords()
                o.zero_()
                o.index_copy_(0, slot, (p.index_select(0, rows) * q.index_select(0, cols)).sum(-1))
            elif self.kind == "ell":
                kern = kernel("sddmm", "ell_sddmm", self.dtype, self.idx, dev, 8)
                kern((-(-self.slots // BLOCK), 1), BLOCK, (m, k, self.width, self.cnt.data_ptr(), self.col.data_ptr(),
                                                          p.data_ptr(), q.data_ptr(), o.data_ptr()), device=self.dev_index)
            else:
                kern = kernel("sddmm", "delta_sddmm", self.dtype, self.idx, dev, 8)
                kern((-(-m * 32 // BLOCK), 1), BLOCK, (m, k, self.bits, self.rowptr.data_ptr(), self.words.data_ptr(),
                                                      p.data_ptr(), q.data_ptr(), o.data_ptr()), device=self.dev_index)
        if self.gather is not None:
            full = out.new_zeros(nb, self.slots)
            out = full.index_add_(-1, self.gather, out)
        return out.reshape(*batch, self.slots)

    def _entry_coords(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row, column and value slot of every stored entry (pattern work, once)."""
        if getattr(self, "_coords", None) is None:
            coords, slot = self._source.entries()
            self._coords = (coords[0].to(torch.int64), coords[1].to(torch.int64), slot.to(torch.int64))
        return self._coords

    def __repr__(self) -> str:
        extra = f", variant={self.variant}" if self.kind in ("csr", "generic", "delta", "dia", "nm") else ""
        return f"CudaSpmmPlan({self.kind}, shape={self.shape}, nnz={self.nnz}, {self.dtype}{extra})"
