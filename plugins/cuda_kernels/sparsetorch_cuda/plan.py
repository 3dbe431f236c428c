"""The product plan: ``Y = A X`` / ``Y = A^H X`` and the SDDMM of its backward, on this backend's
kernels.

Pattern work (``__init__``, once per sparsity pattern; may synchronize with the host):

- **CSR** (and any format without a kernel of its own: COO, CSC, BSR, DIA_J, N:M, ... go
  through a CSR made once from the pattern's entries, after which new values cost one gather):
  row pointers and columns validated (monotone from 0 to nnz, columns in range); the vector
  kernel's lanes per row from the mean row length; for the load-balanced variant, the first row
  of every warp's chunk of nonzeros.
- **DIA** (diagonals indexed by row): the offsets, validated, as int64 on the device.
- **ELL**: every row's slot range checked to be ``[r * width, r * width + count)``; counts as int32.
- **DELTA(b)** with b in {1, 2, 4, 8, 16}: gaps checked to fit b bits and to decode to columns
  inside the matrix, then **bit-packed** into uint32 words (b bits per gap instead of one
  index-dtype word): done once here, so the tensor's own storage stays as it is.

The adjoint direction uses the transposed CSR of the pattern (made on first use), its values a
gather of A's per value set. Values are used where they lie (no copy) when the format has its own
kernel; a call with the same values tensor (same storage and version) as the previous one skips
even the gather.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sparsetorch import InputError, SparseTensor

from ._build import BuildMixin
from ._delta import DeltaMixin
from ._mma import MmaMixin
from ._spmm_bm import BmMixin
from ._spmm_pb import PbMixin
from ._spmm_sp import SpMixin
from .launch import Bound, Prepared, PreparedSeq, allow_pdl, kernel, recording
from .layout import _check_rowptr  # noqa: F401 - re-exported (tests import it from here)
from .layout import (BLOCK, CHUNK, COLS_KERNEL_FROM, CSR16_MIN_MEAN, CSR_VARIANTS, DIA_BLOCK, DIA_DEFAULT, DIA_DEFAULT_FEW, DIA_VARIANTS, DTYPES,
                     INT_LIMIT, MMA_MIN_K, MMA_ROWS, NM_BLOCK, NM_DEFAULT, NM_VARIANTS, ROW_KERNEL_BLOCK, SELL_C,
                     SELL_SIGMA, _GRID_Y, _index_dtype, _sm_count, _vec_for, bsr_params, delta_bits,
                     native_kind, nm_params, sell_layout)

#: DIA variants of the "p" kernels besides layout.DIA_VARIANTS: values loaded with a 256-byte L2
#: prefetch hint ("p1pf"), and also without allocating in L1 ("p1na") (kernels/fast.cu)
DIA_EXTRA = ("p1pf", "p1na", "p1nb", "p1nc", "p1pd", "v2", "v2na", "v4na", "p1w", "p1wt", "p2w", "p1nbw", "q", "qw", "qwt", "qwe",
             "qwb")
_DIA_P8_NAMES = {"p1cs": "dia_p8cs_1", "p1pf": "dia_p8pf_1", "p1na": "dia_p8na_1", "p1nb": "dia_p8nb_1", "p1nc": "dia_p8nc_1",
                 "p1pd": "dia_p8pd_1", "p1w": "dia_p8w_1", "p1wt": "dia_p8wt_1", "p2w": "dia_p8w_2", "p1nbw": "dia_p8nbw_1"}
#: session 11 (kernels/fast.cu dia_p8w*, dia_q*): the DIA kernels that run griddepcontrol.wait before any read or
#: write, launched with programmatic dependent launch (launch.py) from their second launch on: "p1w" / "p2w" / "p1nbw"
#: are "p1" / "p2" / "p1nb" after the wait, "p1wt" also triggers its dependents after it; "q" (no wait) / "qw" /
#: "qwt" / "qwe" (values evict-first) / "qwb" (at most 128 registers): 16 / itemsize consecutive rows per thread,
#: 16-byte value, X and Y accesses, k = 1 with m a multiple of 16 / itemsize and 16-byte aligned values, X, Y
#: (else "p1" / "p1w", float64 "p1nb" / "p1nbw"); DIA_BLOCK_Q threads per block. Measured on the 114^3 stencil
#: (cuda_kernels_h200_s11f_dia.json): the "q" kernels are slower in float32 (graph 16.1-16.8 us, "qwe" 14.9;
#: back to back 16.2-16.6) and about even with "p1nbw" in float64 (27.5-28.3 graph, 27.7-27.9 back to back)
DIA_PDL = frozenset(("p1w", "p1wt", "p2w", "p1nbw", "qw", "qwt", "qwe", "qwb"))
DIA_Q = ("q", "qw", "qwt", "qwe", "qwb")
DIA_BLOCK_Q = 128
#: the float64 default for at most 8 diagonals: "p1nb", p1na's loads compiled for at most 40 registers (12 blocks
#: of 128 threads per SM instead of 10). 114^3 stencil on the H200, cuda_kernels_h200_run2_s8_spmv.json and
#: cuda_kernels_h200_s8_spmv.json: "p1nb" 27.99 / 27.95 us against "p1na"'s 30.73 / 30.63, "p1nc" (32 registers)
#: 28.55 / 28.68, "p1" 30.97 / 30.79 (session 7b: "p1na" 30.0 / 30.4, "p1pf" 33.4 / 34.0). In float32 the "na"
#: kernels are slower (20.3-20.7 against "p1"'s 14.6-15.0): float32 keeps layout.DIA_DEFAULT_FEW
#: Session 11: "p1nbw" ("p1nb" after griddepcontrol.wait, launched with programmatic dependent launch;
#: cuda_kernels_h200_s11f_dia.json, two rounds: Matmul.execute back to back 27.50 / 27.54 us against "p1nb"'s
#: 29.00 / 28.54, CUDA graph 27.66 / 27.47 against 28.00 / 27.78)
DIA_DEFAULT_FEW_F64 = "p1nbw"
#: threads per block of "p1na" (same stencil, two runs: 128 threads 29.99 / 30.09 us, 256 threads 30.01 / 30.41;
#: cuda_kernels_h200_s7b_run1.json, cuda_kernels_h200_s7b.json); the other "p" kernels take layout.DIA_BLOCK
DIA_BLOCK_NA = 128
#: threads per block of fast.cu's csr_stream / ell_stream kernels (CSR_STREAM_BLOCK there)
CSR_STREAM_BLOCK = 256
#: DIA "v2" / "v2na" (kernels/fast.cu dia_v2_1, dia_v2na_1): two consecutive rows per thread, each diagonal's two
#: values one 8- / 16-byte load ("v2na": with p1na's L1::no_allocate + L2::256B hints; "v4na": four rows, two
#: such loads per diagonal); they need m even and the values and Y 16-byte aligned, and run as "p1na" (float64) /
#: "p1" otherwise. Slower on the stencil (float64 v2na 33.9-34.3 us, v4na 39.0; cuda_kernels_h200_run1_s8_spmv.json):
#: 72 / 178 registers, stride-2 X gathers. Threads per block:
DIA_BLOCK_V2 = 128
#: "p1nb" / "p1nc": "p1na" compiled for at most 40 / 32 registers (12 / 16 blocks of 128 threads per SM); "p1pd":
#: "p1na" plus an L2 prefetch of the values DIA_PREFETCH_ROWS rows ahead (kernels/fast.cu; slower: 35.2-35.8 us
#: at 2048, 8192 or 32768 rows ahead); all at 128 threads
DIA_PREFETCH_ROWS = 8192
#: ELL kernels (kernels/fast.cu, on the plan's int32 column copy with -1 in unused slots, when every slot, row
#: and column fits in 32 bits; "rows" is spmv.cu's ell_rows on the columns as stored, with the per-row counts):
#: "p" / "pcs" a thread per row, the width (<= 8) a compile-time constant, all loads before the FMAs ("pcs":
#: evict-first loads); "stream" / "streamcs" 32 rows per warp, the warp's slots in coalesced chunks, products
#: summed in shared memory ("streamcs": evict-first loads). A "p" variant on a width above 8 runs as "stream".
ELL_VARIANTS = ("rows", "p", "pcs", "stream", "streamcs")
#: float64 (and half) default: 114^3 stencil, three H200 runs (cuda_kernels_h200_run1_s8_spmv.json, ..._run2_...,
#: cuda_kernels_h200_s8_spmv.json): "p" 37.5-37.8 us, "streamcs" 41.1-41.7, "pcs" 52.1-52.4, "rows" on int64 columns
#: (what ran before) 67.7-68.8, on int32 47.5-48.3
ELL_DEFAULT = "p"
#: float32's default (same runs: "pcs" 21.5-21.7 us against "p"'s 24.2-24.5; in float64 "pcs" is the slower one)
ELL_DEFAULT_F32 = "pcs"

#: The dense route of the backward pass: for a product with at least DENSE_ROUTE_MIN_K columns (a layer's batch),
#: the values-gradient (:meth:`CudaSpmmPlan.sddmm`) is one dense ``P Q^T`` (cuBLAS; tensor cores for the half types,
#: float32 accumulation, each entry rounded to the values' dtype once, as a dense layer's weight gradient is) gathered
#: at the stored entries, and the adjoint product ``A^T X`` is A scattered into a dense (m, n) buffer times X (one
#: GEMM), where that buffer takes at most DENSE_ROUTE_BYTES and at least DENSE_ROUTE_DENSITY of it is stored (or the
#: format has no sddmm kernel of its own: N:M, BSR, generated). Session 15, H200, half-precision training steps of
#: 4096 x 4096 / 4096 -> 11008 layers at batch 64 (benchmarks/results/train_step_h200_s15*.json): the per-entry
#: sddmm kernels and gathers made a step of a 90 % pruned layer 5-9x and of a 2:4 one 46-180x a dense layer's step;
#: after the dense sddmm the transposed-CSR adjoint kernel (csr_cols) was 440 / 1470 us of the 2:4 steps' 1.1 / 2.7 ms.
DENSE_ROUTE = True
DENSE_ROUTE_MIN_K = 16
DENSE_ROUTE_BYTES = 256 * 2**20
DENSE_ROUTE_DENSITY = 0.01

__all__ = ["CudaSpmmPlan", "DTYPES", "delta_bits", "nm_params", "bsr_params", "native_kind", "sell_layout", "BLOCK"]


class CudaSpmmPlan(BuildMixin, MmaMixin, DeltaMixin, SpMixin, BmMixin, PbMixin):
    """Sparse @ dense on a fixed pattern with this backend's kernels; values by :meth:`set_values`.

    ``variant`` picks the CSR kernel: ``"streamcs"`` / ``"stream"`` (with / without the
    evict-first hint on the entries; ``"stream4"``, ``"stream16"``: chunks of 128 / 512) (32 rows per warp, the warp's nonzeros read
    in coalesced chunks; for short rows), ``"vector"`` (VEC lanes per row, VEC from the mean row
    length), ``"balanced"`` (equal nonzeros per warp, for skewed rows) or ``"sell"`` (a
    SELL-C-sigma copy of the pattern made once, see :func:`sell_layout`; its values are one
    gather per value set; not yet run on a GPU, never chosen by default); ``None`` chooses
    by the rows' lengths (see :func:`sparsetorch_cuda.cost.csr_variant`). For DIA: ``"p1"``,
    ``"p2"``, ``"p4"`` (at most 8 diagonals, offsets as kernel parameters, 1/2/4 rows per
    thread), ``"rows1"``, ``"rows2"`` (offsets staged in shared memory, any count of diagonals,
    in batches of 8) or ``"classic"`` (64-bit kernel of spmv.cu); a "p" variant on more than 8
    diagonals runs as rows1/rows2; the session-11 defaults for at most 8 diagonals, ``"p1w"`` (float32) and
    ``"p1nbw"`` (float64), run ``griddepcontrol.wait`` first and launch with programmatic dependent launch
    (:data:`DIA_PDL`). For DELTA: ``"tc8pkbr"`` / ``"tc8pkbfr"`` (the defaults for DELTA(4) in float16 / bfloat16 with
    one right-hand side and X in 48 KB of shared memory, below / from 20 % stored density,
    :func:`._delta.delta_half_default`: the chunk layout, products on the tensor cores, each unit's base column
    from the plan, a warp's first 32 rows' pointers read once, launched with programmatic dependent launch in one
    block of 1024 threads per SM; "tc8pkbfr" with L2 prefetches two steps ahead; "tc8pkb" / "tc8pkbf" read each
    row's pointers as they go; session 11's "tc8pk" computes the bases by a warp scan; also ``"tc"``,
    ``"tc8"``, ``"tc16"``: :data:`._delta.TC_VARIANTS`, and the other variants of :data:`._delta.TQ_VARIANTS`),
    ``"chunk"`` (the default for the other cases of one right-hand side, kernels/delta.cu; also
    ``"chunk8"``, ``"chunk16"``, the ``_pf`` prefetch and ``"chunk8_o3"`` variants:
    :data:`._delta.CHUNK_VARIANTS`), ``"packed2"`` / ``"packed"`` (b a compile-time
    constant, one gap load per 8 entries, two / one 8-entry groups per lane per step; ``"packed"``
    runs several right-hand sides), ``"groups"`` or ``"lanes"`` (spmv.cu's earlier kernels); all
    copy X into shared memory when it fits in 48 KB. For N:M 2:4 with one right-hand side: ``"warp"`` (a warp per row) or
    ``"s1"`` .. ``"s4"`` (blocks of 384 threads, that many warps share a row). Defaults:
    :data:`DIA_DEFAULT`, :data:`._delta.DELTA_PLAN_DEFAULT`, :data:`NM_DEFAULT` (the measured ones). DIA also takes
    ``"p1pf"``, ``"p1na"``, ``"v2"``, ``"v2na"`` (:data:`DIA_EXTRA`); ELL one of :data:`ELL_VARIANTS`
    (default :data:`ELL_DEFAULT` on the int32 column copy, ``"rows"`` where it does not fit).

    ``kernel="generated"`` runs a kernel generated from A's format (:mod:`.codegen`; kind
    "generated": the storage read as it is, no CSR copy, no value gather) instead of the CSR made
    from the pattern; ``variant`` is then "thread" / "warp" and ``autotune=True`` times them on
    the first call. ``kernel=None`` lets :func:`sparsetorch_cuda.cost.prefer_generated` decide for
    formats without a kernel of their own (the CSR path unless measured slower); "native" keeps
    the CSR path."""

    method = "spmm"
    preconditioner = None
    #: apply(X, bias=) adds a bias per output row (fused where the kernel can; SparseLinear passes it)
    accepts_bias = True

    def __init__(self, A: SparseTensor, *, backend: str = "cuda", variant: str | None = None, kernel: str | None = None,
                 autotune: bool = False) -> None:
        from .cost import csr_variant, prefer_generated  # noqa: PLC0415

        self.backend = backend
        fs = A.format_shape
        if len(fs) != 2 or A.format.num_batch_levels:
            raise InputError(f"{backend}: needs a matrix (2 format dimensions, no BATCH levels), got format {A.format}")
        if A.device.type != "cuda":
            raise InputError(f"{backend}: runs on CUDA tensors; A is on {A.device} (move it with .cuda())")
        if A.dtype not in DTYPES:
            raise InputError(f"{backend}: kernels exist for float16, bfloat16, float32, float64; A is {A.dtype}")
        self.shape = (int(fs[0]), int(fs[1]))
        self.device = A.device
        self.dev_index = A.device.index if A.device.index is not None else torch.cuda.current_device()
        self.dtype = A.dtype
        self.batch_shape = tuple(A.batch_shape)
        self.slots = int(A.values.shape[-1])
        self.kind = native_kind(A.format)
        if kernel not in (None, "native", "generated"):
            raise InputError(f"{backend}: kernel must be None (by the cost model), 'native' or 'generated', got {kernel!r}")
        if kernel == "generated" or (kernel is None and self.kind == "generic"
                                     and prefer_generated(A.format, self.shape, int(A.values.shape[-1]), dtype=A.dtype)):
            # a kernel generated from the format (codegen.py) instead of a CSR made from the pattern
            self.kind = "generated"
            self._gen_options = {"variant": variant, "autotune": autotune}
        self._source = A.detach()
        self._values: torch.Tensor | None = None
        self._values_t: torch.Tensor | None = None
        self._t: dict[str, Any] | None = None  # transposed CSR (adjoint), on first use
        #: dense-route sddmm: (row * n + column of every stored entry, its value slot or None where entry e is slot e)
        self._sddmm_lin: tuple | None = None
        self._dense_place: tuple | None = None  # where each value of the plan lies in a dense (m, n) buffer (dense route)
        self.gather: torch.Tensor | None = None  # generic: value slot of each CSR entry
        m, n = self.shape
        build = getattr(self, f"_build_{self.kind}")
        build(A)
        self.small = max(self.nnz, self.slots, m, n) < INT_LIMIT
        if self.kind in ("csr", "generic"):
            lengths = (self.rowptr[1:] - self.rowptr[:-1]) if m else self.rowptr[:0]
            self.max_row = int(lengths.max()) if m else 0
            self.variant = variant or csr_variant(m, self.nnz, self.max_row)
            if self.variant not in CSR_VARIANTS:
                raise InputError(f"{backend}: CSR variant must be one of {CSR_VARIANTS}, got {variant!r}")
            self.sell = None
            if self.variant == "sell":
                if not (self.small and n < INT_LIMIT):
                    raise InputError(f"{backend}: the SELL-C-sigma kernel needs fewer than {INT_LIMIT} entries, rows and columns")
                self.sell = sell_layout(self.rowptr, self.col, sigma=SELL_SIGMA)
            self.vec = _vec_for(self.nnz / max(m, 1))
            warps = max(1, math.ceil(self.nnz / CHUNK))
            starts = torch.arange(warps, device=self.device, dtype=torch.int64) * CHUNK
            self.first_row = (torch.searchsorted(self.rowptr.to(torch.int64), starts, right=True) - 1).clamp_(0, max(m - 1, 0)).to(self.idx)
        if self.kind == "delta":
            self._init_delta(variant)
        if self.kind == "dia":
            few = DIA_DEFAULT_FEW_F64 if self.dtype == torch.float64 else DIA_DEFAULT_FEW
            self.variant = variant or ((few if self.ndiag <= 8 else DIA_DEFAULT) if self.small else "classic")
            if self.variant not in DIA_VARIANTS + DIA_EXTRA:
                raise InputError(f"{backend}: DIA variant must be one of {DIA_VARIANTS}, got {variant!r}")
        if self.kind == "ell":
            ell_default = ELL_DEFAULT_F32 if self.dtype == torch.float32 else ELL_DEFAULT
            self.variant = variant or (ell_default if self.col32 is not None else "rows")
            if self.variant not in ELL_VARIANTS:
                raise InputError(f"{backend}: ELL variant must be one of {ELL_VARIANTS}, got {variant!r}")
        if self.kind == "nm":
            self.variant = variant or NM_DEFAULT
            if self.variant not in NM_VARIANTS:
                raise InputError(f"{backend}: N:M variant must be one of {NM_VARIANTS}, got {variant!r}")
        if self.kind == "generated":
            self.variant = self.gen.variant
        self.reload_cheap = True
        #: the tensor-core SpMM for half-precision X of MMA_MIN_K or more columns (False: the other kernels)
        self.use_mma = self.kind != "generated"
        #: a cluster size for the tensor-core kernel (1, 2, 4, 8) instead of :meth:`mma_split`'s choice
        self.mma_split_override: int | None = None
        #: csr16_warp for half-precision CSR, one right-hand side, long rows (False: the other kernels)
        self.use_csr16 = variant is None
        self._mma: dict[str, Any] | None = None
        #: rows of A per block of the tensor-core kernel: 128 (256 threads, 2 blocks per SM) or 64
        #: (128 threads, 4 blocks per SM)
        self.mma_rows = MMA_ROWS
        #: benchmarking only (wrong results): 1 skips the products, 2 the zeroing of the A tile, 4 the loads
        self.mma_flags = 0
        #: the one launch of the common call (no adjoint, one matrix, X (n, k) contiguous), recorded on
        #: its first run, per (k, X's address mod 16): replayed with the new X and Y pointers
        self._prepared: dict[tuple[int, int], Prepared | PreparedSeq | None] = {}

    # Pattern builders ---------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """Values of a tensor on this plan's pattern: ``(*batch, slots)``."""
        if values.shape[-1] != self.slots or values.dtype != self.dtype or values.device != self.device:
            raise InputError(f"{self.backend}: values of shape {tuple(values.shape)}, {values.dtype} on {values.device}; "
                             f"this plan takes (*batch, {self.slots}) {self.dtype} on {self.device}")
        # No shortcut on "the same tensor as last time": a gather or an alignment copy must be
        # redone, since writes through .data (gradcheck) or NumPy leave the version unchanged.
        # Formats with their own kernel read the values where they lie, so that costs nothing.
        self._values_t = None
        v = values
        if self.gather is not None:
            v = v.index_select(-1, self.gather)
        v = v.contiguous()
        if self.kind in ("delta", "nm") and v.data_ptr() % 16:
            v = v.clone()  # the DELTA / N:M kernels' 16-byte loads need an aligned base
        old = self._values
        self._values = v
        if getattr(self, "sell", None) is not None:  # SELL-C-sigma slots: one gather per value set
            ext = torch.cat([v, v.new_zeros(*v.shape[:-1], 1)], -1)
            self._values_sell = ext.index_select(-1, self.sell["src"]).contiguous()
            self._prepared = {}
        elif old is None or old.data_ptr() != v.data_ptr() or old.shape != v.shape:
            self._prepared = {}  # the recorded launches hold the old values' address

    # Products -----------------------------------------------------------------------------------
    def apply(self, X: torch.Tensor, *, adjoint: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``A @ X`` (``A^H @ X`` when ``adjoint``) for ``X`` of shape ``(*batch, n, k)``, plus
        ``bias[row]`` on every row when ``bias`` (a vector of the output's rows, A's dtype and
        device) is given: fused into the tensor-core SpMM kernel, a separate add otherwise.

        Half-precision X of 8 or more columns (CSR, formats through the generic CSR, N:M 2:4)
        runs the tensor-core kernel (kernels/mma.cu), which reads X^T and writes Y^T: an X given
        as the transpose of a contiguous ``(k, n)`` tensor (a linear layer's input, ``x.mT``) is
        read where it lies and Y comes back the same way (``Yt.mT``, Yt contiguous ``(k, m)``);
        a contiguous X is transposed first and Y returned contiguous."""
        m, n = self.shape
        if bias is not None:
            rows_b = n if adjoint else m
            if bias.shape != (rows_b,) or bias.dtype != self.dtype or bias.device != self.device:
                raise InputError(f"{self.backend}: bias must be ({rows_b},) {self.dtype} on {self.device}; got "
                                 f"{tuple(bias.shape)} {bias.dtype} on {bias.device}")
            bias = bias.contiguous()
        if not adjoint and X.dim() == 2 and X.shape[0] == n and X.dtype == self.dtype and X.device == self.device \
                and self._values is not None and self._values.dim() == 1:
            k = X.shape[1]
            if self._mma_ok(k):
                return self._apply_mma(X, k, bias)
        if not adjoint and X.dim() == 2 and X.shape[0] == n and X.dtype == self.dtype and X.is_contiguous() \
                and X.device == self.device and self._values is not None:
            k = X.shape[1]
            xp = X.data_ptr()
            key = (k, xp & 15) if bias is None else (k, xp & 15, bias.data_ptr())
            prep = self._prepared.get(key)
            if prep is not None:
                Y = torch.empty((m, k), dtype=self.dtype, device=self.device)
                yp = Y.data_ptr()
                if yp & 15:  # never seen from torch's allocator; the recorded kernel may store 16 bytes at once
                    self._launch(self._values, X, Y, k, False, 0, bias)
                else:
                    prep(xp, yp)
                return Y
            if self._values.dim() == 1 and key not in self._prepared:
                if len(self._prepared) >= 64:  # many different k: keep the dictionary small
                    self._prepared.clear()
                Y = torch.empty((m, k), dtype=self.dtype, device=self.device)
                tuned = len(self.gen.choice) if self.kind == "generated" else 0
                with recording() as calls:
                    self._launch(self._values, X, Y, k, False, 0, bias)
                if self.kind == "generated" and len(self.gen.choice) != tuned:
                    return Y  # this call timed the variants (many launches): record the chosen one next time
                self._prepared[key] = self._prepare(calls, xp, Y.data_ptr())
                return Y
        if self._values is None:
            raise RuntimeError(f"{self.backend}/spmm: apply() before set_values()")
        rows_in = m if adjoint else n
        if X.dtype != self.dtype or X.device != self.device or X.dim() < 2 or X.shape[-2] != rows_in:
            raise InputError(f"{self.backend}: X of shape {tuple(X.shape)}, {X.dtype} on {X.device}; expected (*batch, {rows_in}, k) "
                             f"{self.dtype} on {self.device}")
        k = X.shape[-1]
        if adjoint and X.dim() == 2 and self._values.dim() == 1 and self._dense_route(k):
            Y = self._dense_adjoint(X)  # cuBLAS reads X where it lies
            return Y if bias is None else Y + bias.unsqueeze(-1)
        X = X.contiguous()
        rows_out = n if adjoint else m
        Y = torch.empty(*X.shape[:-2], rows_out, k, dtype=self.dtype, device=self.dev_index)
        vals = self._adjoint_values() if adjoint else self._values
        if vals.dim() == 1 and X.dim() == 2:  # one matrix, one right-hand-side block: no reshapes
            self._launch(vals, X, Y, k, adjoint, 0, bias)
            return Y
        vb = vals.reshape(-1, vals.shape[-1])
        xb = X.reshape(-1, rows_in, k)
        yb = Y.view(-1, rows_out, k)
        if vb.shape[0] not in (1, xb.shape[0]):
            raise InputError(f"{self.backend}: {vb.shape[0]} value sets for {xb.shape[0]} right-hand-side batches")
        for b in range(xb.shape[0]):
            bi = b if vb.shape[0] > 1 else 0
            self._launch(vb[bi], xb[b], yb[b], k, adjoint, bi)
        if bias is not None:
            Y += bias.unsqueeze(-1)
        return Y

    def bind(self, values: torch.Tensor, X: torch.Tensor) -> Bound | None:
        """``Y = A X`` as one launch bound to ``values`` (this pattern's value slots, 1-D, read where
        they lie) for right-hand sides laid out as ``X`` ((n, k), contiguous): a
        :class:`~.launch.Bound`, called as ``bound(X, Y)`` with ``Y`` a contiguous ``(m, k)``
        output, or None where a product needs more than one launch or per-call work on the values
        (the generic formats' gather, SELL-C-sigma slots, the load-balanced CSR's zeroing, DELTA /
        N:M alignment copies, half precision's tensor-core and csr16 paths, generated kernels with
        several launches or variants still to time). Shapes, dtypes and devices are checked here,
        once; the index buffers are the plan's own, validated when it was built; the launch is
        recorded without running (``recording(dry=True)``). This is what ``Matmul.execute`` calls
        per product: the plan's own state (:meth:`set_values`) is neither read nor changed."""
        m, n = self.shape
        if self.dtype not in (torch.float32, torch.float64) or self.gather is not None \
                or getattr(self, "sell", None) is not None:
            return None
        if self.kind in ("csr", "generic") and self.variant == "balanced":
            return None
        if not (isinstance(values, torch.Tensor) and isinstance(X, torch.Tensor) and values.dim() == 1
                and values.shape[0] == self.slots and values.dtype == self.dtype and values.device == self.device
                and values.is_contiguous() and X.dim() == 2 and X.shape[0] == n and X.dtype == self.dtype
                and X.device == self.device and X.is_contiguous()):
            return None
        if self.kind in ("delta", "nm") and values.data_ptr() % 16:
            return None
        k = int(X.shape[1])
        if not (m and k):
            return None
        if self.kind == "generated" and self.gen.autotune and self.gen.variant is None and k not in self.gen.choice:
            return None  # the first product times the variants (real launches)
        Y = torch.empty((m, k), dtype=self.dtype, device=self.device)
        with recording(dry=True) as calls:
            self._launch(values, X, Y, k, False)
        if len(calls) != 1:
            return None
        kern, grid, block, args, shared = calls[0]
        xp, yp = X.data_ptr(), Y.data_ptr()
        if xp == yp or args.count(xp) != 1 or args.count(yp) != 1:
            return None
        return Bound(kern, grid, block, args, shared, args.index(xp), args.index(yp), self.dev_index, values, xp & 15,
                     owner=self)

    # Tensor-core SpMM (kernels/mma.cu) ---------------------------------------------------------
    def _prepare(self, calls: list, xp: int, yp: int) -> Prepared | PreparedSeq | None:
        """A :class:`Prepared` launch from one recorded call (a :class:`PreparedSeq` for a tensor-core product
        followed by its non-finite fix-up, ``spmm_fixup``), or None (other sequences of launches, no launch, or X /
        Y pointers that cannot be told from the other arguments)."""
        if not calls or xp == yp or yp % 16:
            return None
        if len(calls) > 2 or (len(calls) == 2 and calls[1][0].name != "spmm_fixup"):
            return None
        parts = []
        for kern, grid, block, args, shared in calls:
            if args.count(xp) != 1 or args.count(yp) != 1:
                return None
            parts.append(Prepared(kern, grid, block, args, shared, args.index(xp), args.index(yp), self.dev_index))
        return parts[0] if len(parts) == 1 else PreparedSeq(parts)

    def _launch(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, adjoint: bool, bi: int = 0,
                bias: torch.Tensor | None = None) -> None:
        fused = self._launch_product(v, x, y, k, adjoint, bi, bias)
        if bias is not None and not fused:  # the kernel did not add it: one more launch, in place
            rows, cols = y.shape[-2], y.shape[-1]
            kern = kernel("mma", "add_bias", self.dtype, torch.int32, self.dev_index, 6)
            kern((-(-rows * cols // BLOCK), 1), BLOCK, (rows, cols, y.stride(-2), y.stride(-1), bias.data_ptr(), y.data_ptr()),
                 device=self.dev_index)

    def _launch_product(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, adjoint: bool, bi: int = 0,
                        bias: torch.Tensor | None = None) -> bool:
        """Launch the product; True when the kernel also added ``bias``."""
        m, n = self.shape
        dev = self.dev_index
        gy = min(k, _GRID_Y)
        bp = bias.data_ptr() if bias is not None else 0
        if (not adjoint and k == 1 and self.kind in ("csr", "generic") and self.sell is None and self.use_csr16
                and self.dtype in (torch.float16, torch.bfloat16) and self.nnz >= CSR16_MIN_MEAN * max(m, 1)
                and v.data_ptr() % 16 == 0 and self._mma_ok(MMA_MIN_K)):
            lay = self._mma_layout()
            kern = kernel("mma", "csr16_warp", self.dtype, torch.int32, dev, 7)
            kern((-(-m // (ROW_KERNEL_BLOCK // 32)), 1), ROW_KERNEL_BLOCK,
                 (m, lay["rowptr"].data_ptr(), lay["col"].data_ptr(), v.data_ptr(), x.data_ptr(), bp, y.data_ptr()),
                 device=self.dev_index)
            return True
        if adjoint:
            t = self._transposed()
            fits_t = max(int(t["col"].numel()), m, n) < INT_LIMIT and m * k < INT_LIMIT and n * k < INT_LIMIT
            self._csr(t["rowptr"], t["col"], v, x, y, n, k, t["vec"], "vector", None, t["idx"], fits_t)
            return
        kind = self.kind
        if kind == "generated":
            self.gen.product(v, x, y, k)
            return False
        fits = self.small and m * k < INT_LIMIT and n * k < INT_LIMIT  # the 32-bit kernels apply
        if kind in ("csr", "generic") and self.sell is not None and fits:
            sl = self.sell
            sv = self._values_sell.reshape(-1, sl["slots"])[bi]
            perm = sl["perm"]
            kern = kernel("structured", "sell32_perm" if perm is not None else "sell32", self.dtype, torch.int32, dev, 9)
            kern((-(-sl["nslices"] * SELL_C // BLOCK), gy), BLOCK,
                 (m, k, sl["nslices"], sl["slice_ptr"].data_ptr(), sl["col"].data_ptr(), sv.data_ptr(),
                  perm.data_ptr() if perm is not None else 0, x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind in ("csr", "generic"):
            variant = "vector" if self.variant == "sell" else self.variant
            self._csr(self.rowptr, self.col, v, x, y, m, k, self.vec, variant, self.first_row, self.idx, fits)
        elif kind == "dia":
            if self.variant == "classic" or not fits:
                kern = kernel("spmv", "dia_rows", self.dtype, torch.int64, dev, 8)
                kern((-(-m // BLOCK), gy), BLOCK, (m, n, k, self.ndiag, self.offs.data_ptr(), v.data_ptr(), x.data_ptr(),
                                                   y.data_ptr()), shared=8 * self.ndiag, device=self.dev_index)
                return
            variant = self.variant
            if variant in DIA_Q and self.ndiag <= 8:
                vq = 16 // v.element_size()
                if k == 1 and m % vq == 0 and v.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0:
                    offs = [int(o) for o in self.offs_host] + [0] * (8 - self.ndiag)
                    kern = kernel("fast", f"dia_{variant}_1", self.dtype, torch.int64, dev, 15)
                    if variant in DIA_PDL:
                        allow_pdl(kern, self.dev_index)  # the recording launch is plain; Prepared / Bound replays use PDL
                    kern((-(-m // (vq * DIA_BLOCK_Q)), 1), DIA_BLOCK_Q,
                         (m, n, k, self.ndiag, *(o & 0xFFFFFFFFFFFFFFFF for o in offs), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                         device=self.dev_index)
                    return
                f64 = self.dtype == torch.float64
                variant = ("p1nbw" if f64 else "p1w") if "w" in variant else ("p1nb" if f64 else "p1")
            if variant in ("v2", "v2na", "v4na") and self.ndiag <= 8:
                if m % 2 == 0 and v.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0:
                    offs = [int(o) for o in self.offs_host] + [0] * (8 - self.ndiag)
                    kern = kernel("fast", f"dia_{variant}_1", self.dtype, torch.int64, dev, 15)
                    kern((-(-m // (int(variant[1]) * DIA_BLOCK_V2)), gy), DIA_BLOCK_V2,
                         (m, n, k, self.ndiag, *(o & 0xFFFFFFFFFFFFFFFF for o in offs), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                         device=self.dev_index)
                    return
                variant = "p1na" if self.dtype == torch.float64 else "p1"  # odd m or unaligned values / Y
            if variant.startswith("p") and self.ndiag <= 8:  # offsets as kernel parameters
                rows = int(variant[1])
                offs = [int(o) for o in self.offs_host] + [0] * (8 - self.ndiag)
                name = _DIA_P8_NAMES.get(variant) or f"dia_p8_{rows}"
                pd = (DIA_PREFETCH_ROWS,) if variant == "p1pd" else ()
                kern = kernel("fast", name, self.dtype, torch.int64, dev, 15 + len(pd))
                if variant in DIA_PDL:
                    allow_pdl(kern, self.dev_index)  # the recording launch is plain; Prepared / Bound replays use PDL
                threads = DIA_BLOCK_NA if variant == "p1na" else (128 if variant in ("p1nb", "p1nc", "p1pd", "p1nbw") else DIA_BLOCK)
                kern((-(-m // (threads * rows)), gy), threads, (m, n, k, self.ndiag, *(o & 0xFFFFFFFFFFFFFFFF for o in offs),
                                                            *pd, v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
                return
            rows = 2 if variant in ("rows2", "p2", "p4", "v2", "v2na", "v4na") else 1
            kern = kernel("fast", f"dia_fast{rows}", self.dtype, torch.int64, dev, 8)
            kern((-(-m // (BLOCK * rows)), gy), BLOCK, (m, n, k, self.ndiag, self.offs32.data_ptr(), v.data_ptr(), x.data_ptr(),
                                                        y.data_ptr()), shared=4 * (-(-max(self.ndiag, 1) // 8) * 8),
                 device=self.dev_index)
        elif kind == "ell" and self.col32 is not None and fits and self.variant != "rows":
            if self.variant in ("p", "pcs") and 1 <= self.width <= 8:
                kern = kernel("fast", f"ell_{self.variant}{self.width}", self.dtype, torch.int32, dev, 6)
                kern((-(-m // BLOCK), gy), BLOCK, (m, k, self.col32.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()),
                     device=self.dev_index)
            else:
                name = "ell_stream8cs" if self.variant in ("streamcs", "pcs") else "ell_stream8"
                kern = kernel("fast", name, self.dtype, torch.int32, dev, 7)
                kern((-(-m // CSR_STREAM_BLOCK), gy), CSR_STREAM_BLOCK,
                     (m, k, self.width, self.col32.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind == "ell":
            kern = kernel("spmv", "ell_rows", self.dtype, self.idx_stored, dev, 8)
            kern((-(-m // BLOCK), gy), BLOCK, (m, k, self.width, self.cnt.data_ptr(), self.col_stored.data_ptr(), v.data_ptr(),
                                               x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind == "nm":
            S = self.row_slots
            if (fits and k == 1 and (self.nm_n, self.nm_m) == (2, 4) and n % 16 == 0 and x.data_ptr() % 16 == 0
                    and v.data_ptr() % 16 == 0):
                args = (m, S, self.words.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr())
                if self.variant == "warp":  # a warp per row, grid capped at 4 blocks per SM (row loop)
                    kern = kernel("structured", "nm24", self.dtype, torch.int32, dev, 6)
                    wpb = ROW_KERNEL_BLOCK // 32
                    kern((min(-(-m // wpb), 4 * _sm_count(dev)), 1), ROW_KERNEL_BLOCK, args, device=self.dev_index)
                    return
                split = int(self.variant[1])
                kern = kernel("structured", f"nm24_s{split}", self.dtype, torch.int32, dev, 7)
                kern((-(-m // (NM_BLOCK // 32 // split)), 1), NM_BLOCK, (*args[:5], bp, args[5]), device=self.dev_index)
                return True
            kern = kernel("structured", "nm_any", self.dtype, torch.int32, dev, 11)
            kern((-(-m * 32 // BLOCK), gy), BLOCK, (m, n, k, S, self.nm_n, self.nm_m, self.pos_bits, self.words.data_ptr(),
                                                    v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
        elif kind == "bsr":
            kern = kernel("structured", f"bsr_vec{self.vec}", self.dtype, self.idx, dev, 10)
            kern((-(-m * self.vec // BLOCK), gy), BLOCK, (m, n, k, self.bh, self.bw, self.rowptr.data_ptr(), self.col.data_ptr(),
                                                          v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
        else:  # delta
            self._launch_delta(v, x, y, k, fits)

    def _csr(self, rowptr, col, v, x, y, rows: int, k: int, vec: int, variant: str, first_row, idx, fits: bool = False) -> None:
        dev = self.dev_index
        nnz = int(col.numel())
        if variant == "balanced" and first_row is not None:
            acc = self.dtype if self.dtype in (torch.float32, torch.float64) else torch.float32
            out = y if acc == self.dtype else torch.empty(y.shape, dtype=acc, device=self.dev_index)
            out.zero_()
            warps = max(1, -(-nnz // CHUNK))
            kern = kernel("spmv", "csr_balanced", self.dtype, idx, dev, 11)
            kern((-(-warps * 32 // BLOCK), min(k, _GRID_Y)), BLOCK,
                 (rows, k, nnz, CHUNK, int(first_row.numel()), rowptr.data_ptr(), col.data_ptr(), v.data_ptr(),
                  first_row.data_ptr(), x.data_ptr(), out.data_ptr()), device=self.dev_index)
            if out is not y:
                cast = kernel("spmv", "cast_out", self.dtype, idx, dev, 3)
                total = out.numel()
                cast((-(-total // BLOCK), 1), BLOCK, (total, out.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        if k >= COLS_KERNEL_FROM:
            kern = kernel("spmv", "csr_cols", self.dtype, idx, dev, 7)
            kern((-(-rows * 32 // BLOCK), min(-(-k // 32), _GRID_Y)), BLOCK,
                 (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        if fits and variant in ("stream", "stream4", "stream16", "streamcs"):  # stream4 / 16: chunks of 128 / 512 nonzeros
            name = {"stream": "csr_stream8", "stream4": "csr_stream4", "stream16": "csr_stream16", "streamcs": "csr_stream8cs"}[variant]
            kern = kernel("fast", name, self.dtype, idx, dev, 7)
            kern((-(-rows // BLOCK), min(k, _GRID_Y)), BLOCK,
                 (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        if fits and vec >= 2:
            kern = kernel("fast", f"csr_v32_{vec}", self.dtype, idx, dev, 7)
            kern((-(-rows * vec // BLOCK), min(k, _GRID_Y)), BLOCK,
                 (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)
            return
        kern = kernel("spmv", f"csr_vec{vec}", self.dtype, idx, dev, 7)
        kern((-(-rows * vec // BLOCK), min(k, _GRID_Y)), BLOCK,
             (rows, k, rowptr.data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), y.data_ptr()), device=self.dev_index)

    # Adjoint ------------------------------------------------------------------------------------
    def _transposed(self) -> dict[str, Any]:
        """CSR of A^T's pattern and, per entry, the value slot it reads (pattern work, once)."""
        if self._t is None:
            m, n = self.shape
            coords, slot = self._source.entries()
            rows, cols = coords[0].to(torch.int64), coords[1].to(torch.int64)
            order = torch.argsort(cols * max(m, 1) + rows, stable=True)
            idx = _index_dtype(rows.numel(), m, n)
            rowptr = torch.zeros(n + 1, dtype=torch.int64, device=self.dev_index)
            rowptr[1:] = torch.cumsum(torch.bincount(cols, minlength=n), 0)
            self._t = {"rowptr": rowptr.to(idx), "col": rows[order].to(idx).contiguous(), "idx": idx,
                       "slot": slot.to(torch.int64)[order].contiguous(), "vec": _vec_for(rows.numel() / max(n, 1))}
        return self._t

    def _adjoint_values(self) -> torch.Tensor:
        if self._values_t is None:
            t = self._transposed()
            raw = self._source_values()
            self._values_t = raw.index_select(-1, t["slot"]).contiguous()
        return self._values_t

    def _source_values(self) -> torch.Tensor:
        """The values in A's own slot order (undoing the generic path's gather)."""
        if self.gather is None:
            return self._values
        out = self._values.new_zeros(*self._values.shape[:-1], self.slots)
        return out.index_copy_(-1, self.gather, self._values)

    # SDDMM (backward with respect to the values) ------------------------------------------------------
    def sddmm(self, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
        """``out[slot] = sum_c P[row, c] Q[col, c]`` for every stored entry, in A's value slots
        (padding slots get zero): the gradient of ``<dY, A X>`` is ``sddmm(dY, X)``. ``P`` is
        ``(*batch, m, k)``, ``Q`` is ``(*batch, n, k)``."""
        m, n = self.shape
        if (P.dtype != self.dtype or Q.dtype != self.dtype or P.dim() < 2 or P.shape[-2] != m or Q.shape[-2] != n
                or P.shape[-1] != Q.shape[-1] or P.device != self.device or Q.device != self.device):
            raise InputError(f"{self.backend}: sddmm takes P (*batch, {m}, k) and Q (*batch, {n}, k) in {self.dtype} on "
                             f"{self.device}; got {tuple(P.shape)} {P.dtype} and {tuple(Q.shape)} {Q.dtype}")
        batch = torch.broadcast_shapes(P.shape[:-2], Q.shape[:-2])
        k = P.shape[-1]
        if self._dense_route(k):
            # one dense product per batch member (cuBLAS reads the factors where they lie), then its stored
            # entries in A's value slots (padding slots zero; where the entries are the slots in order, a gather)
            P = P.expand(*batch, m, k).reshape(-1, m, k)
            Q = Q.expand(*batch, n, k).reshape(-1, n, k)
            nb = P.shape[0]
            if self._sddmm_lin is None:
                rows, cols, slot = self._entry_coords()
                in_order = slot.numel() == self.slots and bool((slot == torch.arange(self.slots, device=slot.device)).all())
                self._sddmm_lin = (rows * n + cols, None if in_order else slot)
            lin, slot = self._sddmm_lin
            if slot is None and nb == 1:
                return torch.mm(P[0], Q[0].T).view(-1).index_select(0, lin).reshape(*batch, self.slots)
            full = torch.zeros(nb, self.slots, dtype=self.dtype, device=self.dev_index)
            for b in range(nb):
                got = torch.mm(P[b], Q[b].T).view(-1).index_select(0, lin)
                if slot is None:
                    full[b] = got
                else:
                    full[b].index_copy_(0, slot, got)
            return full.reshape(*batch, self.slots)
        P = P.expand(*batch, m, k).contiguous().reshape(-1, m, k)
        Q = Q.expand(*batch, n, k).contiguous().reshape(-1, n, k)
        nb = P.shape[0]
        entries = self.nnz if self.kind in ("csr", "generic", "delta") else self.slots
        out = torch.empty(nb, entries, dtype=self.dtype, device=self.dev_index)
        dev = self.dev_index
        for b in range(nb):
            p, q, o = P[b], Q[b], out[b]
            if self.kind in ("csr", "generic"):
                vec = 1 if self.vec <= 2 else (4 if self.vec <= 8 else 32)
                kern = kernel("sddmm", f"csr_sddmm{vec}", self.dtype, self.idx, dev, 7)
                kern((-(-m * vec // BLOCK), 1), BLOCK, (m, k, self.rowptr.data_ptr(), self.col.data_ptr(), p.data_ptr(),
                                                      q.data_ptr(), o.data_ptr()), device=self.dev_index)
            elif self.kind == "dia":
                kern = kernel("sddmm", "dia_sddmm", self.dtype, torch.int64, dev, 8)
                kern((-(-self.slots // BLOCK), 1), BLOCK, (m, n, k, self.ndiag, self.offs.data_ptr(), p.data_ptr(), q.data_ptr(),
                                                          o.data_ptr()), device=self.dev_index)
            elif self.kind in ("nm", "bsr", "generated"):  # torch gathers over the stored entries (no kernel of its own yet)
                rows, cols, slot = self._entry_coords()
                o.zero_()
                o.index_copy_(0, slot, (p.index_select(0, rows) * q.index_select(0, cols)).sum(-1))
            elif self.kind == "ell":
                kern = kernel("sddmm", "ell_sddmm", self.dtype, self.idx, dev, 8)
                kern((-(-self.slots // BLOCK), 1), BLOCK, (m, k, self.width, self.cnt.data_ptr(), self.col.data_ptr(),
                                                          p.data_ptr(), q.data_ptr(), o.data_ptr()), device=self.dev_index)
            else:
                kern = kernel("sddmm", "delta_sddmm", self.dtype, self.idx, dev, 8)
                kern((-(-m * 32 // BLOCK), 1), BLOCK, (m, k, self.bits, self.rowptr.data_ptr(), self.words.data_ptr(),
                                                      p.data_ptr(), q.data_ptr(), o.data_ptr()), device=self.dev_index)
        if self.gather is not None:
            full = out.new_zeros(nb, self.slots)
            out = full.index_add_(-1, self.gather, out)
        return out.reshape(*batch, self.slots)

    def _dense_route(self, k: int) -> bool:
        """Whether the backward products take the dense route (:data:`DENSE_ROUTE`) for ``k`` columns."""
        m, n = self.shape
        own_kernel = self.kind in ("csr", "generic", "dia", "ell", "delta")
        return (DENSE_ROUTE and k >= DENSE_ROUTE_MIN_K and m * n * self.dtype.itemsize <= DENSE_ROUTE_BYTES
                and (not own_kernel or self.nnz >= DENSE_ROUTE_DENSITY * m * n))

    def _dense_adjoint(self, X: torch.Tensor) -> torch.Tensor:
        """``A^T X`` by the dense route: the plan's values scattered into a zeroed (m, n) buffer, then one GEMM."""
        m, n = self.shape
        if self._dense_place is None:
            rows, cols, slot = self._entry_coords()
            by_slot = torch.full((self.slots,), -1, dtype=torch.int64, device=self.dev_index)
            by_slot[slot] = rows * n + cols
            lin = by_slot if self.gather is None else by_slot.index_select(0, self.gather)
            keep = lin >= 0  # padding slots (ELL, DIA) have no place
            idx = None
            if not bool(keep.all()):
                idx = keep.nonzero().flatten()
                lin = lin.index_select(0, idx)
            self._dense_place = (lin, idx)
        lin, idx = self._dense_place
        v = self._values if idx is None else self._values.index_select(0, idx)
        W = torch.zeros(m * n, dtype=self.dtype, device=self.dev_index)
        W.index_copy_(0, lin, v)
        return torch.mm(W.view(m, n).T, X)

    def _entry_coords(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row, column and value slot of every stored entry (pattern work, once)."""
        if getattr(self, "_coords", None) is None:
            coords, slot = self._source.entries()
            self._coords = (coords[0].to(torch.int64), coords[1].to(torch.int64), slot.to(torch.int64))
        return self._coords

    def __repr__(self) -> str:
        extra = f", variant={self.variant}" if self.kind in ("csr", "generic", "delta", "dia", "ell", "nm", "generated") else ""
        return f"CudaSpmmPlan({self.kind}, shape={self.shape}, nnz={self.nnz}, {self.dtype}{extra})"
