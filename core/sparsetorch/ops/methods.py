"""The operations as methods of :class:`~sparsetorch.SparseTensor`, the way torch-sla spells them:
``A.solve(b)``, ``A.matvec(x)``, ``A.eigsh(k)``, ``A.det()``, ``A.norm()``, ... Each is the function of the
same name with ``A`` first (same keywords, same dispatch, same gradients); nothing here adds behaviour.

The tensor layer sits below the ops, so the methods are bound here (as ``matmul.py`` binds ``@``).
docs/coming-from-torch-sla.md maps torch-sla's names to these.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError, SparseTorchError
from ..tensor import SparseTensor, SparseTensorList
from .logdet import det, logdet, slogdet
from .lstsq import lstsq
from .matmul import matmul, norm
from .solve import solve
from .spectral import eigs, eigsh
from .properties import _components, detect_cached
from .structure import is_hermitian, is_positive_definite, is_symmetric
from .svd import cond, svds

__all__: list[str] = []


def _solve(self: SparseTensor, b: torch.Tensor, **options: Any) -> Any:
    """``sparsetorch.solve(A, b, **options)``: ``x`` with ``A x = b``."""
    if "tol" in options:
        raise InputError(f"solve takes rtol= (and atol=), not tol=: torch-sla's tol={options['tol']!r} is rtol here")
    return solve(self, b, **options)


def _lstsq(self: SparseTensor, b: torch.Tensor, **options: Any) -> Any:
    """``sparsetorch.lstsq(A, b, **options)``: least squares (minimum norm) ``x``."""
    return lstsq(self, b, **options)


def _matvec(self: SparseTensor, x: torch.Tensor, **options: Any) -> torch.Tensor:
    """``A @ x`` (``sparsetorch.matmul(A, x, **options)``): torch-sla's name for the product."""
    return matmul(self, x, **options)


def _values_only(got: Any, vectors: bool, info: bool) -> Any:
    """``(w, V)`` / ``(w, V, info)`` without ``V`` where ``return_eigenvectors=False`` (SciPy's / torch-sla's keyword)."""
    if vectors:
        return got
    return (got[0], got[2]) if info else got[0]


def _eigsh(self: SparseTensor, k: int = 6, which: str | None = None, *, return_eigenvectors: bool = True,
           **options: Any) -> Any:
    """``sparsetorch.eigsh(A, k, which=which, **options)``: ``k`` eigenpairs of a symmetric (Hermitian) A
    (``which`` may be given second, as torch-sla's ``A.eigsh(k, which)``; ``return_eigenvectors=False``: ``w``
    alone, the vectors still computed)."""
    if which is not None:
        options["which"] = which
    return _values_only(eigsh(self, k, **options), return_eigenvectors, bool(options.get("return_info")))


def _eigs(self: SparseTensor, k: int = 6, which: str | None = None, *, return_eigenvectors: bool = True,
          **options: Any) -> Any:
    """``sparsetorch.eigs(A, k, which=which, **options)``: ``k`` eigenpairs of a general square A."""
    if which is not None:
        options["which"] = which
    return _values_only(eigs(self, k, **options), return_eigenvectors, bool(options.get("return_info")))


def _det(self: SparseTensor, **options: Any) -> torch.Tensor:
    """``sparsetorch.det(A, **options)`` (overflows to inf where ``slogdet`` does not)."""
    return det(self, **options)


def _slogdet(self: SparseTensor, **options: Any) -> Any:
    """``sparsetorch.slogdet(A, **options)``: ``(sign, log|det A|)``."""
    return slogdet(self, **options)


def _logdet(self: SparseTensor, **options: Any) -> torch.Tensor:
    """``sparsetorch.logdet(A, **options)``: ``log det A`` (nan where the determinant is negative)."""
    return logdet(self, **options)


def _norm(self: SparseTensor, ord: str | int | float = "fro") -> torch.Tensor:
    """``sparsetorch.norm(A, ord)``: "fro", 1, inf or "max", from the stored entries; ``ord=2``: the spectral norm,
    the largest singular value (:func:`~sparsetorch.svds`, differentiable)."""
    if ord == 2 and not isinstance(ord, bool):
        if len(self.format_shape) != 2 or self.batch_shape or min(self.format_shape) < 3:
            return torch.linalg.matrix_norm(self.to_dense(), 2)
        return svds(self, 1, return_singular_vectors=False)[0]
    return norm(self, ord)


def _connected_components(self: SparseTensor) -> tuple[int, torch.Tensor]:
    """``(count, labels)`` of the graph of A's stored off-diagonal entries taken both ways (SciPy's
    ``connected_components(directed=False)``): ``labels[i]`` numbers row i's component 0 .. count - 1 in the order
    of each component's smallest row. Square A; the pattern only (stored zeros count as edges)."""
    shape = tuple(self.format_shape)
    if len(shape) != 2 or shape[0] != shape[1]:
        raise InputError(f"connected_components: A must be a square matrix, got format shape {shape}")
    coords, _ = self.entries()
    src, dst = coords[0].to(torch.int64), coords[1].to(torch.int64)
    root = _components(shape[0], torch.cat([src, dst]), torch.cat([dst, src]))
    roots, labels = torch.unique(root, sorted=True, return_inverse=True)
    return int(roots.numel()), labels


def _to_connected_components(self: SparseTensor) -> tuple[list[SparseTensor], list[torch.Tensor]]:
    """A's diagonal blocks, one per connected component (:meth:`connected_components`), and each block's rows in
    A: ``blocks[c]`` is ``A[rows[c]][:, rows[c]]`` (differentiable in A's values); solving the blocks is solving A."""
    count, labels = _connected_components(self)
    order = torch.argsort(labels, stable=True)
    sizes = torch.bincount(labels, minlength=count).tolist()
    rows = list(torch.split(order, sizes))
    return [self[r][:, r] for r in rows], rows


def _detect_matrix_type(self: SparseTensor) -> str:
    """torch-sla's name for what dispatch detects: "spd", "symmetric" ("hermitian" for complex values) or
    "general" (:mod:`~sparsetorch.ops.properties`, the tags ``st.explain`` shows; "spd" is Gershgorin's sufficient
    test: ``A.is_positive_definite()`` decides the rest)."""
    tags = detect_cached(self.detach())
    if "spd" in tags:
        return "spd"
    if "hermitian" in tags and self.dtype.is_complex:
        return "hermitian"
    return "symmetric" if "symmetric" in tags else "general"


# SparseTensorList ------------------------------------------------------------------------------------
# torch-sla's SparseTensorList methods: each maps the op over the members (sparsetorch.solve takes the
# list whole: a backend that solves non-uniform batches at once is asked first). Results of one shape
# per member are stacked (a leading dimension of len(L)); results whose shapes differ (eigenvectors of
# members of different sizes, products with different row counts) come as lists. docs/lists.md.


def _stack_or_list(ts: list) -> Any:
    """The members' results stacked where they are tensors of one shape, else the list."""
    if ts and all(isinstance(t, torch.Tensor) for t in ts) and len({tuple(t.shape) for t in ts}) == 1:
        return torch.stack(ts)
    if not ts:
        return torch.empty(0)  # an empty list: an empty stack, as the stacking rule says
    return ts


def _per_member(L: SparseTensorList, xs: Any, what: str) -> tuple[list, bool]:
    """``xs`` as one operand per member and whether it came stacked (a tensor with a leading dim of len(L))."""
    if isinstance(xs, torch.Tensor):
        if xs.dim() == 0 or xs.shape[0] != len(L):
            raise InputError(f"SparseTensorList.{what}: a stacked tensor needs a leading dimension of {len(L)} (one per "
                             f"member), got shape {tuple(xs.shape)}; pass a list for members of different sizes")
        return list(xs.unbind(0)), True
    if isinstance(xs, SparseTensorList):
        items = list(xs)
    elif isinstance(xs, (list, tuple)):
        items = list(xs)
    else:
        raise InputError(f"SparseTensorList.{what} takes a list of tensors (one per member) or a stacked tensor, got "
                         f"{type(xs).__name__}")
    if len(items) != len(L):
        raise InputError(f"SparseTensorList.{what}: {len(L)} members need {len(L)} operands, got {len(items)}")
    return items, False


def _where(i: int, L: SparseTensorList, fn, *args, **kw):
    """``fn(*args, **kw)`` for member ``i``; an error of ours says which member."""
    try:
        return fn(*args, **kw)
    except SparseTorchError as exc:
        if exc.args and isinstance(exc.args[0], str) and "SparseTensorList member" not in exc.args[0]:
            exc.args = (f"SparseTensorList member {i} of {len(L)}: {exc.args[0]}",) + exc.args[1:]
        raise


def _list_solve(self: SparseTensorList, bs: Any, **options: Any) -> Any:
    """``sparsetorch.solve(L, bs, **options)``: ``x_i`` with ``A_i x_i = b_i``. ``bs`` a list (one per member)
    or a stacked tensor (members of one size); the answers come the same way (a stacked tensor for a stacked
    ``bs``); with ``return_info=True`` ``(xs, [info_i])``. Differentiable in the members' values and in ``bs``."""
    if "tol" in options:
        raise InputError(f"solve takes rtol= (and atol=), not tol=: torch-sla's tol={options['tol']!r} is rtol here")
    items, stacked = _per_member(self, bs, "solve")
    if any(isinstance(b, torch.Tensor) and b.dim() > 2 for b in items):
        # a batch of right-hand sides for a member: each member's solve broadcasts as sparsetorch.solve does
        got = [_where(i, self, solve, a, b, **options) for i, (a, b) in enumerate(zip(self, items))]
        if options.get("return_info"):
            xs, infos = [g[0] for g in got], [g[1] for g in got]
            return (_stack_or_list(xs) if stacked else xs), infos
        return _stack_or_list(got) if stacked else got
    got = solve(self, items, **options)
    if options.get("return_info"):
        xs, infos = got
        return (torch.stack(xs) if stacked else list(xs)), infos
    return torch.stack(got) if stacked else list(got)


def _list_matvec(self: SparseTensorList, xs: Any, **options: Any) -> Any:
    """``A_i @ x_i`` per member (``sparsetorch.matmul``): ``xs`` a list or a stacked tensor; the products
    stacked for a stacked ``xs`` whose products have one shape, else a list (a SparseTensorList of
    SparseTensors gives the sparse products as a SparseTensorList)."""
    items, stacked = _per_member(self, xs, "matvec")
    ys = [_where(i, self, matmul, a, x, **options) for i, (a, x) in enumerate(zip(self, items))]
    if ys and all(isinstance(y, SparseTensor) for y in ys):
        return SparseTensorList(ys)
    return _stack_or_list(ys) if stacked else ys


def _list_matmul_operator(self: SparseTensorList, other: Any) -> Any:
    """``L @ xs``: :meth:`SparseTensorList.matvec`."""
    if not isinstance(other, (torch.Tensor, list, tuple, SparseTensorList)):
        return NotImplemented
    return _list_matvec(self, other)


def _mapped(self: SparseTensorList, fn, *args: Any, **options: Any) -> list:
    return [_where(i, self, fn, a, *args, **options) for i, a in enumerate(self)]


def _list_det(self: SparseTensorList, **options: Any) -> Any:
    """``det A_i`` per member, stacked (``(len(L), *value_batch)``); options as :func:`sparsetorch.det`."""
    return _stack_or_list(_mapped(self, det, **options))


def _list_logdet(self: SparseTensorList, **options: Any) -> Any:
    """``log det A_i`` per member, stacked; options as :func:`sparsetorch.logdet`."""
    return _stack_or_list(_mapped(self, logdet, **options))


def _list_slogdet(self: SparseTensorList, **options: Any) -> Any:
    """``(sign, log|det A_i|)`` per member: two stacked tensors (``return_info=True``: and ``[info_i]``)."""
    got = _mapped(self, slogdet, **options)
    infos = [g[2] for g in got] if options.get("return_info") else None
    signs = _stack_or_list([g[0] for g in got])
    logs = _stack_or_list([g[1] for g in got])
    return (signs, logs, infos) if infos is not None else (signs, logs)


def _list_eigsh(self: SparseTensorList, k: int = 6, which: str | None = None, **options: Any) -> Any:
    """``k`` eigenpairs of every (symmetric) member: ``(w, V)`` with ``w`` stacked ``(len(L), k)`` and ``V``
    stacked ``(len(L), n, k)`` when the members have one size, else the list of the ``V_i``
    (``return_info=True``: and ``[info_i]``)."""
    if which is not None:
        options["which"] = which
    got = _mapped(self, eigsh, k, **options)
    ws = _stack_or_list([g[0] for g in got])
    vs = _stack_or_list([g[1] for g in got])
    if options.get("return_info"):
        return ws, vs, [g[2] for g in got]
    return ws, vs


def _list_norm(self: SparseTensorList, ord: str | int | float = "fro") -> Any:
    """``norm(A_i, ord)`` per member, stacked: "fro", 1, inf or "max"."""
    return _stack_or_list(_mapped(self, norm, ord))


for _name, _fn in {"solve": _list_solve, "matvec": _list_matvec, "__matmul__": _list_matmul_operator,
                   "det": _list_det, "slogdet": _list_slogdet, "logdet": _list_logdet, "eigsh": _list_eigsh,
                   "norm": _list_norm}.items():
    _fn.__name__ = _name
    _fn.__qualname__ = f"SparseTensorList.{_name}"
    setattr(SparseTensorList, _name, _fn)


def _svd(self: SparseTensor, k: int = 6, **options: Any) -> Any:
    """``sparsetorch.svds(A, k, **options)``: ``(U, S, Vh)`` of the ``k`` largest singular values (torch-sla's
    ``A.svd(k)``; ``which="SM"`` for the smallest of a square A)."""
    return svds(self, k, **options)


def _condition_number(self: SparseTensor, ord: Any = 2, **options: Any) -> torch.Tensor:
    """``sparsetorch.cond(A, ord)``: the 2-norm condition number (torch-sla's ``A.condition_number()``)."""
    return cond(self, ord, **options)


def _is_symmetric(self: SparseTensor, atol: float = 1e-8, rtol: float = 1e-5) -> bool:
    """``sparsetorch.is_symmetric(A, atol, rtol)``: ``A == A^T`` entrywise within ``atol + rtol |A^T|``."""
    return is_symmetric(self, atol, rtol)


def _is_hermitian(self: SparseTensor, atol: float = 1e-8, rtol: float = 1e-5) -> bool:
    """``sparsetorch.is_hermitian(A, atol, rtol)``: ``A == A^H`` entrywise within ``atol + rtol |A^H|``."""
    return is_hermitian(self, atol, rtol)


def _is_positive_definite(self: SparseTensor, method: str = "auto", **tolerances: Any) -> bool:
    """``sparsetorch.is_positive_definite(A, method)``: "auto", "gershgorin", "cholesky" or "eigenvalue"."""
    return is_positive_definite(self, method, **tolerances)


for _name, _fn in {"solve": _solve, "lstsq": _lstsq, "matvec": _matvec, "eigsh": _eigsh, "eigs": _eigs,
                   "det": _det, "slogdet": _slogdet, "logdet": _logdet, "norm": _norm, "svd": _svd,
                   "condition_number": _condition_number, "cond": _condition_number, "is_symmetric": _is_symmetric,
                   "is_hermitian": _is_hermitian, "is_positive_definite": _is_positive_definite,
                   "connected_components": _connected_components, "to_connected_components": _to_connected_components,
                   "detect_matrix_type": _detect_matrix_type}.items():
    _fn.__name__ = _fn.__qualname__ = _name
    setattr(SparseTensor, _name, _fn)
