"""Pattern work of :class:`~.plan.CudaSpmmPlan` per format (a mixin): what each kernel reads, made
once per pattern and validated before any kernel reads it."""

from __future__ import annotations


import torch

from sparsetorch import InputError, SparseTensor

from .layout import (INT_LIMIT, _check_cols, _check_rowptr, _index_dtype, _nm_pos_bits, _vec_for, bsr_params, delta_bits,
                     nm_params)


class BuildMixin:
    """The ``_build_<format>`` steps of the plan's ``__init__``."""

    def _build_csr(self, A: SparseTensor) -> None:
        m, n = self.shape
        rowptr, col = A.pos(1), A.crd(1)
        if rowptr.dtype != col.dtype:
            rowptr, col = rowptr.to(torch.int64), col.to(torch.int64)
        self.nnz = int(col.numel())
        _check_rowptr(rowptr, m, self.nnz, f"{self.backend} CSR")
        _check_cols(col, n, f"{self.backend} CSR")
        if rowptr.dtype == torch.int64 and max(self.nnz, m, n) < INT_LIMIT:
            # int32 copies of the indices, made once (as the torch backend narrows them): the 32-bit
            # kernels read 4 bytes less per entry (114^3 stencil, float64: 44 against 53 us)
            rowptr, col = rowptr.to(torch.int32), col.to(torch.int32)
        self.rowptr, self.col, self.idx = rowptr.contiguous(), col.contiguous(), rowptr.dtype

    def _build_generic(self, A: SparseTensor) -> None:
        m, n = self.shape
        coords, slot = A.entries()
        rows, cols = coords[0].to(torch.int64), coords[1].to(torch.int64)
        self.nnz = int(rows.numel())
        if self.nnz and (int(rows.min()) < 0 or int(rows.max()) >= m):
            raise InputError(f"{self.backend}: entry rows outside [0, {m})")
        _check_cols(cols, n, self.backend)
        order = torch.argsort(rows * max(n, 1) + cols, stable=True)
        idx = _index_dtype(self.nnz, m, n)
        counts = torch.bincount(rows, minlength=m)
        rowptr = torch.zeros(m + 1, dtype=torch.int64, device=self.dev_index)
        rowptr[1:] = torch.cumsum(counts, 0)
        self.rowptr, self.col, self.idx = rowptr.to(idx), cols[order].to(idx).contiguous(), idx
        gather = slot.to(torch.int64)[order].contiguous()
        # entries stored in row-major order with one value slot each (a sorted COO): the CSR's
        # values are A's values as they lie, so no gather per value set (and the bound launch applies)
        ident = self.nnz == self.slots and bool((gather == torch.arange(self.nnz, device=gather.device)).all())
        self.gather = None if ident else gather

    def _build_dia(self, A: SparseTensor) -> None:
        m, n = self.shape
        offs = A.crd(0).to(torch.int64).contiguous()
        self.ndiag = int(offs.numel())
        if self.ndiag and (int(offs.min()) <= -max(m, 1) or int(offs.max()) >= max(n, 1)):
            raise InputError(f"{self.backend} DIA: offsets must lie in (-{m}, {n}), got {int(offs.min())} .. {int(offs.max())}")
        if self.slots != self.ndiag * m:
            raise InputError(f"{self.backend} DIA: {self.slots} value slots for {self.ndiag} diagonals of {m} rows")
        if self.ndiag > 4096:
            raise InputError(f"{self.backend} DIA: {self.ndiag} diagonals is more than the kernel's 4096")
        self.offs, self.nnz, self.idx = offs, self.ndiag * m, torch.int64
        self.offs32 = offs.to(torch.int32).contiguous()
        self.offs_host = offs.tolist() if self.ndiag <= 8 else []

    def _build_ell(self, A: SparseTensor) -> None:
        m, n = self.shape
        pos, col = A.pos(1), A.crd(1)
        width = self.slots // max(m, 1) if m else 0
        if m and width * m != self.slots:
            raise InputError(f"{self.backend} ELL: {self.slots} slots is not a multiple of {m} rows")
        lo, hi = pos[0::2].to(torch.int64), pos[1::2].to(torch.int64)
        expect = torch.arange(m, device=self.device, dtype=torch.int64) * width
        cnt = hi - lo
        if lo.numel() != m or bool((lo != expect).any()) or bool(((cnt < 0) | (cnt > width)).any()):
            raise InputError(f"{self.backend} ELL: row slot ranges are not [r * {width}, r * {width} + count)")
        if col.numel() != self.slots:
            raise InputError(f"{self.backend} ELL: {col.numel()} column slots for {self.slots} value slots")
        used = torch.arange(width, device=self.dev_index)[None, :] < cnt[:, None]
        _check_cols(col.reshape(m, width)[used] if m else col, n, f"{self.backend} ELL")
        idx = col.dtype
        self.col, self.cnt, self.width, self.idx = col.contiguous(), cnt.to(torch.int32).contiguous(), width, idx
        self.nnz = int(cnt.sum())
        # the 32-bit kernels' columns: an int32 copy made once, -1 in the unused slots (so they read
        # no counts and 4 bytes less per slot than int64; 114^3 stencil float64: NOTES.md "Session 8: stencil SpMV")
        self.col32: torch.Tensor | None = None
        if max(self.slots, m, n) < INT_LIMIT:
            if col.dtype == torch.int32 and self.nnz == self.slots:
                self.col32 = self.col  # every slot used: the columns as they are
            elif m and width:
                pad = torch.full((), -1, dtype=col.dtype, device=col.device)
                self.col32 = torch.where(used, col.reshape(m, width), pad).to(torch.int32).reshape(-1).contiguous()
            else:
                self.col32 = torch.zeros(0, dtype=torch.int32, device=self.dev_index)
        #: ell_rows ("rows") reads the columns as stored; everything else (and the SDDMM) the int32 copy
        self.col_stored, self.idx_stored = self.col, idx
        if self.col32 is not None:
            self.col, self.idx = self.col32, torch.int32

    def _build_delta(self, A: SparseTensor) -> None:
        m, n = self.shape
        b = delta_bits(A.format)
        rowptr, gaps = A.pos(1), A.crd(1)
        self.nnz = int(gaps.numel())
        _check_rowptr(rowptr, m, self.nnz, f"{self.backend} DELTA({b})")
        g = gaps.to(torch.int64)
        if self.nnz and (int(g.min()) < 0 or int(g.max()) >= (1 << b)):
            raise InputError(f"{self.backend} DELTA({b}): gaps must lie in [0, {1 << b}), got {int(g.min())} .. {int(g.max())}")
        # the last column of each row is (sum of gap + 1 over the row) - 1: it must be < n
        csum = torch.zeros(self.nnz + 1, dtype=torch.int64, device=self.dev_index)
        csum[1:] = torch.cumsum(g + 1, 0)
        r64 = rowptr.to(torch.int64)
        span = csum[r64[1:]] - csum[r64[:-1]]
        if m and int(span.max()) > n:
            raise InputError(f"{self.backend} DELTA({b}): gaps of a row decode past column {n - 1}")
        per = 32 // b
        # whole 8-entry groups (8 b bits each), rounded up to whole words
        words = -(-(-(-self.nnz // 8) * 8 * b) // 32) if self.nnz else 0
        padded = torch.zeros(words * per, dtype=torch.int64, device=self.dev_index)
        padded[: self.nnz] = g
        shifts = torch.arange(per, device=self.device, dtype=torch.int64) * b
        packed = (padded.reshape(words, per) << shifts).sum(1) if words else padded
        # uint32 words carried in an int32 tensor (two's complement of the same bits)
        packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
        self.words = torch.cat([packed, packed.new_zeros(4)]).contiguous()  # four spare words
        self.bits, self.rowptr, self.idx = b, rowptr.contiguous(), rowptr.dtype
        self.max_row = int((r64[1:] - r64[:-1]).max()) if m else 0

    def _build_nm(self, A: SparseTensor) -> None:
        m, n = self.shape
        self.nm_n, self.nm_m = nm_params(A.format)
        pb = _nm_pos_bits(self.nm_m)
        groups = -(-n // self.nm_m)
        S = groups * self.nm_n
        if self.slots != m * S:
            raise InputError(f"{self.backend} NM({self.nm_n},{self.nm_m}): {self.slots} value slots for {m} rows of {S}")
        pos = A.crd(2).to(torch.int64)
        if pos.numel() != self.slots:
            raise InputError(f"{self.backend} NM: {pos.numel()} positions for {self.slots} value slots")
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= self.nm_m):
            raise InputError(f"{self.backend} NM({self.nm_n},{self.nm_m}): in-group positions must lie in [0, {self.nm_m})")
        # slots of a last, partial group may point past column n - 1 (padding): the kernels skip them
        per = 32 // pb
        words = -(-self.slots // per) if self.slots else 0
        padded = torch.zeros(words * per, dtype=torch.int64, device=self.dev_index)
        padded[: self.slots] = pos
        shifts = torch.arange(per, device=self.device, dtype=torch.int64) * pb
        packed = (padded.reshape(words, per) << shifts).sum(1) if words else padded
        packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
        self.words = torch.cat([packed, packed.new_zeros(4)]).contiguous()
        self.pos_bits, self.row_slots, self.idx = pb, S, torch.int32
        self.nnz = self.slots

    def _build_bsr(self, A: SparseTensor) -> None:
        m, n = self.shape
        bh, bw = bsr_params(A.format)
        bptr, bcol = A.pos(1), A.crd(1)
        if bptr.dtype != bcol.dtype:
            bptr, bcol = bptr.to(torch.int64), bcol.to(torch.int64)
        brows, bcols = -(-m // bh), -(-n // bw)
        nblocks = int(bcol.numel())
        _check_rowptr(bptr, brows, nblocks, f"{self.backend} BSR({bh},{bw}) block rows")
        _check_cols(bcol, bcols, f"{self.backend} BSR({bh},{bw}) block columns")
        if self.slots != nblocks * bh * bw:
            raise InputError(f"{self.backend} BSR({bh},{bw}): {self.slots} value slots for {nblocks} blocks")
        self.bh, self.bw, self.rowptr, self.col, self.idx = bh, bw, bptr.contiguous(), bcol.contiguous(), bptr.dtype
        self.nnz = self.slots
        self.vec = _vec_for(nblocks * bw / max(brows, 1))

    def _build_generated(self, A: SparseTensor) -> None:
        from .codegen import GeneratedSpmm  # noqa: PLC0415

        opts = getattr(self, "_gen_options", {})
        self.gen = GeneratedSpmm(A, variant=opts.get("variant"), autotune=bool(opts.get("autotune")))
        self.nnz, self.idx = self.slots, self.gen.idx

    # Values -------------------------------------------------------------------------------------
