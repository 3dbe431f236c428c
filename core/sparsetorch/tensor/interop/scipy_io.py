"""SciPy sparse arrays/matrices <-> SparseTensor. SciPy is imported only when used.

==========  ==========================================================  ===========================
scipy       sparsetorch format                                          buffers
==========  ==========================================================  ===========================
csr / csc   CSR / CSC; the compressed level is ``compressed(unordered)``  indptr, indices, data
            when indices are unsorted, ``nonunique`` when repeated        shared
bsr         BSR(R, C) (same level variants)                              shared; data (nblk, R, C)
                                                                         as a flat view
coo         COO / COO_ND(n) when sorted and unique, else unordered COO   coords, data shared;
                                                                         pos[0] = [0, nnz] is new
dia         DIA_J ``(i, j) -> (j - i : compressed, j : range)``;          offsets, data shared;
            offsets unsorted/repeated -> ``unordered``/``nonunique``      pos[0] = [0, ndiag] is new
==========  ==========================================================  ===========================

Copies happen only to repair what the engine cannot wrap: index arrays of mixed dtypes (cast
to int64), dia data whose width is not ``ncols`` (padded or trimmed), dia diagonals wholly
outside the matrix (dropped), non-native byte order or negative strides; and for csr / csc / bsr
with repeated or unsorted column indices, whose three arrays are copied, in both directions
(``from_scipy`` and ``to_scipy``): SciPy sums repeats and sorts indices in place, within the arrays,
from calls that look read-only (``scipy.sparse.linalg.norm``), which left a tensor sharing them reading
a compacted prefix with the old length (a wrong ``to_dense``, a crash in ``solve``) or its entries in
an order its cached coordinates and product plans no longer describe (a wrong ``A @ x``; session 26's
sweep). Canonical arrays (sorted, no repeats), which SciPy leaves as they are, stay shared. (A coo's
``sum_duplicates`` binds new arrays: shared alike.) The reader :func:`from_sparse_like` serves CuPy's
``cupyx.scipy.sparse`` too (same attributes).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...errors import InteropError, ValidationError
from ...format import BSR, CSC, CSR, DIA_J, TensorFormat
from ..sparse_tensor import SparseTensor
from ._common import (
    check_value_dtype, classify, coo_format, format_label, lex_props, no_counterpart,
    shared_batch_error, unify_index, wrap_scanned,
)

__all__ = ["from_scipy", "from_sparse_like", "to_scipy", "SCIPY_FORMATS"]

SCIPY_FORMATS = "csr, csc, coo, bsr and dia (formats CSR, CSC, COO, BSR(bh, bw) and DIA_J)"
_VECTOR = TensorFormat.parse("(i) -> (i : compressed)", name="SparseVector")
AsTensor = Callable[[Any], torch.Tensor]


def from_scipy(obj: Any, *, check: bool = True) -> SparseTensor:
    """Wrap a SciPy sparse array or matrix (csr, csc, coo, bsr, dia)."""
    import scipy.sparse as sp

    from .numpy_io import np_tensor

    if not sp.issparse(obj):
        raise InteropError(
            f"{type(obj).__module__}.{type(obj).__qualname__} is not a SciPy sparse array or matrix; "
            f"from_package takes scipy.sparse csr/csc/coo/bsr/dia arrays and matrices"
        )
    return from_sparse_like(obj, np_tensor, check=check, package="scipy")


def from_sparse_like(obj: Any, as_tensor: AsTensor, *, check: bool, package: str) -> SparseTensor:
    """Wrap a scipy-like sparse object (SciPy's or CuPy's), ``as_tensor`` turning its arrays
    into torch tensors without a copy."""
    fmt = obj.format
    if fmt not in ("csr", "csc", "bsr", "coo", "dia"):
        raise InteropError(
            f"{package} sparse format {fmt!r} ({type(obj).__name__}) is built for assembly, not compute, and "
            f"has no sparsetorch counterpart; convert it first: from_package(A.tocsr())"
        )
    shape = tuple(int(s) for s in obj.shape)
    values = as_tensor(obj.data)
    fix = f"A.astype({'numpy' if package == 'scipy' else package}.float64)"
    check_value_dtype(values.dtype, f"this {package} {fmt} of shape {shape}", fix)
    if fmt in ("csr", "csc", "bsr"):
        indptr, indices = unify_index(as_tensor(obj.indptr), as_tensor(obj.indices))
        if len(shape) == 1:  # SciPy's 1-D csr_array: one segment
            out = wrap_scanned(_VECTOR, 0, shape, [indptr], [indices], values, check)
            if not (out.format.is_unique and out.format.is_ordered):  # rewritten in place by SciPy (module docstring)
                indptr, indices, values = indptr.clone(), indices.clone(), values.clone()
                out = SparseTensor(out.format, shape, [indptr], [indices], values, check=False)
            return out
        if fmt == "bsr":
            base, extra = BSR(*(int(b) for b in obj.blocksize)), [None, None]
            values = values.reshape(-1)
        else:
            base, extra = (CSR if fmt == "csr" else CSC), []
        out = wrap_scanned(base, 1, shape, [None, indptr] + extra, [None, indices] + extra, values, check)
        if not (out.format.is_unique and out.format.is_ordered):  # SciPy may rewrite them in place (module docstring)
            indptr, indices, values = indptr.clone(), indices.clone(), values.clone()
            out = SparseTensor(out.format, shape, [None, indptr] + extra, [None, indices] + extra, values, check=False)
        return out
    if fmt == "coo":
        coords = getattr(obj, "coords", None)
        coords = unify_index(*(as_tensor(c) for c in (coords if coords is not None else (obj.row, obj.col))))
        return _wrap_coo(shape, coords, values, check)
    return _wrap_dia(shape, unify_index(as_tensor(obj.offsets))[0], values, check)


def _wrap_coo(shape: tuple[int, ...], coords: list[torch.Tensor], values: torch.Tensor, check: bool) -> SparseTensor:
    ndim = len(coords)
    pos0 = torch.tensor([0, coords[0].numel()], dtype=coords[0].dtype, device=coords[0].device)
    pos = [pos0] + [None] * (ndim - 1)
    st = SparseTensor(coo_format(ndim, False), shape, pos, coords, values, check=check)
    if all(lex_props(coords)):
        return SparseTensor(coo_format(ndim, True), shape, pos, coords, values, check=False)
    return st


def _wrap_dia(shape: tuple[int, ...], offsets: torch.Tensor, data: torch.Tensor, check: bool) -> SparseTensor:
    m, n = shape
    if data.dim() != 2 or data.shape[0] != offsets.numel() or offsets.dim() != 1:
        raise ValidationError(
            f"dia data must be (ndiag, width) with one row per offset; got data {tuple(data.shape)} and "
            f"offsets {tuple(offsets.shape)}"
        )
    inside = (offsets > -m) & (offsets < n)
    if not bool(inside.all()):  # diagonals that miss the matrix hold nothing: drop them
        data, offsets = data[inside], offsets[inside]
    width = data.shape[1]
    if width < n:  # columns past the data's width are zero
        data = torch.cat([data, data.new_zeros(data.shape[0], n - width)], 1)
    elif width > n:
        data = data[:, :n]
    pos0 = torch.tensor([0, offsets.numel()], dtype=offsets.dtype, device=offsets.device)
    return wrap_scanned(DIA_J, 0, shape, [pos0, None], [offsets, None], data.reshape(-1), check)


# SparseTensor -> scipy ---------------------------------------------------------------------------

def check_kind(kind: str) -> str:
    if kind not in ("array", "matrix"):
        raise InteropError(f"kind must be 'array' (scipy.sparse.csr_array, ...) or 'matrix' (csr_matrix, ...), got {kind!r}")
    return kind


def sparse_parts(t: SparseTensor, package: str, formats: str) -> tuple[str, dict[str, Any]]:
    """The scipy-like format name and the torch buffers it is built from (CPU or CUDA alike)."""
    if t.format.num_batch_levels:
        raise InteropError(
            f"format {format_label(t.format)} is batched and {package} has no batched sparse matrices; hand "
            f"over one matrix at a time, e.g. sparsetorch.from_package(t.to_package('torch')[k]).to_package({package!r})"
        )
    layout = classify(t.format)
    if layout is not None and layout.kind == "dia_row":
        raise InteropError(
            f"format {format_label(t.format)} indexes diagonal slots by row, {package}'s dia by column (DIA_J); "
            f"convert first: t.convert(sparsetorch.format.DIA_J).to_package({package!r})"
        )
    if layout is None or layout.kind in ("dense", "bsc"):
        raise no_counterpart(t, package, formats)
    if t.batch_shape:
        raise shared_batch_error(t, package, f"{package} sparse matrices have no batch")
    v = t.values
    if layout.kind in ("csr", "csc"):
        return layout.kind, {"data": v, "indices": t.crd(1), "indptr": t.pos(1)}
    if layout.kind == "bsr":
        bh, bw = layout.block
        if t.shape[0] % bh or t.shape[1] % bw:
            raise InteropError(
                f"{package}'s bsr needs the shape {tuple(t.shape)} to be a multiple of the block {bh}x{bw}; this "
                f"tensor has partial edge blocks. Use t.convert(sparsetorch.format.CSR).to_package({package!r})"
            )
        return "bsr", {"data": v.reshape(-1, bh, bw), "indices": t.crd(1), "indptr": t.pos(1), "blocksize": (bh, bw)}
    if layout.kind == "dia":
        if not layout.unique:
            raise InteropError(
                f"format {format_label(t.format)} allows repeated diagonals, which {package}'s dia does not; "
                f"sum them first: t.convert(sparsetorch.format.DIA_J).to_package({package!r})"
            )
        return "dia", {"data": v.reshape(t.crd(0).numel(), t.shape[1]), "offsets": t.crd(0)}
    level_of = {d: k for k, d in enumerate(layout.order)}
    coords = [t.crd(level_of[d]) for d in range(t.format.ndim)]
    return "coo", {"data": v, "coords": coords, "canonical": all(lex_props(coords))}


def to_scipy(t: SparseTensor, kind: str = "array") -> Any:
    """``t`` as a ``scipy.sparse`` array (``kind="array"``) or matrix, sharing its buffers (copies of them for a
    csr / csc / bsr with unsorted or repeated indices, which SciPy would rewrite in place)."""
    check_kind(kind)
    if t.device.type != "cpu":
        raise InteropError(f"this tensor is on {t.device}; SciPy works in host memory. Move it first: "
                           f"t.cpu().to_package('scipy') (or use to_package('cupy') on the GPU)")
    name, parts = sparse_parts(t, "scipy", SCIPY_FORMATS)
    import scipy.sparse as sp

    from .numpy_io import numpy_of

    cls = getattr(sp, f"{name}_{kind}")
    shape = tuple(t.shape)
    arr = {k: numpy_of(v) if isinstance(v, torch.Tensor) else v for k, v in parts.items()}
    if name == "coo":
        coords = [numpy_of(c) for c in parts["coords"]]
        if kind == "matrix" and len(coords) != 2:
            raise InteropError(f"scipy's coo_matrix is 2-D; this tensor has shape {shape}: use kind='array'")
        A = cls((arr["data"], tuple(coords)), shape=shape, copy=False)
        if hasattr(A, "coords"):
            if not all(_same(a, b) or a.dtype.itemsize > b.dtype.itemsize for a, b in zip(A.coords, coords)):
                A.coords = tuple(coords)
        else:  # SciPy < 1.13
            A.row, A.col = coords
        A.has_canonical_format = parts["canonical"]
        return _keep(A, data=arr["data"])
    if name == "dia":
        A = cls((arr["data"], arr["offsets"]), shape=shape, copy=False)
        return _keep(A, data=arr["data"], offsets=arr["offsets"])
    extra = {"blocksize": arr["blocksize"]} if name == "bsr" else {}
    if not (t.format.is_unique and t.format.is_ordered):
        # unsorted or repeated indices: SciPy sorts / sums them in place (module docstring), under the tensor
        arr = {k: (v.copy() if k in ("data", "indices", "indptr") else v) for k, v in arr.items()}
    A = cls((arr["data"], arr["indices"], arr["indptr"]), shape=shape, copy=False, **extra)
    return _keep(A, data=arr["data"], indices=arr["indices"], indptr=arr["indptr"])


def _same(a: Any, b: Any) -> bool:
    import numpy as np

    return a.dtype == b.dtype and a.shape == b.shape and (a.size == 0 or np.shares_memory(a, b))


def _keep(A: Any, **arrays: Any) -> Any:
    """Put our arrays back where the constructor swapped in a copy of the same or a narrower
    dtype (SciPy < 1.15 downcasts int64 indices that fit to int32); a widening it chose stays."""
    for name, arr in arrays.items():
        cur = getattr(A, name)
        if not _same(cur, arr) and arr.dtype.itemsize >= cur.dtype.itemsize:
            setattr(A, name, arr)
    return A

