"""Package interop: ``from_package(obj)`` and ``to_package(t, package)``, zero-copy where the
layouts agree.

==========  =================================================================================
package     objects and formats
==========  =================================================================================
torch       strided (dense formats), sparse_coo (COO), sparse_csr/csc/bsr/bsc (CSR, CSC, BSR,
            BSC and their batched forms)
scipy       scipy.sparse csr/csc/coo/bsr/dia arrays and matrices (CSR, CSC, COO, BSR, DIA_J)
numpy       ndarray (dense formats)
cupy        cupy.ndarray (dense formats), cupyx.scipy.sparse csr/csc/coo/dia (CUDA tensors)
==========  =================================================================================

``from_package`` records the package an object came from and ``to_package(t)`` without a package
hands the tensor back there (nvmath-python's UST semantics; see ``_origin.py``).

Dispatch looks at ``type(obj).__module__`` first, so SciPy and CuPy are imported only for their
own objects (``import sparsetorch`` imports neither). Each package's module documents what is
shared and what is copied.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import InteropError
from ..sparse_tensor import SparseTensor
from ._origin import origin_options, origin_package, record_origin

__all__ = ["from_package", "to_package", "origin_package", "PACKAGES"]

PACKAGES = ("torch", "scipy", "numpy", "cupy")
_OPTIONS = {"torch": (), "numpy": (), "scipy": ("kind",), "cupy": ("kind",)}
_ACCEPTED = (
    "a torch.Tensor (strided, sparse_coo, sparse_csr/csc/bsr/bsc), a scipy.sparse csr/csc/coo/bsr/dia "
    "array or matrix, a numpy.ndarray, a cupy.ndarray or cupyx.scipy.sparse csr/csc/coo/dia matrix, or "
    "any dense array with __dlpack__"
)


def from_package(obj: Any, *, check: bool = True) -> SparseTensor:
    """Wrap a tensor or array of another package as a :class:`SparseTensor`, sharing its memory.

    ``check=True`` validates the buffers (bad data raises :class:`~sparsetorch.ValidationError`);
    ``check=False`` skips the O(nnz) content checks (ranges, order, uniqueness, monotone ``pos``)
    and trusts the buffers as they are now (see :class:`SparseTensor`); torch-side in-place writes
    after that are still caught by :meth:`SparseTensor.ensure_valid`, writes through the other
    package's arrays are not (call :meth:`SparseTensor.validate`). A :class:`SparseTensor` is
    returned as is.
    """
    if isinstance(obj, SparseTensor):
        return obj
    t, package = _wrap(obj, check)
    record_origin(t, package, _kind_of(obj) if package in ("scipy", "cupy") else None)
    if package in ("scipy", "cupy"):
        _shared(t)
    return t


def _shared(t: SparseTensor) -> None:
    """Index buffers shared with SciPy / CuPy arrays, whose writes torch's version counters do not see: their
    fingerprint is taken now (O(nnz) once, cached on the pattern), so that :meth:`SparseTensor.validate` can tell
    a write made there since (and rebuild what was derived from the old contents) from none (and keep it)."""
    if t._index and t._values.device.type in ("cpu", "cuda"):
        t.pattern_fingerprint  # noqa: B018 - computed and cached


def _kind_of(obj: Any) -> dict:
    """``{"kind": "matrix"}`` for scipy/cupyx sparse matrices (the spmatrix classes), else none."""
    names = {c.__name__ for c in type(obj).__mro__}
    return {"kind": "matrix"} if "spmatrix" in names else {}


def _wrap(obj: Any, check: bool) -> tuple[SparseTensor, str]:
    if isinstance(obj, torch.Tensor):
        from .torch_io import from_torch

        return from_torch(obj, check=check), "torch"
    root = (type(obj).__module__ or "").split(".")[0]
    if root == "scipy":
        from .scipy_io import from_scipy

        return from_scipy(obj, check=check), "scipy"
    if root.startswith("cupy"):
        from .cupy_io import from_cupy

        return from_cupy(obj, check=check), "cupy"
    import numpy as np

    if isinstance(obj, np.ndarray):
        from .numpy_io import from_numpy

        return from_numpy(obj, check=check), "numpy"
    if hasattr(obj, "__dlpack__"):
        from .torch_io import from_strided

        try:
            dense = torch.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError) as e:
            raise InteropError(f"{type(obj).__qualname__} has __dlpack__ but torch could not take it: {e}") from e
        return from_strided(dense, check=check), "torch"  # no way back to an unknown package
    raise InteropError(f"from_package does not know {type(obj).__module__}.{type(obj).__qualname__}; it takes {_ACCEPTED}")


def to_package(t: SparseTensor, package: Any = None, **options: Any) -> Any:
    """Hand ``t`` to ``package`` ("torch", "scipy", "numpy", "cupy" or the module itself); without
    one, to the package it came from (:func:`origin_package`: the package ``from_package``
    wrapped it from, "torch" for tensors built in torch), as nvmath-python's UST does; a SciPy
    or CuPy sparse *matrix* comes back as a matrix (``kind="matrix"``), an array as an array.

    Zero-copy where the layouts agree; a format the package has no counterpart for raises
    :class:`~sparsetorch.InteropError` naming the package's formats and the conversion to make.
    The index buffers are re-validated first if they were written in place since they were
    last checked (:meth:`SparseTensor.ensure_valid`).
    Options: ``kind="array" | "matrix"`` for scipy (default "array") and cupy.
    """
    if not isinstance(t, SparseTensor):
        raise InteropError(f"to_package takes a SparseTensor, got {type(t).__name__}; use sparsetorch.from_package first")
    if package is None:
        package = origin_package(t)
        options = {**origin_options(t), **options} if package in ("scipy", "cupy") else options
    name = getattr(package, "__name__", package)
    name = name.split(".")[0] if isinstance(name, str) else name
    if name == "cupyx":
        name = "cupy"
    if name not in _OPTIONS:
        raise InteropError(f"unknown package {package!r}; to_package knows {', '.join(PACKAGES)}")
    extra = sorted(set(options) - set(_OPTIONS[name]))
    if extra:
        allowed = ", ".join(_OPTIONS[name]) or "none"
        raise InteropError(f"to_package({name!r}) got unknown option(s) {extra}; its options: {allowed}")
    # The other package's compiled code (and torch's sparse kernels) trusts these index buffers.
    t.ensure_valid()
    if name == "torch":
        from .torch_io import to_torch

        return to_torch(t)
    if name == "numpy":
        from .numpy_io import to_numpy

        return to_numpy(t)
    if name == "scipy":
        from .scipy_io import to_scipy

        out = to_scipy(t, **options)
    else:
        from .cupy_io import to_cupy

        out = to_cupy(t, **options)
    _shared(t)
    return out
