"""Small CPU products without a parallel region.

torch's CPU CSR kernels (``csr @ X``, ``torch.mv`` / ``torch.mm`` on a CSR tensor) open an
intra-op parallel region whatever the size of the product, where torch's dense kernels stay
serial below a grain size. On a machine whose cores are busy (DataLoader workers, other jobs,
several processes each with its own thread pool) a parallel region waits for every thread of the
pool to be scheduled: a product of a few microseconds then takes a scheduler time slice or more.
Measured (``benchmarks/bench_serial_spmv.py``; ``benchmarks/results/serial_spmv_h200host_s19b.json``:
16 cores, torch on 16 threads): with 16 other busy processes, a 1024-row Poisson matrix times a
vector took 34 ms median by torch's CSR kernel and 12.7 us here (idle: 11.7 against 15.4 us; 4096
rows 11.8 against 20.3 us); on a 2-core machine with other work, a 256-row one 8-16 ms, and
``st.solve`` on it (whose accuracy check multiplies by A) 17 ms against SciPy's 0.6 ms.

Products up to :data:`SERIAL_MAX` multiply-adds therefore run here, serially on the tensors'
buffers (zero-copy views): by SciPy's compiled CSR kernels when SciPy is installed (the core does
not require it; looked up on first use), else in NumPy (one gather of X's rows, one multiply and
one segmented sum). Each row is summed in storage order, like torch's kernel. Larger products keep
torch's kernel, whose threads then pay off; so does a process running torch on one thread (no
parallel region to wait for).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["SERIAL_MAX", "SERIAL_DTYPES", "serial_ok", "SerialCsr"]

#: products of at most this many multiply-adds (stored entries x columns of X) run serially
SERIAL_MAX = 1 << 15

_KERNELS: list = []  # [SciPy's _sparsetools module or None], filled on first use


def _scipy_kernels():
    """SciPy's compiled CSR products (``csr_matvec`` / ``csr_matvecs``), or None without SciPy."""
    if not _KERNELS:
        try:
            from scipy.sparse import _sparsetools as spt  # an optional dependency of the core

            spt.csr_matvec, spt.csr_matvecs  # noqa: B018 - both must exist
        except Exception:  # noqa: BLE001 - no SciPy, or one whose private layout changed: NumPy then
            spt = None
        _KERNELS.append(spt)
    return _KERNELS[0]

#: value dtypes NumPy multiplies as torch does (half precision upcasts before reaching a product)
SERIAL_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def serial_ok(values: torch.Tensor, X: torch.Tensor, *, threads: bool = True) -> bool:
    """Whether ``A X`` with these values and right-hand sides runs here: CPU, one value set, the
    same supported dtype, strided, nothing to record for autograd, small, and (``threads``) torch
    running more than one intra-op thread (with one, torch's kernel opens no parallel region and is
    ~2x faster: a caller whose other work is NumPy's anyway passes ``threads=False``)."""
    return (values.device.type == "cpu" and X.device.type == "cpu" and values.dim() == 1 and X.dim() in (1, 2)
            and values.dtype in SERIAL_DTYPES and X.dtype == values.dtype
            and values.layout == torch.strided and X.layout == torch.strided
            and not (values.is_conj() or X.is_conj() or values.is_neg() or X.is_neg())
            and values.shape[0] * (X.shape[1] if X.dim() == 2 else 1) <= SERIAL_MAX
            and not (torch.is_grad_enabled() and (values.requires_grad or X.requires_grad))
            and (not threads or torch.get_num_threads() > 1))


class SerialCsr:
    """``Y = A X`` for one CSR pattern of ``shape`` (``crow``, ``col``: CPU int32 / int64, checked by the
    caller), serially: SciPy's compiled kernel, or NumPy without SciPy. What the pattern alone
    decides is worked out once; calls read the values passed to them where they lie. Stateless per
    call: safe from several threads at once."""

    __slots__ = ("m", "n", "nnz", "ptr", "col", "starts", "lead", "empty", "spt")

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, shape: tuple[int, int]) -> None:
        cp = crow.detach().numpy()
        self.m, self.n = int(shape[0]), int(shape[1])
        self.nnz = int(col.shape[0])
        self.col = np.ascontiguousarray(col.detach().numpy())
        self.ptr = np.ascontiguousarray(cp, dtype=self.col.dtype)  # SciPy's kernels take one index dtype
        self.spt = _scipy_kernels()
        # np.add.reduceat sums per[starts[i]:starts[i + 1]] (the last to the end) and needs every start
        # below len(per): the rows that end the matrix empty (their start is nnz) are left out of it
        # (zeros), and an empty row elsewhere, which gets per[starts[i]] instead of zero, is zeroed after
        self.lead = int(np.searchsorted(cp[:-1], self.nnz, side="left")) if self.nnz else 0
        self.starts = cp[: self.lead].astype(np.intp)
        empty = np.flatnonzero(cp[1 : self.lead + 1] == cp[: self.lead])
        self.empty = empty if empty.size else None

    def inf_norm(self, values: torch.Tensor) -> float:
        """``||A||_inf``: the largest row sum of ``|a_ij|`` (0.0 for a matrix with no entries), serially."""
        v = (values.detach() if values.requires_grad else values).numpy()
        if v.shape[0] != self.nnz:
            raise ValueError(f"SerialCsr: {v.shape[0]} values for a pattern of {self.nnz} entries")
        if not self.lead:
            return 0.0
        sums = np.add.reduceat(np.abs(v), self.starts)
        if self.empty is not None:
            sums[self.empty] = 0
        return float(sums.max())

    def __call__(self, values: torch.Tensor, X: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``A X`` for ``values`` (1-D, ``nnz``) and ``X`` ((n,) or (n, k)); into ``out`` (contiguous,
        ``(m,)`` / ``(m, k)``, the result's shape) when given, else a new tensor. Shapes are checked (a
        ValueError naming them), as torch's kernel checks them."""
        v = (values.detach() if values.requires_grad else values).numpy()
        xn = (X.detach() if X.requires_grad else X).numpy()
        if v.shape[0] != self.nnz:
            raise ValueError(f"SerialCsr: {v.shape[0]} values for a pattern of {self.nnz} entries")
        if xn.shape[0] != self.n or (out is not None and out.shape != (self.m,) + xn.shape[1:]):
            raise ValueError(f"SerialCsr: shapes do not match: A is {self.m} x {self.n}, X {tuple(xn.shape)}"
                             + ("" if out is None else f", out {tuple(out.shape)}"))
        if self.spt is not None:
            res = np.zeros((self.m,) + xn.shape[1:], dtype=xn.dtype) if out is None else out.numpy()
            if out is not None:
                res[...] = 0
            v, xn = np.ascontiguousarray(v), np.ascontiguousarray(xn)
            if xn.ndim == 1:
                self.spt.csr_matvec(self.m, self.n, self.ptr, self.col, v, xn, res)  # res += A x
            else:
                self.spt.csr_matvecs(self.m, self.n, xn.shape[1], self.ptr, self.col, v, xn, res)
            return torch.from_numpy(res) if out is None else out
        per = xn[self.col]
        per *= v if per.ndim == 1 else v[:, None]
        if self.lead == self.m:
            res = np.add.reduceat(per, self.starts, axis=0)
        else:
            res = np.zeros((self.m,) + xn.shape[1:], dtype=xn.dtype)
            if self.lead:
                res[: self.lead] = np.add.reduceat(per, self.starts, axis=0)
        if self.empty is not None:
            res[self.empty] = 0
        if out is None:
            return torch.from_numpy(res)
        out.numpy()[...] = res
        return out
