"""Sparse @ sparse: ``A @ B`` of two :class:`SparseTensor` matrices, a CSR :class:`SparseTensor`.

The product is formed by index arithmetic that runs as it is on the CPU and on CUDA: every stored
entry ``A[i, p]`` meets every stored entry ``B[p, j]`` of row ``p`` of B (one *product* each), and
the products of one ``(i, j)`` are summed into one stored entry of C (sorted, unique: CSR). The
pairing (which entry of A and of B each product reads, which slot of C it adds into) depends on
the patterns only; the values are then one gather, one multiply and one ``index_add``.

Gradients (the adjoint of the bilinear map, on the operands' patterns):
``dA = (dC @ B^H)`` sampled at A's pattern and ``dB = (A^H @ dC)`` sampled at B's pattern: both are
the same pairing run backwards (each product hands ``dC[slot] * conj(b)`` to its entry of A and
``conj(a) * dC[slot]`` to its entry of B), so no product of the full matrices is formed. The
backward pass is written in differentiable torch ops (second derivatives work).

Value batches (a shared pattern with values ``(*batch, nse)``) broadcast against each other; formats
with BATCH levels (one pattern per member) are refused: split them (SparseTensorList) and multiply
member by member.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from ..format import CSR
from ..tensor import SparseTensor

__all__ = ["spgemm"]


def _check(A: object, B: object, op: str) -> None:
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, SparseTensor):
            raise InputError(f"{op}: sparse @ sparse takes two SparseTensors; {name} is a {type(t).__name__}")
        if len(t.format_shape) != 2 or t.format.num_batch_levels:
            raise InputError(f"{op}: sparse @ sparse needs matrices; {name} has format shape {tuple(t.format_shape)} "
                             f"({t.format}); multiply the members of a pattern batch one by one (SparseTensorList)")
        if not (t.dtype.is_floating_point or t.dtype.is_complex):
            raise InputError(f"{op}: {name} has dtype {t.dtype}; use a floating point or complex dtype")
    assert isinstance(A, SparseTensor) and isinstance(B, SparseTensor)
    if A.dtype != B.dtype:
        raise InputError(f"{op}: A has dtype {A.dtype} but B has {B.dtype}; cast one of them (no silent promotion)")
    if A.device != B.device:
        raise InputError(f"{op}: A is on {A.device} but B is on {B.device}; move them to one device")
    k, k2 = A.format_shape[1], B.format_shape[0]
    if k != k2:
        raise InputError(f"{op}: A of shape {tuple(A.shape)} and B of shape {tuple(B.shape)} cannot be multiplied: A has "
                         f"{k} columns, B has {k2} rows")
    try:
        torch.broadcast_shapes(tuple(A.batch_shape), tuple(B.batch_shape))
    except RuntimeError:
        raise InputError(f"{op}: A's value batch {tuple(A.batch_shape)} (shape {tuple(A.shape)}) and B's "
                         f"{tuple(B.batch_shape)} (shape {tuple(B.shape)}) do not broadcast") from None


def _pairing(A: SparseTensor, B: SparseTensor):
    """The symbolic phase: ``(ga, gb, slot, crow, col)``: for every product, A's value slot, B's value slot
    and C's entry it adds into; C's CSR row pointers and column indices."""
    m, _ = A.format_shape
    k, n = B.format_shape
    (ca, sa), (cb, sb) = A.entries(), B.entries()
    dev = ca.device
    rows_a, cols_a = ca[0].long(), ca[1].long()
    rows_b, cols_b = cb[0].long(), cb[1].long()
    # B's entries grouped by row (stable: a row's entries keep their order)
    order = torch.argsort(rows_b, stable=True)
    per_row = torch.bincount(rows_b, minlength=k)
    row_start = torch.cumsum(per_row, 0) - per_row
    counts = per_row.index_select(0, cols_a)  # products of each entry of A
    total = int(counts.sum()) if counts.numel() else 0
    ia = torch.repeat_interleave(torch.arange(rows_a.numel(), device=dev), counts, output_size=total)
    first = torch.cumsum(counts, 0) - counts  # each entry of A's first product
    offset = torch.arange(total, device=dev) - first.index_select(0, ia)
    ib = order.index_select(0, row_start.index_select(0, cols_a.index_select(0, ia)) + offset)
    key = rows_a.index_select(0, ia) * n + cols_b.index_select(0, ib)
    # the products' entries of C: a stable sort and its runs (faster than torch.unique's inverse on the CPU)
    perm = torch.argsort(key, stable=True)
    sk = key.index_select(0, perm)
    new = torch.ones_like(sk, dtype=torch.bool)
    if total > 1:
        torch.ne(sk[1:], sk[:-1], out=new[1:])
    uniq = sk[new]
    slot = torch.empty_like(perm).index_copy_(0, perm, torch.cumsum(new, 0) - 1)
    crow = torch.zeros(m + 1, dtype=torch.int64, device=dev)
    if uniq.numel():
        crow[1:] = torch.cumsum(torch.bincount(uniq // n, minlength=m), 0)
    col = uniq % n if n else uniq
    return sa.long().index_select(0, ia), sb.long().index_select(0, ib), slot, crow, col


#: pairings kept per pattern of A (in A's pattern cache, emptied when an index buffer is written), by B's pattern
_KEEP = 4


def _cached_pairing(A: SparseTensor, B: SparseTensor):
    """:func:`_pairing`, kept on A's pattern for B's (a product repeated on the same patterns, new values: a
    training loop's, pays the symbolic phase once)."""
    if torch.is_inference_mode_enabled():
        return _pairing(A, B)
    try:
        store = A._cache.setdefault("spgemm", {})
        key = B.pattern_key
    except RuntimeError:  # buffers without storage (a torch.func transform): no identity to keep
        return _pairing(A, B)
    got = store.get(key)
    if got is None:
        got = _pairing(A, B)
        for k in [k for k in store if not k.alive()]:
            del store[k]
        while len(store) >= _KEEP:
            del store[next(iter(store))]
        store[key] = got
    return got


def _gather(v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return v.index_select(-1, idx)


class _SpGEMM(torch.autograd.Function):
    """``C.values`` from ``A.values`` and ``B.values`` on a pairing (``ga``, ``gb``, ``slot``, ``nnz``). Written with
    ``setup_context`` and out-of-place ops, so torch.func's grad / vmap / jacrev take it (vmap by the generated rule)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(va: torch.Tensor, vb: torch.Tensor, ga: torch.Tensor, gb: torch.Tensor, slot: torch.Tensor,
                nnz: int) -> torch.Tensor:
        prods = _gather(va, ga) * _gather(vb, gb)
        return prods.new_zeros(prods.shape[:-1] + (nnz,)).index_add(-1, slot, prods)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        va, vb, ga, gb, slot, _ = inputs
        ctx.save_for_backward(va, vb, ga, gb, slot)

    @staticmethod
    def backward(ctx, dc: torch.Tensor):  # noqa: ANN001, ANN205
        va, vb, ga, gb, slot = ctx.saved_tensors
        da = db = None
        dp = _gather(dc, slot)  # dC at each product's entry of C
        if ctx.needs_input_grad[0]:
            terms = dp * _gather(vb, gb).conj()
            da = terms.new_zeros(terms.shape[:-1] + va.shape[-1:]).index_add(-1, ga, terms).sum_to_size(va.shape)
        if ctx.needs_input_grad[1]:
            terms = _gather(va, ga).conj() * dp
            db = terms.new_zeros(terms.shape[:-1] + vb.shape[-1:]).index_add(-1, gb, terms).sum_to_size(vb.shape)
        return da, db, None, None, None, None


_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None) or (lambda: False)
#: dtypes SciPy's sparse product takes (the no-gradient CPU path below)
_SCIPY_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _scipy_csr(t: SparseTensor):  # noqa: ANN202 - a SciPy matrix
    """``t`` as a SciPy CSR matrix (zero-copy where the layouts agree; other formats through a CSR copy)."""
    from ..errors import InteropError  # noqa: PLC0415

    try:
        return t.to_package("scipy").tocsr()
    except InteropError:  # DIA, ELL, DELTA, BSR-like formats SciPy does not hold as they are
        return t.convert(CSR).to_package("scipy").tocsr()


def _scipy_product(A: SparseTensor, B: SparseTensor) -> SparseTensor | None:
    """The product by SciPy's CSR SpGEMM (Gustavson's, a dense accumulator per row: O(products), no sort of
    them) where nothing needs a gradient: one unbatched CPU product of a dtype SciPy takes, no torch.func
    transform or compilation active. None where it does not apply (SciPy missing included). Measured on a
    90,000^2 5-point Laplacian squared (2.2M products, this repository's 2-core VM): ~0.02 s against ~0.9 s
    for the pairing's symbolic phase below. SciPy drops entries whose products cancel to exactly 0; the result
    keeps them, as the pairing does (the same pattern with or without gradients), by a second product of the
    patterns where the counts differ."""
    if (A.device.type != "cpu" or A.batch_shape or B.batch_shape or A.dtype not in _SCIPY_DTYPES
            or (torch.is_grad_enabled() and (A.values.requires_grad or B.values.requires_grad))
            or _transforms_active() or torch.compiler.is_compiling()):
        return None
    try:
        import numpy as np  # noqa: PLC0415 - optional: the core runs without SciPy
        import scipy.sparse  # noqa: PLC0415
    except ImportError:
        return None
    a, b = _scipy_csr(A), _scipy_csr(B)
    a.sum_duplicates()
    b.sum_duplicates()
    c = (a @ b).tocsr()
    c.sort_indices()
    ones = scipy.sparse.csr_matrix((np.ones_like(a.data, dtype=np.float32), a.indices, a.indptr), shape=a.shape) @ \
        scipy.sparse.csr_matrix((np.ones_like(b.data, dtype=np.float32), b.indices, b.indptr), shape=b.shape)
    if ones.nnz != c.nnz:  # products cancelled to exactly 0 somewhere: put the values on the structural pattern
        ones = ones.tocsr()
        ones.sort_indices()
        n = c.shape[1]
        keys = np.repeat(np.arange(ones.shape[0], dtype=np.int64), np.diff(ones.indptr)) * n + ones.indices
        ckeys = np.repeat(np.arange(c.shape[0], dtype=np.int64), np.diff(c.indptr)) * n + c.indices
        data = np.zeros(ones.nnz, dtype=c.dtype)
        data[np.searchsorted(keys, ckeys)] = c.data
        c = scipy.sparse.csr_matrix((data, ones.indices, ones.indptr), shape=c.shape)
    m, n = A.format_shape[0], B.format_shape[1]
    crow = torch.from_numpy(c.indptr)  # SciPy's index dtype (int32 while it fits), no copy
    col = torch.from_numpy(c.indices.astype(c.indptr.dtype, copy=False))
    values = torch.from_numpy(c.data).to(A.dtype)
    return SparseTensor(CSR, (m, n), [None, crow], [None, col], values, check=False)


def spgemm(A: SparseTensor, B: SparseTensor) -> SparseTensor:
    """``A @ B`` for sparse ``A`` (m x k) and ``B`` (k x n) of one dtype and device: a CSR SparseTensor
    (m x n) of the product's structural nonzeros (sorted, unique; entries that cancel to 0 are kept),
    equal to the dense product. Differentiable in both operands' values; value batches broadcast. Where
    no gradient is asked for, one CPU product goes through SciPy's SpGEMM when SciPy is installed (the same
    pattern: entries that cancel are kept there too).
    ``sparsetorch.matmul(A, B)`` and ``A @ B`` call it when ``B`` is a SparseTensor."""
    _check(A, B, "matmul")
    A.ensure_valid()
    B.ensure_valid()
    quick = _scipy_product(A, B)
    if quick is not None:
        return quick
    m, _ = A.format_shape
    _, n = B.format_shape
    ga, gb, slot, crow, col = _cached_pairing(A, B)
    values = _SpGEMM.apply(A.values, B.values, ga, gb, slot, int(col.numel()))
    return SparseTensor(CSR, (m, n), [None, crow], [None, col], values, check=False)
