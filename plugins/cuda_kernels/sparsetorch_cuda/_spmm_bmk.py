"""spmm_bm's bitmap tensor-core SpMM split over the column tiles of A WITHOUT clusters (kernels/spmm_bmk.cu)
for :class:`~.plan.CudaSpmmPlan` (a mixin): the split choice, the per-k workspace and the launch.

The grid is (row blocks of 128 x KS splits of the column tiles, ceil(k / 64)) with KS chosen so the blocks
make one wave (the driver's occupancy x SMs); each block adds its float32 partial into a float32 workspace
(k x mp) with red.global.add, and the block drawing the last ticket of its row block adds the bias, stores Y
and zeroes the workspace again (and its counter): one launch per product, replayable in CUDA graphs. The
plan-side pattern data are spmm_bm's (:func:`._spmm_bm.bm_layout`: bitmaps, value slot) and spmm_fl's (row
pointers, tile offsets); the workspace and counters (zeros) are made once per k and kept by the plan.

Where it runs: ``plan.mma_kernel = "bmk"`` only (half precision, CSR / generic formats, k >= MMA_MIN_K, where
spmm_bm applies); "auto" never picks it (:data:`BMK_AUTO`). Caveat: a plan's workspace for one k is shared by
its calls; two products of the same plan and k running at once on different streams would mix their sums."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ._spmm_bm import BM_MAX_SMEM, BM_ROWS, bm_smem_bytes
from .launch import kernel
from .layout import _sm_count

#: compiled block shapes: kernel name -> (WK (threads 128 WK), pipeline stages, relative time per column tile)
#: (weights not measured: bmk / bmk1 as spmm_bm's bm / bm1; bmk2, two stages, guessed 1.25)
BMK_VARIANTS: dict[str, tuple[int, int, float]] = {"bmk": (2, 4, 0.75), "bmk1": (1, 3, 1.0), "bmk2": (1, 2, 1.25)}
#: "auto" runs spmm_bmk where this is True (never until measured; the integrator's switch)
BMK_AUTO = False
#: fewest column tiles per block the split leaves (more splits than T / this are not made)
BMK_MIN_TILES = 2
#: cost of a block's start and end in column tiles (the variant choice, :func:`bmk_choose`)
BMK_FIXED_TILES = 2
#: shared memory of the partial sums after the loop (64 x (128 + 4) floats), which reuse the stages
_P_BYTES = 64 * (BM_ROWS + 4) * 4
_NARGS = 17
#: dynamic shared memory a block may take: spmm_bm's limit less the kernel's static word (the last-block flag)
BMK_MAX_SMEM = BM_MAX_SMEM - 256


def bmk_smem_bytes(slot: int, stages: int) -> int:
    """Dynamic shared memory of spmm_bmk: spmm_bm's stages, at least the partial sums' 64 x 132 floats."""
    return max(bm_smem_bytes(slot, stages), _P_BYTES)


def bmk_choose(m: int, n: int, k: int, variants: tuple[str, ...], capacity: Any, splits: int | None = None) -> tuple[str, int]:
    """(variant, KS) of spmm_bmk: per variant KS = the most splits whose blocks fit in one wave of
    ``capacity(variant)`` resident blocks (at least 1, at most T / BMK_MIN_TILES; ``splits`` forces it), cost
    waves x (column tiles per block + BMK_FIXED_TILES) x the variant's weight; the first on a tie."""
    T = -(-n // 64)
    rb = -(-m // BM_ROWS) * -(-k // 64)
    best, best_cost = (variants[0], 1), None
    for v in variants:
        cap = int(capacity(v))
        if cap <= 0:
            continue
        ks = splits if splits is not None else max(1, min(cap // rb, -(-T // BMK_MIN_TILES)))
        ks = max(1, min(int(ks), max(T, 1)))
        cost = -(-rb * ks // cap) * (-(-T // ks) + BMK_FIXED_TILES) * BMK_VARIANTS[v][2]
        if best_cost is None or cost < best_cost:
            best, best_cost = (v, ks), cost
    return best


@functools.lru_cache(maxsize=None)
def _capacity(variant: str, smem: int, dtype: torch.dtype, dev: int) -> int:
    """Blocks of ``variant`` resident on the whole GPU at once (the driver's occupancy calculator); 2 per SM
    where it fails (an estimate for :func:`bmk_choose` only)."""
    from ._mma import _allow_smem  # noqa: PLC0415
    from .launch import _driver  # noqa: PLC0415

    sms = _sm_count(dev)
    try:
        cu = _driver()
        kern = kernel("spmm_bmk", f"spmm_{variant}", dtype, torch.int32, dev, _NARGS)
        _allow_smem(kern, dev, smem)
        err, per_sm = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(cu.CUfunction(int(kern._fn)),
                                                                     128 * BMK_VARIANTS[variant][0], smem)
        return int(per_sm) * sms if int(err) == 0 and int(per_sm) > 0 else 2 * sms
    except Exception:  # noqa: BLE001 - an estimate only; the launch itself reports real errors
        return 2 * sms


class BmkMixin:
    """spmm_bmk (kernels/spmm_bmk.cu) for half-precision CSR, k >= 8; needs the BmMixin's layout."""

    _bmk_flags = 0
    _bmk_split: int | None = None
    _bmk_variant: str | None = None

    @property
    def bmk_variant_override(self) -> str | None:
        """A block shape (a key of BMK_VARIANTS) instead of :meth:`bmk_split`'s choice; drops the recorded launches."""
        return self._bmk_variant

    @bmk_variant_override.setter
    def bmk_variant_override(self, v: str | None) -> None:
        if v is not None and v not in BMK_VARIANTS:
            raise ValueError(f"bmk_variant_override must be one of {tuple(BMK_VARIANTS)} or None, got {v!r}")
        self._bmk_variant = v
        self._prepared.clear()

    @property
    def bmk_split_override(self) -> int | None:
        """A number of column-tile splits KS (>= 1) instead of :meth:`bmk_split`'s choice; drops the recorded launches."""
        return self._bmk_split

    @bmk_split_override.setter
    def bmk_split_override(self, s: int | None) -> None:
        if s is not None and int(s) < 1:
            raise ValueError(f"bmk_split_override must be >= 1 or None, got {s!r}")
        self._bmk_split = int(s) if s is not None else None
        self._prepared.clear()

    @property
    def bmk_flags(self) -> int:
        """Benchmarking only (wrong results): 1 skips the products, 2 the A fragments, 4 the value copies,
        8 the X^T copies, 16 the reduction and Y; drops the recorded launches."""
        return self._bmk_flags

    @bmk_flags.setter
    def bmk_flags(self, flags: int) -> None:
        self._bmk_flags = int(flags)
        self._prepared.clear()

    def _bmk_ok(self, k: int) -> bool:
        """Whether the k >= MMA_MIN_K product runs spmm_bmk: :attr:`mma_kernel` "bmk" (or "auto" with
        BMK_AUTO), half precision, CSR / generic, 16-byte aligned values, spmm_bm's layout applies and fits, and
        not a first call for this k inside a CUDA-graph capture (the workspace would live in the graph's pool;
        such a call runs the next kernel in line, correct but slower)."""
        kind = getattr(self, "mma_kernel", "auto")
        if kind != "bmk" and not (kind == "auto" and BMK_AUTO):
            return False
        if self.dtype not in (torch.float16, torch.bfloat16) or self.kind not in ("csr", "generic"):
            return False
        v = self._values
        if v is None or v.dim() != 1 or v.data_ptr() % 16:
            return False
        if k not in self.__dict__.get("_bmk_ws", {}) and torch.cuda.is_current_stream_capturing():
            return False  # its workspace would be the graph's memory: first calls outside a capture make it
        lay = self._bm_layout()
        return lay is not None and any(bmk_smem_bytes(lay["slot"], st) <= BMK_MAX_SMEM for _, st, _ in BMK_VARIANTS.values())

    def bmk_split(self, k: int) -> tuple[str, int]:
        """(variant, KS) for ``k`` columns of X: :func:`bmk_choose` over the variants whose shared memory
        fits, or the overrides where set."""
        m, n = self.shape
        slot = self._bm_layout()["slot"]
        variants = (self._bmk_variant,) if self._bmk_variant else tuple(BMK_VARIANTS)
        variants = tuple(v for v in variants if bmk_smem_bytes(slot, BMK_VARIANTS[v][1]) <= BMK_MAX_SMEM) or variants

        def cap(v: str) -> int:
            smem = bmk_smem_bytes(slot, BMK_VARIANTS[v][1])
            return _capacity(v, smem, self.dtype, self.dev_index) if smem <= BMK_MAX_SMEM else 0

        return bmk_choose(m, n, k, variants, cap, self._bmk_split)

    def _bmk_workspace(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 workspace (k x mp) and int32 counters (row blocks x column blocks) for ``k``, zeros,
        made once per k (the kernel leaves them zero after each launch)."""
        got = self.__dict__.setdefault("_bmk_ws", {})
        ws = got.get(k)
        if ws is None:
            m, _ = self.shape
            mp = -(-m // BM_ROWS) * BM_ROWS
            ws = got[k] = (torch.zeros(k * mp, dtype=torch.float32, device=self.device),
                           torch.zeros(-(-m // BM_ROWS) * -(-k // 64), dtype=torch.int32, device=self.device))
        return ws

    def _launch_bmk(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        """spmm_bmk on X^T ``Xt`` ((k, n), 16-byte aligned) into Y^T ``Yt`` ((k, m)), bias pointer ``bp``."""
        from ._mma import _allow_smem  # noqa: PLC0415 - _mma imports nothing of this module

        m, n = self.shape
        lay = self._mma_layout()
        bl = self._bm_layout()
        variant, ks = self.bmk_split(k)
        _, stages, _ = BMK_VARIANTS[variant]
        smem = bmk_smem_bytes(bl["slot"], stages)
        ws, cnt = self._bmk_workspace(k)
        kern = kernel("spmm_bmk", f"spmm_{variant}", self.dtype, torch.int32, self.dev_index, _NARGS)
        _allow_smem(kern, self.dev_index, smem)
        args = (m, n, k, lay["T"], bl["mp"], bl["slot"], lay["rowptr"].data_ptr(), lay["toff"].data_ptr(),
                bl["bits"].data_ptr(), self._values.data_ptr(), Xt.data_ptr(), bp, Yt.data_ptr(), ws.data_ptr(),
                cnt.data_ptr(), ks, int(self.bmk_flags))
        kern((-(-m // BM_ROWS) * ks, -(-k // 64)), 128 * BMK_VARIANTS[variant][0], args, shared=smem, device=self.dev_index)
