"""The bitmap tensor-core SpMM of half-precision CSR patterns (kernels/spmm_bm.cu) for
:class:`~.plan.CudaSpmmPlan` (a mixin): the per-pattern column bitmaps, the choice of cluster size
and the launch.

No shared-memory scatter: each lane builds its mma.sync A fragments in registers from the rows'
64-bit column bitmaps (one per row and column tile of 64) and the CSR values, which a block copies
into shared memory row run by row run with cp.async (values read where they lie: ``set_values`` and
in-place writes cost nothing and are always seen). The plan's spmm_fl layout (int32 row pointers,
the uint16 per (tile, row) offsets) is reused; the bitmaps (8 bytes per row and column tile) and the
value slot (shared-memory halves per row and tile) are made once per pattern (:func:`bm_layout`).

Where it runs: ``plan.mma_kernel = "bm"`` (half precision, CSR / generic formats, k >= MMA_MIN_K
columns of X, the spmm_fl layout applies, columns strictly increasing per row, 16-byte aligned
values), or "auto" where :func:`bm_auto` says it measured faster. The routing hook is the k >= MMA_MIN_K
branch of ``MmaMixin._launch_mma``."""

from __future__ import annotations

import functools
from typing import Any

import torch

from .launch import kernel, resident_blocks
from .layout import _sm_count

#: rows of A per block (kernels/spmm_bm.cu BM_ROWS) and the cluster sizes compiled (2..8 on sm_90+)
BM_ROWS = 128
BM_SPLITS = (1, 2, 3, 4, 6, 8)
#: the compiled block shapes: kernel name prefix -> (warps along each tile's columns WK (threads 128 WK),
#: pipeline stages, relative time per column tile for :func:`bm_choose`). "bm": 8 warps, each half of a tile's
#: columns; "bm1": 4 warps, up to four blocks per SM. The weights: fitted to cuda_kernels_h200_s10_bm_run1/2.json
#: (4096^2 90 % k = 64: bm S = 6 30.9 us, bm1 S = 8 32.2; 4096 -> 11008: bm1 S = 4 58.0, bm S = 2 78.3)
BM_VARIANTS: dict[str, tuple[int, int, float]] = {"bm": (2, 4, 0.75), "bm1": (1, 3, 1.0)}
#: dynamic shared memory a block may take (the H200's opt-in limit is 227 KB)
BM_MAX_SMEM = 227 * 1024
#: "auto" runs spmm_bm for densities nnz / (m n) in [lo, hi] and k columns of X in [k_lo, k_hi] (None: never;
#: mma_kernel = "bm" forces it), where BM_AUTO_WHERE_FL only in place of spmm_fl (where spmm_ws's blocks do not
#: fit in one wave, MmaMixin.fl_kind). Measured (H200, float16, cuda_kernels_h200_s10_bm_run*.json): at 50 %
#: bm beats fl on 4096 -> 11008 (k = 16 / 64 / 128: 77.8 / 93.6 / 167.8 us against 106.8 / 119.5 / 195.6) but
#: not ws on 4096^2 (k = 64 / 128: 35.2 / 63.1 against 34.9 / 51.5); at 90 % and 99 % it loses to both
#: (4096^2 k = 64: 30.9 against ws 28.1; 4096 -> 11008: 58.0 against fl 56.6). BM_AUTO_MEASURED is that rule;
#: the default stays None until the committed kernels (the two block shapes, run separately in runs 1 and 2, now
#: compiled from one template) pass tests/test_cuda_spmm_bm.py on a GPU: then BM_AUTO = BM_AUTO_MEASURED
BM_AUTO_MEASURED: tuple[float, float, int, int] = (0.3, 1.0, 16, 128)
BM_AUTO: tuple[float, float, int, int] | None = None
BM_AUTO_WHERE_FL = True
#: cost of a block's start and end in column tiles (the split choice, :func:`bm_choose`)
BM_FIXED_TILES = 2


def bm_smem_bytes(slot: int, stages: int = 4) -> int:
    """Dynamic shared memory of spmm_bm with ``slot`` halves of values per row: ``stages`` stages of (X^T
    tile 64 x 72 halves, 128 bitmaps, 128 value slots) and the rows' run alignments."""
    return stages * (64 * 72 * 2 + BM_ROWS * 8 + BM_ROWS * slot * 2) + stages * BM_ROWS * 4


def bm_layout(rowptr: torch.Tensor, col: torch.Tensor, toff: torch.Tensor, m: int, n: int) -> dict[str, Any] | None:
    """spmm_bm's pattern data from a CSR (``toff``: the spmm_fl offsets, ``(T + 1) x m`` uint16 bits in
    int16), or None where it does not apply (columns not strictly increasing within a row). Keys:
    ``bits`` (T x mp int64: bit j of ``bits[t * mp + r]`` = row r holds column 64 t + j; mp = m rounded up
    to 128), ``mp``, ``slot`` (halves of shared memory per row and tile: the most 16-byte units one row's
    run in one tile spans, times 8, made odd in units for conflict-free reads), ``stats``."""
    dev = rowptr.device
    T = -(-n // 64)
    mp = -(-m // BM_ROWS) * BM_ROWS
    r64 = rowptr.to(torch.int64)
    nnz = int(r64[-1])
    lengths = r64[1:] - r64[:-1]
    c = col[:nnz].to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), lengths)
    if nnz > 1 and bool(((rows[1:] == rows[:-1]) & (c[1:] <= c[:-1])).any()):
        return None
    bits = torch.zeros(T * mp, dtype=torch.int64, device=dev)
    if nnz:
        bits.index_add_(0, (c >> 6) * mp + rows, torch.ones_like(c) << (c & 63))  # distinct bits: the sum is the OR
    t16 = toff.to(torch.int64) & 0xFFFF
    es = r64[:-1].unsqueeze(0) + t16[:-1]
    ee = r64[:-1].unsqueeze(0) + t16[1:]
    units = torch.where(ee > es, ((ee + 7) >> 3) - (es >> 3), torch.zeros_like(es))
    most = max(int(units.max()) if units.numel() else 1, 1)
    u = most if most % 2 else most + 1
    stats = {"T": T, "max_units": most, "slot": 8 * u, "nnz": nnz, "bitmap_bytes": T * mp * 8,
             "mean_run": nnz / max(m * T, 1)}
    return {"bits": bits.contiguous(), "mp": mp, "slot": 8 * u, "stats": stats}


def bm_auto(plan: Any, k: int) -> bool:
    """Whether "auto" runs spmm_bm for ``k`` columns of X: :data:`BM_AUTO` (densities and k measured faster
    than spmm_fl; None: never) and, with BM_AUTO_WHERE_FL, only where "auto" would otherwise run spmm_fl."""
    if BM_AUTO is None:
        return False
    lo, hi, k_lo, k_hi = BM_AUTO
    m, n = plan.shape
    density = plan.nnz / max(m * n, 1)
    if not (lo <= density <= hi and k_lo <= k <= k_hi):
        return False
    return not BM_AUTO_WHERE_FL or (plan._fl_ok() and plan.fl_kind(k) == "fl")


@functools.lru_cache(maxsize=None)
def _cluster_ok(dev: int) -> bool:
    return torch.cuda.get_device_capability(dev)[0] >= 9


@functools.lru_cache(maxsize=None)
def _capacity(variant: str, cs: int, smem: int, dtype: torch.dtype, dev: int) -> int:
    """Blocks of <variant>_s<cs> resident on the whole GPU at once, by the driver's occupancy calculator
    (clusters that fit x cs); 2 per SM where it fails (an estimate for :func:`bm_choose` only)."""
    from ._mma import _allow_smem  # noqa: PLC0415

    sms = _sm_count(dev)
    try:
        kern = kernel("spmm_bm", f"spmm_{variant}_s{cs}", dtype, torch.int32, dev, 14)
        _allow_smem(kern, dev, smem)
    except Exception:  # noqa: BLE001 - an estimate only; the launch itself reports real errors
        return 2 * sms
    return resident_blocks(kern, 128 * BM_VARIANTS[variant][0], smem, cs, sms, 2 * sms)


def bm_choose(m: int, n: int, k: int, variants: tuple[str, ...], splits: tuple[int, ...],
              capacity: Any) -> tuple[str, int]:
    """(variant, cluster size S) of spmm_bm: over ``variants`` x ``splits``, the least waves of blocks
    (``capacity(variant, S)`` resident at once, 0 where it does not fit) x (column tiles per block +
    BM_FIXED_TILES) x the variant's weight (BM_VARIANTS), the first on a tie (smaller S)."""
    T = -(-n // 64)
    blocks = -(-m // BM_ROWS) * -(-k // 64)
    best, best_cost = (variants[0], splits[0]), None
    for v in variants:
        for s in splits:
            cap = int(capacity(v, s))
            if cap <= 0:
                continue
            cost = -(-blocks * s // cap) * (-(-T // s) + BM_FIXED_TILES) * BM_VARIANTS[v][2]
            if best_cost is None or cost < best_cost:
                best, best_cost = (v, s), cost
    return best


class BmMixin:
    """The bitmap tensor-core SpMM (kernels/spmm_bm.cu) for half-precision CSR, k >= 8."""

    _bm_flags = 0
    _bm_split: int | None = None
    _bm_variant: str | None = None

    @property
    def bm_variant_override(self) -> str | None:
        """A block shape (a key of BM_VARIANTS) instead of :meth:`bm_split`'s choice; setting it drops the
        recorded launches."""
        return self._bm_variant

    @bm_variant_override.setter
    def bm_variant_override(self, v: str | None) -> None:
        if v is not None and v not in BM_VARIANTS:
            raise ValueError(f"bm_variant_override must be one of {tuple(BM_VARIANTS)} or None, got {v!r}")
        self._bm_variant = v
        self._prepared.clear()

    @property
    def bm_split_override(self) -> int | None:
        """A cluster size (one of BM_SPLITS) instead of :meth:`bm_split`'s choice; setting it drops the
        recorded launches."""
        return self._bm_split

    @bm_split_override.setter
    def bm_split_override(self, s: int | None) -> None:
        self._bm_split = int(s) if s is not None else None
        self._prepared.clear()

    @property
    def bm_flags(self) -> int:
        """Benchmarking only (wrong results): 1 skips the products, 2 the A fragments, 4 the value copies,
        8 the X^T copies, 16 returns after the pipeline's prologue, 32 after the column-tile loop (kernels/spmm_bm.cu);
        setting it drops the recorded launches."""
        return self._bm_flags

    @bm_flags.setter
    def bm_flags(self, flags: int) -> None:
        self._bm_flags = int(flags)
        self._prepared.clear()

    def _bm_layout(self) -> dict[str, Any] | None:
        """:func:`bm_layout` of the plan's CSR, once per pattern (None where it does not apply)."""
        got = self.__dict__.get("_bm")
        if got is None:
            m, n = self.shape
            lay = self._mma_layout() if self.kind in ("csr", "generic") else None
            out = bm_layout(lay["rowptr"], self.col, lay["toff"], m, n) if lay is not None and not lay["nm"] else None
            self.__dict__["_bm"] = got = out if out is not None else {}
        return got or None

    def _bm_ok(self, k: int) -> bool:
        """Whether the k >= MMA_MIN_K product runs spmm_bm: :attr:`mma_kernel` "bm", or "auto" where
        :func:`bm_auto` says so; half precision, CSR / generic, 16-byte aligned values, the layout applies
        and its shared memory fits."""
        kind = getattr(self, "mma_kernel", "auto")
        if kind != "bm" and not (kind == "auto" and bm_auto(self, k)):
            return False
        if self.dtype not in (torch.float16, torch.bfloat16) or self.kind not in ("csr", "generic"):
            return False
        v = self._values
        if v is None or v.dim() != 1 or v.data_ptr() % 16:
            return False
        lay = self._bm_layout()
        return lay is not None and any(bm_smem_bytes(lay["slot"], st) <= BM_MAX_SMEM for _, st, _ in BM_VARIANTS.values())

    def bm_split(self, k: int) -> tuple[str, int]:
        """(variant, cluster size S) for ``k`` columns of X: :func:`bm_choose` over the variants whose shared
        memory fits, or :attr:`bm_variant_override` / :attr:`bm_split_override` where set."""
        m, n = self.shape
        splits = BM_SPLITS if _cluster_ok(self.dev_index) else (1,)
        if self._bm_split is not None:
            if self._bm_split not in splits:
                raise ValueError(f"bm_split_override must be one of {splits} on this device, got {self._bm_split}")
            splits = (self._bm_split,)
        slot = self._bm_layout()["slot"]
        variants = (self._bm_variant,) if self._bm_variant else tuple(BM_VARIANTS)
        variants = tuple(v for v in variants if bm_smem_bytes(slot, BM_VARIANTS[v][1]) <= BM_MAX_SMEM) or variants

        def cap(v: str, s: int) -> int:
            smem = bm_smem_bytes(slot, BM_VARIANTS[v][1])
            return _capacity(v, s, smem, self.dtype, self.dev_index) if smem <= BM_MAX_SMEM else 0

        return bm_choose(m, n, k, variants, splits, cap)

    def _launch_bm(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        """spmm_bm on X^T ``Xt`` ((k, n), 16-byte aligned) into Y^T ``Yt`` ((k, m)), bias pointer ``bp``."""
        from ._mma import _allow_smem  # noqa: PLC0415 - _mma imports nothing of this module

        m, n = self.shape
        lay = self._mma_layout()
        bl = self._bm_layout()
        variant, s = self.bm_split(k)
        wk, stages, _ = BM_VARIANTS[variant]
        smem = bm_smem_bytes(bl["slot"], stages)
        kern = kernel("spmm_bm", f"spmm_{variant}_s{s}", self.dtype, torch.int32, self.dev_index, 14)
        _allow_smem(kern, self.dev_index, smem)
        args = (m, n, k, lay["T"], bl["mp"], bl["slot"], lay["rowptr"].data_ptr(), lay["toff"].data_ptr(),
                bl["bits"].data_ptr(), self._values.data_ptr(), Xt.data_ptr(), bp, Yt.data_ptr(), int(self.bm_flags))
        kern((-(-m // BM_ROWS) * s, -(-k // 64)), 128 * wk, args, shared=smem, device=self.dev_index)
