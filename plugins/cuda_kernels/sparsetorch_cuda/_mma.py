"""The kernels/mma.cu paths of :class:`~.plan.CudaSpmmPlan` (a mixin): the tensor-core SpMM (when
it runs, the dense tile layout it reads, made once per pattern, and its launch) and, for one
right-hand side, csr16_xs (half-precision CSR with uint16 columns and X in shared memory).

CSR runs ``spmm_fl_s<S>`` (session 7: cp.async X^T stages, entries loaded a tile ahead, double-
buffered A tiles, ldmatrix fragments, one barrier per tile) or ``spmm_ws_s<S>`` (the same work split
between producer and consumer warps) as :meth:`MmaMixin.fl_kind` decides, where their inputs allow
(16-byte aligned values, the block's tile offsets in shared memory); N:M 2:4 and the rest run
``spmm_mma*_s<S>``."""

from __future__ import annotations

import functools
from typing import Any

import torch

from .launch import allow_pdl, kernel, recording, resident_blocks
from .layout import (CSR16_MIN_MEAN, INT_LIMIT, MMA_MAX_TILES, MMA_MIN_K, _GRID_Y, _sm_count)

#: the batch-1 kernel of long half-precision CSR rows (``plan.csr16_kernel``): "auto" (session 8: the
#: first of CSR16_AUTO that takes n, else "xv"), one of CSR16_XV_KERNELS, "xs1" / "xs2" / "xs4"
#: (csr16_xs<R>: X copied into shared memory, R rows per warp) or "warp" (the plan's csr16_warp, X
#: gathered through the read-only cache)
CSR16_KERNEL_DEFAULT = "auto"
#: what "auto" runs: the first of these that takes n (:func:`_xv_fits`). "xr" measured slower
#: (NOTES.md "Session 8: batch-1 SpMV of pruned LLM layers": 4.50 against 3.81 µs on 4096², 10.35 against 7.15 on 4096 -> 11008);
#: "x12b" too (session 9, llm_h200_s9.json: its rotation cuts a row's fullest-bank gather steps from 50.8 to 32.3
#: but costs more than it saves: 3.30 against 2.97 µs on 4096² fp16 at 1024 threads, flags 6; 7.00 against 6.40)
CSR16_AUTO = ("x12a", "xva")
#: X of at most this many bytes goes to shared memory in csr16_xs (no opt-in needed)
CSR16_XS_BYTES = 48 * 1024
#: the session-8 batch-1 kernels (csr16_xv*: a lane per aligned pair of 8-entry chunks; "f": X in
#: shared memory as float32; "x12": the columns packed 12 bits each, n <= 4096) and their names
CSR16_XV_KERNELS = {"xv": "csr16_xv", "xvf": "csr16_xvf", "x12": "csr16_x12", "x12f": "csr16_x12f", "xva": "csr16_xva",
                    "x12a": "csr16_x12a", "xr": "csr16_xr", "x12b": "csr16_x12b"}
#: the batch-1 kernels launched with programmatic dependent launch (launch.py) where ``plan.csr16_pdl``
#: (default CSR16_PDL_DEFAULT): the "a" / "b" kernels, which run griddepcontrol.wait before every read of
#: X, the values and the bias and before writing Y (before it only the plan's pattern copies, flags & 4)
CSR16_PDL_KERNELS = ("xva", "x12a", "x12b")
CSR16_PDL_DEFAULT = True
#: flags of the batch-1 kernels where ``plan.csr16_flags`` is not set, per kernel (kernels/mma.cu: 1
#: launch_dependents at the start, 2 after the barrier, 4 the row pointers and first columns before
#: griddepcontrol.wait). x12a: 6 (session 9, llm_h200_s9.json, with 1024 threads and PDL: 4096^2 2.97 /
#: 3.07 us fp16 / bf16, 4096 -> 11008 6.40 / 6.65; flags 4 alone 3.73 / 7.14, flags 1 at 512 threads 4.32).
#: The rest keep 0 (not measured with these flags at their default threads)
CSR16_FLAGS_BY: dict[str, int] = {"x12a": 6}
#: greedy passes over the lanes of csr16_x12b's rotation choice (:func:`rot_assign`)
CSR16_ROT_PASSES = 2
#: copies of X in shared memory for csr16_xr (``plan.csr16_copies`` overrides; 1..15)
CSR16_XR_COPIES = 8
#: threads per block of csr16_xv* (a warp per row; 1024 measured faster than 512 and 256 for xv / x12,
#: cuda_kernels_h200_run1_s8_llm.json), per kernel where another measured faster. x12a: 512 in session 8
#: (plain launches, runs 2-3); 1024 with PDL and flags 6 in session 9 (benchmarks/results/llm_h200_s9.json,
#: 4096^2 fp16: 2.97 us against 3.23 at 512 with flags 2, 3.62 at 512 with flags 0, 3.89 without PDL)
CSR16_XV_THREADS = 1024
CSR16_XV_THREADS_BY = {"x12b": 512}
#: csr16_xv* with 12-bit columns take n up to this
CSR16_X12_MAX_N = 4096
#: what an Inf or NaN in X does in the half-precision tensor-core products (k > 1; ``plan.mma_nonfinite``
#: overrides): "sparse" (the default): the sparse product's answer, as SciPy, cuSPARSE, the CPU backends and the
#: csr16 kernels (k = 1) give it (the Inf reaches only the rows that store its column), by a second launch,
#: spmm_fixup, which reads X once and recomputes the columns of X holding a non-finite value from the stored
#: entries (CSR patterns; N:M 2:4 keeps "dense"); GPU-tested in session 13 (pytest_h200_s13_nonfinite.txt), it
#: costs 1.2-2.0 us per call (bench_s13_fixup.json: 4096^2 k = 16 / 64 / 128: 22.5 -> 23.9, 27.9 -> 29.4,
#: 38.1 -> 39.6 us). "dense": the tensor-core kernels' own answer, which multiplies the tiles' structural zeros
#: (0 * Inf = NaN in every row of the tile, as F.linear on the masked dense weight gives; diag_s12_nonfinite.json)
MMA_NONFINITE = "sparse"
#: the tensor-core kernel of CSR patterns (``plan.mma_kernel``): "auto" (:meth:`MmaMixin.fl_kind`),
#: "fl" (spmm_fl_s<S>: 128 rows per block, 4 warps of 32 rows x 64 columns of X), "ws" (spmm_ws_s<S>:
#: 128 rows, 8 producer and 8 consumer warps) or "tile" (spmm_mma_s<S>, the earlier kernel; N:M 2:4
#: always runs it)
MMA_KERNEL_DEFAULT = "auto"
FL_KERNELS = ("fl", "ws")
#: cluster sizes spmm_fl / spmm_ws are compiled for (1 without clusters, below sm_90)
FL_SPLITS = (1, 2, 3, 4, 8)
#: shared memory spmm_fl / spmm_ws may take per block (the H200 allows 227 KB with the opt-in)
FL_MAX_SMEM = 200 * 1024


def _xs_bytes(kern: str, n: int, copies: int = CSR16_XR_COPIES) -> int:
    """Shared memory the batch-1 kernel ``kern`` takes for X of ``n`` entries (float32 for the "f" kernels,
    ``copies`` copies of whole 32-word blocks for "xr")."""
    if kern == "xr":
        return 4 * copies * _xr_stride(n)
    return (4 if kern.endswith("f") else 2) * n


def _xv_fits(kern: str, n: int, copies: int) -> bool:
    """Whether csr16_xv* kernel ``kern`` takes n columns: x12 n <= CSR16_X12_MAX_N; xr 1..15 copies whose
    shared-memory indices fit in uint16 and whose shared memory fits FL_MAX_SMEM; the rest X in 48 KB."""
    if kern.startswith("x12") and n > CSR16_X12_MAX_N:
        return False
    if kern == "xr":
        return 1 <= copies <= 15 and 2 * copies * _xr_stride(n) <= 65535 and _xs_bytes(kern, n, copies) <= FL_MAX_SMEM
    return _xs_bytes(kern, n) <= CSR16_XS_BYTES


def _xr_stride(n: int) -> int:
    """Words between csr16_xr's copies of X: n / 2 rounded up to whole blocks of 32 words."""
    return -(-(n // 2 + n % 2) // 32) * 32


def xr_assign(rowptr: torch.Tensor, col: torch.Tensor, n: int, copies: int) -> tuple[torch.Tensor, dict]:
    """csr16_xr's columns: for every entry the shared-memory index (in halves) of its column of X in the
    copy chosen for it, and statistics. The kernel's gathers: a warp per row, lane L of pass b taking
    the entries 16 (pa + 32 b + L) + t (pa = rowptr[r] // 16) at step t = 0 .. 15, the row's entries only;
    the 32-bit word w = c // 2 of copy k lies in bank (w + k (2 (w // 32) + 1)) mod 32. Greedy, lane by
    lane over all (row, pass, step) groups at once: each entry takes the copy whose bank its group has
    used least so far (the first such). ``stats``: bank-conflict wavefronts per row (the most accesses
    to one bank, summed over the row's gathers) with one copy and with the choice."""
    dev = rowptr.device
    r64 = rowptr.to(torch.int64)
    m = r64.numel() - 1
    nnz = int(r64[-1])
    c64 = col[:nnz].to(torch.int64)
    lengths = r64[1:] - r64[:-1]
    rows = torch.repeat_interleave(torch.arange(m, device=dev), lengths)
    i = torch.arange(nnz, device=dev, dtype=torch.int64)
    pa, pe = r64[:-1] >> 4, (r64[1:] + 15) >> 4
    lane_g = (i >> 4) - pa[rows]
    passes = (pe - pa + 31) >> 5
    base = torch.cumsum(passes, 0) - passes
    gid = (base[rows] + (lane_g >> 5)) * 16 + (i & 15)
    lane = lane_g & 31
    groups = int(passes.sum()) * 16
    word = c64 >> 1
    odd = 2 * (word >> 5) + 1
    ks = torch.arange(copies, device=dev, dtype=torch.int64)
    load = torch.zeros(max(groups, 1), 32, dtype=torch.int32, device=dev)
    before = torch.zeros_like(load)
    choice = torch.zeros(nnz, dtype=torch.int64, device=dev)
    order = torch.argsort(lane, stable=True)
    counts = torch.bincount(lane, minlength=32).tolist()
    start = 0
    for cnt in counts:
        idx = order[start:start + cnt]
        start += cnt
        if not cnt:
            continue
        g, w, o = gid[idx], word[idx], odd[idx]
        banks = (w[:, None] + ks[None, :] * o[:, None]) & 31
        k = load[g[:, None], banks].argmin(1)
        load[g, banks.gather(1, k[:, None]).squeeze(1)] += 1
        before[g, w & 31] += 1
        choice[idx] = k
    stride = _xr_stride(n)
    pos = choice * stride + (word & ~31) + ((word + choice * odd) & 31)
    out = 2 * pos + (c64 & 1)
    stats = {"copies": copies, "wavefronts_per_row_one_copy": float(before.max(1).values.sum()) / max(m, 1),
             "wavefronts_per_row": float(load.max(1).values.sum()) / max(m, 1), "gathers_per_row": groups / max(m, 1)}
    return out, stats


def rot_assign(rowptr: torch.Tensor, col: torch.Tensor, passes: int = CSR16_ROT_PASSES) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """csr16_x12b's order of the entries: for every pair p of 8-entry chunks (entries 16 p .. 16 p + 15 of
    the whole CSR) a rotation r_p in 0..15, the pair's column slot t then holding entry 16 p + (t + r_p) mod 16
    (its value rotated to match in the kernel's registers). Only whole pairs (all 16 entries in one row)
    rotate; the rest keep 0. The kernel's gathers: a warp per row, lane L of pass b taking pair
    pa + 32 b + L (pa = rowptr[r] // 16) and gathering X at its column slot t at step t = 0 .. 15; the
    half-precision column c lies in bank (c // 2) mod 32. Greedy, lane by lane over all (row, pass) groups at
    once, ``passes`` times (a later pass re-chooses each lane against all the others): each whole pair takes
    the rotation of least sum over its 16 steps of 8 ** (entries already on the bank it would hit), which
    weighs a step's fullest bank (what its gather costs) far above the rest (measured on a random 90 %
    4096^2 pattern: 50.8 conflict steps per row unrotated, 35.1 with a linear weight, 32.4 with this). Returns the columns (P x 16, int64, in slot
    order; P = ceil(nnz / 16) + 1, zeros past nnz), the rotations (P, uint8) and statistics: the sum over a
    row's gather steps of the most entries on one bank (same-word broadcasts counted as conflicts), with no
    rotation and with the choice, per row."""
    dev = rowptr.device
    r64 = rowptr.to(torch.int64)
    m = r64.numel() - 1
    nnz = int(r64[-1])
    P = -(-nnz // 16) + 1
    cp = torch.zeros(P * 16, dtype=torch.int64, device=dev)
    cp[:nnz] = col[:nnz].to(torch.int64)
    cp = cp.view(P, 16)
    bank = (cp >> 1) & 31
    lengths = r64[1:] - r64[:-1]
    whole = torch.zeros(P, dtype=torch.bool, device=dev)
    full = nnz // 16
    if full:
        rows_e = torch.repeat_interleave(torch.arange(m, device=dev), lengths)
        whole[:full] = rows_e[0:16 * full:16] == rows_e[15:16 * full:16]
    pa, pe = r64[:-1] >> 4, (r64[1:] + 15) >> 4
    cnt = pe - pa
    total = int(cnt.sum())
    inc_row = torch.repeat_interleave(torch.arange(m, device=dev), cnt)
    start = torch.cumsum(cnt, 0) - cnt
    local = torch.arange(total, device=dev) - start[inc_row]
    inc_pair = pa[inc_row] + local
    passes_row = (cnt + 31) >> 5
    gbase = torch.cumsum(passes_row, 0) - passes_row
    inc_group = gbase[inc_row] + (local >> 5)
    inc_lane = local & 31
    groups = max(int(passes_row.sum()), 1)
    steps = torch.arange(16, device=dev)
    load = torch.zeros(groups * 16 * 32, dtype=torch.int32, device=dev)

    def slots(g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # flat load index of (group, step, bank)
        return (g[:, None] * 16 + steps[None, :]) * 32 + b

    def add(g: torch.Tensor, b: torch.Tensor, sign: int) -> None:
        load.index_add_(0, slots(g, b).reshape(-1), torch.full((b.numel(),), sign, dtype=torch.int32, device=dev))

    def worst(rot_b: torch.Tensor) -> float:  # stats: sum over groups and steps of the fullest bank, per row
        ld = torch.zeros_like(load)
        ld.index_add_(0, slots(inc_group, rot_b).reshape(-1), torch.ones(rot_b.numel(), dtype=torch.int32, device=dev))
        return float(ld.view(groups, 16, 32).max(-1).values.sum()) / max(m, 1)

    before = worst(bank[inc_pair])
    iw = whole[inc_pair]
    add(inc_group[~iw], bank[inc_pair[~iw]], 1)  # the pairs that do not rotate
    rot = torch.zeros(P, dtype=torch.int64, device=dev)
    shift = (steps[None, :] + steps[:, None]) & 15  # [r, t]: the entry at slot t under rotation r
    sel_by_lane = [torch.nonzero(iw & (inc_lane == L)).squeeze(1) for L in range(32)]
    for it in range(max(passes, 1)):
        for sel in sel_by_lane:
            if not sel.numel():
                continue
            g, p = inc_group[sel], inc_pair[sel]
            if it:
                add(g, bank[p].gather(1, (steps[None, :] + rot[p][:, None]) & 15), -1)
            cand = bank[p][:, shift]  # [i, r, t]
            cost = torch.pow(8.0, load[(g[:, None, None] * 16 + steps[None, None, :]) * 32 + cand].float()).sum(-1)
            r = cost.argmin(1)
            rot[p] = r
            add(g, bank[p].gather(1, (steps[None, :] + r[:, None]) & 15), 1)
    idx = (steps[None, :] + rot[:, None]) & 15
    cols = cp.gather(1, idx)
    after = worst(bank[inc_pair].gather(1, idx[inc_pair]))
    stats = {"passes": passes, "conflict_steps_per_row_no_rotation": before, "conflict_steps_per_row": after,
             "whole_pairs": float(whole.float().mean()) if P else 0.0}
    return cols, rot.to(torch.uint8), stats


def fl_smem_bytes(rows: int, tiles: int, a_tiles: int = 2) -> int:
    """Dynamic shared memory of spmm_fl (``a_tiles`` = 2) / spmm_ws (3) with ``rows`` rows per block
    and at most ``tiles`` column tiles per block: the A tiles, three X^T stages (row stride 72
    halves) and the tile offsets."""
    return a_tiles * rows * 72 * 2 + 3 * 64 * 72 * 2 + (tiles + 1) * rows * 2


@functools.lru_cache(maxsize=None)
def _fl_capacity(name: str, dtype: torch.dtype, dev: int, split: int, threads: int, smem: int) -> int:
    """Blocks of kernel ``name`` (spmm_fl_s<S> / spmm_ws_s<S>) resident on the whole GPU at once
    (clusters that fit x S), by the driver's occupancy calculator; 2 blocks per SM where the
    calculator fails (an estimate for :meth:`MmaMixin.fl_split` only: a real launch error still
    surfaces at the launch)."""
    kern = kernel("mma", name, dtype, torch.int32, dev, 12)
    _allow_smem(kern, dev, smem)
    sms = _sm_count(dev)
    return resident_blocks(kern, threads, smem, split, sms, 2 * sms)


_SMEM_ALLOWED: dict[tuple[str, int], int] = {}


def _allow_smem(kern: Any, dev: int, nbytes: int) -> None:
    """Opt ``kern`` in to ``nbytes`` of dynamic shared memory (above the default 48 KB), once."""
    key = (f"{kern.name}/{id(kern)}", dev)
    if nbytes <= max(_SMEM_ALLOWED.get(key, 0), 48 * 1024):
        return
    from .launch import LaunchError, _driver  # noqa: PLC0415

    cu = _driver()
    want = nbytes
    (err,) = cu.cuKernelSetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, want,
                                     cu.CUkernel(int(kern._fn)), cu.CUdevice(dev))
    if int(err) != 0:
        raise LaunchError(f"cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={want}) for {kern.name} failed ({int(err)})")
    _SMEM_ALLOWED[key] = want


class MmaMixin:
    """Tensor-core SpMM for half-precision X with several columns."""

    def _mma_ok(self, k: int) -> bool:
        """Whether ``k`` columns run this mixin's kernels (see :meth:`apply`): the tensor-core SpMM
        for ``k >= MMA_MIN_K``; for ``k == 1``, long half-precision CSR rows, csr16_xs (X in shared
        memory) where :attr:`csr16_kernel` names it."""
        if self.dtype not in (torch.float16, torch.bfloat16):
            return False
        if k == 1:
            return self._xs_ok()
        if not self.use_mma or k < MMA_MIN_K:
            return False
        m, n = self.shape
        if not (self.small and m * k < INT_LIMIT and n * k < INT_LIMIT and k <= _GRID_Y * 64):
            return False
        return self._mma_layout() is not None

    def _xs_ok(self) -> bool:
        m, n = self.shape
        kern = self._csr16_name()
        if kern not in ("xs1", "xs2", "xs4", *CSR16_XV_KERNELS) or not (self.use_mma and self.use_csr16) \
                or self.kind not in ("csr", "generic"):
            return False
        if self.sell is not None or not self.small or self.nnz < CSR16_MIN_MEAN * max(m, 1):
            return False
        if not (_xv_fits(kern, n, int(getattr(self, "csr16_copies", CSR16_XR_COPIES))) if kern in CSR16_XV_KERNELS
                else 2 * n <= CSR16_XS_BYTES):
            return False
        v = self._values
        if v is None or v.dim() != 1 or v.data_ptr() % 16:
            return False
        return self._mma_layout() is not None

    def _csr16_name(self) -> str:
        """:attr:`csr16_kernel` (default CSR16_KERNEL_DEFAULT) with "auto" resolved by n."""
        kern = getattr(self, "csr16_kernel", CSR16_KERNEL_DEFAULT)
        if kern == "auto":
            n = self.shape[1]
            for name in CSR16_AUTO:
                if _xv_fits(name, n, int(getattr(self, "csr16_copies", CSR16_XR_COPIES))):
                    return name
            return "xv"
        return kern

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

    def _col12(self) -> torch.Tensor:
        """The columns packed 12 bits each (n <= 4096), for csr16_x12*: entry i's column in bits
        [12 i, 12 i + 12) of a little-endian byte string, padded with zeros to whole pairs of 8-entry
        chunks (24 bytes per 16 entries) plus one; made once per pattern."""
        lay = self._mma_layout()
        got = lay.get("col12")
        if got is None:
            pairs = -(-self.nnz // 16) + 1
            c = torch.zeros(pairs * 16, dtype=torch.int32, device=self.device)
            c[:self.nnz] = self.col.to(torch.int32)
            a, b = c.view(pairs, 8, 2).unbind(-1)
            got = torch.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], -1).to(torch.uint8).reshape(-1).contiguous()
            lay["col12"] = got
        return got

    def _col12b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """csr16_x12b's columns (:func:`rot_assign`'s slot order, packed 12 bits each as :meth:`_col12`) and
        its rotation bytes; once per pattern."""
        lay = self._mma_layout()
        got = lay.get("col12b")
        if got is None:
            cols, rot, stats = rot_assign(lay["rowptr"], self.col, CSR16_ROT_PASSES)
            c = cols.to(torch.int32).reshape(-1, 8, 2)
            a, b = c.unbind(-1)
            packed = torch.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], -1).to(torch.uint8).reshape(-1).contiguous()
            got = lay["col12b"] = (packed, rot.contiguous())
            lay["rot_stats"] = stats
        return got

    def _xr_cols(self) -> torch.Tensor:
        """csr16_xr's columns (:func:`xr_assign`) as uint16 bits, padded as the uint16 columns are; once per
        pattern and number of copies."""
        lay = self._mma_layout()
        copies = int(getattr(self, "csr16_copies", CSR16_XR_COPIES))
        got = lay.get(f"xr{copies}")
        if got is None:
            idx, stats = xr_assign(lay["rowptr"], self.col, self.shape[1], copies)
            full = torch.zeros(lay["col"].numel(), dtype=torch.int64, device=self.device)
            full[:self.nnz] = idx
            got = torch.where(full >= 32768, full - 65536, full).to(torch.int16).contiguous()
            lay[f"xr{copies}"] = got
            lay["xr_stats"] = stats
        return got

    def _fl_ok(self) -> bool:
        """Whether the CSR product runs spmm_fl / spmm_ws (see the module docstring)."""
        if getattr(self, "mma_kernel", MMA_KERNEL_DEFAULT) not in (*FL_KERNELS, "auto"):
            return False
        lay = self._mma_layout()
        v = self._values
        if lay is None or lay["nm"] or v is None or v.data_ptr() % 16:
            return False
        tiles = -(-lay["T"] // (8 if lay["cluster"] else 1))
        return self._fl_smem(tiles, "fl") <= FL_MAX_SMEM

    def fl_kind(self, k: int) -> str:
        """The kernel of :attr:`mma_kernel` for ``k`` columns of X; "auto": "ws" where its blocks
        fit in one wave with the column tiles split at least two ways (few row blocks: each block's
        producers and consumers overlap, and one block per SM loses nothing to a second wave),
        else "fl" (several blocks per SM)."""
        kind = getattr(self, "mma_kernel", MMA_KERNEL_DEFAULT)
        if kind != "auto":
            return kind
        lay = self._mma_layout()
        if not lay["cluster"]:
            return "fl"
        m, _ = self.shape
        blocks = -(-m // 128) * -(-k // 64)
        for s in FL_SPLITS[1:]:
            smem = self._fl_smem(-(-lay["T"] // s), "ws")
            name, threads, _ = self._fl_kernel(s, "ws")
            if smem <= FL_MAX_SMEM and blocks * s <= _fl_capacity(name, self.dtype, self.dev_index, s, threads, smem):
                return "ws"
        return "fl"

    def fl_split(self, k: int, kind: str | None = None) -> int:
        """Cluster size S of spmm_fl / spmm_ws: over the sizes they are compiled for, the one with
        the fewest column tiles per block times waves of blocks (blocks resident at once from the
        driver's occupancy calculator), the smaller S on a tie; ``mma_split_override`` where set."""
        kind = kind or self.fl_kind(k)
        lay = self._mma_layout()
        m, n = self.shape
        rows = self._fl_kernel(1, kind)[2]
        splits = FL_SPLITS if lay["cluster"] else (1,)
        fits = [s for s in splits if self._fl_smem(-(-lay["T"] // s), kind) <= FL_MAX_SMEM]
        if self.mma_split_override:
            want = int(self.mma_split_override)
            return min((s for s in fits if s >= want), default=fits[-1])
        blocks = -(-m // rows) * -(-k // 64)
        best, best_cost = fits[-1], None
        for s in fits:
            name, threads, _ = self._fl_kernel(s, kind)
            cap = _fl_capacity(name, self.dtype, self.dev_index, s, threads, self._fl_smem(-(-lay["T"] // s), kind))
            cost = -(-blocks * s // max(cap, 1)) * -(-lay["T"] // s)
            if best_cost is None or cost < best_cost:
                best, best_cost = s, cost
        return best

    def _fl_kernel(self, s: int, kind: str) -> tuple[str, int, int]:
        """The spmm_fl / spmm_ws kernel ``kind`` for cluster size ``s``: name, threads and rows per block."""
        return (f"spmm_ws_s{s}", 512, 128) if kind == "ws" else (f"spmm_fl_s{s}", 128, 128)

    def _fl_smem(self, tiles: int, kind: str) -> int:
        return fl_smem_bytes(128, tiles, 3 if kind == "ws" else 2)

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
            prep = self._prepared[key] = self._prepare(calls, xp, Yt.data_ptr())
            if prep is not None and prep.pdl and not (k == 1 and getattr(self, "csr16_pdl", CSR16_PDL_DEFAULT)):
                prep.set_pdl(False)  # the kernel allows PDL (another plan opted it in), this plan does not
        return Yt.mT if transposed else Yt.mT.contiguous()

    def _launch_mma(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        """The product Y^T = X^T A^T (+ bias) of the half-precision paths, then, for k > 1 (the tensor-core kernels)
        and CSR patterns, where :attr:`mma_nonfinite` (default :data:`MMA_NONFINITE`) is "sparse", the fix-up
        that gives the sparse product's answer where X holds Inf or NaN (kernels/mma.cu spmm_fixup)."""
        self._launch_mma_kernel(Xt, Yt, k, bp)
        if k > 1 and getattr(self, "mma_nonfinite", MMA_NONFINITE) == "sparse":
            lay = self._mma_layout()
            if lay is not None and not lay["nm"]:
                m, n = self.shape
                kern = kernel("mma", "spmm_fixup", self.dtype, torch.int32, self.dev_index, 8)
                kern((k, 1), 256, (m, n, lay["rowptr"].data_ptr(), lay["col"].data_ptr(), self._values.data_ptr(),
                                   Xt.data_ptr(), bp, Yt.data_ptr()), device=self.dev_index)

    def _launch_mma_kernel(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        m, n = self.shape
        lay = self._mma_layout()
        v = self._values
        if k == 1 and self._csr16_name() in CSR16_XV_KERNELS:
            # csr16_xv*: X in shared memory, a warp per row, a lane per pair of 8-entry chunks
            name = self._csr16_name()
            threads = int(getattr(self, "csr16_threads", CSR16_XV_THREADS_BY.get(name, CSR16_XV_THREADS)))
            kern = kernel("mma", CSR16_XV_KERNELS[name], self.dtype, torch.int32, self.dev_index, 10 if name == "x12b" else 9)
            if name in CSR16_PDL_KERNELS and getattr(self, "csr16_pdl", CSR16_PDL_DEFAULT):
                allow_pdl(kern, self.dev_index)  # this call (the recording) launches without it; the replays with it
            flags = getattr(self, "csr16_flags", None)
            flags = int(CSR16_FLAGS_BY.get(name, 0) if flags is None else flags)
            copies = int(getattr(self, "csr16_copies", CSR16_XR_COPIES))
            extra: tuple[int, ...] = ()
            if name == "xr":
                col = self._xr_cols()
                flags |= (copies << 8) | (_xr_stride(n) << 16)
            elif name == "x12b":
                col, rot = self._col12b()
                extra = (rot.data_ptr(),)
            else:
                col = self._col12() if name.startswith("x12") else lay["col"]
            smem = -(-_xs_bytes(name, n, copies) // 16) * 16
            _allow_smem(kern, self.dev_index, smem)
            kern((-(-m // (threads // 32)), 1), threads,
                 (m, n, lay["rowptr"].data_ptr(), col.data_ptr(), v.data_ptr(), Xt.data_ptr(), bp, Yt.data_ptr(), flags, *extra),
                 shared=smem, device=self.dev_index)
            return
        if k == 1:  # csr16_xs: X in shared memory, 16 R rows per block of 512 threads
            rows = int(self._csr16_name()[2:])
            kern = kernel("mma", f"csr16_xs{rows}", self.dtype, torch.int32, self.dev_index, 8)
            kern((-(-m // (16 * rows)), 1), 512, (m, n, lay["rowptr"].data_ptr(), lay["col"].data_ptr(), v.data_ptr(),
                                                  Xt.data_ptr(), bp, Yt.data_ptr()),
                 shared=-(-2 * n // 16) * 16, device=self.dev_index)
            return
        if self._pb_ok(k):  # pair-bitmap fragments decoded in registers, values where they lie (kernels/spmm_pb.cu)
            self._launch_pb(Xt, Yt, k, bp)
            return
        if self._bm_ok(k):  # per-row column bitmaps into register fragments (kernels/spmm_bm.cu, _spmm_bm.py)
            self._launch_bm(Xt, Yt, k, bp)
            return
        if self._sp_ok(k):  # the 2:4 sparse tensor cores (kernels/spmm_sp.cu, _spmm_sp.py)
            self._launch_sp(Xt, Yt, k, bp)
            return
        rows = self.mma_rows
        if self._fl_ok():
            kind = self.fl_kind(k)
            s = self.fl_split(k, kind)
            name, threads, rows = self._fl_kernel(s, kind)
            kern = kernel("mma", name, self.dtype, torch.int32, self.dev_index, 12)
            smem = self._fl_smem(-(-lay["T"] // s), kind)
            _allow_smem(kern, self.dev_index, smem)
            args = (m, n, k, lay["T"], lay["rowptr"].data_ptr(), lay["toff"].data_ptr(), lay["col"].data_ptr(), v.data_ptr(),
                    Xt.data_ptr(), bp, Yt.data_ptr(), self.mma_flags)
            kern((-(-m // rows) * s, -(-k // 64)), threads, args, shared=smem, device=self.dev_index)
            return
        s = self.mma_split(k)
        grid = (-(-m // rows) * s, -(-k // 64))
        r64 = "_r64" if rows == 64 else ""
        if lay["nm"]:
            kern = kernel("mma", f"spmm_mma24{r64}_s{s}", self.dtype, torch.int32, self.dev_index, 12)
            args = (m, n, k, lay["T"], 0, 0, self.words.data_ptr(), v.data_ptr(), Xt.data_ptr(), bp, Yt.data_ptr(), self.mma_flags)
        else:
            kern = kernel("mma", f"spmm_mma{r64}_s{s}", self.dtype, torch.int32, self.dev_index, 12)
            args = (m, n, k, lay["T"], lay["rowptr"].data_ptr(), lay["toff"].data_ptr(), lay["col"].data_ptr(), v.data_ptr(),
                    Xt.data_ptr(), bp, Yt.data_ptr(), self.mma_flags)
        kern(grid, 2 * rows, args, device=self.dev_index)

