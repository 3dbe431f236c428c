"""Krylov plans of the torch backend: CG, BiCGStab, GMRES(m), MINRES with Jacobi, block-Jacobi
or a user preconditioner. The product plan and the preconditioner are the pattern/value work;
``solve`` only iterates. Adjoint solves reuse both (with the conjugate transpose)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from ...errors import InputError
from ...dispatch.results import IterationResult
from ...tensor import SparseTensor
from .krylov import bicgstab, block_jacobi, cg, gmres, jacobi, minres
from .cost import PATTERN_PRECONDITIONERS, POLY_DEGREE
from .krylov.incomplete import IncompletePattern, ic0, ilu0, polynomial, ssor
from .spmm import TorchSpmmPlan

__all__ = ["KrylovPlan", "KRYLOV", "diagonal_of", "diagonal_blocks_of"]

KRYLOV = {"cg": cg, "bicgstab": bicgstab, "gmres": gmres, "minres": minres}
#: the Chebyshev preconditioner's interval ratio (backend_options "poly_ratio"; its degree: cost.POLY_DEGREE)
POLY_RATIO = 30.0


def diagonal_of(A: SparseTensor, values: torch.Tensor) -> torch.Tensor:
    """The main diagonal of ``A`` with ``values`` (*batch, n): explicit entries summed, zeros elsewhere."""
    coords, slot = A.entries()
    on = coords[0] == coords[1]
    n = A.format_shape[0]
    d = values.new_zeros(*values.shape[:-1], n)
    return d.index_add(-1, coords[0][on], values[..., slot[on]])


def diagonal_blocks_of(A: SparseTensor, values: torch.Tensor, bs: int) -> torch.Tensor:
    """Dense diagonal blocks (*batch, nblocks, bs, bs); a last partial block is padded with I."""
    coords, slot = A.entries()
    r, c = coords[0], coords[1]
    on = (r // bs) == (c // bs)
    n = A.format_shape[0]
    nblocks = -(-n // bs)
    flat = values.new_zeros(*values.shape[:-1], nblocks * bs * bs)
    idx = (r[on] // bs) * bs * bs + (r[on] % bs) * bs + (c[on] % bs)
    flat = flat.index_add(-1, idx, values[..., slot[on]])
    blocks = flat.reshape(*values.shape[:-1], nblocks, bs, bs)
    pad = nblocks * bs - n
    if pad:
        eye = torch.zeros(bs, bs, dtype=values.dtype, device=values.device)
        eye[bs - pad :, bs - pad :] = torch.eye(pad, dtype=values.dtype, device=values.device)
        blocks = blocks.clone()
        blocks[..., -1, :, :] += eye
    return blocks


class KrylovPlan:
    """One Krylov method with its preconditioner on a fixed pattern."""

    backend = "torch"
    #: new values cost a pointer swap (and Jacobi's diagonal, or block Jacobi's small LUs):
    #: reload them on every call rather than keep an nnz-sized snapshot to compare with
    reload_cheap = True

    def __init__(self, A: SparseTensor, method: str, options: dict, *, hermitian: bool = False) -> None:
        self.method = method
        #: A = A^H (known or detected): adjoint solves (the backward pass) run the forward operator
        #: and never build the transposed CSR (values, indices and a sort: 4x the forward's memory
        #: at the backward's peak, measured on the H200 at 1M unknowns)
        self.hermitian = hermitian
        self._A = A
        self._mm = TorchSpmmPlan(A)
        self._options = options
        pre = options.get("preconditioner")
        if pre is None or (isinstance(pre, str) and pre in ("none", "identity")):
            self.preconditioner = None
        elif isinstance(pre, str) and pre in ("jacobi", "block_jacobi") + PATTERN_PRECONDITIONERS:
            self.preconditioner = pre
        elif callable(pre):
            self.preconditioner = "user"
        else:
            raise InputError(
                f"preconditioner={pre!r} is not known to the torch backend; use 'jacobi', 'block_jacobi', 'ic0', "
                f"'ilu0', 'ssor', 'polynomial', None, or a callable applying M^-1 to an (n, k) tensor"
            )
        self._M: Callable | None = None
        self._M_adj: Callable | None = None
        self._pattern: IncompletePattern | None = None  # the pattern preconditioners' symbolic part, on first use

    def set_values(self, values: torch.Tensor) -> None:
        values = values.detach()
        self._mm.set_values(values)
        n = self._A.format_shape[0]
        pre = self._options.get("preconditioner")
        if self.preconditioner == "jacobi":
            d = diagonal_of(self._A, values)
            self._M = jacobi(d)
            self._M_adj = jacobi(d.conj()) if d.is_complex() else self._M
        elif self.preconditioner == "block_jacobi":
            bs = int(self._options.get("block_size") or 4)
            blocks = diagonal_blocks_of(self._A, values, bs)
            self._M = block_jacobi(blocks, n)
            bh = blocks.transpose(-2, -1)
            self._M_adj = block_jacobi(bh.conj() if bh.is_complex() else bh, n)
        elif self.preconditioner in PATTERN_PRECONDITIONERS:
            self._M, self._M_adj = self._pattern_preconditioner(values)
        elif self.preconditioner == "user":
            self._M = self._M_adj = pre
        else:
            self._M = self._M_adj = None

    def _pattern_preconditioner(self, values: torch.Tensor) -> tuple[Callable, Callable]:
        """ic0 / ilu0 / ssor / polynomial (krylov/incomplete.py) from the stored entries' ``values``."""
        coords, slot = self._A.entries()
        if self._pattern is None:
            self._pattern = IncompletePattern(coords[0], coords[1], self._A.format_shape[0], values.device)
        stored = values[..., slot]
        opts = self._options.get("backend_options") or {}
        name = self.preconditioner
        if name == "ic0":
            M = ic0(self._pattern, stored)
            return M, M
        if name == "ilu0":
            return ilu0(self._pattern, stored)
        if name == "ssor":
            return ssor(self._pattern, stored, float(opts.get("ssor_omega", 1.0)))
        return polynomial(self._pattern, stored, lambda X: self._mm.apply(X), lambda X: self._mm.apply(X, adjoint=True),
                          degree=opts.get("poly_degree", POLY_DEGREE), ratio=opts.get("poly_ratio", POLY_RATIO))

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """Iterate on ``B`` with this call's ``options`` (rtol, atol, maxiter, check_every, callback)."""
        o = {**self._options, **{k: v for k, v in (options or {}).items() if k == "callback" or v is not None}}
        fn = KRYLOV[self.method]
        kw = dict(
            x0=None,
            rtol=o.get("rtol", 1e-6),
            atol=o.get("atol", 0.0),
            maxiter=o.get("maxiter"),
            M=self._M_adj if adjoint else self._M,
            check_every=o.get("check_every") or 8,
            callback=o.get("callback"),
        )
        if self.method == "gmres":
            kw["restart"] = o.get("restart") or 30
        if self.method == "cg":
            # our product and Jacobi never synchronise and read fixed buffers: capturable (the
            # solver captures only on a GPU); backend_options
            # {"cuda_graph": False} or SPARSETORCH_CUDA_GRAPHS=0 turn it off
            graph = (o.get("backend_options") or {}).get("cuda_graph", True)
            # (the polynomial preconditioner is products and vector operations on fixed buffers: capturable too)
            kw["cuda_graph"] = self.preconditioner in (None, "jacobi", "polynomial") and graph is not False
        if adjoint and self.hermitian:
            # A^H = A; the preconditioners built from A's values are then Hermitian too (Jacobi's
            # diagonal is real, block Jacobi's blocks are Hermitian), user callables are the user's
            adjoint = False
            if self.preconditioner in ("jacobi", "block_jacobi") + PATTERN_PRECONDITIONERS:
                kw["M"] = self._M
        return fn(lambda X: self._mm.apply(X, adjoint=adjoint), B, **kw)

