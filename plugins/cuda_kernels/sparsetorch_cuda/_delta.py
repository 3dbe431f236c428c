"""The DELTA(b) paths of :class:`~.plan.CudaSpmmPlan` (a mixin): the variant chosen per plan and
the product's launch. The gaps are bit-packed into uint32 words once per pattern by
``_build.BuildMixin._build_delta``; the kernels are in ``kernels/fast.cu`` (``delta_b<b>``,
``delta2_b<b>``: b a compile-time constant) and ``kernels/spmv.cu`` (``delta_rows`` /
``delta_lanes``: b a run-time argument, 64-bit offsets); for one right-hand side, the "chunk"
kernels of ``kernels/delta.cu`` (``delta_c<U>_b<b>``: units of U entries per lane, X in shared
memory as float, eight 4-bit gaps summed with one multiply); for DELTA(4) in the half types, the
"tile" kernels (``delta_t_b4*``: consecutive lanes take consecutive entries of a row's tiles of 256,
the gaps re-packed per tile by :meth:`DeltaMixin._tile_layout`); for DELTA(4) in the half types with
X in shared memory, the "tc" kernels (``delta_tc<U>_b4``, session 10: the chunk layout with X as 16-bit
values and the products on the tensor cores), and session 11's "tc8p*" (tc8 launched with programmatic
dependent launch) and "tq*" kernels (a cp.async ring); "tc8pk" (tc8p in one block of 1024 threads per SM)
is the default there."""

from __future__ import annotations

import threading

import torch

from sparsetorch import InputError

from .launch import allow_pdl, kernel, resident_blocks
from .layout import BLOCK, DELTA_SMEM_BLOCK, DELTA_SMEM_BYTES, DELTA_VARIANTS, ROW_KERNEL_BLOCK, _sm_count

__all__ = ["DeltaMixin", "UB_VARIANTS", "unit_bases", "delta_half_default", "DELTA_HALF_SPARSE", "DELTA_HALF_SPLIT",
           "CHUNK_VARIANTS", "TILE_VARIANTS", "TC_VARIANTS", "TQ_VARIANTS", "DELTA_PLAN_DEFAULT", "DELTA_HALF_DEFAULT",
           "tile_layout"]

#: the "chunk" kernels (kernels/delta.cu, k = 1 only; k > 1 runs "packed"): "chunk" takes units of
#: 8 entries per lane, "chunk8" / "chunk16" fix the unit;
#: "_pf": with L2 prefetches of the step after next; "chunk8_o3": units of 8 compiled for three blocks
#: per SM (b = 4, X in shared memory, not float64; otherwise it runs as "chunk8")
CHUNK_VARIANTS = ("chunk", "chunk8", "chunk16", "chunk_pf", "chunk8_pf", "chunk16_pf", "chunk8_o3")
#: the "tile" kernels (kernels/delta.cu, session 9; DELTA(4), float16 / bfloat16, k = 1, X in shared
#: memory, n * 2 (tile, tile_p1) or n * 4 (tile_f) bytes <= 48 KB; otherwise the plan runs "chunk"):
#: "tile" X as 16-bit values, two tiles' loads in flight; "tile_f" X as float; "tile_p1" one tile in flight.
#: Measured slower than "chunk" on the H200 (8192^2 fp16, 50 %: 40.1-45.0 us against 31.4; 10 %: 13.5-16.8
#: against 11.3; results/cuda_delta_h200_s9.json), so never a default
TILE_VARIANTS = ("tile", "tile_f", "tile_p1")
#: the "tc" kernels (kernels/delta.cu, session 10; DELTA(4), float16 / bfloat16, k = 1, X as 16-bit values in
#: shared memory, (n + 2 * TC_PAD) * 2 bytes <= 48 KB; otherwise the plan runs "chunk"): the chunk kernel's
#: layout (units of U entries per lane, no plan-side buffer), the products on the tensor cores; "tc" takes
#: units of :data:`TC_UNIT`, "tc8" / "tc16" fix the unit. Measured on the H200 (results/cuda_delta_h200_s10*.json,
#: 8192^2): as fast as "chunk" within noise (fp16 50 %: 31.2 us against 31.3-31.8; 10 %: 11.1-11.2 against 11.3),
#: with half its shared memory; "tc16" 32.4 us at 50 %
TC_VARIANTS = ("tc", "tc8", "tc16")
#: session 11 (kernels/delta.cu, DELTA(4), float16 / bfloat16, k = 1, same conditions as "tc", else "chunk"):
#: "tc8p" is tc8 launched with programmatic dependent launch (launch.allow_pdl: the row pointers read before
#: griddepcontrol.wait, the values, X and Y after it); the "tq" kernels take tc8's work per step but bring the
#: units' values and gap words through a ring of S stages in shared memory filled by cp.async (S - 1 steps in
#: flight, across rows): "tq<S>", "tq<S>p" (with PDL), "tq<S>p3" (three blocks per SM, 40 registers); "tc8pf" is
#: tc8p with L2 prefetches of the warp's first step and of X before the wait, "tc8pk" tc8p in one block of 1024
#: threads per SM, "tc8p5" in five blocks of 256 per SM (47 registers: 40 warps per SM against 32).
#: Measured (session 11, H200, 8192^2, one right-hand side, kernel time in a CUDA graph of 20 calls, two rounds;
#: results/cuda_delta_h200_s11d*.json), fp16 50 % / 10 % / 30 %: tc 30.9 / 11.2 / 20.7 us, tc8p 30.0 / 10.4 / 20.0,
#: tc8pf 29.5 / 10.5 / 19.7, tc8pk 29.7 / 10.2 / 19.7, tc8p5 36.8 / 12.2 / 24.6, tq4p 34.5 / 12.6 / 23.3 (bf16 alike;
#: run 1: tq3 / tq4 / tq3p / tq6p 34.5-35.6 us at 50 %, tq4p3 42.6). The ring issues ~29 % more instructions
#: (Nsight Compute, 50 %: 20.8M against tc8's 16.2M) and cuts the long-scoreboard stalls (2.02 -> 0.82 per
#: issue), but tc8's first stall is short-scoreboard (the X gathers in shared memory, 4.2 per issue), so more
#: bytes in flight do not pay; PDL saves ~0.8 us per call (the launch gap and the row-pointer reads overlap the
#: kernel before).
#: Session 12 (results/cuda_delta_h200_s12d.json, same conditions, fp16 / bf16, 10 % / 30 % / 50 %): "tc16pk" (units of
#: 16, half a row's sequential steps) 10.7 / 20.1 / 31.3 us against tc8pk's 10.4 / 20.1 / 30.2, so at 10 % the time
#: is not the chain of a warp's ~6 load latencies; "tc8pkf" / "tc16pkf" (L2 prefetches before the wait) 10.4 / 19.9 /
#: 29.8 and 10.7 / 20.0 / 30.9 (within 1.3 % of tc8pk: not the default). GEMV 38.1-38.3 fp16, 34.0-34.4 bf16.
#: Session 13 (results/cuda_delta_h200_s13a-c.json): tc8pk with each lane's gathers rotated by lane / 4 entries, so that
#: lanes four apart (columns ~one bank period apart) read other banks, was slower (50 % 33.9 us against 30.1, 10 %
#: 11.4 against 10.4: the kernel is bound by instruction issue and memory latency, not by the bank conflicts): removed.
#: "tc8pkb" is tc8pk with each unit's base column read from a plan-side array (:func:`unit_bases`, int16, 2 bytes per
#: unit of 8 entries) instead of a warp scan per step; "tc8pkbf" is tc8pkb with L2 prefetches of the step after next
#: (kernels/delta.cu tc_prefetch; on tc8pk they made it slower: 50 % 31.1 against 29.6 us; three steps ahead on tc8pkb
#: 30.2 against 29.3; units of 16 reading every other base, with or without them: 30.0 / 32.0 against 29.3; tc8pkb in
#: five blocks of 256 per SM: 35.0, 11.1 at 10 % against 9.0; with session 12's prefetches before the wait: 30.0 / 9.0;
#: removed, results/cuda_delta_h200_s13e/f.json). Session 14: tc8pkb with 2, 3 or 4 steps held in registers ahead
#: (a loader walking the warp's step stream across rows; "tc8pkb2f" with an L2 prefetch one step further) passed
#: test_cuda_delta.py on the H200 (48 passed, results/pytest_h200_s14c_delta.txt) and was slower, warm and cold: fp16
#: 50 % 30.3 / 29.5 / 30.8 / 31.6 us against tc8pkbf 29.1-29.4; 10 % cold 11.0 / 11.7 / 11.5 / 12.7 against tc8pkb 10.7
#: (results/cuda_delta_h200_s14a.json, _s14c_cold.json): bytes in flight are not what limits it; removed.
#: Session 14 -> 15: "tc8pkbr" / "tc8pkbfr", tc8pkb / tc8pkbf with a warp's first 32 rows' pointers read once (before
#: griddepcontrol.wait) and passed by shuffles (kernels/delta.cu RP), GPU-tested in session 15 (46 passed,
#: results/pytest_h200_s15a_delta_rp.txt) and a little faster in both of that session's device calls, warm and cold
#: (results/cuda_delta_h200_s15a_*.json, _s15b_*.json; 8192^2, fp16 / bf16): 10 % cold 10.3 / 10.3 us against tc8pkb's
#: 10.5 / 10.5, warm equal (8.9-9.0); 50 % cold 28.7 / 28.7 against tc8pkbf's 29.0 / 29.0, warm 28.6 against 28.8: the
#: defaults from session 15. Tried in session 15 and removed: the warp's first rows (values, gap words, bases; up to
#: 8 or 16 KB a warp) asked of L2 by prefetch.global.L2 before the wait ("tc8pkbrp" / "tc8pkbrp4" / "tc8pkbfrp"), so
#: that a weight read cold streams in during the launch, the wait and the X copy: slower everywhere (10 % cold 12.0
#: against 10.3 us, warm 9.9 against 8.9; 50 % 31.2 against 28.7; results/cuda_delta_h200_s15b_*.json).
#: Session 16, tried and removed (commits 0aed253..dddf5ce hold them): the units fed from shared memory by the copy
#: engine (sm_90 bulk copies, cp.async.bulk with mbarrier completion, issued right after griddepcontrol.wait): "tc8s",
#: tc8pkbr with each warp's first rows staged whole (every byte of a warp in flight at once; at 10 % a warp's ~2 rows
#: fit its 6.5 KB share) and "tc8sr", every row through a two-buffer ring per warp (chunks of up to 4 steps). Correct
#: (test_cuda_delta.py, 364 passed, results/pytest_h200_s16a.txt) and slower everywhere (results/cuda_delta_h200_s16a_
#: cold/warm.json, 8192^2, fp16 / bf16 alike): 10 % cold 14.9 / 13.9 us against tc8pkbr's 10.3, warm 12.5 / 12.4
#: against 9.0; 30 % 21.0-21.3 / 23.7-24.3 against 18.5-19.0; 50 % 32.5 / 33.1-33.3 against 28.5-28.7. With the loads
#: gone from the loop the work per entry is what is left, and it is not faster: the kernel is bound by its
#: instructions and shared-memory gathers, not by global-memory latency (as sessions 11-15 found for the other
#: prefetching designs).
#: name -> (kernel, stages (0: no ring), blocks per SM, launched with PDL, threads per block)
TQ_KERNELS = {"tc8p": ("delta_tc8p_b4", 0, 2, True, 512), "tc8pf": ("delta_tc8pf_b4", 0, 2, True, 512),
              "tc8pk": ("delta_tc8pk_b4", 0, 1, True, 1024), "tc8p5": ("delta_tc8p5_b4", 0, 5, True, 256),
              "tc16pk": ("delta_tc16pk_b4", 0, 1, True, 1024), "tc8pkf": ("delta_tc8pkf_b4", 0, 1, True, 1024),
              "tc16pkf": ("delta_tc16pkf_b4", 0, 1, True, 1024),
              "tc8pkb": ("delta_tc8pkb_b4", 0, 1, True, 1024), "tc8pkbf": ("delta_tc8pkbf_b4", 0, 1, True, 1024),
              "tc8pkbr": ("delta_tc8pkbr_b4", 0, 1, True, 1024), "tc8pkbfr": ("delta_tc8pkbfr_b4", 0, 1, True, 1024),
              "tq3": ("delta_tq3_b4", 3, 2, False, 512), "tq4": ("delta_tq4_b4", 4, 2, False, 512),
              "tq3p": ("delta_tq3p_b4", 3, 2, True, 512), "tq4p": ("delta_tq4p_b4", 4, 2, True, 512),
              "tq6p": ("delta_tq6p_b4", 6, 2, True, 512), "tq4p3": ("delta_tq4p3_b4", 4, 3, True, 512)}
TQ_VARIANTS = tuple(TQ_KERNELS)
_UB_LOCK = threading.Lock()
#: the variants that read :func:`unit_bases`
UB_VARIANTS = ("tc8pkb", "tc8pkbf", "tc8pkbr", "tc8pkbfr")
#: bytes per warp and stage of the tq ring (kernels/delta.cu TQ_STAGE: 32 units' values and gap words)
TQ_STAGE = 640
#: shared memory a block may take with the opt-in (sm_80 and later: 163 KB on the A100; 227 KB on Hopper)
TQ_MAX_SMEM = 160 * 1024
#: zero entries either side of X in shared memory (kernels/delta.cu TC_PAD: at least twice the unit)
TC_PAD = 32
#: the unit of the "tc" variant
TC_UNIT = 8
#: entries per tile (kernels/delta.cu: 8 steps of 32 lanes)
TILE = 256
#: the default DELTA variant of a plan whose offsets fit 32 bits
DELTA_PLAN_DEFAULT = "chunk"
#: the default of such a plan for DELTA(4) in float16 / bfloat16 when X fits shared memory as 16-bit values
#: (:func:`delta_half_default`): DELTA_HALF_SPARSE below a stored density (nnz / (m n)) of DELTA_HALF_SPLIT,
#: DELTA_HALF_DEFAULT from there. Session 13 (results/cuda_delta_h200_s13b/c.json, H200, 8192^2, CUDA graph of 20
#: calls, fp16): 10 % tc8pkb 9.0 us, tc8pkbf 9.5, tc8pk 10.2; 30 % tc8pkbf 18.4, tc8pkb 19.2, tc8pk 19.6; 50 %
#: tc8pkbf 28.8, tc8pk 29.6, tc8pkb 30.3 (bf16 alike). "tc8pk" was the default from session 11 to 12, "tc" before.
DELTA_HALF_SPLIT = 0.2
DELTA_HALF_SPARSE = "tc8pkbr"
DELTA_HALF_DEFAULT = "tc8pkbfr"
#: threads per block of the chunk kernels (kernels/delta.cu DELTA_CHUNK_BLOCK) and the pads of X
CHUNK_BLOCK = 512
CHUNK_PAD = 16


class DeltaMixin:
    """DELTA(b) variant choice and launch (mixed into CudaSpmmPlan, which provides the pattern:
    ``rowptr``, ``words``, ``bits``, ``nnz``, ``idx``, ``shape``, ``dtype``, ``dev_index``)."""

    def _init_delta(self, variant: str | None) -> None:
        self.variant = variant or (DELTA_PLAN_DEFAULT if self.small else "groups")
        if variant is None and self._tc_ok():
            self.variant = delta_half_default(self.nnz, *self.shape)
        every = DELTA_VARIANTS + CHUNK_VARIANTS + TILE_VARIANTS + TC_VARIANTS + TQ_VARIANTS
        if self.variant not in every:
            raise InputError(f"{self.backend}: DELTA variant must be one of {every}, got {variant!r}")
        self.tiles: dict[str, torch.Tensor | int] | None = None
        #: UB_VARIANTS: built once (:meth:`_unit_bases`; here for the default, outside any CUDA-graph capture, else on
        #: the first launch that needs it), never replaced (a recorded launch holds its address)
        self.ubase: torch.Tensor | None = None
        if self.variant in UB_VARIANTS and self._tc_ok():
            self._unit_bases()
        if self.variant in TILE_VARIANTS and self._tile_ok():
            self.tiles = tile_layout(self.rowptr, self.words, self.nnz, self.shape[0], self._tile_warps())

    def _unit_bases(self) -> torch.Tensor:
        """The plan's :func:`unit_bases`, built once under a lock (two threads' first calls build it once)."""
        ub = self.ubase
        if ub is None:
            with _UB_LOCK:
                if self.ubase is None:
                    self.ubase = unit_bases(self.rowptr, self.words, self.nnz, self.shape[0])
                ub = self.ubase
        return ub

    def _tile_ok(self) -> bool:
        """Whether the tile kernels apply to this plan (the host checks n's bytes again per launch)."""
        m, n = self.shape
        xb = 4 if self.variant == "tile_f" else 2
        return (self.bits == 4 and self.dtype in (torch.float16, torch.bfloat16) and self.small
                and -(-n * xb // 16) * 16 <= DELTA_SMEM_BYTES and (n + TILE) * xb + 4096 < 2**16)

    def _tc_ok(self) -> bool:
        """Whether the tc kernels apply to this plan (DELTA(4), half types, 32-bit offsets, X fits shared memory)."""
        n = self.shape[1]
        return (self.bits == 4 and self.dtype in (torch.float16, torch.bfloat16) and self.small
                and -(-(n + 2 * TC_PAD) * 2 // 16) * 16 <= DELTA_SMEM_BYTES)

    def _tq_smem(self) -> int:
        """Dynamic shared memory of this plan's tc8p / tq kernel: X as 16-bit values with its pads, then the ring."""
        xb = -(-(self.shape[1] + 2 * TC_PAD) * 2 // 16) * 16
        return xb + (TQ_KERNELS[self.variant][4] // 32) * TQ_KERNELS[self.variant][1] * TQ_STAGE

    def _tile_grid(self) -> int:
        return max(1, min(-(-self.shape[0] // (CHUNK_BLOCK // 32)), 2 * _sm_count(self.dev_index)))

    def _tile_warps(self) -> int:
        return self._tile_grid() * (CHUNK_BLOCK // 32)

    def _chunk_unit(self) -> int:
        """Entries per lane of the chunk kernel this plan runs."""
        if self.variant.startswith("chunk8"):
            return 8
        if self.variant.startswith("chunk16"):
            return 16
        return 8  # measured: 8 is faster than 16 for the half types at 50 % and 10 % (results/cuda_delta_h200_s8_delta.json)

    def _launch_delta(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, fits: bool) -> None:
        """``y = A x`` for DELTA(b); ``fits``: the 32-bit kernels apply (nnz, m * k, n * k < 2^31 - 1024)."""
        m, n = self.shape
        dev = self.dev_index
        variant = self.variant
        if variant in TQ_VARIANTS:
            if fits and k == 1 and self._tc_ok():
                # DELTA(4), half types (session 11): tc8 with PDL, or the values and gaps through a cp.async ring
                name, stages, per_sm, pdl, threads = TQ_KERNELS[variant]
                extra: tuple[int, ...] = ()
                if variant in UB_VARIANTS:
                    extra = (self._unit_bases().data_ptr(),)
                kern = kernel("delta", name, self.dtype, self.idx, dev, 8 + len(extra))
                if pdl:
                    allow_pdl(kern, dev)  # this call (the recording) launches without it; the plan's replays with it
                smem = self._tq_smem()
                if smem > 48 * 1024:
                    from ._mma import _allow_smem  # noqa: PLC0415

                    _allow_smem(kern, dev, smem)
                sms = _sm_count(dev)
                per = resident_blocks(kern, threads, smem, 1, sms, per_sm * sms) if stages else per_sm * sms
                grid = max(1, min(-(-m // (threads // 32)), per_sm * sms, per))
                kern((grid, 1), threads,
                     (m, n, self.nnz, self.rowptr.data_ptr(), self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr(),
                      *extra), shared=smem, device=dev)
                return
            variant = "chunk"
        if variant in TC_VARIANTS:
            if fits and k == 1 and self._tc_ok():
                # DELTA(4), half types: X as 16-bit values in shared memory, products on the tensor cores
                unit = 16 if variant == "tc16" else (8 if variant == "tc8" else TC_UNIT)
                kern = kernel("delta", f"delta_tc{unit}_b4", self.dtype, self.idx, dev, 8)
                grid = max(1, min(-(-m // (CHUNK_BLOCK // 32)), 2 * _sm_count(dev)))
                kern((grid, 1), CHUNK_BLOCK,
                     (m, n, self.nnz, self.rowptr.data_ptr(), self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                     shared=-(-(n + 2 * TC_PAD) * 2 // 16) * 16, device=dev)
                return
            variant = "chunk"  # other b, dtypes, sizes, or k > 1 ("packed" below)
        if self.tiles is not None and fits and k == 1:
            # DELTA(4), half types: consecutive lanes on consecutive entries of a row's tiles
            t = self.tiles
            xb = 4 if variant == "tile_f" else 2
            name = {"tile": "delta_t_b4", "tile_f": "delta_t_b4_f", "tile_p1": "delta_t_b4_p1"}[variant]
            kern = kernel("delta", name, self.dtype, self.idx, dev, 10)
            assert isinstance(t["tileptr"], torch.Tensor) and isinstance(t["toff"], torch.Tensor)
            assert isinstance(t["wrow"], torch.Tensor) and isinstance(t["words"], torch.Tensor)
            kern((self._tile_grid(), 1), CHUNK_BLOCK,
                 (m, n, int(t["warps"]), t["tileptr"].data_ptr(), t["toff"].data_ptr(), t["wrow"].data_ptr(),
                  t["words"].data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                 shared=-(-n * xb // 16) * 16, device=dev)
            return
        if variant in TILE_VARIANTS:
            variant = "chunk"  # no tile layout (other b, dtypes, sizes) or k > 1 ("packed" below)
        if variant in CHUNK_VARIANTS and fits and k == 1:
            # one right-hand side: units of U entries per lane, X in shared memory as acc_t when it fits
            unit = self._chunk_unit()
            acc = 8 if self.dtype == torch.float64 else 4
            smem = (n + 2 * CHUNK_PAD) * acc
            name = f"delta_c{unit}_b{self.bits}" + ("_smem" if smem <= DELTA_SMEM_BYTES else "") + ("_pf" if variant.endswith("_pf") else "")
            per_sm = 1 if (self.dtype == torch.float64 and unit == 16) else 2
            if variant == "chunk8_o3" and name == "delta_c8_b4_smem" and self.dtype != torch.float64:
                name, per_sm = name + "_o3", 3
            kern = kernel("delta", name, self.dtype, self.idx, dev, 8)
            grid = max(1, min(-(-m // (CHUNK_BLOCK // 32)), per_sm * _sm_count(dev)))
            kern((grid, 1), CHUNK_BLOCK,
                 (m, n, self.nnz, self.rowptr.data_ptr(), self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                 shared=smem if smem <= DELTA_SMEM_BYTES else 0, device=dev)
            return
        if variant in CHUNK_VARIANTS:
            variant = "packed"  # k > 1 (or offsets past 32 bits: then "groups" below)
        if variant in ("packed", "packed2") and fits:
            # bit-packed DELTA, b a compile-time constant; X in shared memory (8-entry pads) when it fits
            smem = (n + 16) * k * x.element_size()
            name = ("delta2_b" if variant == "packed2" else "delta_b") + str(self.bits)
            if smem <= DELTA_SMEM_BYTES:
                name += "_smem"
            kern = kernel("fast", name, self.dtype, self.idx, dev, 9)
            wpb = ROW_KERNEL_BLOCK // 32
            grid = -(-m // wpb) if variant == "packed2" else min(-(-m // wpb), 4 * _sm_count(dev))  # packed: row loop
            kern((grid, 1), ROW_KERNEL_BLOCK,
                 (m, n, k, self.nnz, self.rowptr.data_ptr(), self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                 shared=smem if smem <= DELTA_SMEM_BYTES else 0, device=dev)
            return
        # spmv.cu's kernels: X in shared memory when it fits (the gathers then stay on the SM)
        xbytes = n * k * x.element_size()
        smem = xbytes <= DELTA_SMEM_BYTES
        name = ("delta_lanes" if variant == "lanes" else "delta_rows") + ("_smem" if smem else "")
        block = DELTA_SMEM_BLOCK if smem else BLOCK
        kern = kernel("spmv", name, self.dtype, self.idx, dev, 10)
        kern((-(-m * 32 // block), 1), block, (m, n, k, self.nnz, self.bits, self.rowptr.data_ptr(), self.words.data_ptr(),
                                               v.data_ptr(), x.data_ptr(), y.data_ptr()),
             shared=xbytes if smem else 0, device=dev)


def tile_layout(rowptr: torch.Tensor, words: torch.Tensor, nnz: int, m: int, warps: int) -> dict[str, torch.Tensor | int]:
    """The tile kernels' index buffers (kernels/delta.cu, "tile"), built from a DELTA(4) plan's
    validated ``rowptr`` and bit-packed ``words`` (entry e's gap: bits 4 (e % 8) of word e // 8):
    each row's entries cut into tiles of :data:`TILE` (the last one of a row partial), rows in
    order. ``tileptr`` (m + 1): row r's tiles; ``toff`` (tiles + 1): each tile's first entry, then
    nnz; ``words``: 32 per tile, word 32 t + L holding the gaps of the tile's entries 32 j + L
    (j < 4 at bits 8 j, j >= 4 at bits 8 (j - 4) + 4; zero past the tile's end), four spare words;
    ``wrow`` (warps + 1): contiguous row ranges per warp, balanced by tiles. All int32."""
    dev = rowptr.device
    i64 = torch.int64
    r64 = rowptr.to(i64)
    cnt = r64[1:] - r64[:-1]
    per_row = (cnt + TILE - 1) // TILE
    tileptr = torch.zeros(m + 1, dtype=i64, device=dev)
    tileptr[1:] = torch.cumsum(per_row, 0)
    ntiles = int(tileptr[-1]) if m else 0
    trow = torch.repeat_interleave(torch.arange(m, device=dev), per_row)
    toff = torch.empty(ntiles + 1, dtype=i64, device=dev)
    toff[:ntiles] = r64[trow] + TILE * (torch.arange(ntiles, device=dev) - tileptr[trow])
    toff[ntiles] = nnz
    tw = torch.zeros(32 * ntiles + 4, dtype=i64, device=dev)
    if nnz:
        nw = -(-nnz // 8)
        w = words[:nw].to(i64) & 0xFFFFFFFF
        gaps = ((w.unsqueeze(1) >> (4 * torch.arange(8, device=dev))) & 15).reshape(-1)[:nnz]
        erow = torch.repeat_interleave(torch.arange(m, device=dev), cnt)
        q = torch.arange(nnz, device=dev) - r64[erow]
        t = tileptr[erow] + q // TILE
        qq = q % TILE
        j, lane = qq // 32, qq % 32
        shift = torch.where(j < 4, 8 * j, 8 * (j - 4) + 4)
        tw.index_add_(0, 32 * t + lane, gaps << shift)  # distinct nibbles of a word: the sum is their OR
        del w, gaps, erow, q, t, qq, j, lane, shift
    tw = torch.where(tw >= 2**31, tw - 2**32, tw).to(torch.int32)
    targets = torch.div(torch.arange(warps + 1, device=dev, dtype=i64) * ntiles, warps, rounding_mode="floor")
    wrow = torch.searchsorted(tileptr, targets, side="left").clamp_(0, m)
    wrow[0], wrow[-1] = 0, m
    return {"tileptr": tileptr.to(torch.int32).contiguous(), "toff": toff.to(torch.int32).contiguous(),
            "words": tw.contiguous(), "wrow": wrow.to(torch.int32).contiguous(), "warps": warps, "tiles": ntiles}


def delta_half_default(nnz: int, m: int, n: int) -> str:
    """The default variant of a DELTA(4) half-precision plan with ``nnz`` stored entries (padding included) in
    an ``m`` x ``n`` matrix, where the tc kernels apply (:data:`DELTA_HALF_SPLIT`)."""
    return DELTA_HALF_SPARSE if nnz < DELTA_HALF_SPLIT * m * n else DELTA_HALF_DEFAULT


def unit_bases(rowptr: torch.Tensor, words: torch.Tensor, nnz: int, m: int) -> torch.Tensor:
    """The "tc8pkb" kernel's unit bases (kernels/delta.cu), built from a DELTA(4) plan's validated ``rowptr``
    and bit-packed ``words`` (entry e's gap: bits 4 (e % 8) of word e // 8): for each unit u of 8 entries
    (entries 8 u .. 8 u + 7 of the stream), the column of entry 8 u - 1 when it lies in the same row as entry
    8 u, else -1 (entry 8 u starts its row); int16 (the tc kernels take n below 2^15), one spare element."""
    dev = rowptr.device
    i64 = torch.int64
    units = -(-nnz // 8)
    out = torch.full((units + 1,), -1, dtype=torch.int16, device=dev)
    if not nnz:
        return out
    r64 = rowptr.to(i64)
    w = words[:units].to(i64) & 0xFFFFFFFF
    gaps = ((w.unsqueeze(1) >> (4 * torch.arange(8, device=dev))) & 15).reshape(-1)[:nnz]
    csum = torch.zeros(nnz + 1, dtype=i64, device=dev)
    csum[1:] = torch.cumsum(gaps + 1, 0)
    e0 = torch.arange(units, device=dev, dtype=i64) * 8
    row = torch.searchsorted(r64[1:].contiguous(), e0, right=True)  # the row holding entry e0
    start = r64[row]
    col_before = csum[e0] - csum[start] - 1  # column of entry e0 - 1 counted in e0's row (-1 at its start)
    if int(col_before.max()) >= 2**15:
        raise InputError(f"unit_bases: columns up to {int(col_before.max())} do not fit int16 (the tc kernels take n < 2^15)")
    out[:units] = col_before.to(torch.int16)
    return out
