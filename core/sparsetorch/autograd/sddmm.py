"""The sampled product ``SDDMM`` behind every values-gradient: ``P Q^H`` at A's stored entries."""

from __future__ import annotations

import math

import torch

from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain

__all__ = ["sddmm"]


def sddmm(A: SparseTensor, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """``sum_c P[..., row, c] * conj(Q[..., col, c])`` for every stored entry of ``A``, in A's value
    slots (padding slots get zero). Differentiable in ``P`` and ``Q`` (second derivatives).

    One column (the common case: a vector right-hand side) skips the reduction over columns; many
    columns on a matrix that is not too sparse take one dense product and keep its stored entries;
    otherwise the per-entry gathers run in chunks. A pattern whose entries fill its value slots in
    order (CSR, CSC, COO: no padding) skips the scatter into the slots."""
    Qc = Q.conj() if Q.is_complex() else Q
    if _plain_csr(A) and P.dim() == 2 and Q.dim() == 2 and P.shape[-1] == 1 and Q.shape[-1] == 1:
        # One vector on a CSR matrix (the backward of most solves): rows by repeating P along
        # crow, the column index used as it is: no entry list (rows, columns and slots, three
        # nnz-long int64 tensors kept in the pattern cache) and one gather instead of two.
        crow, col = A.pos(1), A.crd(1)
        rep = torch.repeat_interleave(P[:, 0], crow.diff(), output_size=col.numel())
        return rep * Qc[:, 0].index_select(0, col)
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    k = P.shape[-1]
    if k == 1 and Q.shape[-1] == 1:
        per = P[..., 0].index_select(-1, rows) * Qc[..., 0].index_select(-1, cols)
    elif _dense_sampling(A, P, rows.numel()):
        # many columns on a not-too-sparse matrix (a sparse layer's batch): one GEMM for every
        # (i, j), then the stored ones. Gathering both factors per entry moved 2 nnz k values
        # and was 50x a dense layer's backward at 50 % density (benchmarks/results/nn_cpu.json).
        G = P @ Qc.mT
        per = G.reshape(*G.shape[:-2], -1).index_select(-1, _linear_index(A, rows, cols))
    else:
        # per entry gathers, in chunks that keep the (chunk, k) temporaries near _SDDMM_CHUNK_BYTES;
        # rows must be contiguous (a transposed X, a layer's batch, made each gather 20x slower)
        P, Qc = P.contiguous(), Qc.contiguous()
        budget = _SDDMM_CHUNK_BYTES if P.device.type == "cpu" else _SDDMM_CHUNK_BYTES_DEVICE
        step = max(1, budget // max(1, k * P.element_size() * max(1, math.prod(P.shape[:-2]))))
        per = torch.cat([(P.index_select(-2, rows[s:s + step]) * Qc.index_select(-2, cols[s:s + step])).sum(-1)
                         for s in range(0, rows.numel(), step)], -1) if rows.numel() else \
            P.new_zeros(*P.shape[:-2], 0)
    nlin = A.values.shape[-1]
    if _slots_in_order(A, slot, nlin):
        return per
    out = per.new_zeros(*per.shape[:-1], nlin)
    return out.index_add(-1, slot, per)


#: the dense sampled product is used up to this many bytes for the (m, n) product...
_SDDMM_DENSE_BYTES = 256 * 2**20
#: ... and when at least this fraction of the (i, j) are stored. Measured (CPU, one thread,
#: 4096 x 4096, k = 64): the dense product 52-91 ms; chunked gathers 216 ms at 50 % density,
#: 36.5 ms at 10 %, 11.8 ms at 3 %, 4.3 ms at 1 %: the crossover is near 12 %
_SDDMM_DENSE_DENSITY = 0.12
#: per-entry gathers work in chunks of about this many bytes of temporaries: small enough for the
#: allocator to reuse them (64 MB chunks were 16x slower, from fresh pages on every chunk)
_SDDMM_CHUNK_BYTES = 4 * 2**20
#: on a GPU (a caching allocator, launch-bound small kernels) the chunks are larger
_SDDMM_CHUNK_BYTES_DEVICE = 256 * 2**20


def _linear_index(A: SparseTensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``rows * n + cols`` (entry positions in a row-major (m, n) buffer), kept on the pattern."""
    cache = A._cache
    lin = cache.get("sddmm_linear_index")
    if lin is None:
        lin = rows * A.format_shape[-1] + cols
        if is_plain(lin):
            cache["sddmm_linear_index"] = lin
    return lin


def _dense_sampling(A: SparseTensor, P: torch.Tensor, nnz: int) -> bool:
    if P.shape[-1] < 8:
        return False
    m, n = A.format_shape[-2], A.format_shape[-1]
    batch = P[..., 0, 0].numel()
    return (len(A.format_shape) == 2 and m * n * batch * P.element_size() <= _SDDMM_DENSE_BYTES
            and nnz >= _SDDMM_DENSE_DENSITY * m * n)


def _plain_csr(A: SparseTensor) -> bool:
    """A 2-D CSR matrix with one set of values, stored in entry order (no padding)."""
    from ..format import CSR

    return A.format == CSR and A.values.dim() == 1 and A.values.shape[-1] == A.crd(1).shape[-1]


def _slots_in_order(A: SparseTensor, slot: torch.Tensor, nlin: int) -> bool:
    """Whether entry ``k`` of ``A.entries()`` is value slot ``k`` for every ``k`` (pattern-only,
    cached on the pattern)."""
    if slot.numel() != nlin:
        return False
    cache = A._cache
    got = cache.get("slots_in_order")
    if got is None:
        got = nlin == 0 or bool((slot == torch.arange(nlin, device=slot.device)).all())
        if is_plain(slot):
            cache["slots_in_order"] = got
    return got
