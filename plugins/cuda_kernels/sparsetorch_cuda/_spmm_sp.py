"""The 2:4 sparse-tensor-core SpMM of half-precision CSR patterns (kernels/spmm_sp.cu) for
:class:`~.plan.CudaSpmmPlan` (a mixin): the per-pattern index layout, the choice of block
configuration and the launch.

An unstructured pattern (a magnitude-pruned layer) is almost 2:4 already: at 10 % density a row's
group of four columns holds three or more entries ~0.4 % of the time. The plan cuts A into blocks
of 16 rows x 32 columns and stores, once per pattern, a 160-byte record per block (the rows'
column bitmaps, their runs' offsets, the mma.sp metadata words in the order the lanes hand them
over: :func:`sp_layout`); the kernel reads the values where they lie (the plan's CSR values: each
block copies its rows' runs into shared memory first), so new values (``set_values``, in-place
writes) cost nothing and are always seen. A group's third and fourth entries form the residual,
added on CUDA cores by the same block before its store.

Where it runs: ``plan.mma_kernel = "sp"`` (half precision, CSR / generic formats, k >= MMA_MIN_K
columns of X, n % 8 == 0, rows of fewer than 65536 entries, strictly increasing columns per row),
or "auto" where :func:`sp_auto` says it measured faster than spmm_fl / spmm_ws. The routing hook
is the k >= MMA_MIN_K branch of ``MmaMixin._launch_mma``."""

from __future__ import annotations

import functools
from typing import Any

import torch

from .launch import kernel, resident_blocks
from .layout import _sm_count

#: the compiled block configurations (R strips of 16 rows per warp, WR warps along rows, WK along K),
#: each for cluster sizes 1, 2, 4, 8 (2..8 on sm_90 and later)
SP_CONFIGS = ((4, 2, 4), (4, 4, 2), (2, 4, 2), (2, 2, 4))
SP_CLUSTERS = (1, 2, 4, 8)
#: bytes per block record, residual entries staged in shared memory per block (kernels/spmm_sp.cu)
SP_REC = 160
SP_RES = 512
#: dynamic shared memory a block may take (the H200's opt-in limit is 227 KB)
SP_MAX_SMEM = 227 * 1024
#: layouts of more blocks than this are not made (memory of the plan's temporaries)
SP_MAX_BLOCKS = 1 << 24
#: "auto" runs the sp kernel where k >= this many columns of X (None: never; "sp" forces it)
SP_AUTO_MIN_K: int | None = None


def _meta_lut(device: torch.device) -> torch.Tensor:
    """mma.sp metadata nibble (first kept position in the low 2 bits, second in the high 2, ascending)
    for each 4-bit occupancy of a group: its first two entries; one entry at p < 3 pairs with 3, one at 3
    with 2; an empty group (0, 1). Never 0b0000 / 0b0101 / 0b1010 / 0b1111 (invalid)."""
    lut = []
    for nib in range(16):
        bits = [p for p in range(4) if nib >> p & 1]
        if not bits:
            lut.append(0b0100)
        elif len(bits) == 1:
            p = bits[0]
            lut.append(2 | 3 << 2 if p == 3 else p | 3 << 2)
        else:
            lut.append(bits[0] | bits[1] << 2)
    return torch.tensor(lut, dtype=torch.int64, device=device)


def _as_i32(t: torch.Tensor) -> torch.Tensor:
    """uint32 bit patterns held in int64 as int32."""
    return torch.where(t >= 1 << 31, t - (1 << 32), t).to(torch.int32)


def sp_layout(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int) -> dict[str, Any] | None:
    """The kernel's index layout of a CSR pattern, or None where it does not apply (a row of 65536 or
    more entries, columns not strictly increasing within a row, too many blocks). Keys: ``S`` strips
    of 16 rows, ``J`` k-chunks of 32 columns, ``rec`` (S J x 40 int32: the block records, see
    kernels/spmm_sp.cu), ``rptr`` (S J + 1: residual entries per block, prefix), ``res_pos`` (their
    CSR positions), ``res_rc`` (column << 4 | row in strip), ``rowptr`` (int32), ``stats``."""
    dev = rowptr.device
    S, J = -(-m // 16), -(-n // 32)
    if not (m and n) or S * J > SP_MAX_BLOCKS or m * J > SP_MAX_BLOCKS * 4:
        return None
    r64 = rowptr.to(torch.int64)
    nnz = int(r64[-1])
    lengths = r64[1:] - r64[:-1]
    if nnz and int(lengths.max()) >= 65536:
        return None
    c = col[:nnz].to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64), lengths)
    if nnz > 1 and bool(((rows[1:] == rows[:-1]) & (c[1:] <= c[:-1])).any()):
        return None
    if nnz and (int(c.min()) < 0 or int(c.max()) >= n):
        return None
    SJ = S * J
    s, rl, j, cc = rows >> 4, rows & 15, c >> 5, c & 31
    blk = s * J + j
    occ = torch.zeros(SJ * 16, dtype=torch.int64, device=dev)
    occ.index_add_(0, blk * 16 + rl, torch.ones_like(cc) << cc)  # one bit per entry: the sum is the OR
    occ = occ.view(SJ, 16)
    # toff: the row's entries before k-chunk j
    counts = torch.bincount(rows * J + j, minlength=m * J).view(m, J)
    toff = torch.zeros(S * 16, J, dtype=torch.int64, device=dev)
    toff[:m] = torch.cumsum(counts, 1) - counts
    toff = toff.view(S, 16, J).permute(0, 2, 1).reshape(SJ, 16)
    # metadata words: lane 4 g + h: groups 4 h .. 4 h + 3 of rows g (bits 15:0) and g + 8 (31:16)
    nibs = (occ.unsqueeze(-1) >> (4 * torch.arange(8, device=dev))) & 15      # (SJ, 16 rows, 8 groups)
    metan = _meta_lut(dev)[nibs].view(SJ, 2, 8, 2, 4)                          # (half, g, h, jj)
    shifts = (16 * torch.arange(2, device=dev)).view(1, 2, 1, 1, 1) + (4 * torch.arange(4, device=dev)).view(1, 1, 1, 1, 4)
    meta = (metan << shifts).sum(dim=(1, 4)).reshape(SJ, 16)                  # (g, h) -> 2 g + h
    occ_w = occ.view(SJ, 2, 8).permute(0, 2, 1).reshape(SJ, 16)                # 2 g + h = row g + 8 h
    t2 = toff.view(SJ, 2, 8)
    toff_w = t2[:, 0] | (t2[:, 1] << 16)
    rec = _as_i32(torch.cat([occ_w, toff_w, meta], 1)).contiguous()
    # the residual: a group's entries after its first two, grouped by block
    idx = torch.arange(nnz, device=dev, dtype=torch.int64)
    key = rows * (J * 8) + (c >> 2)
    new = torch.ones(nnz, dtype=torch.bool, device=dev)
    if nnz > 1:
        new[1:] = key[1:] != key[:-1]
    start = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), 0).values if nnz else idx
    res = torch.nonzero(idx - start >= 2).flatten()
    rblk = blk[res]
    order = torch.argsort(rblk, stable=True)
    res = res[order]
    rptr = torch.zeros(SJ + 1, dtype=torch.int64, device=dev)
    rptr[1:] = torch.cumsum(torch.bincount(rblk, minlength=SJ), 0)
    nres = int(res.numel())
    pad = lambda t: torch.cat([t, t.new_zeros(1)]).to(torch.int32).contiguous()  # noqa: E731 - never empty
    stats = {"blocks": SJ, "residual": nres, "nnz": nnz, "index_bytes": SJ * SP_REC + 8 * nres + 4 * (SJ + 1)}
    return {"S": S, "J": J, "rec": rec, "rptr": rptr.to(torch.int32).contiguous(), "res_pos": pad(res),
            "res_rc": pad((c[res] << 4) | rl[res]), "rowptr": r64.to(torch.int32).contiguous(), "stats": stats}


def _sp_tables(cfg: tuple[int, int, int], kpw: int) -> int:
    """Bytes of shared memory after the values: residual entries, row tables, strip ranges."""
    rows = 16 * cfg[0] * cfg[1]
    return 8 * SP_RES + 4 * (3 * rows + 4 + 32)


def sp_smem(cfg: tuple[int, int, int], kpw: int, vcap: int = 0) -> tuple[int, int]:
    """(dynamic shared memory, value capacity) of configuration ``cfg`` = (R, WR, WK) with ``kpw``
    k-chunks per warp and ``vcap`` bytes for the block's values (kernels/spmm_sp.cu): the X^T slots,
    the records, the values, the tables, the barriers; the capacity grows where the float32 partial
    sums (which reuse the memory from the start after the loop) would reach the barriers."""
    R, WR, WK = cfg
    vcap = -(-vcap // 16) * 16
    head = kpw * WK * 4096 + kpw * WK * R * WR * SP_REC
    psum = 64 * (16 * R * WR + 4) * 4
    vcap = max(vcap, psum - head - _sp_tables(cfg, kpw))
    vcap = -(-vcap // 16) * 16
    return head + vcap + _sp_tables(cfg, kpw) + 8 * (kpw + 1), vcap


def sp_auto(plan: Any, k: int) -> bool:
    """Whether "auto" runs the sp kernel for ``k`` columns of X: k >= SP_AUTO_MIN_K (None: never)."""
    return SP_AUTO_MIN_K is not None and k >= SP_AUTO_MIN_K


@functools.lru_cache(maxsize=None)
def _cluster_ok(dev: int) -> bool:
    return torch.cuda.get_device_capability(dev)[0] >= 9


@functools.lru_cache(maxsize=None)
def _capacity(cfg: tuple[int, int, int], cs: int, smem: int, dev: int) -> int:
    """Blocks of configuration ``cfg`` with cluster size ``cs`` resident on the whole GPU at once, by the
    driver's occupancy calculator (clusters that fit x cs); one block per SM where it fails (an
    estimate for :func:`sp_choose` only: a real launch error still surfaces at the launch)."""
    from ._mma import _allow_smem  # noqa: PLC0415

    R, WR, WK = cfg
    sms = _sm_count(dev)
    try:
        kern = kernel("spmm_sp", f"spmm_sp_r{R}w{WR}k{WK}_s{cs}", torch.float16, torch.int32, dev, 16)
        _allow_smem(kern, dev, smem)
    except Exception:  # noqa: BLE001 - an estimate only
        return sms
    return resident_blocks(kern, 32 * WR * WK, smem, cs, sms, sms)


def sp_choose(m: int, n: int, k: int, dev: int, override: tuple[int, int, int, int] | None = None,
              capacity: Any = None, need: Any = None) -> tuple[int, int, int, int, int, int, int] | None:
    """(R, WR, WK, CS, kpw, smem, vcap) for an (m, n) pattern and k columns of X: ``override`` = (R, WR,
    WK, CS) where given (None if it does not fit), else over SP_CONFIGS x SP_CLUSTERS the one with the
    least estimated time: waves of blocks (blocks resident at once from ``capacity(cfg, cs, smem,
    dev)``, default the driver's occupancy calculator) x (k-chunks per warp x R x blocks sharing an SM
    + 6 for the block's start and end), the larger row range on a tie (less X traffic). ``need(rows,
    chunks)``: the most bytes of values one block of ``rows`` rows and ``chunks`` k-chunks copies into
    shared memory (None: 0); a configuration where they do not fit runs with the values read from
    global memory (vcap = 0), chosen only where nothing else fits."""
    J = -(-n // 32)
    capacity = capacity or _capacity
    clusters = SP_CLUSTERS if _cluster_ok(dev) else (1,)
    best, best_key = None, None
    cands = [override] if override is not None else [(*cfg, cs) for cfg in SP_CONFIGS for cs in clusters]
    sms = _sm_count(dev) if override is None else 1
    for R, WR, WK, CS in cands:
        if (R, WR, WK) not in SP_CONFIGS or CS not in clusters:
            return None
        kpw = -(-J // (CS * WK))
        rows = 16 * R * WR
        want = int(need(rows, WK * kpw)) if need is not None else 0
        penalty = 1
        smem, vcap = sp_smem((R, WR, WK), kpw, want)
        if smem > SP_MAX_SMEM:
            smem, vcap = sp_smem((R, WR, WK), kpw, 0)
            penalty = 3
            if smem > SP_MAX_SMEM:
                continue
        blocks = -(-m // rows) * CS * -(-k // 64)
        cap = max(1, int(capacity((R, WR, WK), CS, smem, dev)))
        per_sm = max(1, cap // max(sms, 1))
        key = (-(-blocks // cap) * (kpw * R * per_sm + 6) * penalty, -rows)
        if best_key is None or key < best_key:
            best, best_key = (R, WR, WK, CS, kpw, smem, vcap), key
    return best


class SpMixin:
    """The 2:4 sparse-tensor-core SpMM (kernels/spmm_sp.cu) for half-precision CSR, k >= 8."""

    _sp_override: tuple[int, int, int, int] | None = None
    _sp_flags = 0

    @property
    def sp_config_override(self) -> tuple[int, int, int, int] | None:
        """(R, WR, WK, CS) instead of :func:`sp_choose`'s choice (benchmarks, tests); setting it drops
        the recorded launches."""
        return self._sp_override

    @sp_config_override.setter
    def sp_config_override(self, cfg: tuple[int, int, int, int] | None) -> None:
        self._sp_override = tuple(cfg) if cfg is not None else None  # type: ignore[assignment]
        self._prepared.clear()

    @property
    def sp_flags(self) -> int:
        """Benchmarking only (wrong results): 1 skips the products, 2 the value loads, 4 the residual, 8 the
        copies into shared memory, 16 the cluster's sum; setting it drops the recorded launches."""
        return self._sp_flags

    @sp_flags.setter
    def sp_flags(self, flags: int) -> None:
        self._sp_flags = int(flags)
        self._prepared.clear()

    def _sp_layout(self) -> dict[str, Any] | None:
        """:func:`sp_layout` of the plan's CSR, once per pattern (None where it does not apply)."""
        got = self.__dict__.get("_sp")
        if got is None:
            m, n = self.shape
            lay = sp_layout(self.rowptr, self.col, m, n) if self.kind in ("csr", "generic") else None
            self.__dict__["_sp"] = got = lay if lay is not None else {}
        return got or None

    def _sp_ok(self, k: int) -> bool:
        """Whether the k >= MMA_MIN_K product runs spmm_sp: :attr:`mma_kernel` "sp", or "auto" where
        :func:`sp_auto` says so; half precision, CSR / generic, sm_80 or later, n % 8 == 0, the layout
        applies and a configuration fits."""
        kind = getattr(self, "mma_kernel", "auto")
        if kind != "sp" and not (kind == "auto" and sp_auto(self, k)):
            return False
        if self.dtype not in (torch.float16, torch.bfloat16) or self.kind not in ("csr", "generic"):
            return False
        m, n = self.shape
        if n % 8 or torch.cuda.get_device_capability(self.dev_index)[0] < 8:
            return False
        v = self._values
        if v is None or v.dim() != 1 or self._sp_layout() is None:
            return False
        return self.sp_choice(k) is not None

    def sp_choice(self, k: int) -> tuple[int, ...] | None:
        """(R, WR, WK, CS, kpw, smem, vcap) the product with ``k`` columns of X runs."""
        m, n = self.shape
        return sp_choose(m, n, k, self.dev_index, self.sp_config_override, need=self._sp_need)

    def _sp_need(self, rows: int, chunks: int) -> int:
        """The most bytes of values a block of ``rows`` rows and ``chunks`` k-chunks copies into shared
        memory (per row its run in 16-byte units, at most two more than the run's own), once per pair."""
        lay = self._sp_layout()
        cache = lay.setdefault("need", {})
        got = cache.get((rows, chunks))
        if got is None:
            m, n = self.shape
            r64 = lay["rowptr"].to(torch.int64)
            lengths = r64[1:] - r64[:-1]
            nb = -(-lay["J"] // chunks)
            rows_of = torch.repeat_interleave(torch.arange(m, device=r64.device), lengths)
            seg = torch.bincount(rows_of * nb + (self.col[:int(r64[-1])].to(torch.int64) >> 5) // chunks, minlength=m * nb)
            units = torch.where(seg > 0, (2 * seg + 15) // 16 + 1, torch.zeros_like(seg)).view(m, nb)
            pad = -(-m // rows) * rows - m
            units = torch.cat([units, units.new_zeros(pad, nb)]).view(-1, rows, nb).sum(1)
            got = cache[(rows, chunks)] = 16 * int(units.max()) if units.numel() else 0
        return got

    def _launch_sp(self, Xt: torch.Tensor, Yt: torch.Tensor, k: int, bp: int) -> None:
        """spmm_sp on X^T ``Xt`` ((k, n), 16-byte aligned) into Y^T ``Yt`` ((k, m)), bias pointer ``bp``."""
        from ._mma import _allow_smem  # noqa: PLC0415 - _mma imports nothing of this module

        m, n = self.shape
        lay = self._sp_layout()
        R, WR, WK, CS, kpw, smem, vcap = self.sp_choice(k)
        kern = kernel("spmm_sp", f"spmm_sp_r{R}w{WR}k{WK}_s{CS}", self.dtype, torch.int32, self.dev_index, 16)
        _allow_smem(kern, self.dev_index, smem)
        args = (m, n, k, lay["J"], kpw, vcap, lay["rowptr"].data_ptr(), lay["rec"].data_ptr(), lay["rptr"].data_ptr(),
                lay["res_pos"].data_ptr(), lay["res_rc"].data_ptr(), self._values.data_ptr(), Xt.data_ptr(), bp,
                Yt.data_ptr(), int(self.sp_flags))
        kern((-(-m // (16 * R * WR)) * CS, -(-k // 64)), 32 * WR * WK, args, shared=smem, device=self.dev_index)
