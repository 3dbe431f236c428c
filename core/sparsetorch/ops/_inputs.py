"""Checking and normalising operands of the ops (real checks, never ``assert``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..dispatch.records import OperandInfo
from ..errors import InputError
from ..tensor import SparseTensor
from ..tensor.pattern import version_of
from ..tensor.validate import check_finite

__all__ = ["describe_sparse", "describe_factored", "describe_dense", "as_rhs", "check_matrix", "check_finite", "restore_rhs",
           "index_buffers_now", "index_buffers_unchanged"]


#: whether torch.jit.trace is recording (its sizes are 0-d tensors then)
_tracing = torch._C._get_tracing_state


def index_buffers_now(a: SparseTensor) -> tuple | None:
    """``(a, a._pos, a._crd, ((buffer, version, address, shape), ...))``: what a plan made on ``a``'s pattern
    records to see later that the pattern is still the one it planned for (:func:`index_buffers_unchanged`),
    or None where buffers have no address (a torch.func transform)."""
    try:
        return (a, a._pos, a._crd, tuple((b, version_of(b), b.data_ptr(), b.shape) for b in (*a._pos, *a._crd) if b is not None))
    except RuntimeError:
        return None


def index_buffers_unchanged(recorded: tuple | None, a: SparseTensor) -> bool:
    """Whether ``a`` is the tensor :func:`index_buffers_now` recorded, with the same index buffers, each at the
    same version, address and shape (no write in place since, no buffer swapped): O(levels), no pattern key
    built (0.8 against 9 us on a 2-core CPU). False says nothing more (compare pattern keys then)."""
    if recorded is None or recorded[0] is not a or recorded[1] is not a._pos or recorded[2] is not a._crd:
        return False
    for b, version, ptr, shape in recorded[3]:
        if version_of(b) != version or b.data_ptr() != ptr or b.shape != shape:
            return False
    return True


def describe_sparse(A: SparseTensor) -> OperandInfo:
    if _tracing():  # torch.jit.trace gives sizes as 0-d tensors: the cost models' sizes are ints
        return OperandInfo("sparse", tuple(int(s) for s in A.shape), A.dtype, A.device, A.format, int(A.nse),
                           tuple(int(s) for s in A.batch_shape), A.requires_grad)
    return OperandInfo("sparse", tuple(A.shape), A.dtype, A.device, A.format, A.nse, tuple(A.batch_shape), A.requires_grad)


def describe_factored(A: SparseTensor, properties: frozenset[str] = frozenset()) -> OperandInfo:
    """:func:`describe_sparse` for ops that price factorizations (solve, logdet): with the growth
    dimension of A's graph and its independent pieces (``ops/_graph.py``, measured once per pattern),
    which the direct solvers' fill models read through ``fill_dimension`` / ``lu_fill_flops``. ``properties``: A's known tags (a
    symmetric pattern is searched as it is)."""
    from ._graph import graph_components, graph_dimension  # noqa: PLC0415

    symmetric = bool({"symmetric", "hermitian", "spd"} & properties)
    return replace(describe_sparse(A), graph_dimension=graph_dimension(A, symmetric=symmetric),
                   components=graph_components(A, symmetric=symmetric))


def describe_dense(X: torch.Tensor) -> OperandInfo:
    shape = tuple(X.shape)
    if _tracing():  # torch.jit.trace gives sizes as 0-d tensors: the cost models' sizes are ints
        shape = tuple(int(s) for s in shape)
    return OperandInfo("dense", shape, X.dtype, X.device, None, None, (), X.requires_grad)


#: the dtypes the operations take (complex32 and the float8 types are storable, not computable)
_OP_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128})


def check_matrix(A: object, op: str, *, square: bool) -> SparseTensor:
    if not isinstance(A, SparseTensor):
        if type(A).__name__ in ("SparseTensorList", "DSparseTensorList", "list", "tuple"):
            raise InputError(
                f"{op} takes one sparsetorch.SparseTensor as A, got a {type(A).__name__}; call it per matrix "
                f"([sparsetorch.{op}(a, ...) for a in L]), or give matrices of one pattern as a value batch "
                f"(A.with_values(V), V of shape (batch, nnz)): sparsetorch.solve takes a SparseTensorList itself"
            )
        raise InputError(
            f"{op} takes a sparsetorch.SparseTensor as A, got {type(A).__name__}; wrap torch/SciPy/CuPy "
            f"matrices with sparsetorch.from_package(A)"
        )
    fs = A.format_shape
    if len(fs) != 2 or A.format.num_batch_levels:
        raise InputError(
            f"{op} needs a matrix (2 format dims, value batches allowed), got format shape {fs} "
            f"({A.format}); use a SparseTensorList for matrices with different patterns"
        )
    if not (A.dtype.is_floating_point or A.dtype.is_complex):
        raise InputError(f"A has dtype {A.dtype}; use a floating point or complex dtype")
    if A.dtype not in _OP_DTYPES:
        raise InputError(f"{op}: A has dtype {A.dtype}, which no operation supports; use float16, bfloat16, float32, "
                         f"float64, complex64 or complex128 (A.to(torch.float32), say)")
    if square and fs[0] != fs[1]:
        what = {"solve": "; for least squares use sparsetorch.lstsq(A, b)",
                "Solver": "; for least squares use sparsetorch.Lstsq(A)",
                "explain": "; for least squares explain('lstsq', A, b)"}.get(op, "")
        raise InputError(f"{op} needs a square matrix, got {fs[0]}x{fs[1]}{what}")
    # Backends hand the index buffers to compiled code: re-validate them if they were written in
    # place since they were last checked (a few attribute reads when they were not).
    A.ensure_valid()
    return A


def as_rhs(A: SparseTensor, B: object, op: str, *, rows: int) -> tuple[torch.Tensor, bool]:
    """``B`` as ``(*batch, rows, k)`` and whether it was a vector; an unbatched ``B`` of a value-batched
    A is broadcast over A's batch."""
    if not isinstance(B, torch.Tensor):
        raise InputError(f"{op}: the right-hand side must be a torch.Tensor, got {type(B).__name__}")
    if B.layout != torch.strided:
        raise InputError(f"{op}: the right-hand side must be dense (strided), got layout {B.layout}")
    if not (B.dtype.is_floating_point or B.dtype.is_complex):
        raise InputError(f"{op}: the right-hand side has dtype {B.dtype}; integer or bool data must be cast (e.g. b.to({A.dtype}))")
    if B.dtype != A.dtype:
        raise InputError(f"{op}: A has dtype {A.dtype} but the right-hand side has {B.dtype}; cast one of them (no silent promotion)")
    if B.device != A.device:
        raise InputError(f"{op}: A is on {A.device} but the right-hand side is on {B.device}; move them to one device")
    vb = tuple(A.batch_shape)
    nb = len(vb)
    if B.dim() == nb + 1 and tuple(B.shape[:nb]) == vb and B.shape[-1] == rows:
        return B.unsqueeze(-1), True
    if B.dim() == nb + 2 and tuple(B.shape[:nb]) == vb and B.shape[-2] == rows:
        return B, False
    if nb and B.dim() in (1, 2) and B.shape[0] == rows:
        # an unbatched right-hand side for a value-batched A: broadcast over the batch, as torch's
        # batched solves and products do (the batched forms above take precedence where a shape
        # could be read either way); a copy, so that the batch members own their columns
        full = B.unsqueeze(-1) if B.dim() == 1 else B
        return full.expand(vb + tuple(full.shape)).contiguous(), B.dim() == 1
    want = f"{vb + (rows,)} or {vb + (rows, 'k')}" + (f" (or {(rows,)} / {(rows, 'k')}, broadcast over the batch)" if nb else "")
    raise InputError(f"{op}: the right-hand side has shape {tuple(B.shape)}; for A of shape {tuple(A.shape)} it must be {want}")


def restore_rhs(X: torch.Tensor, vector: bool) -> torch.Tensor:
    return X.squeeze(-1) if vector else X


