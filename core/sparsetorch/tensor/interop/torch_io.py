"""PyTorch layouts <-> SparseTensor.

=====================  ===========================================  =====================================
torch layout           sparsetorch format                            buffers
=====================  ===========================================  =====================================
sparse_coo coalesced   COO / COO_ND(n)                               indices rows, values: shared;
                                                                     pos[0] = [0, nnz] is new
sparse_coo otherwise   unordered COO (``compressed(nonunique,         shared (duplicates sum in to_dense)
                       unordered), singleton(nonunique, unordered)``)
sparse_csr / csc       CSR / CSC (``batched(...)`` for crow (B, m+1)) shared
sparse_bsr / bsc       BSR(bh, bw) / BSC(bh, bw) (batched too)       shared; values (nblk, bh, bw) as a
                                                                     flat view
strided                DENSE / DENSE_ND(n); DENSE_COL (transposed);  values = a view when the strides are
                       any dense level order for permuted strides    a permutation of row-major, else a copy
=====================  ===========================================  =====================================

Back to torch the same table applies; COO indices are one (ndim, nnz) int64 tensor (the
original one when the rows are views of it, else a stack) and ``is_coalesced`` is set when the
indices are sorted and unique (checked on the data, O(nnz)).
"""

from __future__ import annotations

import warnings

import torch

from ...errors import InteropError, ValidationError
from ...format import BSC, BSR, CSC, CSR, batched
from ..sparse_tensor import SparseTensor
from ._common import (
    Layout, check_value_dtype, classify, coo_format, dense_format, format_label, lex_props,
    no_counterpart, shared_batch_error,
)

__all__ = ["from_torch", "from_strided", "to_torch", "compressed_tensor"]

_CTORS = {"csr": torch.sparse_csr_tensor, "csc": torch.sparse_csc_tensor, "bsr": torch.sparse_bsr_tensor,
          "bsc": torch.sparse_bsc_tensor}
_QUIET: set = set()  # the kinds built once here: torch's notices for them are spent


def compressed_tensor(kind: str, comp: torch.Tensor, plain: torch.Tensor, values: torch.Tensor,
                      shape: tuple) -> torch.Tensor:
    """torch's compressed sparse tensor of ``kind`` ("csr", "csc", "bsr", "bsc") over index buffers the core
    checked (``check_invariants=False``), without torch's "in beta" / invariant-check notices. torch gives
    them once per process, so only the first construction of a kind is made under a warning filter (the
    filter costs several microseconds: this runs per product on the solves' and the bound products' paths)."""
    ctor = _CTORS[kind]
    if kind in _QUIET:
        return ctor(comp, plain, values, shape, check_invariants=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse (CSR|CSC|BSR|BSC) tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        out = ctor(comp, plain, values, shape, check_invariants=False)
    _QUIET.add(kind)
    return out

_COMPRESSED = {
    torch.sparse_csr: ("csr", "crow_indices", "col_indices"),
    torch.sparse_csc: ("csc", "ccol_indices", "row_indices"),
    torch.sparse_bsr: ("bsr", "crow_indices", "col_indices"),
    torch.sparse_bsc: ("bsc", "ccol_indices", "row_indices"),
}

TORCH_FORMATS = (
    "COO (any order, coalesced or not), CSR, CSC, BSR(bh, bw), BSC(bh, bw), their batched(...) "
    "forms, and dense formats (DENSE, DENSE_COL, DENSE_ND and other dense level orders)"
)


def from_torch(t: torch.Tensor, *, check: bool = True) -> SparseTensor:
    """Wrap a torch tensor of any layout (see the module table)."""
    if t.layout == torch.strided:
        return from_strided(t, check=check)
    if t.layout == torch.sparse_coo:
        return _from_coo(t, check)
    if t.layout in _COMPRESSED:
        return _from_compressed(t, check)
    raise InteropError(f"torch layout {t.layout} is not supported; accepted: strided, sparse_coo, "
                       f"sparse_csr, sparse_csc, sparse_bsr, sparse_bsc")


def _hybrid_error(t: torch.Tensor) -> InteropError:
    return InteropError(
        f"this torch {t.layout} tensor of shape {tuple(t.shape)} is hybrid: its values carry "
        f"{t.dense_dim()} dense trailing dim(s) {tuple(t.shape[t.dim() - t.dense_dim():])}, which no "
        f"sparsetorch format stores. Make them sparse dims first, e.g. t.to_dense().to_sparse_csr() "
        f"(or .to_sparse() for COO), then call from_package"
    )


def from_strided(t: torch.Tensor, *, check: bool = True) -> SparseTensor:
    """A strided tensor as a dense format: zero-copy when some order of its dims is row-major."""
    if t.dim() == 0:
        raise InteropError("a 0-d tensor has no storage format; reshape it first, e.g. t.reshape(1)")
    check_value_dtype(t.dtype, f"this {tuple(t.shape)} tensor", "t.double() (or t.float())")
    if t.is_contiguous():
        order = list(range(t.dim()))
    else:
        order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
        if not t.permute(order).is_contiguous():  # expanded or sliced: copy into row-major
            t, order = t.contiguous(), list(range(t.dim()))
    return SparseTensor(dense_format(order), tuple(t.shape), [None] * t.dim(), [None] * t.dim(),
                        t.permute(order).reshape(-1), check=check)


def _from_coo(t: torch.Tensor, check: bool) -> SparseTensor:
    if t.dense_dim():
        raise _hybrid_error(t)
    check_value_dtype(t.dtype, "this torch sparse_coo tensor", "t.double() (or t.float())")
    coalesced = t.is_coalesced()
    indices, values = (t.indices(), t.values()) if coalesced else (t._indices(), t._values())
    ndim = indices.shape[0]
    if ndim == 0:
        raise InteropError("a sparse_coo tensor with no sparse dims has no storage format")
    rows = [indices[k] for k in range(ndim)]
    if coalesced and check and not all(lex_props(rows)):
        raise ValidationError(
            "this torch sparse_coo tensor says is_coalesced() but its indices are not sorted and unique; "
            "call t.coalesce() (or build it without is_coalesced=True)"
        )
    pos0 = torch.tensor([0, rows[0].numel()], dtype=indices.dtype, device=indices.device)
    return SparseTensor(coo_format(ndim, coalesced), tuple(t.shape), [pos0] + [None] * (ndim - 1),
                        rows, values, check=check)


def _from_compressed(t: torch.Tensor, check: bool) -> SparseTensor:
    kind, comp_name, plain_name = _COMPRESSED[t.layout]
    if t.dense_dim():
        raise _hybrid_error(t)
    check_value_dtype(t.dtype, f"this torch {t.layout} tensor", "t.double() (or t.float())")
    comp, plain, values = getattr(t, comp_name)(), getattr(t, plain_name)(), t.values()
    nb = comp.dim() - 1
    if kind in ("bsr", "bsc"):
        bh, bw = values.shape[nb + 1], values.shape[nb + 2]
        inner, extra = (BSR if kind == "bsr" else BSC)(bh, bw), [None, None]
    else:
        inner, extra = (CSR if kind == "csr" else CSC), []
    fmt = batched(inner, nb) if nb else inner
    pos = [None] * (nb + 1) + [comp] + extra
    crd = [None] * (nb + 1) + [plain] + extra
    vals = values.reshape(*values.shape[:nb], -1)
    return SparseTensor(fmt, tuple(t.shape), pos, crd, vals, check=check)


# SparseTensor -> torch ---------------------------------------------------------------------------

def to_torch(t: SparseTensor) -> torch.Tensor:
    """``t`` as a torch tensor of the matching layout, sharing its buffers (see the module table)."""
    layout = classify(t.format)
    if layout is None or layout.kind in ("dia", "dia_row"):
        raise no_counterpart(t, "torch", TORCH_FORMATS)
    if layout.kind == "dense":
        return _dense_view(t, layout)
    if t.batch_shape:
        raise shared_batch_error(t, "torch", "torch sparse layouts give every batch its own indices")
    if layout.kind == "coo":
        return _to_coo(t, layout)
    if not (layout.unique and layout.ordered):
        target = {"csr": "CSR", "csc": "CSC", "bsr": f"BSR{layout.block}", "bsc": f"BSC{layout.block}"}[layout.kind]
        raise InteropError(
            f"format {format_label(t.format)} allows unsorted or repeated indices in a segment, which torch's "
            f"{layout.kind.upper()} does not; sort and sum them first: "
            f"t.convert(sparsetorch.format.{target.replace(' ', '')}).to_package('torch')"
        )
    return _to_compressed(t, layout)


def _dense_view(t: SparseTensor, layout: Layout) -> torch.Tensor:
    nvb = len(t.batch_shape)
    sizes = t.format.level_sizes(t.format_shape)
    inverse = [layout.order.index(d) for d in range(len(layout.order))]
    v = t.values.reshape(*t.batch_shape, *sizes)
    return v.permute(*range(nvb), *(nvb + k for k in inverse))


def coo_rows(t: SparseTensor, layout: Layout) -> list[torch.Tensor]:
    """The coordinate rows of a COO-like tensor in dimension order (views of its crd buffers)."""
    level_of = {d: k for k, d in enumerate(layout.order)}
    return [t.crd(level_of[d]) for d in range(t.format.ndim)]


def _stacked(rows: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(rows)`` as int64, or the tensor the rows are already views of."""
    base = rows[0]._base
    if (
        base is not None and base.dtype == torch.int64 and base.dim() == 2
        and tuple(base.shape) == (len(rows), rows[0].numel())
        and all(r._base is base and r.stride() == (base.stride(1),)
                and r.storage_offset() == base.storage_offset() + k * base.stride(0)
                for k, r in enumerate(rows))
    ):
        return base
    return torch.stack(rows).to(torch.int64)


def _to_coo(t: SparseTensor, layout: Layout) -> torch.Tensor:
    rows = coo_rows(t, layout)
    coalesced = all(lex_props(rows))
    return torch.sparse_coo_tensor(_stacked(rows), t.values, tuple(t.shape), is_coalesced=coalesced,
                                   check_invariants=False)


def _to_compressed(t: SparseTensor, layout: Layout) -> torch.Tensor:
    k = layout.nbatch + 1  # the compressed level
    comp, plain, values = t.pos(k), t.crd(k), t.values
    shape = tuple(t.shape)
    if layout.kind in ("bsr", "bsc"):
        bh, bw = layout.block
        m, n = shape[-2:]
        if m % bh or n % bw:
            raise InteropError(
                f"torch's {layout.kind.upper()} needs the shape {shape[-2:]} to be a multiple of the block "
                f"{bh}x{bw}; this tensor has partial edge blocks. Use t.convert(sparsetorch.format.CSR)"
                f".to_package('torch') instead"
            )
        values = values.reshape(*values.shape[:-1], -1, bh, bw)
    return compressed_tensor(layout.kind, comp, plain, values, shape)

