"""The DELTA(b) paths of :class:`~.plan.CudaSpmmPlan` (a mixin): the variant chosen per plan and
the product's launch. The gaps are bit-packed into uint32 words once per pattern by
``_build.BuildMixin._build_delta``; the kernels are in ``kernels/fast.cu`` (``delta_b<b>``,
``delta2_b<b>``: b a compile-time constant) and ``kernels/spmv.cu`` (``delta_rows`` /
``delta_lanes``: b a run-time argument, 64-bit offsets); for one right-hand side, the "chunk"
kernels of ``kernels/delta.cu`` (``delta_c<U>_b<b>``: units of U entries per lane, X in shared
memory as float, eight 4-bit gaps summed with one multiply)."""

from __future__ import annotations

import torch

from sparsetorch import InputError

from .launch import kernel
from .layout import BLOCK, DELTA_SMEM_BLOCK, DELTA_SMEM_BYTES, DELTA_VARIANTS, ROW_KERNEL_BLOCK, _sm_count

__all__ = ["DeltaMixin", "CHUNK_VARIANTS", "DELTA_PLAN_DEFAULT"]

#: the "chunk" kernels (kernels/delta.cu, k = 1 only; k > 1 runs "packed"): "chunk" takes units of
#: 8 entries per lane, "chunk8" / "chunk16" fix the unit;
#: "_pf": with L2 prefetches of the step after next; "chunk8_o3": units of 8 compiled for three blocks
#: per SM (b = 4, X in shared memory, not float64; otherwise it runs as "chunk8")
CHUNK_VARIANTS = ("chunk", "chunk8", "chunk16", "chunk_pf", "chunk8_pf", "chunk16_pf", "chunk8_o3")
#: the default DELTA variant of a plan whose offsets fit 32 bits
DELTA_PLAN_DEFAULT = "chunk"
#: threads per block of the chunk kernels (kernels/delta.cu DELTA_CHUNK_BLOCK) and the pads of X
CHUNK_BLOCK = 512
CHUNK_PAD = 16


class DeltaMixin:
    """DELTA(b) variant choice and launch (mixed into CudaSpmmPlan, which provides the pattern:
    ``rowptr``, ``words``, ``bits``, ``nnz``, ``idx``, ``shape``, ``dtype``, ``dev_index``)."""

    def _init_delta(self, variant: str | None) -> None:
        self.variant = variant or (DELTA_PLAN_DEFAULT if self.small else "groups")
        if self.variant not in DELTA_VARIANTS + CHUNK_VARIANTS:
            raise InputError(f"{self.backend}: DELTA variant must be one of {DELTA_VARIANTS + CHUNK_VARIANTS}, got {variant!r}")

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
