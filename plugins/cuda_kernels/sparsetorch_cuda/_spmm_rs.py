"""The resident-copy tensor-core SpMM of half-precision CSR patterns (kernels/spmm_rs.cu), standalone.

Y^T (k x m) = X^T (k x n) A^T (+ bias) for a pruned linear layer's forward pass, k <= 64 per grid row (more
columns: one more grid row per 64). spmm_pb's register-decoded A fragments (the same pair maps and words), but a
block copies everything its K range needs into shared memory first (asynchronous copies in pieces, one mbarrier
each), so the K loop reads no global memory; X^T is read where it lies (no permute launch). See the kernel's header.

Per pattern (:func:`rs_layout`, torch ops on the pattern's device, made once per configuration's row block of R
rows): tiles ordered by (row block, column block of 32, strip of 16 rows), headers of 8 ``(map word, offset)``
pairs per tile, the pair words in (tile, map bit) order with every (row block, column block) group padded to four
words, ``gbase`` the groups' first words. ``set_values`` repacks the words (one scatter).

Use: ``RsSpmm(rowptr, col, values, (m, n))``; ``op(Xt, bias)`` returns Y^T. Not wired into the plan (measured
standalone first: benchmarks/gpu/s29/bench_rs.py).

One of compile.py's PARTIAL_SOURCES, for sm_90 only (clusters), half types only.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import compile as _compile
from . import launch as _launch
from ._spmm_pb import call_operands, pack_pairs, pair_slots

__all__ = ["RsSpmm", "rs_layout", "rs_smem_bytes", "rs_choose", "kernel_names", "compile_cubin", "RS_CONFIGS",
           "RS_DEFAULT", "RS_CLUSTERS"]

#: the compiled configurations (kernels/spmm_rs.cu SPMM_RS_CFG): (MS strips of 16 rows per warp, W warps)
RS_CONFIGS: tuple[tuple[int, int], ...] = ((1, 8), (2, 4), (2, 8), (1, 16))
#: the default configuration: 256 rows per block (8 warps of 32 rows)
RS_DEFAULT = (2, 8)
#: cluster sizes (K-splits)
RS_CLUSTERS: tuple[int, ...] = (1, 2, 4, 8)
#: the largest dynamic shared memory a block may take (sm_90: 227 KB)
RS_SMEM_MAX = 232448
_NARGS = 13
_SRC = "spmm_rs"


def kernel_names() -> list[str]:
    """Every kernel spmm_rs.cu exports for the half types on sm_90."""
    return ([f"spmm_rs_p{p}_w{w}_s{s}" for p, w in RS_CONFIGS for s in RS_CLUSTERS]
            + [f"spmm_rs_p{p}_w{w}_s8_abl" for p, w in RS_CONFIGS])


def _xst(nbmax: int) -> int:
    """Bytes per batch row of a block's X^T slice (kernel: an odd multiple of 64)."""
    return 64 * (2 * ((nbmax + 1) // 2) + 1)


def _bounds(nkb: int, S: int) -> list[int]:
    return [nkb * q // S for q in range(S + 1)]


def rs_smem_bytes(lay: dict[str, Any], config: tuple[int, int], S: int) -> int:
    """Dynamic shared memory of a block at K-split S: mbarriers, the X^T slice, the headers and the widest
    segment's words, or the epilogue's float32 sums [64][R + 4] where larger."""
    ms, w = config
    nst = ms * w
    nkb = lay["nkb"]
    kb = _bounds(nkb, S)
    nbmax = max(kb[q + 1] - kb[q] for q in range(S))
    g = lay["gbase_host"]
    nrb = lay["nrb"]
    widest = 0
    for rb in range(nrb):
        for q in range(S):
            widest = max(widest, g[rb * nkb + kb[q + 1]] - g[rb * nkb + kb[q]])
    loop = 128 + 64 * _xst(nbmax) + nbmax * nst * 64 + 4 * widest
    return max(loop, 128 + 64 * (16 * nst + 4) * 4)


def rs_layout(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int, nst: int) -> dict[str, Any] | None:
    """The per-pattern layout of spmm_rs for row blocks of ``nst`` strips of 16 rows, or None where a (row,
    column) repeats. Keys: ``hdr`` (int32, tiles x 8 x 2: per tile and map word g, the word's bits and the offset
    of its first pair counted from the row block's first word; tiles = row blocks x ceil(n / 32) x nst in that
    order), ``gbase`` (int32, groups + 1: the first word of each (row block, column block) group, a multiple of
    4), ``dest`` (int64, nnz: the half-word slot of each CSR entry in the words), ``npairs`` (words, padding
    included), ``stats``."""
    slots = pair_slots(rowptr, col, m, n)
    if slots is None:
        return None
    rows, c, bit, nnz = slots["rows"], slots["cols"], slots["bit"], slots["nnz"]
    dev = col.device
    nkb = -(-n // 32)
    strips = -(-m // 16)
    nrb = -(-strips // nst)
    ngroups = nrb * nkb
    ntiles = ngroups * nst
    strip = rows >> 4
    tile = ((strip // nst) * nkb + (c >> 5)) * nst + strip % nst
    key = tile * 256 + bit
    ukey, inv = torch.unique(key, return_inverse=True)  # sorted: (row block, column block, strip), map-bit order
    npairs = int(ukey.numel())
    grp = (ukey >> 8) // nst
    gcnt = torch.bincount(grp, minlength=ngroups) if npairs else torch.zeros(ngroups, dtype=torch.int64, device=dev)
    gbase = torch.zeros(ngroups + 1, dtype=torch.int64, device=dev)
    gfirst = torch.zeros(ngroups + 1, dtype=torch.int64, device=dev)
    if ngroups:
        gbase[1:] = torch.cumsum((gcnt + 3) // 4 * 4, 0)
        gfirst[1:] = torch.cumsum(gcnt, 0)
    nwords = int(gbase[-1])
    if nwords >= 2**31:
        return None
    widx = gbase[grp] + torch.arange(npairs, device=dev) - gfirst[grp]
    dest = 2 * widx[inv] + (c & 1)
    wordidx = ukey >> 5  # tile * 8 + g
    bits = torch.zeros(ntiles * 8, dtype=torch.int64, device=dev)
    cnt = torch.zeros(ntiles * 8, dtype=torch.int64, device=dev)
    if npairs:
        bits.scatter_add_(0, wordidx, torch.ones_like(ukey) << (ukey & 31))
        cnt = torch.bincount(wordidx, minlength=ntiles * 8)
    ordinal = torch.zeros(ntiles * 8, dtype=torch.int64, device=dev)
    if ntiles:
        ordinal[1:] = torch.cumsum(cnt, 0)[:-1]
    egrp = torch.arange(ntiles * 8, device=dev) // (8 * nst)  # each header entry's group
    off = gbase[egrp] + ordinal - gfirst[egrp] - gbase[(egrp // nkb) * nkb]
    bits32 = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    hdr = torch.stack([bits32, off.to(torch.int32)], 1).contiguous()
    if hdr.numel() == 0:
        hdr = torch.zeros(1, 2, dtype=torch.int32, device=dev)
    stats = {"tiles": ntiles, "strips": strips, "blocks": nkb, "row_blocks": nrb, "nnz": nnz, "pairs": npairs,
             "words": nwords, "bytes": 4 * max(nwords, 1) + 8 * hdr.shape[0] + 4 * (ngroups + 1)}
    return {"hdr": hdr, "gbase": gbase.to(torch.int32), "gbase_host": gbase.tolist(), "dest": dest,
            "npairs": max(nwords, 1), "nkb": nkb, "nrb": nrb, "nst": nst, "stats": stats}


def rs_choose(lay: dict[str, Any], config: tuple[int, int], sms: int, resident: dict[int, int]) -> int | None:
    """The K-split S of RS_CLUSTERS for a layout: the largest S whose blocks fit the shared memory, fit one wave
    (``resident[S]`` blocks resident at once, the driver's count) and leave each split two column blocks; None
    where no S fits the shared memory."""
    best = None
    nkb, nrb = lay["nkb"], lay["nrb"]
    for s in RS_CLUSTERS:
        if rs_smem_bytes(lay, config, s) > RS_SMEM_MAX or (s > 1 and nkb < 2 * s):
            continue
        if best is None or nrb * s <= max(resident.get(s, 0), sms):
            best = s
    return best


# Compilation and loading: compile.py's (spmm_rs is one of its PARTIAL_SOURCES: half types, int32 indices) ---------
def compile_cubin(value: str, arch: str = "sm_90") -> bytes:
    """spmm_rs.cu compiled by NVRTC (no cache). Needs NVRTC only (no driver, no GPU)."""
    return _compile.compile_cubin(_SRC, value, "int32", arch)


def _kernel(name: str, dtype: torch.dtype, device: int) -> _launch.Kernel:
    return _launch.kernel(_SRC, name, dtype, torch.int32, device, _NARGS)


@functools.lru_cache(maxsize=None)
def _resident(name: str, dtype: torch.dtype, device: int, threads: int, smem: int, S: int) -> int:
    """Blocks of ``name`` resident at once (clusters of S x S; the driver's occupancy calculator)."""
    from ._mma import _allow_smem  # noqa: PLC0415

    kern = _kernel(name, dtype, device)
    _allow_smem(kern, device, smem)
    return S * _launch.clusters_resident(kern, device, threads, smem, S)


class RsSpmm:
    """Y^T = X^T A^T (+ bias) for a half-precision CSR A (m x n) with spmm_rs; the layout is made once.

    ``rowptr``, ``col``: the CSR (int32 or int64, on the GPU); ``values``: float16 or bfloat16 (nnz). Options:
    ``config`` ((MS, W) of RS_CONFIGS; default RS_DEFAULT), ``clusters`` (S of RS_CLUSTERS; default
    :func:`rs_choose` for the device), ``flags`` (benchmarking only, wrong results, S = 8 only: see the kernel's
    header). Raises ValueError where the layout does not apply (repeated entries), no K-split fits the shared
    memory (rows too dense for it) or the device is not sm_90+."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int], *,
                 config: tuple[int, int] | None = None, clusters: int | None = None, flags: int = 0) -> None:
        m, n = int(shape[0]), int(shape[1])
        if values.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"spmm_rs takes float16 or bfloat16 values, got {values.dtype}")
        self.config = tuple(config) if config else RS_DEFAULT
        if self.config not in RS_CONFIGS:
            raise ValueError(f"config must be one of {RS_CONFIGS}, got {config}")
        if clusters is not None and clusters not in RS_CLUSTERS:
            raise ValueError(f"clusters must be one of {RS_CLUSTERS}, got {clusters}")
        self.shape, self.dtype, self.device = (m, n), values.dtype, values.device
        self.dev_index = values.device.index if values.device.index is not None else torch.cuda.current_device()
        if int(_launch.arch_of(self.dev_index)[3:]) < 90:
            raise ValueError("spmm_rs needs sm_90 or later (clusters)")
        ms, w = self.config
        lay = rs_layout(rowptr, col, m, n, ms * w)
        if lay is None:
            raise ValueError("spmm_rs: the CSR repeats a (row, column) entry")
        self.layout = lay
        self.nkb = lay["nkb"]
        self.flags = int(flags)
        if clusters is None:
            from .layout import _sm_count  # noqa: PLC0415

            res = {}
            for s in RS_CLUSTERS:
                smem = rs_smem_bytes(lay, self.config, s)
                if smem <= RS_SMEM_MAX:
                    res[s] = _resident(f"spmm_rs_p{ms}_w{w}_s{s}", self.dtype, self.dev_index, 32 * w, smem, s)
            clusters = rs_choose(lay, self.config, _sm_count(self.dev_index), res)
            if clusters is None:
                raise ValueError("spmm_rs: no K-split fits a block's copies in shared memory (rows too dense)")
        elif rs_smem_bytes(lay, self.config, clusters) > RS_SMEM_MAX:
            raise ValueError(f"spmm_rs: clusters={clusters} needs {rs_smem_bytes(lay, self.config, clusters)} bytes "
                             f"of shared memory (at most {RS_SMEM_MAX}); take more clusters")
        if self.flags and clusters != 8:
            raise ValueError("spmm_rs's benchmarking flags need clusters=8")
        self.S = int(clusters)
        kb = _bounds(self.nkb, self.S)
        self.nbmax = max(kb[q + 1] - kb[q] for q in range(self.S))
        self.smem = rs_smem_bytes(lay, self.config, self.S)
        self.set_values(values)

    def set_values(self, values: torch.Tensor) -> None:
        """Pack a value set (same pattern; the CSR's entry order) into the pair words (one scatter)."""
        if values.dtype != self.dtype:
            raise ValueError(f"values dtype {values.dtype} differs from the layout's {self.dtype}")
        if values.numel() != self.layout["stats"]["nnz"]:
            raise ValueError(f"values must have {self.layout['stats']['nnz']} entries, got {values.numel()}")
        self.words = pack_pairs(self.layout, values)

    def kernel_name(self) -> str:
        ms, w = self.config
        return f"spmm_rs_p{ms}_w{w}_s{self.S}" + ("_abl" if self.flags else "")

    def launch_shape(self, k: int) -> tuple[Any, tuple[int, int], int, int]:
        """(kernel, grid, threads, shared bytes) of a product with ``k`` columns."""
        _ms, w = self.config
        return (_kernel(self.kernel_name(), self.dtype, self.dev_index), (self.layout["nrb"] * self.S, -(-k // 64)),
                32 * w, self.smem)

    def __call__(self, Xt: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Y^T (k x m) for X^T ``Xt`` (k x n), plus ``bias`` (m) where given."""
        m, n = self.shape
        Xt, bias, out, done = call_operands(self, Xt, bias, out)
        if done:
            return out
        k = Xt.shape[0]
        kern, grid, threads, smem = self.launch_shape(k)
        from ._mma import _allow_smem  # noqa: PLC0415

        _allow_smem(kern, self.dev_index, smem)
        vec = int(n % 8 == 0 and Xt.data_ptr() % 16 == 0)
        args = (m, n, k, self.nkb, self.nbmax, vec, self.layout["hdr"].data_ptr(), self.words.data_ptr(),
                self.layout["gbase"].data_ptr(), Xt.data_ptr(), bias.data_ptr() if bias is not None else 0,
                out.data_ptr(), self.flags)
        kern(grid, threads, args, shared=smem, device=self.dev_index)
        return out
