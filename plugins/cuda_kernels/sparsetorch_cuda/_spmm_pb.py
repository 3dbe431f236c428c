"""The pair-bitmap tensor-core SpMM of half-precision CSR patterns (kernels/spmm_pb.cu), standalone.

Y^T (k x m) = X^T (k x n) A^T (+ bias) for a pruned linear layer's forward pass, k <= 64 per grid row (more
columns: one more grid row per 64). The A fragments of mma.sync are decoded in registers from a per-tile pair
bitmap (no shared-memory A tile, no scatter, no barrier in the K loop): see the kernel's header for the k
permutation that makes every A register one aligned pair of columns and every B fragment one 16-byte load.

Per pattern (:func:`pb_layout`, torch ops on the pattern's device, made once): tiles of 16 rows x 32 columns;
per tile a header of 8 ``(map word, offset)`` pairs (64 bytes) and the tile's nonzero column pairs as 32-bit
words in map-bit order. ``set_values`` repacks the words (one scatter). Per call: X^T is permuted into the
chunks the warps read (``spmm_pb_xperm``, 2 bytes per X^T element), then the product.

Use: ``PbSpmm(rowptr, col, values, (m, n))``; ``op(Xt, bias)`` returns Y^T. Not wired into the plan yet
(session 25: measured standalone first, benchmarks/gpu/s25/bench_pb.py).

One of compile.py's PARTIAL_SOURCES (its NVRTC options and caches; loaded by launch.kernel), for sm_90 only
(clusters), half types only.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import compile as _compile
from . import launch as _launch

__all__ = ["PbSpmm", "pb_layout", "pair_slots", "call_operands", "pbr_layout", "pb_choose", "pb_smem_bytes", "kernel_names", "compile_cubin",
           "prewarm", "PB_CONFIGS", "PB_DEFAULT", "PB_CLUSTERS"]

#: the compiled configurations (kernels/spmm_pb.cu SPMM_PB_CFG): (MS strips of 16 rows per warp, W warps)
PB_CONFIGS: tuple[tuple[int, int], ...] = ((1, 4), (1, 8), (2, 4), (2, 8))
#: the default configuration: 32 rows per warp (64 float32 accumulators), 4 warps
PB_DEFAULT = (2, 4)
#: the configurations also built with the deep pipeline (``deep=True``: headers 8 blocks ahead, A words 4, B 1)
PB_DEEP: tuple[tuple[int, int], ...] = ((1, 4), (1, 8))
#: whether the product is launched with programmatic dependent launch behind the permute of X
PB_PDL = False
#: cluster sizes (K-splits)
PB_CLUSTERS: tuple[int, ...] = (1, 2, 4, 8)
_NARGS = 9
_SRC = "spmm_pb"


def kernel_names() -> list[str]:
    """Every kernel spmm_pb.cu exports for the half types on sm_90."""
    return ([f"spmm_pb{r}_p{p}_w{w}_s{s}" for r in ("", "r") for p, w in PB_CONFIGS for s in PB_CLUSTERS]
            + [f"spmm_pb{r}_p{p}_w{w}_s4_abl" for r in ("", "r") for p, w in PB_CONFIGS] + ["spmm_pb_xperm"]
            + [f"spmm_pb{r}d_p1_w{w}_s{s}{a}" for r in ("", "r") for w in (4, 8) for s in PB_CLUSTERS for a in ("", "_abl")
               if not a or s == 4])


def pb_smem_bytes(ms: int, w: int) -> int:
    """Dynamic shared memory of a block: the float32 sums [64 batch][R + 4], R = 16 MS W rows."""
    return 64 * (16 * ms * w + 4) * 4


def pb_choose(m: int, n: int, config: tuple[int, int], sms: int, resident: int) -> int:
    """The K-split S of PB_CLUSTERS for an m x n pattern: the largest S whose blocks (row blocks x S) still fit
    in one wave of ``resident`` blocks, at least 1, and no more K-splits than column blocks of 32 allow
    (each split at least two blocks)."""
    ms, w = config
    nrb = -(-m // (16 * ms * w))
    nkb = -(-n // 32)
    best = 1
    for s in PB_CLUSTERS:
        if nrb * s <= max(resident, sms) and nkb >= 2 * s:
            best = s
    return best


def pair_slots(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int) -> dict[str, Any] | None:
    """Each CSR entry's place in the pair maps of the tiles of 16 rows x 32 columns (kernels/spmm_pb.cu's k
    permutation), shared by spmm_pb's and spmm_rs's layouts; None where a (row, column) repeats. Keys: ``rows``,
    ``cols`` (int64, nnz), ``bit`` (0..255: map word g = row % 8, bit 8 t + slot), ``nnz``."""
    dev = col.device
    r64 = rowptr.to(torch.int64)
    nnz = int(r64[-1]) if r64.numel() else 0
    c = col[:nnz].to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), r64[1:] - r64[:-1])
    if nnz and torch.unique(rows * n + c).numel() != nnz:
        return None
    r = rows & 15
    pair = (c & 31) >> 1
    t = pair >> 2
    st = (pair >> 1) & 1
    sb = pair & 1
    g = r & 7
    sub = 2 * sb + (r >> 3)
    return {"rows": rows, "cols": c, "bit": 8 * (4 * g + t) + 4 * st + sub, "nnz": nnz}


def pb_layout(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int) -> dict[str, Any] | None:
    """The per-pattern layout of spmm_pb (torch ops on the pattern's device), or None where a (row, column)
    repeats. Keys: ``hdr`` (int32, tiles x 8 x 2: per tile and map word g, the word's bits and the absolute
    offset of its first pair; tiles = ceil(m / 16) x ceil(n / 32), strip-major), ``dest`` (int64, nnz: the
    half-word slot of each CSR entry in the value words), ``npairs``, ``stats``."""
    slots = pair_slots(rowptr, col, m, n)
    if slots is None:
        return None
    rows, c, bit, nnz = slots["rows"], slots["cols"], slots["bit"], slots["nnz"]
    dev = col.device
    nkb = -(-n // 32)
    strips = -(-m // 16)
    ntiles = strips * nkb
    tile = (rows >> 4) * nkb + (c >> 5)
    key = tile * 256 + bit
    ukey, inv = torch.unique(key, return_inverse=True)  # sorted: tile-major, map-bit order
    npairs = int(ukey.numel())
    dest = 2 * inv + (c & 1)
    wordidx = ukey >> 5  # tile * 8 + g
    bits = torch.zeros(ntiles * 8, dtype=torch.int64, device=dev)
    if npairs:
        bits.scatter_add_(0, wordidx, torch.ones_like(ukey) << (ukey & 31))
    cnt = torch.bincount(wordidx, minlength=ntiles * 8) if npairs else torch.zeros(ntiles * 8, dtype=torch.int64, device=dev)
    off = torch.zeros(ntiles * 8, dtype=torch.int64, device=dev)
    if ntiles:
        off[1:] = torch.cumsum(cnt, 0)[:-1]
    if npairs >= 2**31:
        return None
    bits32 = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    hdr = torch.stack([bits32, off.to(torch.int32)], 1).contiguous()
    if hdr.numel() == 0:
        hdr = torch.zeros(1, 2, dtype=torch.int32, device=dev)
    stats = {"tiles": ntiles, "strips": strips, "blocks": nkb, "nnz": nnz, "pairs": npairs,
             "bytes": 4 * max(npairs, 1) + 8 * hdr.shape[0]}
    return {"hdr": hdr, "dest": dest, "npairs": npairs, "nkb": nkb, "stats": stats}


def pbr_layout(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int) -> dict[str, Any] | None:
    """The per-pattern layout of spmm_pbr (the values read where they lie, in CSR order), or None where the columns
    of a row are not strictly increasing. Keys: ``hdr`` (int32, tiles x 8 x 4: per tile and g, row 16 s + g's
    32 column bits in the block and the CSR index of its first entry there, then the same for row 16 s + g + 8),
    ``stats``."""
    dev = col.device
    r64 = rowptr.to(torch.int64)
    nnz = int(r64[-1]) if r64.numel() else 0
    c = col[:nnz].to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), r64[1:] - r64[:-1])
    if nnz > 1:
        same = rows[1:] == rows[:-1]
        if bool((same & (c[1:] <= c[:-1])).any()):
            return None
    nkb = -(-n // 32)
    strips = -(-m // 16)
    ntiles = strips * nkb
    slot = (((rows >> 4) * nkb + (c >> 5)) * 8 + (rows & 7)) * 2 + ((rows >> 3) & 1)  # (tile, g, half)
    bits = torch.zeros(ntiles * 16, dtype=torch.int64, device=dev)
    off = torch.zeros(ntiles * 16, dtype=torch.int64, device=dev)
    if nnz:
        bits.scatter_add_(0, slot, torch.ones_like(c) << (c & 31))
        off.scatter_reduce_(0, slot, torch.arange(nnz, device=dev), reduce="amin", include_self=False)
    if nnz >= 2**31:
        return None
    bits32 = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    hdr = torch.stack([bits32, off.to(torch.int32)], 1).reshape(ntiles * 8, 4)
    if hdr.numel() == 0:
        hdr = torch.zeros(1, 4, dtype=torch.int32, device=dev)
    stats = {"tiles": ntiles, "strips": strips, "blocks": nkb, "nnz": nnz, "bytes": 2 * nnz + 16 * hdr.shape[0]}
    return {"hdr": hdr.contiguous(), "nkb": nkb, "stats": stats}


def pack_pairs(lay: dict[str, Any], values: torch.Tensor) -> torch.Tensor:
    """The pair words of one value set (int32, at least one): halves scattered to their slots, absent halves zero."""
    buf = torch.zeros(2 * max(lay["npairs"], 1), dtype=torch.int16, device=values.device)
    if lay["dest"].numel():
        buf[lay["dest"]] = values.reshape(-1).view(torch.int16)
    return buf.view(torch.int32)


def call_operands(op: Any, Xt: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, bool]:
    """The operands of a standalone half-precision SpMM's call ``op(Xt, bias, out)`` (PbSpmm, RsSpmm: ``op.shape``
    (m, n), ``op.dtype``, ``op.device``) checked and made contiguous: ``(Xt, bias, out, done)``, ``done`` where
    ``out`` already holds the answer (no product to launch: k, m or n zero, or an ``out`` the kernel cannot write,
    filled through a fresh call)."""
    m, n = op.shape
    if Xt.dim() != 2 or Xt.shape[1] != n:
        raise ValueError(f"X^T must be (k, {n}), got {tuple(Xt.shape)}")
    if Xt.dtype != op.dtype or Xt.device != op.device:
        raise ValueError(f"X^T must be {op.dtype} on {op.device}")
    if not Xt.is_contiguous():
        Xt = Xt.contiguous()
    k = Xt.shape[0]
    if bias is not None:
        if bias.numel() != m:
            raise ValueError(f"bias must have {m} entries, got {bias.numel()}")
        bias = bias.to(op.dtype).contiguous()
    if out is not None and (tuple(out.shape) != (k, m) or out.dtype != op.dtype or not out.is_contiguous()):
        out.copy_(op(Xt, bias))
        return Xt, bias, out, True
    if out is None:
        out = torch.empty(k, m, dtype=op.dtype, device=op.device)
    if k == 0 or m == 0:
        return Xt, bias, out, True
    if n == 0:
        out.copy_(bias.expand(k, m) if bias is not None else torch.zeros((), dtype=op.dtype, device=op.device))
        return Xt, bias, out, True
    return Xt, bias, out, False


# Compilation and loading: compile.py's (spmm_pb is one of its PARTIAL_SOURCES: half types, int32 indices) ---------
def compile_cubin(value: str, arch: str = "sm_90") -> bytes:
    """spmm_pb.cu compiled by NVRTC (no cache). Needs NVRTC only (no driver, no GPU)."""
    return _compile.compile_cubin(_SRC, value, "int32", arch)


def prewarm(arch: str = "sm_90", values: tuple[str, ...] = ("float16", "bfloat16")) -> int:
    """Compile the modules for ``arch`` into the disk cache (in parallel processes)."""
    return _compile.prewarm(arch, [_SRC], list(values), ["int32"])


def _kernel(name: str, dtype: torch.dtype, device: int, nargs: int = _NARGS) -> _launch.Kernel:
    return _launch.kernel(_SRC, name, dtype, torch.int32, device, nargs)


@functools.lru_cache(maxsize=None)
def _resident(name: str, dtype: torch.dtype, device: int, threads: int, smem: int, S: int) -> int:
    """Blocks of ``name`` resident at once (clusters of S x S; the driver's occupancy calculator)."""
    return S * _launch.clusters_resident(_kernel(name, dtype, device), device, threads, smem, S)


class PbSpmm:
    """Y^T = X^T A^T (+ bias) for a half-precision CSR A (m x n) with spmm_pb; the layout is made once.

    ``rowptr``, ``col``: the CSR (int32 or int64, on the GPU); ``values``: float16 or bfloat16 (nnz). Options:
    ``config`` ((MS, W) of PB_CONFIGS; default PB_DEFAULT), ``clusters`` (S of PB_CLUSTERS; default
    :func:`pb_choose` for the device), ``flags`` (benchmarking only, wrong results, S = 4 only: see the kernel's
    header); ``csr`` (True: spmm_pbr, the values read where they lie in the CSR order through per-row column
    maps, so in-place changes of ``values`` are seen by every later call and graph replay without
    ``set_values``; the columns of each row must be increasing). Raises ValueError where the layout does not apply
    (repeated or unsorted entries) or the device is not sm_90+."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int], *,
                 config: tuple[int, int] | None = None, clusters: int | None = None, flags: int = 0,
                 csr: bool = False, deep: bool = False) -> None:
        m, n = int(shape[0]), int(shape[1])
        if values.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"spmm_pb takes float16 or bfloat16 values, got {values.dtype}")
        self.config = tuple(config) if config else PB_DEFAULT
        if self.config not in PB_CONFIGS:
            raise ValueError(f"config must be one of {PB_CONFIGS}, got {config}")
        self.deep = bool(deep)
        #: launch the product with programmatic dependent launch behind the permute of X (kernel header)
        self.pdl = PB_PDL
        if self.deep and self.config not in PB_DEEP:
            raise ValueError(f"deep=True takes a configuration of {PB_DEEP}, got {self.config}")
        if clusters is not None and clusters not in PB_CLUSTERS:
            raise ValueError(f"clusters must be one of {PB_CLUSTERS}, got {clusters}")
        self.shape, self.dtype, self.device = (m, n), values.dtype, values.device
        self.dev_index = values.device.index if values.device.index is not None else torch.cuda.current_device()
        if int(_launch.arch_of(self.dev_index)[3:]) < 90:
            raise ValueError("spmm_pb needs sm_90 or later (clusters)")
        self.csr = bool(csr)
        lay = (pbr_layout if self.csr else pb_layout)(rowptr, col, m, n)
        if lay is None:
            raise ValueError("spmm_pb: the CSR repeats a (row, column) entry" + (" or a row's columns are not increasing"
                                                                                 if self.csr else ""))
        self.layout = lay
        self.hdr = lay["hdr"]
        self.nkb = lay["nkb"]
        self.flags = int(flags)
        if clusters is None:
            from .layout import _sm_count  # noqa: PLC0415

            ms, w = self.config
            name = f"spmm_pb{'r' if self.csr else ''}{'d' if self.deep else ''}_p{ms}_w{w}_s4"
            res = _resident(name, self.dtype, self.dev_index, 32 * w, pb_smem_bytes(ms, w), 4)
            clusters = pb_choose(m, n, self.config, _sm_count(self.dev_index), res)
        if self.flags and clusters != 4:
            raise ValueError("spmm_pb's benchmarking flags need clusters=4")
        self.S = int(clusters)
        self.set_values(values)

    def set_values(self, values: torch.Tensor) -> None:
        """Pack a value set (same pattern; the CSR's entry order) into the pair words (one scatter)."""
        if values.dtype != self.dtype:
            raise ValueError(f"values dtype {values.dtype} differs from the layout's {self.dtype}")
        if self.csr:
            if values.numel() != self.layout["stats"]["nnz"]:
                raise ValueError(f"values must have {self.layout['stats']['nnz']} entries, got {values.numel()}")
            self.words = values.contiguous() if values.numel() else torch.zeros(2, dtype=self.dtype, device=self.device)
        else:
            self.words = pack_pairs(self.layout, values)

    def kernel_name(self) -> str:
        ms, w = self.config
        return (f"spmm_pb{'r' if self.csr else ''}{'d' if self.deep else ''}_p{ms}_w{w}_s{self.S}"
                + ("_abl" if self.flags else ""))

    def launch_shape(self, k: int) -> tuple[Any, tuple[int, int], int, int]:
        """(kernel, grid, threads, shared bytes) of a product with ``k`` columns."""
        m, _n = self.shape
        ms, w = self.config
        smem = pb_smem_bytes(ms, w)
        nrb = -(-m // (16 * ms * w))
        return _kernel(self.kernel_name(), self.dtype, self.dev_index), (nrb * self.S, -(-k // 64)), 32 * w, smem

    def permute_x(self, Xt: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """X^T's chunks in the order the products read them (int32, ceil(k / 64) x nkb x 8 x 32 x 4)."""
        k, n = Xt.shape
        nbg = -(-k // 64)
        nch = nbg * self.nkb * 256
        if out is None:
            out = torch.empty(nch * 4, dtype=torch.int32, device=self.device)
        vec = int(n % 8 == 0 and Xt.data_ptr() % 16 == 0)
        kern = _kernel("spmm_pb_xperm", self.dtype, self.dev_index, 7)
        kern((-(-nch // 256), 1), 256, (k, n, self.nkb, nch, vec, Xt.data_ptr(), out.data_ptr()),
             shared=0, device=self.dev_index)
        return out

    def __call__(self, Xt: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Y^T (k x m) for X^T ``Xt`` (k x n), plus ``bias`` (m) where given."""
        m, _n = self.shape
        Xt, bias, out, done = call_operands(self, Xt, bias, out)
        if done:
            return out
        k = Xt.shape[0]
        xp = self.permute_x(Xt)
        kern, grid, threads, smem = self.launch_shape(k)
        from ._mma import _allow_smem  # noqa: PLC0415

        _allow_smem(kern, self.dev_index, smem)
        args = (m, k, self.nkb, self.hdr.data_ptr(), self.words.data_ptr(), xp.data_ptr(),
                bias.data_ptr() if bias is not None else 0, out.data_ptr(), self.flags)
        if self.pdl:
            _launch.allow_pdl(kern, self.dev_index)
        kern(grid, threads, args, shared=smem, device=self.dev_index, pdl=self.pdl)
        return out


#: when "auto" runs spmm_pbr in the plan (None: never; ``plan.mma_kernel = "pb"`` forces it): set from measurements
PB_AUTO: dict[str, float] | None = None
#: the plan's spmm_pbr build: the deep pipeline, configuration (1, 4)
PB_PLAN_DEEP = False
PB_PLAN_CONFIG = (1, 4)


def pb_auto(m: int, n: int, nnz: int, k: int, rule: dict[str, float] | None) -> bool:
    """Whether "auto" takes spmm_pbr for an m x n pattern with ``nnz`` entries and ``k`` columns of X under
    ``rule`` ({"min_k": ..., "max_density": ...}; None: never)."""
    if rule is None or not m or not n:
        return False
    return k >= rule.get("min_k", 33) and nnz <= rule.get("max_density", 0.3) * m * n


class PbMixin:
    """spmm_pbr for :class:`~.plan.CudaSpmmPlan` (a mixin). The op's per-row maps are made once per pattern from
    the plan's CSR; the values are read where they lie (the plan's current ``_values``), so ``set_values`` and
    in-place writes cost nothing and are seen by every later launch and replay. X^T is permuted first (two
    launches: the plan's one-launch replay does not apply)."""

    def _pb_op(self) -> "PbSpmm | None":
        got = self.__dict__.get("_pb")
        if got is None:
            got = False
            lay = self._mma_layout() if self.kind in ("csr", "generic") else None
            if (lay is not None and not lay["nm"] and self._values is not None and self._values.dim() == 1
                    and int(_launch.arch_of(self.dev_index)[3:]) >= 90):
                try:
                    got = PbSpmm(lay["rowptr"], self.col, self._values, self.shape, csr=True, deep=PB_PLAN_DEEP,
                                 config=PB_PLAN_CONFIG)
                except ValueError:
                    got = False
            self.__dict__["_pb"] = got
        return got or None

    def _pb_ok(self, k: int) -> bool:
        """Whether the k >= MMA_MIN_K product runs spmm_pbr: ``mma_kernel`` "pb", or "auto" where :func:`pb_auto`
        with :data:`PB_AUTO` says so; half precision, CSR / generic, one value set, sm_90+, sorted rows."""
        kind = getattr(self, "mma_kernel", "auto")
        m, n = self.shape
        if kind != "pb" and not (kind == "auto" and pb_auto(m, n, self.nnz, k, PB_AUTO)):
            return False
        if self.dtype not in (torch.float16, torch.bfloat16) or self.kind not in ("csr", "generic"):
            return False
        if self._values is None or self._values.dim() != 1:
            return False
        return self._pb_op() is not None

    def _launch_pb(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        """spmm_pbr on X^T ``Xt`` ((k, n)) into Y^T ``Yt`` ((k, m), contiguous), bias pointer ``bp`` (0: none)."""
        from ._mma import _allow_smem  # noqa: PLC0415 - _mma imports nothing of this module

        op = self._pb_op()
        m, n = self.shape
        xp = op.permute_x(Xt.contiguous())
        kern, grid, threads, smem = op.launch_shape(k)
        _allow_smem(kern, self.dev_index, smem)
        args = (m, k, op.nkb, op.hdr.data_ptr(), self._values.data_ptr(), xp.data_ptr(), bp, Yt.data_ptr(), 0)
        if op.pdl:
            _launch.allow_pdl(kern, self.dev_index)
        kern(grid, threads, args, shared=smem, device=self.dev_index, pdl=op.pdl)
