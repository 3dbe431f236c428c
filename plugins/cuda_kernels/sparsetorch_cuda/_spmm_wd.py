"""The warp-decoded tensor-core SpMM of half-precision CSR patterns (kernels/spmm_wd.cu), standalone.

Y^T (k x m) = X^T (k x n) A^T (+ bias) for a pruned linear layer's forward pass, k <= 64 per block row of the
grid (more columns: one more grid row per 64). Per pattern the entries are packed once into 32-bit words (value
bits | swizzled place in a warp's RW x 64 A tile << 16), sorted by (strip of RW rows, tile of 64 columns), with
absolute per-(strip, tile) offsets (:func:`wd_layout`). A block of W warps owns RB = W RW rows and one of S
K-splits (a cluster of S blocks per row block, ranks = splits, KR columns each); it copies its X^T slice into
shared memory once (cp.async in pieces, one mbarrier each: the only block-wide wait) and walks row blocks
persistently. Each warp decodes its own tiles into a private A buffer that is kept all-zero (scatter, ldmatrix,
mma.sync m16n8k16 with float32 accumulation, clear the same places), and the S partial sums meet in distributed
shared memory in rank order (deterministic). See the kernel's header for the details.

Use: ``WdSpmm(rowptr, col, values, (m, n))`` builds the layout once; ``op(Xt, bias)`` returns Y^T;
``op.set_values(values)`` repacks the value halves (one gather): in-place changes of a values tensor are seen
after ``set_values``. Not wired into the plan (session 22: measured standalone first,
benchmarks/gpu/s22/bench_wd.py).

Measured (H200, session 22, benchmarks/results/spmm_wd_h200_s22a.json; 10 % stored, k = 64, CUDA graph of 20 calls,
per call, fp16 / bf16 alike; the default (2, 4), S = 8): 4096^2: 27.0 us warm / 29.8 cold against dense F.linear 9.7 /
13.2, the plan's product 29.5 / 31.5, spmm_cc 25.1 / 28.9; best variant (2, 8), S = 4: 22.8. 4096 -> 11008: 39.8 / 43.8
against dense 26.4 / 26.3, plan 57.9 / 69.5, spmm_cc 47.6 / 52.8. Ablation (4096^2): launch + X copy alone 4.2 us,
launch + X copy + epilogue (no K loop) 11.7, no mma 28.1, no scatter 28.8, neither 26.1: neither the tensor work nor
the decode bounds it. At 102 KB of shared memory per block the driver keeps fewer than 32 clusters of 8 resident, so
4096^2's 32 row blocks ran as 16 clusters x 2 rounds on 128 SMs with one block each (``launch_shape``). The "_f2"
builds (words two tiles ahead) and the (2, 5) configuration (26 row blocks at 4096^2: one round) are host-compiled
but were not GPU-run in session 22 (no device was lent for the second call): benchmarks/gpu/s22/run_s22.sh with
``BENCH_ARGS=--tune NCU=1`` runs their tests, times and Nsight Compute stall reasons.

The source is one of compile.py's PARTIAL_SOURCES (its NVRTC options, memory and disk caches, prewarm; loaded by
launch.kernel), for sm_90 only (clusters, mbarrier try_wait), half types only.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import compile as _compile
from . import launch as _launch

__all__ = ["WdSpmm", "spmm_wd", "wd_layout", "wd_choose", "wd_smem_bytes", "kernel_names",
           "compile_cubin", "prewarm", "WD_CONFIGS", "WD_PF2", "WD_DEFAULT", "WD_PREFETCH", "WD_CLUSTERS"]

#: the compiled configurations (kernels/spmm_wd.cu SPMM_WD_CFG): (SPW strips of 16 rows per warp, W warps)
WD_CONFIGS: tuple[tuple[int, int], ...] = ((1, 8), (2, 4), (2, 8), (4, 2), (4, 4), (2, 5))
#: the configurations also built with the words two tiles ahead of their scatter (``prefetch=2``, "_f2" kernels)
WD_PF2: tuple[tuple[int, int], ...] = ((1, 8), (2, 4), (2, 8), (2, 5))
#: the default configuration: 32 rows per warp (64 float32 accumulators), 4 warps
WD_DEFAULT = (2, 4)
#: the default word prefetch distance (tiles) where the configuration has both builds
WD_PREFETCH = 1
#: cluster sizes (K-splits)
WD_CLUSTERS: tuple[int, ...] = (1, 2, 4, 8)
#: the default K-split: the fewest S with ceil(n / S) <= WD_KR_TARGET columns
WD_KR_TARGET = 512
#: the largest K-slice (a warp reads its tile offsets with one load per lane: KR / 64 + 1 <= 32)
WD_KR_MAX = 31 * 64
#: dynamic shared memory a block may take (the H200's opt-in limit is 227 KB)
WD_MAX_SMEM = 227 * 1024
_NARGS = 13
_SRC = "spmm_wd"


def kernel_names() -> list[str]:
    """Every kernel spmm_wd.cu exports for the half types on sm_90."""
    return ([f"spmm_wd_p{p}_w{w}_s{s}" for p, w in WD_CONFIGS for s in WD_CLUSTERS]
            + [f"spmm_wd_p{p}_w{w}_s8_abl" for p, w in WD_CONFIGS]
            + [f"spmm_wd_p{p}_w{w}_s{s}_f2" for p, w in WD_PF2 for s in WD_CLUSTERS]
            + [f"spmm_wd_p{p}_w{w}_s8_f2_abl" for p, w in WD_PF2])


def wd_smem_bytes(spw: int, w: int, kr: int) -> int:
    """Dynamic shared memory of a block: the mbarriers (128 bytes), W warp regions (two RW x 64 half A buffers,
    or 64 x (RW + 4) float32 sums, whichever is larger) and the X^T slice (64 x KR halves)."""
    rw = 16 * spw
    wreg = max(64 * (rw + 4) * 4, 2 * rw * 128)
    return 128 + w * wreg + 64 * kr * 2


def wd_choose(n: int, clusters: int | None = None) -> tuple[int, int] | None:
    """(S, KR) for ``n`` columns of A: ``clusters`` if given, else the fewest S of WD_CLUSTERS with
    ceil(n / S) <= WD_KR_TARGET; KR = ceil(n / S) rounded up to 64. None where KR would exceed WD_KR_MAX."""
    pick = None
    for s in (clusters,) if clusters else WD_CLUSTERS:
        per = -(-n // s)  # columns per split ...
        kr = max(64, -(-per // 64) * 64)  # ... in whole tiles
        if kr > WD_KR_MAX:
            continue
        pick = (s, kr)
        if -(-n // s) <= WD_KR_TARGET:
            break
    return pick


def wd_layout(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int, rw: int) -> dict[str, Any] | None:
    """The per-pattern layout of spmm_wd for strips of ``rw`` rows (torch ops on the pattern's device), or None
    where a (row, column) repeats. Keys: ``toff`` (int32, strips x T + 1: absolute offset of each (strip, tile)'s
    first word, T = ceil(n / 64)), ``hi`` (int32, nnz: the words' high halves, the swizzled place << 16), ``perm``
    (int64, nnz: the CSR entry of each word), ``stats``."""
    dev = col.device
    r64 = rowptr.to(torch.int64)
    nnz = int(r64[-1]) if r64.numel() else 0
    c = col[:nnz].to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), r64[1:] - r64[:-1])
    if nnz and torch.unique(rows * n + c).numel() != nnz:
        return None
    T = -(-n // 64)
    strips = -(-m // rw)
    r = rows % rw
    cc = c & 63
    key = (rows // rw) * T + (c >> 6)
    perm = torch.sort(key, stable=True).indices
    place = r * 64 + ((((cc >> 3) ^ (r & 7)) << 3) | (cc & 7))
    hi = (place[perm] << 16).to(torch.int32)
    cnt = torch.bincount(key, minlength=strips * T) if nnz else torch.zeros(strips * T, dtype=torch.int64, device=dev)
    toff = torch.zeros(strips * T + 1, dtype=torch.int64, device=dev)
    toff[1:] = torch.cumsum(cnt, 0)
    mx = int(cnt.max()) if cnt.numel() else 0
    stats = {"rw": rw, "tiles": T, "strips": strips, "nnz": nnz, "max_words_per_tile": mx,
             "mean_words_per_tile": nnz / max(strips * T, 1), "bytes": 4 * nnz + 4 * (strips * T + 1)}
    return {"toff": toff.to(torch.int32).contiguous(), "hi": hi.contiguous(), "perm": perm, "stats": stats}


def pack_words(lay: dict[str, Any], values: torch.Tensor) -> torch.Tensor:
    """The words of one value set: ``hi | value bits`` (int32, at least one element)."""
    v = values.reshape(-1)
    if lay["perm"].numel() == 0:
        return torch.zeros(1, dtype=torch.int32, device=values.device)
    bits = v.view(torch.int16)[lay["perm"]].to(torch.int32) & 0xFFFF
    return (lay["hi"] | bits).contiguous()


# Compilation and loading: compile.py's (spmm_wd is one of its PARTIAL_SOURCES: half types, int32 indices) ---------
def compile_cubin(value: str, arch: str = "sm_90") -> bytes:
    """spmm_wd.cu compiled by NVRTC (no cache). Needs NVRTC only (no driver, no GPU)."""
    return _compile.compile_cubin(_SRC, value, "int32", arch)


def prewarm(arch: str = "sm_90", values: tuple[str, ...] = ("float16", "bfloat16")) -> int:
    """Compile the modules for ``arch`` into the disk cache (in parallel processes)."""
    return _compile.prewarm(arch, [_SRC], list(values), ["int32"])


def _kernel(name: str, dtype: torch.dtype, device: int) -> _launch.Kernel:
    return _launch.kernel(_SRC, name, dtype, torch.int32, device, _NARGS)


@functools.lru_cache(maxsize=None)
def _clusters_resident(name: str, dtype: torch.dtype, device: int, threads: int, smem: int, S: int) -> int:
    """Clusters of S blocks of ``name`` resident at once (the driver's occupancy calculator; SMs / S where it fails)."""
    return _launch.clusters_resident(_kernel(name, dtype, device), device, threads, smem, S)


class WdSpmm:
    """Y^T = X^T A^T (+ bias) for a half-precision CSR A (m x n) with spmm_wd; the layout is made once.

    ``rowptr``, ``col``: the CSR (int32 or int64, on the GPU); ``values``: float16 or bfloat16 (nnz). Options:
    ``config`` ((SPW, W) of WD_CONFIGS; default WD_DEFAULT), ``prefetch`` (1: a tile's words loaded one tile
    ahead of their scatter, 2: two tiles ahead, configurations WD_PF2 only; default WD_PREFETCH), ``clusters`` (S; default :func:`wd_choose`), ``ncl``
    (clusters launched; default: the fewest that keep the row blocks in as few rounds as the resident clusters
    allow), ``flags`` (benchmarking only, wrong results, S = 8 only: 1 return after the X copy, 2 no K loop, 4 no
    mma, 8 no scatter / clear, 16 no X copy). Raises ValueError where the layout does not apply (repeated
    entries, n too large for the X slice) or the device is not sm_90+."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int], *,
                 config: tuple[int, int] | None = None, clusters: int | None = None, ncl: int | None = None,
                 flags: int = 0, prefetch: int | None = None) -> None:
        m, n = int(shape[0]), int(shape[1])
        if values.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"spmm_wd takes float16 or bfloat16 values, got {values.dtype}")
        self.config = tuple(config) if config else WD_DEFAULT
        if self.config not in WD_CONFIGS:
            raise ValueError(f"config must be one of {WD_CONFIGS}, got {config}")
        self.prefetch = int(prefetch or (WD_PREFETCH if self.config in WD_PF2 else 1))
        if self.prefetch not in (1, 2) or (self.prefetch == 2 and self.config not in WD_PF2):
            raise ValueError(f"prefetch must be 1, or 2 for a configuration of {WD_PF2}")
        choice = wd_choose(n, clusters)
        if choice is None:
            raise ValueError(f"spmm_wd: n = {n} columns do not fit the X slice with clusters={clusters}")
        self.S, self.KR = choice
        if wd_smem_bytes(*self.config, self.KR) > WD_MAX_SMEM:
            raise ValueError(f"spmm_wd: the X slice of {self.KR} columns does not fit shared memory")
        self.shape, self.dtype, self.device = (m, n), values.dtype, values.device
        self.dev_index = values.device.index if values.device.index is not None else torch.cuda.current_device()
        spw, _w = self.config
        lay = wd_layout(rowptr, col, m, n, 16 * spw)
        if lay is None:
            raise ValueError("spmm_wd: the CSR repeats a (row, column) entry")
        self.layout = lay
        self.toff = lay["toff"]
        self.flags = int(flags)
        if self.flags and self.S != 8:
            raise ValueError("spmm_wd's benchmarking flags need clusters=8")
        self.ncl = ncl
        self.set_values(values)

    def set_values(self, values: torch.Tensor) -> None:
        """Pack a value set (same pattern; the CSR's entry order) into the words (one gather)."""
        if values.dtype != self.dtype:
            raise ValueError(f"values dtype {values.dtype} differs from the layout's {self.dtype}")
        self.words = pack_words(self.layout, values)

    def kernel_name(self) -> str:
        spw, w = self.config
        return f"spmm_wd_p{spw}_w{w}_s{self.S}" + ("_f2" if self.prefetch == 2 else "") + ("_abl" if self.flags else "")

    def launch_shape(self, k: int) -> tuple[Any, tuple[int, int], int, int, int]:
        """(kernel, grid, threads, shared bytes, clusters) of a product with ``k`` columns."""
        if int(_launch.arch_of(self.dev_index)[3:]) < 90:
            raise ValueError("spmm_wd needs sm_90 or later (clusters, mbarrier try_wait)")
        m, _n = self.shape
        spw, w = self.config
        name = self.kernel_name()
        smem = wd_smem_bytes(spw, w, self.KR)
        threads = 32 * w
        nrb = -(-m // (16 * spw * w))
        if self.ncl:
            ncl = self.ncl
        else:
            res = _clusters_resident(name, self.dtype, self.dev_index, threads, smem, self.S)
            rounds = -(-nrb // res)
            ncl = -(-nrb // rounds)
        ncl = max(1, min(ncl, nrb))
        return _kernel(name, self.dtype, self.dev_index), (ncl * self.S, -(-k // 64)), threads, smem, ncl

    def __call__(self, Xt: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Y^T (k x m) for X^T ``Xt`` (k x n), plus ``bias`` (m) where given."""
        m, n = self.shape
        if Xt.dim() != 2 or Xt.shape[1] != n:
            raise ValueError(f"X^T must be (k, {n}), got {tuple(Xt.shape)}")
        if Xt.dtype != self.dtype or Xt.device != self.device:
            raise ValueError(f"X^T must be {self.dtype} on {self.device}")
        if not Xt.is_contiguous():
            Xt = Xt.contiguous()
        k = Xt.shape[0]
        if bias is not None:
            if bias.numel() != m:
                raise ValueError(f"bias must have {m} entries, got {bias.numel()}")
            bias = bias.to(self.dtype).contiguous()
        if out is not None and (tuple(out.shape) != (k, m) or out.dtype != self.dtype or not out.is_contiguous()
                                or out.data_ptr() % 8):
            out.copy_(self(Xt, bias))
            return out
        if out is None:
            out = torch.empty(k, m, dtype=self.dtype, device=self.device)
        if k == 0 or m == 0:
            return out
        if n == 0:
            out.copy_(bias.expand(k, m) if bias is not None else torch.zeros((), dtype=self.dtype, device=self.device))
            return out
        kern, grid, threads, smem, ncl = self.launch_shape(k)
        from ._mma import _allow_smem  # noqa: PLC0415

        _allow_smem(kern, self.dev_index, smem)
        spw, w = self.config
        nrb = -(-m // (16 * spw * w))
        vec = int(n % 8 == 0 and Xt.data_ptr() % 16 == 0)
        args = (m, n, k, self.KR, nrb, ncl, vec, self.toff.data_ptr(), self.words.data_ptr(), Xt.data_ptr(),
                bias.data_ptr() if bias is not None else 0, out.data_ptr(), self.flags)
        kern(grid, threads, args, shared=smem, device=self.dev_index)
        return out


def spmm_wd(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int], Xt: torch.Tensor,
            bias: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
    """One-shot Y^T = X^T A^T + bias (builds the layout, then runs): see :class:`WdSpmm`."""
    return WdSpmm(rowptr, col, values, shape, **kw)(Xt, bias)
