"""The strip-compacted tensor-core SpMM of half-precision CSR patterns (kernels/spmm_cc.cu), standalone.

Roles swapped against spmm_fl / spmm_ws / spmm_bm: the batch (columns of X) is the MMA's M and 8 rows of
A (a strip) its N, Y^T = X^T A^T. Per strip and K-slice only the union of the 8 rows' columns is walked
(at 10 % density about 57 % of the columns), 16 columns a step; the B operand of a step is the strip's
values at those columns, packed once per value set in the exact mma.m16n8k16 B-fragment order (one 8-byte
load per lane), and the A operand (X^T at the gathered columns) comes from X held feature-major in shared
memory by ldmatrix.x4.trans. The K-slices' partial sums meet in a cluster (distributed shared memory).

Use: :class:`CcSpmm` (``CcSpmm(rowptr, col, values, (m, n))`` builds the layout once; ``op(Xt, bias)``
returns Y^T (k x m)) or the one-shot :func:`spmm_cc`. The plan integration (``plan.mma_kernel = "cc"``)
is not made here: see the session-11 report (H2) for the diff.

Measured (H200, graph20, benchmarks/results/cuda_kernels_h200_s11b_cc_run2.json, float16 / bfloat16 alike):
4096^2 at 10 %: k = 1 / 16 / 64 / 128: 12.2 / 12.7 / 22.4 / 44.1 us against the plan's default kernels (csr16 /
spmm_ws) 2.9 / 22.3 / 27.7 / 38.0 and dense F.linear 10.0 / 9.7 / 9.4 / 14.0; at 50 %: 15.2 / 15.8 / 27.3 / 55.2
against 9.0 / 30.8 / 35.3 / 52.3. 4096 -> 11008 at 10 %: 24.0 / 24.9 / 42.9 / 83.6 against (csr16 / spmm_fl) 6.2 /
43.6 / 55.9 / 106.6, dense 24.5 / 25.0 / 24.8 / 27.1; at 50 %: 36.3 / 36.9 / 57.6 / 112.7 against 25.0 / 107.6 /
120.2 / 195.9. So spmm_cc beats the plan's kernels for 16 <= k <= 64 (and k = 128 where spmm_fl runs), never
dense F.linear at k >= 16 (the goal, 1.5x faster than dense, is not met). Its empty skeleton (flags 15) takes
19.8 of the 22.4 us at 4096^2 k = 64.

Session 12 (benchmarks/results/diag_s12_*.json, bench_s12_cc.json, ncu_s12c_cc.txt): the SM clock is 1980 MHz
throughout (read in-kernel with clock64 against %globaltimer; session 11's 345 MHz was the idle reading before
a call), a launch of 8-block clusters with 128-200 KB of shared memory costs 1.3-1.5 us by itself (3.0 us with
three cluster barriers), and the time grows with the rounds (4096^2 k = 64: 22.3 / 30.3 / 53.7 / 100.7 us with
15 / 8 / 4 / 2 clusters; the skeleton likewise). Nsight Compute: the kernel issues 6.2M warp instructions at
0.30 per cycle per scheduler (4 warps each; long-scoreboard 2.9, barrier 2.7, wait 2.0 cycles a stall per
issue), so it is bound by instruction latency, not bytes or tensor throughput; the skeleton issues 9.0M (its
flag tests) at 0.55. The "once" builds (``_o``, :data:`CC_ONCE`): every round's partial sums kept in shared
memory, one cluster barrier and one reduction after the last round: 4096^2 k = 1 / 16 / 64 / 128: 10.8 / 11.0
/ 20.7 / 40.6 us against 12.7 / 12.9 / 22.3 / 43.9 per round (same run); 4096 -> 11008 needs 6 rounds, whose
buffers do not fit beside the X slice, so it keeps the per-round build.

kernels/spmm_cc.cu is one of compile.py's SOURCES (NVRTC, the memory and disk caches, prewarm); this module
loads its library and takes kernels from it (launch.Kernel._bind).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import compile as _compile
from . import launch as _launch

__all__ = ["CcSpmm", "spmm_cc", "cc_layout", "cc_choose", "CC_CLUSTERS", "CC_MAX_SMEM", "CC_KS_TARGET",
           "kernel_names", "compile_cubin", "prewarm"]

#: warps per block (kernels/spmm_cc.cu CC_NW), steps prefetched (CC_PF: the arrays' padding), compiled batch-tile
#: counts (NMT: 1 for k <= 16 in a block's 64 columns, else 4) and cluster sizes (K-slices C)
CC_NW = 16
CC_PF = 8
CC_NMT = (1, 4)
CC_CLUSTERS: tuple[int, ...] = (1, 2, 4, 8)
#: dynamic shared memory a block may take (the H200's opt-in limit is 227 KB)
CC_MAX_SMEM = 227 * 1024
#: the default K-slice: the fewest clusters C with ceil(n / C) <= CC_KS_TARGET features
CC_KS_TARGET = 512
#: B formats: "dense" (spmm_cc_*: every B register of a step stored) and "z" (spmm_ccz_*: only the nonzero
#: registers, with a per-step bitmap); the default
CC_FORMATS = {"dense": "", "z": "z"}
CC_FORMAT = "z"
#: the "once" builds by default (CcSpmm's ``once``): one cluster reduction after the last round, where every
#: round's partial sums fit beside the X slice (session 12, bench_s12_cc.json: 1.6-3.3 us faster at 4096^2)
CC_ONCE = True
_NARGS = 14
#: where the plan's "auto" would run spmm_cc (see the module docstring's numbers): densities nnz / (m n) in
#: [lo, hi] (10 % and 50 % measured, a margin for rounding; between them interpolated) and k columns of X in
#: [k_lo, k_hi]; k up to K_FL_HI where the plan would
#: otherwise run spmm_fl (its blocks do not fit in one wave: 4096 -> 11008, k = 128 measured 83.6 against 106.6 us)
CC_AUTO_MEASURED: tuple[float, float, int, int] = (0.09, 0.51, 16, 64)
CC_AUTO_K_FL_HI = 128


def cc_auto(m: int, n: int, nnz: int, k: int, fl_kind: str | None = None,
            rule: tuple[float, float, int, int] | None = CC_AUTO_MEASURED) -> bool:
    """Whether "auto" should run spmm_cc for an m x n pattern of nnz entries and k columns of X: the measured
    rule (None: never); ``fl_kind`` is what the plan would run otherwise (MmaMixin.fl_kind), "fl" widening k
    to CC_AUTO_K_FL_HI. The X slice must fit (cc_choose)."""
    if rule is None or cc_choose(n) is None:
        return False
    lo, hi, k_lo, k_hi = rule
    density = nnz / max(m * n, 1)
    if fl_kind == "fl":
        k_hi = max(k_hi, CC_AUTO_K_FL_HI)
    return lo <= density <= hi and k_lo <= k <= k_hi


def kernel_names() -> list[str]:
    """Every kernel spmm_cc.cu exports for half types on sm_90 (C = 1 only below sm_90)."""
    return ([f"spmm_cc{f}_c{c}_n{t}" for f in CC_FORMATS.values() for c in CC_CLUSTERS for t in CC_NMT]
            + [f"spmm_cc_c{c}_n{t}_o" for c in CC_CLUSTERS for t in CC_NMT]
            + [f"spmm_cc{f}_c8_n4_abl" for f in CC_FORMATS.values()] + ["spmm_cc_c8_n4_o_abl"])


def cc_smem_bytes(ks: int, buffers: int = 2) -> int:
    """Dynamic shared memory of spmm_cc: ``buffers`` partial-sum buffers (NW strips x 64 x 8 float32: two, or one
    a round for the "once" builds) and the X slice (KS features x 64 halves)."""
    return buffers * CC_NW * 64 * 8 * 4 + ks * 128


def cc_choose(n: int, clusters: int | None = None) -> tuple[int, int] | None:
    """(C, KS) for ``n`` features: ``clusters`` if given, else the fewest C of CC_CLUSTERS with
    ceil(n / C) <= CC_KS_TARGET; KS = ceil(n / C) rounded up to 16. None where the X slice does not fit."""
    cands = (clusters,) if clusters else CC_CLUSTERS
    pick = None
    for c in cands:
        per = -(-n // c)  # columns per K-slice ...
        ks = -(-per // 16) * 16  # ... rounded up to whole 16-column steps
        if cc_smem_bytes(ks) > CC_MAX_SMEM:
            continue
        pick = (c, ks)
        if -(-n // c) <= CC_KS_TARGET:
            break
    return pick


def cc_layout(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int, C: int, ks: int) -> dict[str, Any] | None:
    """The per-pattern layout of spmm_cc (see kernels/spmm_cc.cu) for a CSR on any device, or None where
    it does not apply (a repeated (row, column)). Keys: ``sptr`` (int32, strips C + 1: steps of group
    g = s C + q), ``cols`` (int16 bits of uint16, (steps + CC_PF) x 16: slice-local features), ``gather``
    (int64, (steps + CC_PF) x 128: the CSR entry of each B-fragment half, -1 for a zero), ``recs`` (int32,
    (steps + CC_PF) x 4: the compressed format's records), ``gather_z`` (its halves' entries), ``steps``,
    ``stats``. The CC_PF spare steps at the end are zero (the kernel's prefetch runs past a strip)."""
    dev = col.device
    r64 = rowptr.to(torch.int64)
    nnz = int(r64[-1]) if r64.numel() else 0
    c = col[:nnz].to(torch.int64)
    strips = -(-m // 8)
    G = strips * C
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), r64[1:] - r64[:-1])
    if nnz and torch.unique(rows * n + c).numel() != nnz:
        return None
    q = c // ks
    f = c - q * ks
    grp = (rows >> 3) * C + q
    ukey, inv = torch.unique(grp * ks + f, return_inverse=True)  # sorted: group-major, then feature
    U = int(ukey.numel())
    ug, uf = ukey // ks, ukey % ks
    res = uf & 7
    # rank of each union column among its group's columns of the same residue f % 8
    k2 = ug * 8 + res
    o2 = torch.argsort(k2 * ks + uf)
    k2s = k2[o2]
    idx = torch.arange(U, device=dev, dtype=torch.int64)
    first = torch.ones(U, dtype=torch.bool, device=dev)
    if U > 1:
        first[1:] = k2s[1:] != k2s[:-1]
    start = torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), 0).values if U else idx
    rank = torch.empty_like(idx)
    rank[o2] = idx - start
    # a group's columns ordered by (rank, residue): consecutive 8 mostly of distinct residues (bank-free gathers)
    o3 = torch.argsort(ug * (ks + 8) + rank * 8 + res)
    cnt = torch.bincount(ug, minlength=G) if U else torch.zeros(G, dtype=torch.int64, device=dev)
    gstart = torch.cumsum(cnt, 0) - cnt
    pos = torch.empty_like(idx)
    pos[o3] = idx - gstart[ug[o3]]
    nst = (cnt + 15) // 16
    sptr = torch.zeros(G + 1, dtype=torch.int64, device=dev)
    sptr[1:] = torch.cumsum(nst, 0)
    S = int(sptr[-1])
    step_u = sptr[ug] + pos // 16
    j_u = pos % 16
    cols = (torch.arange(16, device=dev, dtype=torch.int64) & 7).repeat(S + CC_PF)  # CC_PF spare steps
    if U:
        cols[step_u * 16 + j_u] = uf
    # each CSR entry's half in its step's B fragments: lane = 4 (row % 8) + (j % 8) / 2, half (j % 2) + 2 (j / 8)
    st_e, j_e = step_u[inv], j_u[inv]
    slot = st_e * 128 + ((rows & 7) * 4 + ((j_e & 7) >> 1)) * 4 + (j_e & 1) + (j_e >> 3) * 2
    gather = torch.full(((S + CC_PF) * 128,), -1, dtype=torch.int64, device=dev)
    if nnz:
        gather[slot] = torch.arange(nnz, device=dev, dtype=torch.int64)
    # bank conflicts left: per half-step, the most gathered features sharing a residue (1 = none)
    cv = cols[: 16 * S].view(S, 2, 8) & 7 if S else cols[:0].view(0, 2, 8)
    worst = (torch.nn.functional.one_hot(cv, 8).sum(2).max(2).values.float().mean().item()) if S else 1.0
    # the compressed format: a step's 64 B registers (4-byte words, lane-major), only the nonzero ones stored
    g2 = gather.view(S + CC_PF, 64, 2)
    present = (g2 >= 0).any(2)
    wts = torch.ones(32, dtype=torch.int64, device=dev) << torch.arange(32, device=dev, dtype=torch.int64)
    lo = (present[:, :32].to(torch.int64) * wts).sum(1)
    hi = (present[:, 32:].to(torch.int64) * wts).sum(1)
    cnt_w = present.sum(1)
    base = torch.cumsum(cnt_w, 0) - cnt_w
    words = int(cnt_w.sum())

    def i32(t: torch.Tensor) -> torch.Tensor:
        return torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)

    recs = torch.stack([i32(lo), i32(hi), i32(base), torch.zeros_like(base, dtype=torch.int32)], 1).contiguous()
    gather_z = g2[present].reshape(-1)
    stats = {"C": C, "KS": ks, "steps": S, "union": U, "nnz": nnz, "fill": nnz / max(S * 128, 1),
             "mean_conflict": worst, "bytes": S * (256 + 32) + 4 * (G + 1),
             "words_z": words, "bytes_z": S * (16 + 32) + 4 * words + 4 * (G + 1)}
    return {"sptr": sptr.to(torch.int32).contiguous(), "cols": cols.to(torch.int16).contiguous(),
            "gather": gather, "recs": recs, "gather_z": gather_z, "steps": S, "stats": stats}


def pack_values(lay: dict[str, Any], values: torch.Tensor, fmt: str = "dense") -> torch.Tensor:
    """The B fragments of one value set: values at the layout's gather, 0 where -1 ("dense": steps x 128
    halves; "z": the nonzero registers' halves, two per word, plus two spare words)."""
    gi = lay["gather"] if fmt == "dense" else torch.cat([lay["gather_z"], lay["gather_z"].new_full((4,), -1)])
    v = values.reshape(-1)
    if v.numel() == 0:
        return torch.zeros(gi.numel(), dtype=values.dtype, device=values.device)
    out = v[gi.clamp(min=0)]
    return torch.where(gi >= 0, out, torch.zeros((), dtype=values.dtype, device=values.device)).contiguous()


# Compilation and loading: compile.py's (spmm_cc is one of its SOURCES: memory, disk cache, NVRTC) --------
def compile_cubin(value: str, index: str, arch: str) -> bytes:
    """spmm_cc.cu compiled by NVRTC (no cache). Needs NVRTC only (no driver, no GPU)."""
    return _compile.compile_cubin("spmm_cc", value, index, arch)


def prewarm(arch: str, values: tuple[str, ...] = ("float16", "bfloat16")) -> int:
    """Compile the half-precision modules for ``arch`` into the disk cache (in parallel processes)."""
    return _compile.prewarm(arch, ["spmm_cc"], list(values), ["int32"])


def _kernel(name: str, dtype: torch.dtype, device: int) -> _launch.Kernel:
    return _launch.kernel("spmm_cc", name, dtype, torch.int32, device, _NARGS)


@functools.lru_cache(maxsize=None)
def _clusters_resident(name: str, dtype: torch.dtype, device: int, threads: int, smem: int, C: int) -> int:
    """Clusters of C blocks of ``name`` resident at once (the driver's occupancy calculator; SMs / C where it fails)."""
    return _launch.clusters_resident(_kernel(name, dtype, device), device, threads, smem, C)


class CcSpmm:
    """Y^T = X^T A^T (+ bias) for a half-precision CSR A (m x n) with spmm_cc; the layout is made once.

    ``rowptr``, ``col``: the CSR (int32 or int64, on the GPU); ``values``: float16 or bfloat16. Options:
    ``clusters`` (C, the K-slices; default :func:`cc_choose`), ``fmt`` (a CC_FORMATS key; default CC_FORMAT),
    ``ncl`` (clusters launched; default the resident count), ``flags`` (benchmarking only, wrong results: 1 no
    products, 2 no A loads, 4 no pattern loads, 8 no X slice; C = 8, k > 16 only). Raises ValueError where the layout does not apply
    (repeated entries, n too large for the X slice)."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int], *,
                 clusters: int | None = None, fmt: str | None = None,
                 flags: int = 0, ncl: int | None = None, once: bool | None = None) -> None:
        m, n = int(shape[0]), int(shape[1])
        if values.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"spmm_cc takes float16 or bfloat16 values, got {values.dtype}")
        choice = cc_choose(n, clusters)
        if choice is None:
            raise ValueError(f"spmm_cc: n = {n} features do not fit the X slice with clusters={clusters}")
        self.C, self.KS = choice
        self.shape, self.dtype, self.device = (m, n), values.dtype, values.device
        self.dev_index = values.device.index if values.device.index is not None else torch.cuda.current_device()
        lay = cc_layout(rowptr, col, m, n, self.C, self.KS)
        if lay is None:
            raise ValueError("spmm_cc: the CSR repeats a (row, column) entry")
        self.layout = lay
        self.fmt = fmt or CC_FORMAT
        if self.fmt not in CC_FORMATS:
            raise ValueError(f"fmt must be one of {tuple(CC_FORMATS)}, got {fmt!r}")
        self.flags = int(flags)
        #: clusters launched (None: the occupancy calculator's resident count, at most the strip groups)
        self.ncl = ncl
        #: the "_o" builds (dense B only): every round's partial sums kept, one cluster reduction at the end
        #: (where they fit in shared memory); None: CC_ONCE
        self.once = once
        self.set_values(values)

    def set_values(self, values: torch.Tensor) -> None:
        """Pack a new value set (same pattern) into the B fragments (one gather)."""
        if values.dtype != self.dtype:
            raise ValueError(f"values dtype {values.dtype} differs from the layout's {self.dtype}")
        self.bv = pack_values(self.layout, values, self.fmt)

    def _launch_args(self, k: int) -> tuple[Any, tuple[int, int], int, int, int]:
        m, n = self.shape
        C = self.C
        if C > 1 and int(_launch.arch_of(self.dev_index)[3:]) < 90:
            raise ValueError("spmm_cc's clusters need sm_90 or later")
        nmt = 1 if k <= 16 else 4
        abl = "_abl" if self.flags else ""
        if abl and (C != 8 or nmt != 4):
            raise ValueError("spmm_cc's benchmarking flags need clusters=8 and k > 16")
        name = f"spmm_cc{CC_FORMATS[self.fmt]}_c{C}_n{nmt}{abl}"
        smem = cc_smem_bytes(self.KS)
        strips = -(-m // 8)
        ncl = self.ncl or _clusters_resident(name, self.dtype, self.dev_index, CC_NW * 32, smem, C)
        ncl = max(1, min(ncl, strips))
        once = CC_ONCE if self.once is None else self.once
        if once and self.fmt == "dense":
            per = -(-strips // ncl)
            rounds = -(-per // CC_NW)
            big = cc_smem_bytes(self.KS, max(rounds, 1))
            if big <= CC_MAX_SMEM:
                name = f"spmm_cc_c{C}_n{nmt}_o{abl}"
                smem = big
        return _kernel(name, self.dtype, self.dev_index), (ncl * C, -(-k // 64)), CC_NW * 32, smem, ncl

    def __call__(self, Xt: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Y^T (k x m) for X^T ``Xt`` (k x n, contiguous), plus ``bias`` (m) where given."""
        m, n = self.shape
        if Xt.dim() != 2 or Xt.shape[1] != n:
            raise ValueError(f"X^T must be (k, {n}), got {tuple(Xt.shape)}")
        if Xt.dtype != self.dtype or Xt.device != self.device:
            raise ValueError(f"X^T must be {self.dtype} on {self.device}")
        if not Xt.is_contiguous() or Xt.data_ptr() % 4:
            Xt = Xt.contiguous().clone()
        k = Xt.shape[0]
        if out is not None and (tuple(out.shape) != (k, m) or out.dtype != self.dtype or not out.is_contiguous()
                                or out.data_ptr() % 8):
            res = self(Xt, bias)
            out.copy_(res)
            return out
        if out is None:
            out = torch.empty(k, m, dtype=self.dtype, device=self.device)
        if k == 0 or m == 0:
            return out
        if n == 0:
            out.copy_(bias.expand(k, m) if bias is not None else torch.zeros((), dtype=self.dtype, device=self.device))
            return out
        bp = 0
        if bias is not None:
            bias = bias.to(self.dtype).contiguous()
            bp = bias.data_ptr()
        kern, grid, threads, smem, ncl = self._launch_args(k)
        from ._mma import _allow_smem  # noqa: PLC0415

        _allow_smem(kern, self.dev_index, smem)
        lay = self.layout
        args = (m, n, k, self.KS, -(-m // 8), ncl, lay["sptr"].data_ptr(), lay["cols"].data_ptr(), self.bv.data_ptr(),
                lay["recs"].data_ptr(), Xt.data_ptr(), bp, out.data_ptr(), self.flags)
        kern(grid, threads, args, shared=smem, device=self.dev_index)
        return out


def spmm_cc(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int], Xt: torch.Tensor,
            bias: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
    """One-shot Y^T = X^T A^T + bias (builds the layout, then runs): see :class:`CcSpmm`."""
    return CcSpmm(rowptr, col, values, shape, **kw)(Xt, bias)


#: the rule "auto" uses (None: never; ``plan.mma_kernel = "cc"`` forces spmm_cc); CC_AUTO_MEASURED once wired
CC_AUTO: tuple[float, float, int, int] | None = None


class CcMixin:
    """spmm_cc for :class:`~.plan.CudaSpmmPlan` (a mixin; not yet in the plan's bases: the session-11 H2 report
    gives the diff). The op is built once per pattern from the plan's CSR; it reads packed copies of the values,
    so a new value set (``set_values``, which replaces ``_values``) is repacked at the next launch, while
    writes into the same values tensor are not seen: the plan's ``bind`` must decline where spmm_cc runs."""

    def _cc_op(self) -> "CcSpmm | None":
        got = self.__dict__.get("_cc")
        if got is None:
            got = False
            lay = self._mma_layout() if self.kind in ("csr", "generic") else None
            if lay is not None and not lay["nm"] and self._values is not None and self._values.dim() == 1:
                try:
                    got = CcSpmm(lay["rowptr"], self.col, self._values, self.shape)
                    got.values_ref = self._values
                except ValueError:
                    got = False
            self.__dict__["_cc"] = got
        return got or None

    def _cc_ok(self, k: int) -> bool:
        """Whether the k >= MMA_MIN_K product runs spmm_cc: ``mma_kernel`` "cc", or "auto" where :func:`cc_auto`
        with :data:`CC_AUTO` says so; half precision, CSR / generic, one value set, the layout applies."""
        kind = getattr(self, "mma_kernel", "auto")
        if kind != "cc" and not (kind == "auto" and CC_AUTO is not None):
            return False
        if self.dtype not in (torch.float16, torch.bfloat16) or self.kind not in ("csr", "generic"):
            return False
        if self._values is None or self._values.dim() != 1:
            return False
        if kind == "auto":
            m, n = self.shape
            fl = self.fl_kind(k) if self._fl_ok() else None
            if not cc_auto(m, n, self.nnz, k, fl, CC_AUTO):
                return False
        return self._cc_op() is not None

    def _launch_cc(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        """spmm_cc on X^T ``Xt`` ((k, n)) into Y^T ``Yt`` ((k, m)), bias pointer ``bp`` (0: none)."""
        op = self._cc_op()
        if op.values_ref is not self._values:  # a new value set: one gather
            op.set_values(self._values)
            op.values_ref = self._values
        m, n = self.shape
        kern, grid, threads, smem, ncl = op._launch_args(k)
        from ._mma import _allow_smem  # noqa: PLC0415

        _allow_smem(kern, self.dev_index, smem)
        lay = op.layout
        args = (m, n, k, op.KS, -(-m // 8), ncl, lay["sptr"].data_ptr(), lay["cols"].data_ptr(), op.bv.data_ptr(),
                lay["recs"].data_ptr(), Xt.data_ptr(), bp, Yt.data_ptr(), 0)
        kern(grid, threads, args, shared=smem, device=self.dev_index)
